"""Numbers and wide tables in a real browser (Debian chromium): floats read as 4 significant
digits with the exact value on hover; the trials table of a wide search scrolls inside its
card with the trial number kept in view; the job page's side panel does not break
hyperparameter names mid-word; a parameter importance drawn from few trials says so; and
the tuning page is ready about as fast as the other pages. Screenshots:
/tmp/trainyard-numbers-*.png."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import JobStatus, TrainingJob
from tests.e2e.conftest import SCREENSHOTS
from tests.e2e.test_job_pages import finished_job, ready_version, sign_in  # noqa: F401 - fixtures
from tuning.models import TuningJob, TuningStatus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LONG_FLOAT = 0.00031622776601683794  # 10 ** -3.5, as a log-scale sampler hands it out
WIDE = {f"param_{index:02d}_{'x' * 6}": {"type": "continuous", "min": 0.0, "max": 1.0} for index in range(12)}
RANGES = {"learning_rate": {"type": "continuous", "min": 1e-4, "max": 0.1, "scale": "log"}, **WIDE}


@pytest.fixture
def wide_search(project, scientist):
    now = timezone.now()
    search = TuningJob.objects.create(
        project=project, name="wide-search", status=TuningStatus.COMPLETED, strategy="random",
        base_job={"algorithm": "tabular-classifier", "hyperparameters": {"epochs": 5, "weight_decay": 0.012345678901234}},
        parameter_ranges=RANGES, objective={"metric": "validation_accuracy", "goal": "maximize"}, max_trials=4,
        max_parallel=2, created_by=scientist, started_at=now - timedelta(minutes=20), finished_at=now,
        end_reason="MaxTrialsReached")
    trials = []
    for number in range(4):
        params = {"learning_rate": LONG_FLOAT * (number + 1), **{name: (number + 1) / 7 for name in WIDE}}
        trials.append(TrainingJob.objects.create(
            project=project, name=f"wide-search-{number}", algorithm="tabular-classifier", status=JobStatus.COMPLETED,
            tuning_job=search, trial_number=number, trial_params=params, objective_value=0.8 + number / 30,
            hyperparameters={"epochs": 5, **params}, started_at=now - timedelta(minutes=19 - number),
            finished_at=now - timedelta(minutes=15 - number)))
    TuningJob.objects.filter(pk=search.pk).update(best_trial=trials[-1], best_value=trials[-1].objective_value)
    search.refresh_from_db()
    return search


DRAW_TIMES_JS = """(() => {
    // Each Plotly.react: which chart, when it started and how long it held the main thread.
    window.__draws = [];
    window.__loaded = Infinity;
    window.addEventListener("load", () => { window.__loaded = performance.now(); });
    let plotly;
    Object.defineProperty(window, "Plotly", {configurable: true, get() { return plotly; }, set(value) {
        plotly = value;
        const react = value.react;
        value.react = function (div) {
            const start = performance.now();
            const result = react.apply(this, arguments);
            window.__draws.push({id: div.id, start: start, ms: performance.now() - start});
            return result;
        };
    }});
})();"""

BREAKS_JS = """(cell) => {
    // Where the browser wrapped the text: the index of each character that starts a new line.
    const text = cell.firstChild ? cell.textContent : "";
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    const starts = [];
    let top = null, offset = 0, node;
    while ((node = walker.nextNode())) {
        for (let i = 0; i < node.length; i++) {
            const range = document.createRange();
            range.setStart(node, i); range.setEnd(node, i + 1);
            const rect = range.getBoundingClientRect();
            if (top !== null && rect.top > top + 2) starts.push(offset + i);
            top = rect.top;
        }
        offset += node.length;
    }
    return {text, starts};
}"""


def test_numbers_wide_trials_side_panel_and_load_time(live_server, scientist, wide_search, ready_version,  # noqa: F811
                                                      browser_page):
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    url = f"{base}/tuning/{wide_search.pk}/"

    # Ready as fast as the other pages. Load times on this shared machine swing 0.3-6 s with
    # the other work on it, so the test asserts what decides them: the chart drawing done
    # before the load event. Parallel coordinates (WebGL, about 1.1 s in software here) used
    # to be drawn there, and the page took 2.1-4.3 s against the job page's 0.2-0.5 s.
    page.add_init_script(DRAW_TIMES_JS)
    loads = []
    for _ in range(3):
        page.goto(url)
        page.wait_for_load_state("load")
        loads.append(page.evaluate("""() => ({load: performance.getEntriesByType('navigation')[0].loadEventEnd,
                                             draws: window.__draws.filter(d => d.start < window.__loaded)})"""))
    print("tuning page, ms:", loads)
    for load in loads:
        assert all(draw["id"] != "parcoords-chart" for draw in load["draws"]), load
    assert min(sum(draw["ms"] for draw in load["draws"]) for load in loads) <= 500, loads
    page.locator("#parcoords-chart .main-svg").first.wait_for()  # still drawn, after the load

    # 4 significant digits, the exact value on hover: trial cells, the best trial, fixed hyperparameters.
    cell = page.locator("#trials-table tbody tr[data-trial='0'] td").nth(3)
    assert cell.inner_text() == "0.0003162"
    assert cell.locator(".num-exact").get_attribute("title") == repr(LONG_FLOAT)
    assert page.locator(".best-params").inner_text().count("0.5714") == 12
    assert "0.5714285714285714" not in page.locator("body").inner_text()
    assert page.locator("#tuning-side .table--kv").inner_text().split()[-1] == "0.01235"

    # Parameter importance from 4 trials says it is a rough hint.
    caveat = page.locator("#importance-caveat")
    assert caveat.is_visible() and "4 completed trials" in caveat.inner_text()

    # At a phone's width, the page keeps its width; the trials table scrolls inside its card
    # with the trial number still in view.
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(url)
    page.wait_for_load_state("load")
    widths = page.evaluate("""() => {
        const panel = document.querySelector('.trials-panel').getBoundingClientRect();
        const scroller = document.querySelector('.trials-panel .table-scroll');
        return {page: document.documentElement.scrollWidth, panelRight: panel.right,
                scroll: scroller.scrollWidth, client: scroller.clientWidth};
    }""")
    assert widths["page"] <= 390 and widths["panelRight"] <= 390, widths
    assert widths["scroll"] > widths["client"], widths  # 13 parameters do not fit: it scrolls
    page.evaluate("() => { document.querySelector('.trials-panel .table-scroll').scrollLeft = 600; }")
    number = page.locator("#trials-table tbody tr[data-trial='2'] td").first
    scroller_left = page.evaluate("() => document.querySelector('.trials-panel .table-scroll').getBoundingClientRect().left")
    assert abs(number.bounding_box()["x"] - scroller_left) < 2
    assert number.inner_text() == "#2"
    page.screenshot(path=str(SCREENSHOTS / "trainyard-numbers-trials-390.png"), full_page=False)

    # The job page's side panel wraps a long hyperparameter name after an underscore, never mid-word.
    page.set_viewport_size({"width": 1360, "height": 900})
    job = finished_job(wide_search.project, scientist, ready_version, name="long-names", status="Completed",
                       hyperparameters={"gradient_accumulation_steps_per_device": 8, "learning_rate": LONG_FLOAT,
                                        "warmup_ratio_of_total_training_steps": 0.061234567},
                       final={"validation_accuracy_on_the_held_out_rows": 0.9333333333333333}, curve=1.0)
    page.goto(f"{base}/jobs/{job.pk}/")
    names = page.locator(".detail-side .table--kv td:first-child, .detail-side .facts--mono dt")
    assert names.count() == 4
    for index in range(names.count()):
        lines = names.nth(index).evaluate(BREAKS_JS)
        for start in lines["starts"]:
            assert lines["text"][start - 1] == "_", lines  # a new line only right after an underscore
    overflowing = page.evaluate("""() => [...document.querySelectorAll('.detail-side .panel')]
        .filter(panel => panel.scrollWidth > panel.clientWidth + 1).map(panel => panel.innerText.slice(0, 40))""")
    assert not overflowing, overflowing
    numbers = page.locator(".detail-side .table--kv .num-exact")
    assert all(numbers.nth(i).evaluate("e => e.getClientRects().length") == 1 for i in range(numbers.count()))
    side = page.locator(".detail-side").inner_text()
    assert "0.0003162" in side and "0.9333" in side and "0.9333333333333333" not in side
    page.screenshot(path=str(SCREENSHOTS / "trainyard-numbers-job-side.png"), full_page=True)
    assert not page.console_errors, page.console_errors
