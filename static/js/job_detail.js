// The job page, live: one plotly chart per metric series that grows as points arrive, a
// system chart, a log tail, and the status regions — all fed by the metrics/logs API for
// history and one EventSource on /api/v1/jobs/<id>/stream for what happens next.
// Log lines and every other user text go in with textContent, never as HTML.
(function () {
  "use strict";

  var live = window.Trainyard.pageData("job-live");
  if (!live) return;
  var shared = window.Trainyard.live, getJSON = shared.getJSON, escapeLabel = shared.escapeLabel;
  var MAX_LOG_LINES = 2000;
  var MAX_TRACE_POINTS = 20000;  // extendTraces drops the oldest beyond this: the page stays light
  var HISTORY_POINTS = 1000;
  var PALETTE = ["#2f4fc7", "#0b7d8c", "#6741c9", "#c2570c", "#23804a", "#bd2b2b", "#56606d", "#9a5a06"];
  var FINISHED = ["Completed", "Stopped", "Failed"];

  var charts = {};        // metric name → {div, traces: {rank: index}, last: {rank: step}}
  var queued = {};        // metric name → {rank: {x: [], y: []}}, drawn on the next tick
  var historyLoaded = false;
  var early = [];         // metric events that arrived before the history: applied after it
  var stream = null;

  function baseLayout(extra) {
    return shared.chartLayout({
      margin: { l: 52, r: 16, t: 8, b: 36 }, height: 220,
      xaxis: { title: { text: "step", standoff: 4 }, gridcolor: "#eef0f3", zeroline: false },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" }, hovermode: "x unified",
    }, extra);
  }

  // --- metric charts -------------------------------------------------------------------------
  function chartFor(name) {
    if (charts[name]) return charts[name];
    var box = document.getElementById("charts");
    var card = shared.chartCard(name);
    var figure = card.figure;
    var div = card.div;
    // Keep the cards in the order people read them: losses first, then accuracies.
    var names = Object.keys(charts).concat([name]).sort(metricOrder);
    var after = names[names.indexOf(name) + 1];
    box.insertBefore(figure, after && charts[after] ? charts[after].div.parentNode : null);
    document.getElementById("charts-empty").hidden = true;
    window.Plotly.newPlot(div, [], baseLayout(), shared.CHART_CONFIG);
    charts[name] = { div: div, traces: {}, last: {} };
    applyMarks(name);
    return charts[name];
  }

  // --- where a rule went into ALARM, marked on the charts (the Rules panel's #rule-marks) ------
  function ruleMarks() {
    var node = document.getElementById("rule-marks");
    try { return node ? JSON.parse(node.textContent) || [] : []; } catch (e) { return []; }
  }

  function applyMarks(name) {
    var chart = charts[name];
    if (!chart) return;
    var marks = ruleMarks().filter(function (m) {
      return m.to === "ALARM" && m.step !== null && (!m.metric || m.metric === name);
    });
    if (!marks.length && !chart.marked) return;
    chart.marked = marks.length > 0;
    // One label per rule, on its newest mark, the labels stepped down so that neighbours
    // do not overlap; the older marks are lines whose reason shows on hover.
    var labelled = marks.filter(function (m) { return m.newest !== false; });
    window.Plotly.relayout(chart.div, {
      shapes: marks.map(function (m) {
        return { type: "line", xref: "x", yref: "paper", x0: m.step, x1: m.step, y0: 0, y1: 1,
                 line: { color: "#bd2b2b", width: 1, dash: "dot" } };
      }),
      annotations: labelled.map(function (m, i) {
        // Inside the plot, beside its line: the chart's top margin is too thin to hold a label.
        return { x: m.step, xref: "x", y: 1 - (i % 5) * 0.09, yref: "paper", yanchor: "top", xanchor: "left", xshift: 3, showarrow: false,
                 text: escapeLabel(m.rule), hovertext: escapeLabel(m.reason), bgcolor: "rgba(255,255,255,0.8)",
                 font: { size: 10, color: "#bd2b2b" } };
      }),
    });
  }

  function metricOrder(a, b) {
    function rank(n) { n = n.toLowerCase(); return n.indexOf("loss") !== -1 ? 0 : n.indexOf("acc") !== -1 ? 1 : 2; }
    return rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0);
  }

  function traceFor(chart, rank) {
    if (rank in chart.traces) return chart.traces[rank];
    var index = Object.keys(chart.traces).length;
    window.Plotly.addTraces(chart.div, {
      type: "scattergl", mode: "lines+markers", x: [], y: [], name: "rank " + rank,
      line: { color: PALETTE[index % PALETTE.length], width: 1.6 }, marker: { size: 5 },
      hovertemplate: "%{y:.4g}<extra>rank " + rank + "</extra>",
    });
    chart.traces[rank] = index;
    if (index === 1) window.Plotly.relayout(chart.div, { showlegend: true, "margin.t": 28 });
    return index;
  }

  // Points are queued and drawn together a few times a second: one redraw per tick, not one
  // per point. A point at or before the last drawn step of its trace is a repeat (history and
  // stream overlap on reconnects) and is dropped.
  function queuePoint(name, rank, step, value) {
    var chart = chartFor(name);
    var last = chart.last[rank];
    if (last !== undefined && step <= last) return;
    chart.last[rank] = step;
    var byRank = queued[name] || (queued[name] = {});
    var batch = byRank[rank] || (byRank[rank] = { x: [], y: [] });
    batch.x.push(step);
    batch.y.push(value);
    if (historyLoaded) scheduleDraw();
  }

  // Redraws are throttled to the frame: at most one per MIN_DRAW_MS for everything queued
  // since (metric points and system samples together), in an animation frame, so a busy
  // stream costs a few redraws a second and a background tab none (frames pause there).
  var MIN_DRAW_MS = 250;
  var drawPending = false;
  var lastDraw = 0;

  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    var wait = Math.max(0, lastDraw + MIN_DRAW_MS - Date.now());
    window.setTimeout(function () {
      window.requestAnimationFrame(function () {
        drawPending = false;
        lastDraw = Date.now();
        if (historyLoaded) drawQueued();
        drawQueuedSamples();
      });
    }, wait);
  }

  function drawQueued() {
    Object.keys(queued).forEach(function (name) {
      var chart = charts[name];
      var byRank = queued[name];
      var ranks = Object.keys(byRank);
      var indices = ranks.map(function (rank) { return traceFor(chart, rank); });
      window.Plotly.extendTraces(chart.div, {
        x: ranks.map(function (rank) { return byRank[rank].x; }),
        y: ranks.map(function (rank) { return byRank[rank].y; }),
      }, indices, MAX_TRACE_POINTS);
      // Markers show a series' first few points (one point draws no line); then just the line.
      var dense = indices.filter(function (i) { return chart.div.data[i].mode !== "lines" && chart.div.data[i].x.length > 24; });
      if (dense.length) window.Plotly.restyle(chart.div, { mode: "lines" }, dense);
    });
    queued = {};
  }

  function seriesList(payload) {
    // [{name, rank, ...}] under "series" or "results", or a bare list; a series may list "ranks".
    var items = Array.isArray(payload) ? payload : payload.series || payload.results || [];
    var out = [];
    items.forEach(function (item) {
      var ranks = item.ranks || [item.rank === undefined || item.rank === null ? 0 : item.rank];
      ranks.forEach(function (rank) { out.push({ name: item.name, rank: rank }); });
    });
    return out;
  }

  function loadHistory() {
    return getJSON(live.urls.metrics).then(function (payload) {
      return Promise.all(seriesList(payload).map(function (series) {
        var url = live.urls.metrics + "?name=" + encodeURIComponent(series.name) + "&rank=" + series.rank + "&points=" + HISTORY_POINTS;
        return getJSON(url).then(function (body) {
          (body.points || []).forEach(function (point) { queuePoint(series.name, series.rank, point[0], point[1]); });
        });
      }));
    }).catch(function () { /* the stream still draws new points */ }).then(function () {
      historyLoaded = true;
      early.forEach(applyMetricEvent);
      early = [];
      drawQueued();
    });
  }

  function applyMetricEvent(payload) {
    var rank = payload.rank || 0;
    var latest = {};
    (payload.points || []).forEach(function (p) {
      queuePoint(p[0], rank, p[1], p[2]);
      latest[p[0]] = p[2];
    });
    if (rank === 0) Object.keys(latest).forEach(function (name) { showLatest(name, latest[name]); });
  }

  // The side panel's latest values follow rank 0 (as the stored final metrics do).
  function showLatest(name, value) {
    var cell = Array.prototype.filter.call(document.querySelectorAll("dd[data-latest]"), function (dd) {
      return dd.getAttribute("data-latest") === name;
    })[0];
    if (!cell || typeof value !== "number") return;
    cell.textContent = Math.abs(value) >= 1e-3 || value === 0 ? String(Number(value.toPrecision(4))) : value.toExponential(3);
    cell.title = String(value);  // the exact value on hover, as |sig renders it
  }

  // --- system chart ----------------------------------------------------------------------------
  var system = { div: document.getElementById("system-chart"), traces: {}, last: {}, drawn: false };

  function sampleTime(value) {
    return new Date(typeof value === "number" ? value * 1000 : value);
  }

  function systemTraces(node) {
    if (system.traces[node]) return system.traces[node];
    var base = Object.keys(system.traces).length * 2;
    var label = Object.keys(system.traces).length || node !== "" ? " · " + escapeLabel(node) : "";
    window.Plotly.addTraces(system.div, [
      { type: "scatter", mode: "lines", x: [], y: [], name: "CPU %" + label, line: { color: PALETTE[(base / 2) % 4], width: 1.6 },
        hovertemplate: "%{y:.0f}%<extra>CPU" + label + "</extra>" },
      { type: "scatter", mode: "lines", x: [], y: [], name: "memory GiB" + label, yaxis: "y2",
        line: { color: PALETTE[(base / 2) % 4 + 4], width: 1.4, dash: "dot" }, hovertemplate: "%{y:.2f} GiB<extra>memory" + label + "</extra>" },
    ]);
    system.traces[node] = [base, base + 1];
    return system.traces[node];
  }

  // Samples are queued like metric points and drawn in the same throttled frame.
  var queuedSamples = {};  // node → {x: [], cpu: [], mem: []}
  var SHORTEST_SPAN_MS = 60000;

  function addSample(sample) {
    if (!system.div || !window.Plotly) return;
    var node = sample.node || "";
    var when = sampleTime(sample.time);
    if (system.last[node] !== undefined && when <= system.last[node]) return;  // already drawn
    system.last[node] = when;
    var batch = queuedSamples[node] || (queuedSamples[node] = { x: [], cpu: [], mem: [] });
    batch.x.push(when);
    batch.cpu.push(sample.cpu);
    batch.mem.push(sample.mem === null || sample.mem === undefined ? null : sample.mem / 1073741824);
    scheduleDraw();
  }

  function drawQueuedSamples() {
    var nodes = Object.keys(queuedSamples);
    if (!nodes.length || !system.div) return;
    if (!system.drawn) {
      window.Plotly.newPlot(system.div, [], baseLayout({
        xaxis: { type: "date", gridcolor: "#eef0f3", tickformatstops: [{ dtickrange: [null, 1000], value: "%H:%M:%S" }] }, yaxis: { title: { text: "CPU %" }, rangemode: "tozero", gridcolor: "#eef0f3" },
        yaxis2: { title: { text: "memory GiB" }, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false,
                  tickformat: ".1f" },
        showlegend: true, legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
        margin: { l: 52, r: 60, t: 28, b: 30 }, hovermode: "x unified",
      }), shared.CHART_CONFIG);
      system.drawn = true;
      document.getElementById("system-empty").hidden = true;
    }
    var x = [], y = [], indices = [];
    nodes.forEach(function (node) {
      var batch = queuedSamples[node];
      var pair = systemTraces(node);
      indices.push(pair[0], pair[1]);
      x.push(batch.x, batch.x);
      y.push(batch.cpu, batch.mem);
      batch.x.forEach(function (when) {
        if (!system.first || when < system.first) system.first = when;
        if (!system.newest || when > system.newest) system.newest = when;
      });
    });
    queuedSamples = {};
    window.Plotly.extendTraces(system.div, { x: x, y: y }, indices, 5000);
    // One sample (or a few seconds of them) autoranges to milliseconds: show at least a
    // minute around them until the samples span one.
    var span = system.newest - system.first;
    if (span < SHORTEST_SPAN_MS) {
      var pad = (SHORTEST_SPAN_MS - span) / 2;
      window.Plotly.relayout(system.div, { "xaxis.range": [new Date(system.first.getTime() - pad), new Date(system.newest.getTime() + pad)] });
      system.padded = true;
    } else if (system.padded) {
      window.Plotly.relayout(system.div, { "xaxis.autorange": true });
      system.padded = false;
    }
  }

  // --- logs -------------------------------------------------------------------------------------
  var log = document.getElementById("log");
  var logStatus = document.getElementById("log-status");
  var rankSelect = document.getElementById("log-rank");
  var download = document.getElementById("log-download");

  function showsRank(rank) {
    return !rankSelect || rankSelect.value === "" || String(rank) === rankSelect.value;
  }

  function appendLines(lines) {
    if (!lines.length) return;
    var stick = log.scrollHeight - log.scrollTop - log.clientHeight < 24;
    var fragment = document.createDocumentFragment();
    lines.forEach(function (entry) {
      var row = document.createElement("div");
      row.className = "log-line" + (entry.stream === "err" ? " log-line--err" : "");
      row.setAttribute("data-rank", String(entry.rank));
      if (rankSelect) {  // several ranks: say whose line it is
        var rank = document.createElement("span");
        rank.className = "log-rank";
        rank.textContent = "[" + entry.rank + "] ";
        row.appendChild(rank);
      }
      row.appendChild(document.createTextNode(entry.text));
      fragment.appendChild(row);
    });
    log.appendChild(fragment);
    while (log.childElementCount > MAX_LOG_LINES) log.removeChild(log.firstElementChild);
    logStatus.hidden = true;
    if (stick) log.scrollTop = log.scrollHeight;
  }

  // History first, then live lines: lines that arrive while the history loads wait, and a
  // line the history already holds (same rank, time and text) is not shown twice.
  var logsLoaded = false;
  var earlyLines = [];
  var seenLines = {};

  function lineKey(line) { return line.rank + "|" + line.time + "|" + line.text; }

  // Where the live log lines the page has taken end (a Redis stream id): the history is
  // read up to it, so the two meet without a gap or a repeat (the stored file lags the
  // stream by a few seconds). Null once the job has ended, or when Redis could not be asked.
  var logPosition = live.stream_after ? live.stream_after.split(",")[2] || null : null;

  function logQuery() {
    // A running job: the live stream's recent lines up to logPosition. Ended: one rank's file
    // in the object store (complete); all ranks — and a one-rank job, whose page shows the
    // launcher's lines beside rank 0's as they come — the live stream's recent lines.
    var rank = rankSelect ? rankSelect.value : "";
    var query = "?tail=" + MAX_LOG_LINES + "&rank=" + (rank === "" ? "all" : rank);
    return logPosition && !live.finished ? query + "&until=" + encodeURIComponent(logPosition) : query;
  }

  function loadLogs() {
    logsLoaded = false;
    return getJSON(live.urls.logs + logQuery()).then(function (body) {
      if (!(body.lines || []).length && (!rankSelect || rankSelect.value === "")) {
        return getJSON(live.urls.logs + "?tail=" + MAX_LOG_LINES + "&rank=0");  // the stream expired: rank 0's file
      }
      return body;
    }).then(function (body) {
      var lines = body.lines || [];
      seenLines = {};
      lines.forEach(function (line) { if (line.time !== undefined) seenLines[lineKey(line)] = true; });
      log.textContent = "";
      appendLines(lines);
      if (!lines.length) { logStatus.hidden = false; logStatus.textContent = live.finished ? "This job wrote no output." : "No output yet."; }
    }).catch(function () {
      logStatus.hidden = false;
      logStatus.textContent = "The log history could not be loaded; new lines still appear here.";
    }).then(function () {
      logsLoaded = true;
      appendLines(earlyLines.filter(function (line) { return showsRank(line.rank) && !seenLines[lineKey(line)]; }));
      earlyLines = [];
    });
  }

  function onLogEvent(payload, eventId) {
    var position = (eventId || "").split(",")[2];
    if (position) logPosition = position;
    var line = { rank: payload.rank, time: payload.time, text: payload.line, stream: payload.stream };
    if (!logsLoaded) { earlyLines.push(line); return; }
    if (showsRank(line.rank) && !seenLines[lineKey(line)]) appendLines([line]);
  }

  if (rankSelect) {
    rankSelect.addEventListener("change", function () {
      var base = download.getAttribute("href").split("?")[0];
      download.setAttribute("href", rankSelect.value === "" ? base : base + "?rank=" + rankSelect.value);
      loadLogs().then(function () { log.scrollTop = log.scrollHeight; });
    });
  }

  // --- cost, counted on --------------------------------------------------------------------------
  // The regions are re-read only when the status changes, so while a job trained its cost
  // stood still. A running attempt's panel carries how its figures grow per second
  // (jobs.templatetags.job_cost): they are counted on here each second from when this copy of
  // the panel arrived (the browser's clock measures, so no skew with the server's), with no
  // request; a status change brings a fresh panel and the count starts again from its figures.
  function durationWords(seconds) {  // as jobs.cost.duration_words
    seconds = Math.max(0, seconds);
    if (seconds < 60) return seconds.toFixed(1) + " s";
    var whole = Math.round(seconds), hours = Math.floor(whole / 3600), minutes = Math.floor((whole % 3600) / 60);
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    return hours ? hours + " h " + pad(minutes) + " min" : minutes + " min " + pad(whole % 60) + " s";
  }

  function countCost() {
    var panel = document.querySelector("#cost-panel[data-accrual]");
    if (!panel || live.finished) return;
    if (!panel.countedFrom) panel.countedFrom = Date.now();
    var elapsed = (Date.now() - panel.countedFrom) / 1000;
    var perSecond = { cost: Number(panel.getAttribute("data-cost-per-second")) || 0,
                      billable: Number(panel.getAttribute("data-billable-nodes")) || 0,
                      training: Number(panel.getAttribute("data-training-nodes")) || 0 };
    panel.querySelectorAll("[data-grows]").forEach(function (figure) {
      var kind = figure.getAttribute("data-grows");
      var value = Number(figure.getAttribute("data-value")) + perSecond[kind] * elapsed;
      if (isNaN(value)) return;
      // The figure leads the element's first text ("3.50 USD", then "so far" in a span of its own).
      var text = figure.firstChild;
      if (!text || text.nodeType !== Node.TEXT_NODE) return;
      text.nodeValue = kind === "cost" ? text.nodeValue.replace(/^[0-9.]+/, value.toFixed(2)) : durationWords(value);
    });
  }
  countCost();
  window.setInterval(countCost, 1000);

  // --- status, stop -----------------------------------------------------------------------------
  // Re-read the page and swap the regions that depend on the status (header, status area,
  // side panels) on each status change.
  var refreshRegions = shared.regionRefresher(live.urls.page, function () { Object.keys(charts).forEach(applyMarks); countCost(); });

  function onStatus(payload) {
    // A rule's alarm (or its clearing) is a timeline note: the Rules panel and the chart marks change.
    if (payload.message && payload.message.indexOf("rule ") === 0) refreshRegions();
    // Every (re)connection starts with the current status: only a change needs a refresh.
    if (payload.status === live.status && !payload.final) return;
    live.status = payload.status;
    var badge = document.querySelector("#job-status .badge");
    if (badge) badge.textContent = payload.status;  // at once; the refresh brings the colour and the rest
    refreshRegions();
    if (FINISHED.indexOf(payload.status) !== -1) {
      live.finished = true;
      if (stream) stream.close();
      document.getElementById("metrics-note").textContent = "";
      // "No metrics yet — a chart appears…" no longer holds once the job has ended.
      var emptyTitle = document.getElementById("charts-empty-title");
      var emptyText = document.getElementById("charts-empty-text");
      if (emptyTitle) emptyTitle.textContent = "No metrics";
      if (emptyText) {
        emptyText.textContent = payload.status === "Failed"
          ? "This job failed before it reported a metric; its log below says why."
          : "This job reported no metrics.";
      }
      // The rule watcher's last transitions (a rule clearing, "never got data") and the
      // partition's measured times (or FSDP's report) are stored just after the final
      // status: look again a little later, twice.
      window.setTimeout(refreshRegions, 2500);
      window.setTimeout(refreshRegions, 7000);
    }
  }

  shared.stopButton("#stop-job", "job-state", "The connection broke off; the job was not asked to stop. Try again.", function () {
    return refreshRegions();
  });

  // --- the stream -----------------------------------------------------------------------------------
  function listen() {
    if (live.finished || !window.EventSource) return;
    // EventSource reconnects by itself and sends Last-Event-ID, so a dropped connection
    // resumes where it left off.
    // stream_after: where the page's data ends (metric points a few seconds earlier, so
    // none fall between the history and the stream).
    stream = new EventSource(live.urls.stream + (live.stream_after ? "?last_event_id=" + encodeURIComponent(live.stream_after) : ""));
    stream.addEventListener("metric", function (event) {
      var payload = JSON.parse(event.data);
      if (historyLoaded) applyMetricEvent(payload); else early.push(payload);
    });
    stream.addEventListener("log", function (event) { onLogEvent(JSON.parse(event.data), event.lastEventId); });
    stream.addEventListener("system", function (event) { addSample(JSON.parse(event.data)); });
    stream.addEventListener("status", function (event) { onStatus(JSON.parse(event.data)); });
    // EventSource gives up for good on an HTTP error (a proxy refusing streams, say): fall
    // back to asking for the status every few seconds, so the page never stays stale.
    stream.addEventListener("error", function () {
      if (stream.readyState === EventSource.CLOSED && !live.finished) pollStatus();
    });
  }

  function pollStatus() {
    var timer = window.setInterval(function () {
      getJSON(live.urls.job).then(function (job) {
        if (job.status !== live.status) onStatus({ status: job.status });
        if (live.finished) window.clearInterval(timer);
      }).catch(function () { /* try again on the next tick */ });
    }, 5000);
  }

  function start() {
    if (!window.Plotly) return;
    if (live.finished && !(live.system || []).length) {  // none will come: no empty chart area
      system.div.hidden = true;
      document.getElementById("system-empty").textContent = "No system samples: no node reported any while this job ran.";
    }
    (live.system || []).forEach(addSample);
    listen();
    loadHistory();
    loadLogs();
  }

  shared.whenReady(start);
})();
