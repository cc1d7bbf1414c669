"""The Nodes page's charts over time: no y-axis label (the title, the ticks) overlaps the
x-axis's time labels, at a laptop's width and a phone's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import ClusterSample, Node, NodeState
from tests.e2e.conftest import SCREENSHOTS
from tests.e2e.test_job_pages import sign_in

OVERLAPS_JS = """() => [...document.querySelectorAll('#cluster-history .js-plotly-plot')].map(plot => {
    const boxes = sel => [...plot.querySelectorAll(sel)].map(el => el.getBoundingClientRect())
        .filter(r => r.width > 0 && r.height > 0);
    const ys = boxes('.ytick text, .g-ytitle text'), xs = boxes('.xtick text, .g-xtitle text');
    const hits = [];
    for (const y of ys) for (const x of xs)
        if (y.left < x.right - 0.5 && x.left < y.right - 0.5 && y.top < x.bottom - 0.5 && x.top < y.bottom - 0.5)
            hits.push([Math.round(y.left), Math.round(y.top), Math.round(x.left), Math.round(x.top)]);
    return {plot: plot.id, yLabels: ys.length, xLabels: xs.length, hits};
})"""


@pytest.mark.parametrize("width", [1280, 390])
def test_the_nodes_charts_labels_do_not_overlap(live_server, scientist, project, browser_page, width):
    page = browser_page
    Node.objects.create(name="node-a", hostname="h1", queue="node.cpu.a", state=NodeState.BUSY, cpus=8)
    now = timezone.now()
    for minute in range(0, 60, 2):
        ClusterSample.objects.create(at=now - timedelta(minutes=minute), queue_depth=minute % 7,
                                     nodes={"node-a": {"state": "busy", "cpu_percent": 30.0 + minute, "gpu_percent": None,
                                                       "job": None}})
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/nodes/")
    page.wait_for_function("() => document.querySelectorAll('#cluster-history .js-plotly-plot .xtick text').length > 0")
    page.wait_for_timeout(300)
    page.locator("#cluster-history").screenshot(path=str(SCREENSHOTS / f"trainyard-nodes-charts-{width}.png"))
    charts = page.evaluate(OVERLAPS_JS)
    assert charts and all(c["yLabels"] and c["xLabels"] for c in charts), charts
    assert all(not c["hits"] for c in charts), charts
