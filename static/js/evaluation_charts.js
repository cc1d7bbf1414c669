// What the evaluation pages' charts share, as window.Trainyard.evaluationCharts: the
// reliability diagram (each bin's accuracy as a bar at its confidence range, the bin's mean
// confidence as a dot, and the diagonal where confidence is the chance of being right).
// Loaded before the page's own script (static/js/evaluation_detail.js, evaluation_compare.js).
(function () {
  "use strict";

  var Trainyard = window.Trainyard = window.Trainyard || {};
  var ACCENT = "#2f4fc7";
  var MUTED = "#9aa3b2";
  var MIN_BAR = 0.012;  // the confidence == 1.0 bin has no width of its own

  function baseLayout(extra) {
    var live = Trainyard.live;
    var defaults = { margin: { l: 48, r: 12, t: 8, b: 40 } };
    return live ? live.chartLayout(defaults, extra) : Object.assign({}, defaults, extra);
  }

  // bins: [{lower, upper, count, confidence, accuracy}]; extra traces (e.g. another set of
  // bins) may be appended by the caller through options.more.
  function reliabilityTraces(bins, name, colour) {
    var used = (bins || []).filter(function (bin) { return bin.count > 0 && bin.accuracy !== null; });
    return [{
      type: "bar", name: name,
      x: used.map(function (bin) { return (bin.lower + bin.upper) / 2; }),
      width: used.map(function (bin) { return Math.max(bin.upper - bin.lower, MIN_BAR); }),
      y: used.map(function (bin) { return bin.accuracy; }),
      customdata: used.map(function (bin) { return [bin.lower, bin.upper, bin.count, bin.confidence]; }),
      marker: { color: colour, opacity: 0.75, line: { color: "#ffffff", width: 1 } },
      hovertemplate: "confidence %{customdata[0]:.3f}–%{customdata[1]:.3f}<br>%{customdata[2]:,} items<br>" +
                     "mean confidence %{customdata[3]:.3f}<br>accuracy %{y:.3f}<extra>" + name + "</extra>",
    }, {
      type: "scatter", mode: "markers", name: name + " confidence",
      x: used.map(function (bin) { return bin.confidence; }), y: used.map(function (bin) { return bin.confidence; }),
      marker: { color: "#1f2937", size: 5, symbol: "line-ew-open", line: { width: 2 } }, hoverinfo: "skip", showlegend: false,
    }];
  }

  function diagonal() {
    return { type: "scatter", mode: "lines", x: [0, 1], y: [0, 1], line: { color: MUTED, dash: "dot", width: 1 },
             hoverinfo: "skip", name: "perfect", showlegend: false };
  }

  function reliability(div, bins, options) {
    if (!div || !window.Plotly) return false;
    options = options || {};
    var traces = [diagonal()].concat(reliabilityTraces(bins, options.name || "bins", options.colour || ACCENT));
    (options.more || []).forEach(function (more) {
      traces = traces.concat(reliabilityTraces(more.bins, more.name, more.colour));
    });
    if (!(bins || []).length && !(options.more || []).length) {
      div.textContent = "No bins to draw.";
      div.classList.add("empty");
      return false;
    }
    // A K-class model's top confidence is at least 1/K: start the axis at the lowest bin
    // (rounded down to a tenth) so the bins are not squeezed into the right half.
    var lowest = 1;
    [bins].concat((options.more || []).map(function (more) { return more.bins; })).forEach(function (set) {
      (set || []).forEach(function (bin) { if (bin.count > 0) lowest = Math.min(lowest, bin.lower); });
    });
    var start = Math.max(0, Math.min(0.9, Math.floor(lowest * 10) / 10));
    window.Plotly.newPlot(div, traces, baseLayout({
      barmode: "overlay", showlegend: Boolean(options.more && options.more.length),
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
      margin: { l: 48, r: 12, t: options.more && options.more.length ? 28 : 8, b: 40 },
      xaxis: { title: { text: "confidence" }, range: [start, 1.02], gridcolor: "#eef0f3", zeroline: false },
      yaxis: { title: { text: "accuracy" }, range: [0, 1.02], gridcolor: "#eef0f3", zeroline: false, automargin: true },
    }), { displayModeBar: false, responsive: true });
    return true;
  }

  function readJSON(id) {
    var source = document.getElementById(id);
    return source ? JSON.parse(source.textContent) : null;
  }

  function whenReady(start) {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
    else start();
  }

  Trainyard.evaluationCharts = { reliability: reliability, baseLayout: baseLayout, readJSON: readJSON,
                                 whenReady: whenReady, ACCENT: ACCENT, MUTED: MUTED };
})();
