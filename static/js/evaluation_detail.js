// An evaluation's report page: the confusion matrix, the reliability diagrams before and
// after the temperature (equal-width and equal-mass bins), ROC and precision–recall curves
// and the risk–coverage curve of the threshold proposal, drawn with plotly from the JSON the
// page embeds (json_script "evaluation-chart-data"). Labels are user data and plotly reads a
// few HTML tags in them, so they are escaped.
(function () {
  "use strict";

  var charts = window.Trainyard.evaluationCharts;
  var CONFIG = { displayModeBar: false, responsive: true };
  var PALETTE = ["#2f4fc7", "#23804a", "#c2410c", "#7c3aed", "#0e7490", "#b91c1c", "#a16207", "#475569", "#db2777", "#15803d"];
  var MARKERS = { t_risk: "#23804a", t_cost: "#7c3aed", current: "#c2410c", "0.8": "#475569" };

  function escapeLabel(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function drawConfusion(data) {
    var div = document.getElementById("confusion-chart");
    if (!div || !data.confusion_matrix.length) return;
    var labels = data.labels.map(escapeLabel);
    var size = labels.length;
    div.style.height = Math.max(300, Math.min(640, 90 + 40 * size)) + "px";
    window.Plotly.newPlot(div, [{
      type: "heatmap", z: data.confusion_matrix, x: labels, y: labels,
      text: data.confusion_matrix.map(function (row) { return row.map(String); }),
      texttemplate: size <= 15 ? "%{text}" : "", colorscale: [[0, "#f7f8fa"], [1, "#2f4fc7"]], showscale: false,
      xgap: 2, ygap: 2, hovertemplate: "true %{y} · predicted %{x}: %{z}<extra></extra>",
    }], charts.baseLayout({
      margin: { l: 96, r: 12, t: 8, b: 64 },
      xaxis: { title: { text: "predicted" }, type: "category", side: "bottom" },
      yaxis: { title: { text: "true" }, type: "category", autorange: "reversed", automargin: true },
    }), CONFIG);
  }

  function drawReliability(data) {
    var reliability = data.reliability;
    charts.reliability(document.getElementById("reliability-before-width"), (reliability.before || {}).width, { name: "before" });
    charts.reliability(document.getElementById("reliability-before-mass"), (reliability.before || {}).mass, { name: "before" });
    charts.reliability(document.getElementById("reliability-after-width"), (reliability.after || {}).width,
                       { name: "after", colour: "#23804a" });
    charts.reliability(document.getElementById("reliability-after-mass"), (reliability.after || {}).mass,
                       { name: "after", colour: "#23804a" });
    var isotonic = document.getElementById("reliability-isotonic-width");
    if (isotonic) charts.reliability(isotonic, (reliability.isotonic || {}).width, { name: "isotonic", colour: "#0e7490" });
  }

  function drawCurves(id, curves, xKey, yKey, xTitle, yTitle, areaKey, withDiagonal) {
    var div = document.getElementById(id);
    if (!div) return;
    var names = Object.keys(curves).filter(function (name) { return curves[name][xKey].length; });
    if (!names.length) {
      div.textContent = "No curve: every record has the same label.";
      div.classList.add("empty");
      return;
    }
    var traces = names.map(function (name, index) {
      var curve = curves[name];
      var area = curve[areaKey];
      return {
        type: "scatter", mode: "lines", x: curve[xKey], y: curve[yKey], line: { color: PALETTE[index % PALETTE.length], width: 2 },
        name: escapeLabel(name) + (area !== null && area !== undefined ? " (" + area.toFixed(3) + ")" : ""),
        hovertemplate: escapeLabel(name) + ": " + xTitle + " %{x:.3f}, " + yTitle + " %{y:.3f}<extra></extra>",
      };
    });
    if (withDiagonal) {
      traces.unshift({ type: "scatter", mode: "lines", x: [0, 1], y: [0, 1], line: { color: charts.MUTED, dash: "dot", width: 1 },
                       hoverinfo: "skip", showlegend: false });
    }
    window.Plotly.newPlot(div, traces, charts.baseLayout({
      showlegend: true, legend: withDiagonal ? { x: 0.98, xanchor: "right", y: 0.04, yanchor: "bottom", bgcolor: "rgba(255,255,255,0.85)" }
                                            : { x: 0.02, y: 0.04, yanchor: "bottom", bgcolor: "rgba(255,255,255,0.85)" },
      xaxis: { title: { text: xTitle }, range: [0, 1.01], gridcolor: "#eef0f3", zeroline: false },
      yaxis: { title: { text: yTitle }, range: [0, 1.02], gridcolor: "#eef0f3", zeroline: false, automargin: true },
    }), CONFIG);
  }

  function drawRiskCoverage(data) {
    var div = document.getElementById("risk-coverage-chart");
    if (!div || !data.candidates.length) return;
    var rows = data.candidates;
    var hover = "threshold %{customdata:.4f}<br>coverage %{x:.3f}<br>";
    var traces = [{
      type: "scatter", mode: "lines", name: "risk", x: rows.map(function (row) { return row.coverage; }),
      y: rows.map(function (row) { return row.risk; }), customdata: rows.map(function (row) { return row.threshold; }),
      line: { color: charts.ACCENT, width: 2 }, hovertemplate: hover + "risk %{y:.4f}<extra></extra>",
    }, {
      type: "scatter", mode: "lines", name: "upper bound", x: rows.map(function (row) { return row.coverage; }),
      y: rows.map(function (row) { return row.risk_upper; }), customdata: rows.map(function (row) { return row.threshold; }),
      line: { color: charts.ACCENT, width: 1, dash: "dash" }, hovertemplate: hover + "upper bound %{y:.4f}<extra></extra>",
    }];
    if (data.target_error !== null && data.target_error !== undefined) {
      traces.push({ type: "scatter", mode: "lines", name: "target", x: [0, 1], y: [data.target_error, data.target_error],
                    line: { color: "#b91c1c", width: 1, dash: "dot" }, hoverinfo: "skip" });
    }
    Object.keys(data.markers).forEach(function (name) {
      var marker = data.markers[name];
      traces.push({
        type: "scatter", mode: "markers+text", name: name, x: [marker.coverage], y: [marker.risk === null ? 0 : marker.risk],
        text: [name + " = " + marker.threshold.toFixed(3)], textposition: marker.coverage > 0.8 ? "top left" : "top right",
        marker: { color: MARKERS[name] || "#1f2937", size: 10, symbol: name === "0.8" ? "diamond" : "circle" },
        hovertemplate: name + ": threshold " + marker.threshold.toFixed(4) + "<br>coverage %{x:.3f}<br>risk %{y:.4f}<extra></extra>",
      });
    });
    // Up to a few times the target: the bound near zero coverage is near 1 and would flatten
    // the part of the curve where the thresholds are chosen.
    var highest = Math.max.apply(null, rows.map(function (row) { return row.risk || 0; }).concat([(data.target_error || 0.05) * 3]));
    window.Plotly.newPlot(div, traces, charts.baseLayout({
      showlegend: true, legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" }, margin: { l: 56, r: 16, t: 28, b: 44 },
      xaxis: { title: { text: "coverage (share auto-accepted)" }, range: [0, 1.02], gridcolor: "#eef0f3", zeroline: false },
      yaxis: { title: { text: "risk among auto-accepted" }, range: [0, Math.min(1.02, highest * 1.2)],
               gridcolor: "#eef0f3", zeroline: false, automargin: true },
    }), CONFIG);
  }

  function draw() {
    if (!window.Plotly) return;
    var data = charts.readJSON("evaluation-chart-data");
    if (!data) return;
    drawConfusion(data);
    drawReliability(data);
    drawCurves("roc-chart", data.roc, "fpr", "tpr", "false positive rate", "true positive rate", "auc", true);
    drawCurves("pr-chart", data.pr, "recall", "precision", "recall", "precision", "average_precision", false);
    drawRiskCoverage(data);
  }

  charts.whenReady(draw);
})();
