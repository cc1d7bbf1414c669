// The tuning job page: three plotly charts (objective per trial with the best so far,
// parallel coordinates, parameter importances) drawn from the page's data, then, while the
// search runs, refreshed from /tuning/<id>/data/ every few seconds. When the search's
// signature changes the charts are redrawn and the server-rendered regions (status, best
// trial, trial rows, side panel) re-read — no full reload. Plus the Stop button.
// Parameter names and values are user data: plotly reads a few HTML tags in labels, so
// everything that goes into a label is escaped.
(function () {
  "use strict";

  var live = window.Trainyard.pageData("tuning-live");
  if (!live) return;
  var shared = window.Trainyard.live, getJSON = shared.getJSON, escapeLabel = shared.escapeLabel;
  var styles = getComputedStyle(document.documentElement);
  var COLOURS = { Completed: "#23804a", Pruned: "#9a5a06", Failed: "#bd2b2b", Stopped: "#56606d", Running: "#6741c9" };
  var ORDER = ["Completed", "Pruned", "Running", "Stopped", "Failed"];
  var BEST = "#2f4fc7";
  var timer = null;

  function shown(value) {
    if (typeof value === "number") return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(4)));
    if (value === null || value === undefined) return "—";
    return typeof value === "object" ? JSON.stringify(value) : String(value);
  }

  function layout(extra) {
    return shared.chartLayout({ margin: { l: 56, r: 16, t: 8, b: 40 }, height: 260, hovermode: "closest" }, extra);
  }

  var CONFIG = shared.CHART_CONFIG;

  function showChart(id, visible) {
    document.getElementById(id + "-chart").hidden = !visible;
    document.getElementById(id + "-empty").hidden = visible;
  }

  // A trial's group in the chart: its shown status, with every still-moving status as "Running".
  function group(status) {
    return COLOURS[status] ? status : "Running";
  }

  function hoverText(trial, metric) {
    var lines = ["<b>trial #" + trial.number + "</b> · " + escapeLabel(trial.status.toLowerCase()),
                 escapeLabel(metric) + (trial.reported ? " (last reported)" : "") + ": " + shown(trial.value)];
    Object.keys(trial.params).forEach(function (name) {
      lines.push(escapeLabel(name) + " = " + escapeLabel(shown(trial.params[name])));
    });
    return lines.join("<br>");
  }

  function drawObjective(charts) {
    var div = document.getElementById("objective-chart");
    var plotted = charts.trials.filter(function (trial) { return trial.value !== null && trial.value !== undefined; });
    showChart("objective", plotted.length > 0);
    if (!plotted.length) return;
    var metric = charts.objective.metric;
    var traces = ORDER.map(function (name) {
      var points = plotted.filter(function (trial) { return group(trial.status) === name; });
      return {
        type: "scatter", mode: "markers", name: name.toLowerCase(),
        x: points.map(function (trial) { return trial.number; }),
        y: points.map(function (trial) { return trial.value; }),
        customdata: points.map(function (trial) { return trial.id; }),
        text: points.map(function (trial) { return hoverText(trial, metric); }),
        hovertemplate: "%{text}<extra></extra>",
        marker: {
          size: 9, color: COLOURS[name], line: { width: 1.5, color: COLOURS[name] },
          // A value that is not the final objective (a pruned or running trial's last report) is hollow.
          symbol: points.map(function (trial) { return trial.reported ? "circle-open" : "circle"; }),
        },
      };
    }).filter(function (trace) { return trace.x.length; });
    var last = plotted.reduce(function (most, trial) { return Math.max(most, trial.number); }, 0);
    if (charts.best_so_far.length) {
      var steps = charts.best_so_far;
      var xs = steps.map(function (point) { return point[0]; });
      var ys = steps.map(function (point) { return point[1]; });
      if (last > xs[xs.length - 1]) { xs.push(last); ys.push(ys[ys.length - 1]); }  // carry the line to the newest trial
      traces.unshift({
        type: "scatter", mode: "lines", name: "best so far", x: xs, y: ys, hoverinfo: "skip",
        line: { color: BEST, width: 2, shape: "hv" },
      });
    }
    window.Plotly.react(div, traces, layout({
      xaxis: { title: { text: "trial", standoff: 6 }, gridcolor: "#eef0f3", zeroline: false,
               range: [Math.min.apply(null, plotted.map(function (t) { return t.number; })) - 0.5, last + 0.5],
               dtick: last <= 30 ? 1 : null },
      yaxis: { title: { text: escapeLabel(metric), standoff: 6 }, gridcolor: "#eef0f3", zeroline: false, automargin: true },
    }), CONFIG);
    if (!div.hasAttribute("data-clickable")) {
      div.setAttribute("data-clickable", "");
      div.on("plotly_click", function (event) {
        var point = event.points && event.points[0];
        if (point && point.customdata) window.location.assign(live.urls.job_base + point.customdata + "/");
      });
    }
  }

  function drawParcoords(charts) {
    var div = document.getElementById("parcoords-chart");
    var parcoords = charts.parcoords;
    var visible = parcoords.dimensions.length > 0 && parcoords.color.length > 0;
    showChart("parcoords", visible);
    if (!visible) return;
    var minimize = charts.objective.goal === "minimize";
    var dimensions = parcoords.dimensions.map(function (dimension) {
      var out = { label: escapeLabel(dimension.label), values: dimension.values, range: dimension.range };
      if (out.range && out.range[0] === out.range[1]) out.range = [out.range[0] - 1, out.range[1] + 1];
      if (dimension.tickvals) {
        out.tickvals = dimension.tickvals;
        out.ticktext = dimension.ticktext.map(escapeLabel);
      }
      return out;
    });
    window.Plotly.react(div, [{
      type: "parcoords", dimensions: dimensions,
      // The best trials are the brightest, whichever way the objective goes.
      line: { color: parcoords.color, colorscale: "Viridis", reversescale: minimize, showscale: true,
              colorbar: { thickness: 10, len: 0.8, outlinewidth: 0 } },
      labelangle: dimensions.length > 6 ? -20 : 0, labelfont: { size: 12 }, tickfont: { size: 11 },
    }], layout({ height: 340, margin: { l: 72, r: 96, t: dimensions.length > 6 ? 64 : 48, b: 24 } }), CONFIG);
  }

  function drawImportances(charts) {
    var div = document.getElementById("importance-chart");
    var names = Object.keys(charts.importances);
    showChart("importance", names.length > 0);
    if (!names.length) return;
    names.sort(function (a, b) { return charts.importances[a] - charts.importances[b]; });  // the most important on top
    var values = names.map(function (name) { return charts.importances[name]; });
    window.Plotly.react(div, [{
      type: "bar", orientation: "h", y: names.map(escapeLabel), x: values,
      text: values.map(function (value) { return Math.round(value * 100) + "%"; }), textposition: "auto",
      marker: { color: "#6741c9" }, hovertemplate: "%{y}: %{x:.1%}<extra></extra>",
    }], layout({
      height: Math.max(180, 60 + 34 * names.length),
      margin: { l: 16, r: 16, t: 8, b: 36 },
      xaxis: { range: [0, Math.min(1, Math.max.apply(null, values) * 1.15)], tickformat: ".0%", gridcolor: "#eef0f3",
               zeroline: false },
      yaxis: { automargin: true, tickfont: { family: styles.getPropertyValue("--mono").trim() || "monospace" } },
    }), CONFIG);
  }

  // Parallel coordinates are WebGL: the first draw costs about a second where the GPU is
  // software (1.15 s in headless chromium here), which held the page's load 1.6-3.2 s.
  // So it is drawn after the page has loaded and only once it nears the viewport; a live
  // update while it is away is drawn when it comes near.
  var parcoords = { charts: null, near: false, loaded: document.readyState === "complete", pending: false };

  function drawParcoordsSoon(charts) {
    if (charts) parcoords.charts = charts;
    if (!parcoords.charts || !parcoords.near || !parcoords.loaded || parcoords.pending) return;
    parcoords.pending = true;
    window.requestAnimationFrame(function () {
      window.setTimeout(function () {
        parcoords.pending = false;
        var latest = parcoords.charts;
        parcoords.charts = null;
        if (latest) drawParcoords(latest);
      }, 0);
    });
  }

  function watchParcoords() {
    var div = document.getElementById("parcoords-chart");
    if (!("IntersectionObserver" in window)) parcoords.near = true;
    else new IntersectionObserver(function (entries) {
      parcoords.near = entries.some(function (entry) { return entry.isIntersecting; });
      drawParcoordsSoon();
    }, { rootMargin: "600px 0px" }).observe(div.parentNode);
    if (!parcoords.loaded) window.addEventListener("load", function () { parcoords.loaded = true; drawParcoordsSoon(); });
  }

  function draw(charts) {
    drawObjective(charts);
    drawParcoordsSoon(charts);
    drawImportances(charts);
    document.getElementById("objective-chart").setAttribute("data-drawn", "");
  }

  // --- live regions -------------------------------------------------------------------------
  function cellValue(row, index, numeric) {
    var cell = row.cells[index];
    if (!cell) return numeric ? -Infinity : "";
    var raw = cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent.trim();
    if (!numeric) return raw.toLowerCase();
    var number = parseFloat(raw);
    return isNaN(number) ? -Infinity : number;
  }

  // The rows come back in trial order; keep the order the person chose (tables.js sorts on click).
  function keepSortAndFilter() {
    var table = document.getElementById("trials-table");
    if (!table) return;
    table.closest(".table-scroll").hidden = table.tBodies[0].rows.length === 0;
    var headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
    var sorted = headers.filter(function (th) {
      var state = th.getAttribute("aria-sort");
      return state === "ascending" || state === "descending";
    })[0];
    if (sorted) {
      var index = headers.indexOf(sorted);
      var numeric = sorted.getAttribute("data-sort") === "number";
      var ascending = sorted.getAttribute("aria-sort") === "ascending";
      var collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
      var body = table.tBodies[0];
      Array.prototype.slice.call(body.rows).sort(function (a, b) {
        var x = cellValue(a, index, numeric), y = cellValue(b, index, numeric);
        var order = numeric ? (x < y ? -1 : x > y ? 1 : 0) : collator.compare(x, y);
        return ascending ? order : -order;
      }).forEach(function (row) { body.appendChild(row); });
    }
    var filter = document.querySelector('input[data-filter-for="trials-table"]');
    if (filter && filter.value) filter.dispatchEvent(new Event("input"));
  }

  // A change seen while a page read is in flight gets a read of its own once that one is done.
  var refreshRegions = shared.regionRefresher(live.urls.page, keepSortAndFilter);

  function poll() {
    getJSON(live.urls.data).then(function (payload) {
      if (payload.signature !== live.signature) {
        live.signature = payload.signature;
        live.status = payload.status;
        draw(payload.charts);
        refreshRegions();
      }
      if (payload.finished) {
        live.finished = true;
        window.clearInterval(timer);
      }
    }).catch(function () { /* a dropped request: the next tick asks again */ });
  }

  // --- stop -----------------------------------------------------------------------------------
  shared.stopButton("#stop-tuning", "tuning-state", "The connection broke off; the search was not asked to stop. Try again.", function () {
    poll();
    return refreshRegions();
  });

  function start() {
    if (!window.Plotly) return;
    watchParcoords();
    draw(live.charts);
    if (!live.finished) timer = window.setInterval(poll, (live.poll_seconds || 4) * 1000);
  }

  shared.whenReady(start);
})();
