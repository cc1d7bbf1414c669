// What the live pages (a job, a tuning job, the compare page) share, as
// window.Trainyard.live: reading JSON, re-reading the page to swap its server-rendered
// [data-live-region] parts, the chart cards that hold one plotly chart each, labels made safe
// for plotly, and the Stop button with its error line. Loaded before the page's own script.
(function () {
  "use strict";

  var Trainyard = window.Trainyard = window.Trainyard || {};

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (response) {
      if (!response.ok) throw new Error(url + " answered " + response.status);
      return response.json();
    });
  }

  // plotly reads a few HTML tags in labels; metric, job and parameter names are user data.
  function escapeLabel(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  // A function that re-reads pageUrl and swaps each [data-live-region] for the fresh one of
  // the same id (the server renders them the one way it always does), then calls after();
  // inside a region, an element marked [data-live-keep] with an id is kept as it is.
  // A refresh asked for while a read is in flight gets a read of its own once that one is
  // done: the read in flight may predate what asked (Starting → Training within one read).
  function regionRefresher(pageUrl, after) {
    var refreshing = null;
    var refreshAgain = false;
    function refresh() {
      if (refreshing) {
        refreshAgain = true;
        return refreshing;
      }
      refreshing = fetch(pageUrl, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) { return response.text(); })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html");
          var active = document.activeElement;
          document.querySelectorAll("[data-live-region]").forEach(function (region) {
            var replacement = fresh.getElementById(region.id);
            if (!replacement) return;
            // A [data-live-keep] element (a form being filled in) stays as the user left it:
            // open, typed into, focused — the fresh copy of it is dropped.
            region.querySelectorAll("[data-live-keep][id]").forEach(function (kept) {
              var stale = replacement.querySelector("#" + CSS.escape(kept.id));
              if (stale) stale.replaceWith(kept);
            });
            region.replaceWith(document.adoptNode(replacement));
          });
          // A kept field that had the focus gets it back (moving it took it away).
          if (active && active !== document.activeElement && document.contains(active)) active.focus();
          if (after) after();
        })
        .catch(function () { /* the next change tries again */ })
        .then(function () {
          refreshing = null;
          if (refreshAgain) {
            refreshAgain = false;
            return refresh();
          }
        });
      return refreshing;
    }
    return refresh;
  }

  // A <figure class="chart-card"> titled with the metric's name, around the chart's div
  // (div.chart[data-metric]); the caller puts the figure where it belongs.
  function chartCard(name) {
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
    return { figure: figure, div: div };
  }

  // The layout every chart starts from; extra's keys replace the defaults'.
  function chartLayout(defaults, extra) {
    var layout = {
      font: { family: getComputedStyle(document.documentElement).getPropertyValue("--font").trim() || "system-ui, sans-serif",
              size: 12, color: "#4a5565" },
      xaxis: { gridcolor: "#eef0f3", zeroline: false }, yaxis: { gridcolor: "#eef0f3", zeroline: false, automargin: true },
      showlegend: false, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    };
    [defaults, extra].forEach(function (more) {
      Object.keys(more || {}).forEach(function (key) { layout[key] = more[key]; });
    });
    return layout;
  }

  var CHART_CONFIG = { displayModeBar: false, responsive: true };

  // The page's action error, just above the element with id beforeId.
  function showActionError(text, beforeId) {
    var box = document.getElementById("action-error");
    if (!box) {
      box = document.createElement("div");
      box.id = "action-error";
      box.className = "message message--error";
      box.setAttribute("role", "alert");
      var anchor = document.getElementById(beforeId);
      anchor.parentNode.insertBefore(box, anchor);
    }
    box.textContent = text;
  }

  // The Stop button (selector; it carries data-confirm-text and data-stop-url), which the
  // live regions may replace at any time, so the click is heard on the document. After
  // the API has answered, done() runs (the regions are re-read there); a broken
  // connection shows brokeText and gives the button back.
  function stopButton(selector, errorBeforeId, brokeText, done) {
    document.addEventListener("click", function (event) {
      var button = event.target.closest && event.target.closest(selector);
      if (!button) return;
      if (!window.confirm(button.getAttribute("data-confirm-text"))) return;
      button.disabled = true;
      button.textContent = "Stopping…";
      fetch(button.getAttribute("data-stop-url"), {
        method: "POST", credentials: "same-origin",
        headers: { "X-CSRFToken": Trainyard.csrfToken(), Accept: "application/json" },
      }).then(function (response) {
        return response.json().catch(function () { return {}; }).then(function (body) {
          if (!response.ok) {
            showActionError((body.error && body.error.message) || "The stop request failed (" + response.status + ").", errorBeforeId);
          }
          return done();
        });
      }, function () {
        showActionError(brokeText, errorBeforeId);
        button.disabled = false;
        button.textContent = "Stop";
      });
    });
  }

  // Runs start once the page's deferred scripts have run and the document is parsed.
  function whenReady(start) {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
    else start();
  }

  Trainyard.live = {
    getJSON: getJSON, escapeLabel: escapeLabel, regionRefresher: regionRefresher,
    chartCard: chartCard, chartLayout: chartLayout, CHART_CONFIG: CHART_CONFIG, showActionError: showActionError,
    stopButton: stopButton, whenReady: whenReady,
  };
})();
