"""A flow item's own page (flow item names used to be plain text): the flow
page's items table links each loop name to /review/flows/<flow>/items/<name>/, which shows
the input, the model's prediction, each reviewer's answer and the status, to the
project's readers only (reviewers, outsiders and another flow's id get 404), with user text
escaped."""

from __future__ import annotations

import re

from django.test import Client

from review.actions.answers import answer_slot
from review.actions.claims import claim_next_slot
from review.models import HumanLoop, LoopStatus


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_flow_items_link_to_a_loop_page_with_input_prediction_answers_and_status(
        project, owner, reviewer, teammate, reviewers, team, make_flow, make_loops):
    flow = make_flow(name="animals", title="Animals", task_count=1,
                     work_team=team(owner, reviewer, name="team-a"))
    loops = make_loops(flow, 2, content=lambda i: [{"text": "<script>alert(1)</script>a purring cat"},
                                                   {"row": {"legs": 4, "sound": "woof"}}][i],
                       confidence=lambda i: 0.41)
    assignment = claim_next_slot(reviewer, flow)
    answer_slot(assignment.pk, reviewer, {"label": "dog"})

    client = signed_in(teammate)
    flow_page = client.get(f"/review/flows/{flow.pk}/").content.decode()
    links = re.findall(r'<a class="loop-link" href="([^"]+)">([^<]+)</a>', flow_page)
    assert sorted(name for _, name in links) == sorted(loop.name for loop in loops)
    url = dict((name, href) for href, name in links)[loops[0].name]
    assert url == f"/review/flows/{flow.pk}/items/{loops[0].name}/"

    response = client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert loops[0].name in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;a purring cat" in html and "<script>alert(1)" not in html
    facts = html[html.index('id="loop-facts"'):]
    model = re.search(r"<dt>Model</dt><dd>(.*?)</dd>", facts).group(1)
    assert re.sub(r"<[^>]+>", "", model).split() == ["cat", "41%"], model
    assert re.search(r"<dt>Consensus</dt><dd><span class=\"mono strong\">dog</span>", facts)
    answers = html[html.index('id="answers-table"'):html.index("</table>", html.index('id="answers-table"'))]
    assert reviewer.get_username() in answers and ">dog<" in answers
    lede = html[html.index('<p class="lede">'):html.index("</p>", html.index('<p class="lede">'))]
    assert LoopStatus.COMPLETED.label in re.sub(r"<[^>]+>", "", lede) and "1 of 1 answer" in lede, lede

    # The second item: its row input as a table, nobody has taken it yet.
    second = client.get(f"/review/flows/{flow.pk}/items/{loops[1].name}/").content.decode()
    assert '<th scope="row" class="mono">legs</th><td class="mono">4</td>' in second
    assert "Nobody has taken this item yet." in second


def test_loop_page_is_for_the_projects_readers_only(project, owner, reviewer, teammate, outsider, team, make_flow,
                                                     make_loops):
    flow = make_flow(name="animals", title="Animals", work_team=team(owner, reviewer, name="team-a"))
    other = make_flow(name="plants", title="Plants", work_team=team(owner, reviewer, name="team-b"))
    loop = make_loops(flow, 1)[0]
    url = f"/review/flows/{flow.pk}/items/{loop.name}/"
    assert signed_in(teammate).get(url).status_code == 200
    assert signed_in(reviewer).get(url).status_code == 404  # reviewers reach no flow page
    assert signed_in(outsider).get(url).status_code == 404
    assert signed_in(teammate).get(f"/review/flows/{other.pk}/items/{loop.name}/").status_code == 404
    assert signed_in(teammate).get(f"/review/flows/{flow.pk}/items/no-such-loop/").status_code == 404
    assert Client().get(url).status_code == 302  # sign in first


def test_a_loop_name_with_a_slash_and_markup_links_and_opens(project, owner, reviewer, teammate, team, make_flow,
                                                              make_loops):
    # The API takes any loop name up to 128 characters: the link must neither 500 nor inject.
    flow = make_flow(name="animals", title="Animals", work_team=team(owner, reviewer, name="team-a"))
    loop = make_loops(flow, 1, content=lambda i: {"row": {"tags": ["a", "b"], "size": None}})[0]
    HumanLoop.objects.filter(pk=loop.pk).update(name='batch/7 <b>"x"</b>?#')
    client = signed_in(teammate)
    flow_page = client.get(f"/review/flows/{flow.pk}/")
    assert flow_page.status_code == 200
    href = re.search(r'<a class="loop-link" href="([^"]+)">', flow_page.content.decode()).group(1)
    assert "<b>" not in href and "#" not in href
    page = client.get(href.replace("&amp;", "&"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "batch/7 &lt;b&gt;&quot;x&quot;&lt;/b&gt;?#" in html
    assert '<td class="mono">[&quot;a&quot;, &quot;b&quot;]</td>' in html and '<td class="mono">null</td>' in html
