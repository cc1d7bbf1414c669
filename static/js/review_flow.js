// A review flow's page: two plotly charts drawn from the flow's stats JSON (the container's
// data-url) — items completed per hour over the last 24 hours, and the confusion matrix of
// the model's labels against the people's consolidated labels — refreshed every 30 s.
// Labels are user data and plotly reads a few HTML tags in them, so they are escaped.
(function () {
  "use strict";

  var container = document.getElementById("review-charts");
  if (!container) return;
  var url = container.getAttribute("data-url");
  var shared = window.Trainyard.live;
  var escapeLabel = shared.escapeLabel;
  var CONFIG = shared.CHART_CONFIG;
  var REFRESH_MS = 30000;

  function layout(extra) {
    return shared.chartLayout({ margin: { l: 48, r: 16, t: 8, b: 40 }, height: 200 }, extra);
  }

  function show(id, visible) {
    var chart = document.getElementById(id + "-chart");
    if (!chart) return false;
    chart.hidden = !visible;
    document.getElementById(id + "-empty").hidden = visible;
    return true;
  }

  function drawHourly(series) {
    var total = series.reduce(function (sum, point) { return sum + point.completed; }, 0);
    if (!show("hourly", total > 0) || !total) return;
    window.Plotly.react(document.getElementById("hourly-chart"), [{
      type: "bar", x: series.map(function (point) { return point.hour; }),
      y: series.map(function (point) { return point.completed; }),
      marker: { color: "#23804a" }, hovertemplate: "%{x|%H:00}: %{y} completed<extra></extra>",
    }], layout({
      xaxis: { type: "date", tickformat: "%H:00", gridcolor: "#eef0f3", zeroline: false },
      yaxis: { gridcolor: "#eef0f3", zeroline: false, rangemode: "tozero", tickformat: ",d", automargin: true },
    }), CONFIG);
  }

  function drawConfusion(result) {
    var confusion = result.confusion;
    var visible = confusion.matrix.length > 0;
    if (!show("confusion", visible) || !visible) return;
    var human = confusion.human_labels.map(escapeLabel);
    var model = confusion.model_labels.map(escapeLabel);
    var text = confusion.matrix.map(function (row) { return row.map(String); });
    var size = Math.max(model.length, human.length);
    window.Plotly.react(document.getElementById("confusion-chart"), [{
      type: "heatmap", z: confusion.matrix, x: human, y: model, text: text, texttemplate: "%{text}",
      colorscale: [[0, "#f7f8fa"], [1, "#2f4fc7"]], showscale: false, xgap: 2, ygap: 2,
      hovertemplate: "model %{y} · people %{x}: %{z}<extra></extra>",
    }], layout({
      height: Math.max(220, 60 + 44 * size),
      margin: { l: 96, r: 16, t: 8, b: 56 },
      xaxis: { title: { text: "people (consensus)" }, type: "category", side: "bottom" },
      yaxis: { title: { text: "model" }, type: "category", autorange: "reversed", automargin: true },
    }), CONFIG);
  }

  function draw(stats) {
    drawHourly(stats.completed_per_hour);
    drawConfusion(stats.model_vs_human);
  }

  function load() {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error(url + " answered " + response.status);
        return response.json();
      })
      .then(draw)
      .catch(function () { /* a dropped request: the next refresh asks again */ });
  }

  function start() {
    if (!window.Plotly) return;
    load();
    window.setInterval(load, REFRESH_MS);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

// The export form: before an export, ask the server what the new version will
// hold ("8,000 rows of demo-tabular v1 + 6 reviewed, 2 relabelled") and confirm that; a
// merge that cannot be done shows its reason beside the button instead.
(function () {
  "use strict";

  var form = document.getElementById("export-form");
  if (!form) return;
  var url = form.getAttribute("data-preview-url");
  var error = document.getElementById("export-error");
  var button = document.getElementById("export-button");
  var busy = false;

  function fail(message) {
    error.textContent = message;
    error.hidden = false;
  }

  function firstMessage(body) {
    var err = body && body.error;
    if (!err) return "";
    var fields = err.fields || {};
    var names = Object.keys(fields);
    if (names.length && fields[names[0]] && fields[names[0]].length) return String(fields[names[0]][0]);
    return String(err.message || "");
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    if (busy) return;
    var chosen = form.querySelector('input[name="mode"]:checked');
    busy = true;
    button.disabled = true;
    error.hidden = true;
    fetch(chosen ? url + "?mode=" + encodeURIComponent(chosen.value) : url,
          { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        return response.json().then(function (body) { return { ok: response.ok, body: body }; });
      })
      .then(function (result) {
        busy = false;
        button.disabled = false;
        if (!result.ok) {
          fail(firstMessage(result.body) || "The export cannot be made.");
          return;
        }
        if (window.confirm(result.body.confirm)) {
          form.querySelector('input[name="confirmed"]').value = "1";
          form.submit();
        }
      })
      .catch(function () {
        busy = false;
        button.disabled = false;
        fail("Could not ask the server what the export holds; try again.");
      });
  });
})();
