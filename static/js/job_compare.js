// The compare page: one overlay chart per metric name with a line per job, drawn from the
// downsampled metrics API (rank 0, as the final metrics are). Colours follow the jobs
// table's swatches (the same palette, in the same order).
(function () {
  "use strict";

  // Neighbours differ in hue by far (blue, orange, green, magenta …) and in dash, so two jobs
  // read apart for colour-blind eyes and in print too; the first two used to be blue and teal.
  var PALETTE = ["#2f4fc7", "#c2570c", "#23804a", "#b8327a", "#0b7d8c", "#6741c9", "#bd2b2b", "#56606d", "#9a5a06", "#4d7c0f"];
  var DASHES = ["solid", "dash", "dot", "dashdot"];
  var POINTS = 600;

  var shared = window.Trainyard.live;

  function getJSON(url) {
    return shared.getJSON(url).catch(function () { return null; });
  }

  function drawMetric(box, name, jobs) {
    var card = shared.chartCard(name);
    var figure = card.figure;
    var div = card.div;
    box.appendChild(figure);
    var requests = jobs.map(function (job) {
      return getJSON(job.metrics_url + "?name=" + encodeURIComponent(name) + "&points=" + POINTS);
    });
    return Promise.all(requests).then(function (bodies) {
      var traces = [];
      bodies.forEach(function (body, index) {
        var points = (body && body.points) || [];
        if (!points.length) return;
        var label = shared.escapeLabel(jobs[index].name) + " #" + jobs[index].id;
        traces.push({
          type: "scattergl", mode: points.length > 24 ? "lines" : "lines+markers", name: label,
          x: points.map(function (p) { return p[0]; }), y: points.map(function (p) { return p[1]; }),
          line: { color: PALETTE[index % PALETTE.length], width: 1.8, dash: DASHES[index % DASHES.length] }, marker: { color: PALETTE[index % PALETTE.length], size: 5 },
          hovertemplate: "%{y:.4g}<extra>" + label + "</extra>",
        });
      });
      if (!traces.length) { figure.remove(); return; }
      window.Plotly.newPlot(div, traces, shared.chartLayout({
        margin: { l: 52, r: 16, t: 8, b: 36 }, height: 240,
        xaxis: { title: { text: "step", standoff: 4 }, gridcolor: "#eef0f3", zeroline: false }, hovermode: "x unified",
      }), shared.CHART_CONFIG);
    });
  }

  function draw() {
    var source = document.getElementById("compare-data");
    var box = document.getElementById("compare-charts");
    if (!source || !box || !window.Plotly) return;
    var data = JSON.parse(source.textContent);
    Promise.all(data.metric_names.map(function (name) { return drawMetric(box, name, data.jobs); })).then(function () {
      box.setAttribute("data-drawn", String(box.querySelectorAll(".chart-card").length));
    });
  }

  shared.whenReady(draw);
})();
