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

  function escapeLabel(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (response) {
      return response.ok ? response.json() : null;
    }).catch(function () { return null; });
  }

  function drawMetric(box, name, jobs, font) {
    var figure = document.createElement("figure");
    figure.className = "chart-card";
    var caption = document.createElement("figcaption");
    caption.className = "chart-title mono";
    caption.textContent = name;
    var div = document.createElement("div");
    div.className = "chart";
    div.setAttribute("data-metric", name);
    figure.appendChild(caption);
    figure.appendChild(div);
    box.appendChild(figure);
    var requests = jobs.map(function (job) {
      return getJSON(job.metrics_url + "?name=" + encodeURIComponent(name) + "&points=" + POINTS);
    });
    return Promise.all(requests).then(function (bodies) {
      var traces = [];
      bodies.forEach(function (body, index) {
        var points = (body && body.points) || [];
        if (!points.length) return;
        var label = escapeLabel(jobs[index].name) + " #" + jobs[index].id;
        traces.push({
          type: "scattergl", mode: points.length > 24 ? "lines" : "lines+markers", name: label,
          x: points.map(function (p) { return p[0]; }), y: points.map(function (p) { return p[1]; }),
          line: { color: PALETTE[index % PALETTE.length], width: 1.8, dash: DASHES[index % DASHES.length] }, marker: { color: PALETTE[index % PALETTE.length], size: 5 },
          hovertemplate: "%{y:.4g}<extra>" + label + "</extra>",
        });
      });
      if (!traces.length) { figure.remove(); return; }
      window.Plotly.newPlot(div, traces, {
        margin: { l: 52, r: 16, t: 8, b: 36 }, height: 240,
        font: { family: font, size: 12, color: "#4a5565" },
        xaxis: { title: { text: "step", standoff: 4 }, gridcolor: "#eef0f3", zeroline: false },
        yaxis: { gridcolor: "#eef0f3", zeroline: false, automargin: true },
        showlegend: false, hovermode: "x unified",
        paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      }, { displayModeBar: false, responsive: true });
    });
  }

  function draw() {
    var source = document.getElementById("compare-data");
    var box = document.getElementById("compare-charts");
    if (!source || !box || !window.Plotly) return;
    var data = JSON.parse(source.textContent);
    var font = getComputedStyle(document.documentElement).getPropertyValue("--font").trim() || "system-ui, sans-serif";
    Promise.all(data.metric_names.map(function (name) { return drawMetric(box, name, data.jobs, font); })).then(function () {
      box.setAttribute("data-drawn", String(box.querySelectorAll(".chart-card").length));
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
