// The endpoint page's try-it form: posts the textarea's JSON to the invocation API with
// the session and CSRF token, then shows each prediction with a confidence bar and the
// human loops it started. Everything shown is set as text, never as HTML.
(function () {
  "use strict";
  var form = document.getElementById("try-form");
  if (!form) return;
  var byId = function (id) { return document.getElementById(id); };
  var textarea = byId("try-instances"), errorBox = byId("try-error"), statusBox = byId("try-status");
  var result = byId("try-result"), tbody = document.querySelector("#predictions-table tbody"), loops = byId("try-loops");
  var button = byId("try-submit"), counter = byId("endpoint-invocations");

  var csrfToken = window.Trainyard.csrfToken;

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = false;
    textarea.setAttribute("aria-invalid", "true");
  }

  function clearError() {
    errorBox.hidden = true;
    errorBox.textContent = "";
    textarea.removeAttribute("aria-invalid");
  }

  // A new error must not sit above the previous request's predictions: they would read
  // as this request's answer.
  function clearResult() {
    result.hidden = true;
    tbody.textContent = "";
    loops.textContent = "";
  }

  // The served count, re-read after every request (the invocation API counts a request
  // once it is answered; the endpoint API writes this process's pending counts first).
  function refreshCounter() {
    if (!counter || !form.dataset.endpointUrl) return;
    fetch(form.dataset.endpointUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (body) {
        if (body && typeof body.invocations === "number") counter.textContent = String(body.invocations);
      })
      .catch(function () { /* the count stays as shown; the next request tries again */ });
  }

  function cell(row, text, className) {
    var td = row.insertCell();
    if (className) td.className = className;
    if (text !== undefined) td.textContent = text;
    return td;
  }

  function render(body) {
    tbody.textContent = "";
    (body.predictions || []).forEach(function (prediction, index) {
      var row = tbody.insertRow();
      cell(row, String(index), "num mono");
      if (prediction.text !== undefined) {  // a generative model
        var wide = cell(row, prediction.text, "mono");
        wide.colSpan = 3;
        return;
      }
      cell(row, prediction.label, "strong");
      var confidence = cell(row, undefined, "nowrap");
      var percent = Math.round(prediction.confidence * 1000) / 10;
      var bar = document.createElement("span");
      bar.className = "bar bar--progress";
      bar.setAttribute("aria-hidden", "true");
      var fill = document.createElement("span");
      fill.style.width = percent + "%";
      bar.appendChild(fill);
      var value = document.createElement("span");
      value.className = "mono confidence-value";
      value.textContent = percent.toFixed(1) + "% ";
      confidence.appendChild(value);
      confidence.appendChild(bar);
      var parts = Object.keys(prediction.probabilities || {}).map(function (label) {
        return label + " " + (prediction.probabilities[label] * 100).toFixed(1) + "%";
      });
      cell(row, parts.join(" · "), "small mono muted");
    });
    var names = body.human_loops || [];
    loops.textContent = names.length
      ? names.length + " human loop" + (names.length === 1 ? "" : "s") + " started: " + names.join(", ")
      : "No human loop started.";
    result.hidden = false;
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    clearError();
    var instances;
    try {
      instances = JSON.parse(textarea.value);
    } catch (error) {
      clearResult();
      statusBox.textContent = "";
      showError("The instances are not valid JSON: " + error.message);
      return;
    }
    button.disabled = true;
    statusBox.textContent = "Predicting…";
    fetch(form.dataset.url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify({ instances: instances }),
    })
      .then(function (response) {
        return response.json().catch(function () { return {}; }).then(function (body) {
          return { ok: response.ok, status: response.status, body: body };
        });
      })
      .then(function (answer) {
        if (!answer.ok) {
          var message = answer.body && answer.body.error ? answer.body.error.message : "HTTP " + answer.status;
          clearResult();
          showError(message);
          statusBox.textContent = "";
          return;
        }
        render(answer.body);
        statusBox.textContent = "Answered by version " + answer.body.model_version + ".";
      })
      .catch(function (error) {
        clearResult();
        showError("The request failed: " + error.message);
        statusBox.textContent = "";
      })
      .finally(function () {
        button.disabled = false;
        refreshCounter();
      });
  });
})();
