// The nodes page's charts over time: CPU and GPU % per node and the queue's depth, from
// GET /api/v1/cluster/history/ (section#cluster-history[data-url]), redrawn every sample
// interval. Without samples in the window the charts give way to the empty line.
(function () {
  "use strict";

  var CONFIG = { displayModeBar: false, responsive: true };
  var COLOURS = ["#2f4fc7", "#0f9d8a", "#c2410c", "#7c3aed", "#b45309", "#0369a1", "#be185d", "#4d7c0f"];
  var timer = null;

  function escapeLabel(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function layout(yaxis) {
    return {
      margin: { l: 44, r: 8, t: 24, b: 44 }, showlegend: true,
      legend: { orientation: "h", x: 0, y: 1.0, yanchor: "bottom", font: { size: 11 } },
      font: { family: getComputedStyle(document.documentElement).getPropertyValue("--font").trim() || "system-ui, sans-serif",
              size: 12, color: "#4a5565" },
      // The y labels are centred on their lines, so "0 %" hangs below the x-axis: invisible
      // outside ticks push the time labels clear of it, automargin keeps the date line in.
      xaxis: { type: "date", gridcolor: "#eef0f3", zeroline: false, nticks: 6, tickangle: 0,
               hoverformat: "%b %-d, %H:%M:%S", automargin: true, ticks: "outside", ticklen: 8,
               tickcolor: "rgba(0,0,0,0)" },
      yaxis: Object.assign({ gridcolor: "#eef0f3", zeroline: false, automargin: true, rangemode: "tozero" }, yaxis),
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", hovermode: "closest",
    };
  }

  // x and y with a null wherever two points are further apart than `gap` ms, so a line
  // breaks where sampling stopped (or the node had no job) instead of bridging the hole.
  function withGaps(points, field, gap) {
    var x = [], y = [], text = [];
    var last = null;
    points.forEach(function (point) {
      var at = Date.parse(point.at);
      if (point[field] === null || point[field] === undefined) return;
      if (last !== null && at - last > gap) { x.push(new Date(last + 1).toISOString()); y.push(null); text.push(""); }
      x.push(point.at);
      y.push(point[field]);
      text.push(point.job ? escapeLabel(point.job.name) + " #" + point.job.id : (point.busy ? "a job of another project" : ""));
      last = at;
    });
    return { x: x, y: y, text: text };
  }

  function drawNodes(div, body, field, gap) {
    var traces = [];
    body.nodes.forEach(function (node, index) {
      var series = withGaps(node.points, field, gap);
      if (!series.y.some(function (v) { return v !== null; })) return;
      traces.push({
        type: "scatter", mode: "lines", name: escapeLabel(node.name), x: series.x, y: series.y, text: series.text,
        connectgaps: false, line: { width: 1.6, color: COLOURS[index % COLOURS.length] },
        hovertemplate: "%{y:.1f} %<br>%{x}<br>%{text}<extra>" + escapeLabel(node.name) + "</extra>",
      });
    });
    if (!traces.length) {
      if (window.Plotly) window.Plotly.purge(div);
      div.textContent = field === "gpu_percent" ? "No GPU figures in this window: no job on a GPU node reported one."
                                                 : "No CPU figures in this window: nodes report them while they run a job.";
      div.classList.add("empty", "small", "muted");
      return;
    }
    if (div.classList.contains("empty")) { div.textContent = ""; div.classList.remove("empty", "small", "muted"); }
    window.Plotly.react(div, traces, layout({ range: [0, 100], ticksuffix: " %" }), CONFIG);
  }

  function drawQueue(div, body) {
    var points = body.points;
    window.Plotly.react(div, [{
      type: "scatter", mode: "lines", line: { shape: "hv", width: 1.6, color: "#2f4fc7" }, name: "pending jobs",
      x: points.map(function (p) { return p.at; }), y: points.map(function (p) { return p.queue_depth; }),
      customdata: points.map(function (p) { return p.oldest_pending_seconds === null ? "none waiting" :
                                                   "oldest waited " + Math.round(p.oldest_pending_seconds) + " s"; }),
      hovertemplate: "%{y} pending<br>%{customdata}<br>%{x}<extra></extra>",
    }], Object.assign(layout({ rangemode: "tozero" }), { showlegend: false }), CONFIG);
  }

  function load(section) {
    var windowSeconds = Number(document.getElementById("cluster-window").value);
    var since = new Date(Date.now() - windowSeconds * 1000).toISOString();
    var url = section.getAttribute("data-url") + "?points=500&since=" + encodeURIComponent(since);
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error(url + " answered " + response.status);
        return response.json();
      })
      .then(function (body) {
        var empty = document.getElementById("cluster-empty");
        var charts = document.getElementById("cluster-charts");
        if (!body.samples || !window.Plotly) {
          empty.hidden = false;
          charts.hidden = true;
          return;
        }
        empty.hidden = true;
        charts.hidden = false;
        var every = Number(section.getAttribute("data-refresh-seconds")) || 15;
        var gap = 3 * 1000 * Math.max(every, body.bucket_seconds || 0);
        drawNodes(document.getElementById("chart-cpu"), body, "cpu_percent", gap);
        drawNodes(document.getElementById("chart-gpu"), body, "gpu_percent", gap);
        drawQueue(document.getElementById("chart-queue"), body);
      })
      .catch(function () { /* the next refresh tries again */ });
  }

  function start() {
    var section = document.getElementById("cluster-history");
    if (!section) return;
    var every = Math.max(5, Number(section.getAttribute("data-refresh-seconds")) || 15);
    var refresh = function () { load(section); };
    document.getElementById("cluster-window").addEventListener("change", refresh);
    refresh();
    timer = window.setInterval(function () { if (!document.hidden) refresh(); }, every * 1000);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
  window.addEventListener("pagehide", function () { if (timer) window.clearInterval(timer); });
})();
