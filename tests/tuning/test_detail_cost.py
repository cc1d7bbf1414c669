"""The tuning page's cost, server side: the tuning page reads a fixed number of queries however
many trials the search has (no query per trial), shows floats to 4 significant digits with
the exact value in the title, and says when its parameter importances come from few trials."""

from __future__ import annotations

import re

from tests.tuning.test_pages import login, make_trial, searched

EXACT = 0.00031622776601683794


def _add_trials(job, start: int, count: int) -> None:
    for number in range(start, start + count):
        make_trial(job, number, {"learning_rate": 0.001 + number / 1000, "layers": 1 + number % 4, "optimizer": "adam"},
                   0.5 + number / 200)


def test_detail_reads_a_fixed_number_of_queries_however_many_trials(owner, project, django_assert_max_num_queries):
    job, _ = searched(project, owner)
    client = login(owner)
    client.get(f"/tuning/{job.pk}/")  # the session and the content types are read once per process
    with django_assert_max_num_queries(12) as few:
        assert client.get(f"/tuning/{job.pk}/").status_code == 200
    _add_trials(job, 7, 40)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(f"/tuning/{job.pk}/").status_code == 200
    with django_assert_max_num_queries(8):
        assert client.get(f"/tuning/{job.pk}/data/").status_code == 200


def test_floats_show_four_digits_with_the_exact_value_on_hover(owner, project):
    job, trials = searched(project, owner)
    make_trial(job, 7, {"learning_rate": EXACT, "layers": 2, "optimizer": "adam"}, 0.9333333333333333)
    body = login(owner).get(f"/tuning/{job.pk}/").content.decode()
    assert repr(EXACT) in body  # on hover
    assert re.search(r'title="0\.00031622776601683794"[^>]*>0\.0003162</span>', body)
    assert re.search(r'title="0\.9333333333333333"[^>]*>0\.9333</span>', body)
    assert ">0.9333333333333333<" not in body and ">0.00031622776601683794<" not in body


def test_importance_from_few_trials_carries_a_caveat(owner, project):
    job, _ = searched(project, owner)  # four completed trials
    client = login(owner)
    caveat = re.search(r'<p class="small caveat" id="importance-caveat"[^>]*>', client.get(f"/tuning/{job.pk}/").content.decode())
    assert caveat and "hidden" not in caveat.group(0)
    assert "From 4 completed trials only" in client.get(f"/tuning/{job.pk}/").content.decode()
    _add_trials(job, 7, 6)  # ten completed now
    caveat = re.search(r'<p class="small caveat" id="importance-caveat"[^>]*>', client.get(f"/tuning/{job.pk}/").content.decode())
    assert caveat and "hidden" in caveat.group(0)
