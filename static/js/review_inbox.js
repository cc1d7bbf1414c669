// The reviewer inbox: Start claims the next item through the reviewer API; the work view
// shows it (text, a table row, an image, or formatted JSON), its instructions and the
// model's guess and its place ("Item n of N"); N starts, keys 1–9 pick a label, Enter
// submits, S skips (releases), and the next item is claimed without a page load. A timer shows the lease; when it runs out the item
// is gone (its slot went back to the queue).
//
// Safety: the instructions are HTML that the server rendered from Markdown and sanitised
// (nh3 allow-list), so they alone go in through innerHTML. Everything else a client or a
// reviewer wrote — content, labels, loop names, titles, error messages — goes in as text.
(function () {
  "use strict";

  var source = document.getElementById("inbox-config");
  if (!source) return;
  var config = JSON.parse(source.textContent);
  var IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
  var AMBER_SECONDS = 60;

  var el = function (id) { return document.getElementById(id); };
  var work = el("work"), done = el("done"), list = el("inbox-flows");
  var labelsBox = el("work-labels"), textField = el("work-text-field"), textArea = el("work-text");
  var submitButton = el("work-submit"), skipButton = el("work-skip"), nextButton = el("work-next");
  var errorBox = el("work-error"), statusBox = el("inbox-status");

  var current = null;  // the claim payload being worked on
  var chosen = null;  // index of the picked label
  var flowFilter = null;  // the flow Start was pressed for (null: any of mine)
  var deadline = 0;  // local clock ms when the lease runs out
  var ticker = null;
  var busy = false;
  var expired = false;
  var handled = 0;  // items answered or skipped since Start was pressed: the position is handled + 1
  var countsAsked = 0;  // the latest counts request; an older answer arriving late is dropped

  var csrfToken = window.Trainyard.csrfToken;

  function post(url, body) {
    return fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: { "X-CSRFToken": csrfToken(), Accept: "application/json", "Content-Type": "application/json" },
      body: JSON.stringify(body || {}),
    }).then(function (response) {
      if (response.status === 204) return { status: 204, body: null };
      return response.json().catch(function () { return {}; }).then(function (data) {
        return { status: response.status, body: data };
      });
    });
  }

  function urlFor(template, id) {
    return template.replace(/\/0\/([a-z]+\/)$/, "/" + id + "/$1");
  }

  function announce(text) {
    statusBox.textContent = "";
    window.setTimeout(function () { statusBox.textContent = text; }, 30);
  }

  function showError(text) {
    errorBox.textContent = text;
    errorBox.hidden = !text;
  }

  function errorMessage(result, fallback) {
    var error = result.body && result.body.error;
    return (error && error.message) || fallback;
  }

  // --- states ---------------------------------------------------------------------------------
  function showList() {
    stopTimer();
    current = null;
    work.hidden = true;
    done.hidden = true;
    list.hidden = false;
    refreshCounts();
  }

  function showDone() {
    stopTimer();
    current = null;
    work.hidden = true;
    list.hidden = true;
    done.hidden = false;
    el("done-text").textContent = flowFilter && config.flows[flowFilter]
      ? "Nothing in “" + config.flows[flowFilter] + "” is waiting for you right now. New items arrive when a model is unsure of a prediction; come back later, or check again."
      : "Nothing is waiting for you right now. New items arrive when a model is unsure of a prediction; come back later, or check again.";
    done.focus();
    announce("All done: nothing is waiting for you.");
    refreshCounts();
  }

  function setWorking(enabled) {
    submitButton.disabled = !enabled;
    skipButton.disabled = !enabled;
    textArea.disabled = !enabled;
    labelsBox.querySelectorAll("button").forEach(function (button) { button.disabled = !enabled; });
  }

  function itemGone(message) {
    // The item is no longer ours: nothing more can be sent for it; offer the next one.
    stopTimer();
    expired = true;
    setWorking(false);
    showError(message);
    nextButton.hidden = false;
    nextButton.focus();
    announce(message);
  }

  // --- claiming --------------------------------------------------------------------------------
  // An item this reviewer still holds (say, from before a reload) comes first: otherwise it
  // would stay locked, unanswerable, until its lease ran out.
  function claim() {
    if (busy) return;
    busy = true;
    showError("");
    var url = config.urls.held + (flowFilter ? "?flow=" + encodeURIComponent(flowFilter) : "");
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (response) {
      if (response.status !== 200) return claimNew();
      return response.json().then(function (item) {
        busy = false;
        show(item);
        announce("Resumed the item you were holding.");
      });
    }).catch(claimNew);
  }

  function claimNew() {
    post(config.urls.claim, flowFilter ? { flow_definition: Number(flowFilter) } : {}).then(function (result) {
      busy = false;
      if (result.status === 204) return showDone();
      if (result.status !== 200) {
        list.hidden = false;
        work.hidden = true;
        return announceListError(errorMessage(result, "Could not get an item (" + result.status + ")."));
      }
      show(result.body);
    }, function () {
      busy = false;
      announceListError("The connection broke off before an item arrived. Try Start again.");
    });
  }

  function announceListError(text) {
    var box = el("inbox-error");
    if (!box) {
      box = document.createElement("div");
      box.id = "inbox-error";
      box.className = "message message--error";
      box.setAttribute("role", "alert");
      list.parentNode.insertBefore(box, list);
    }
    box.textContent = text;
  }

  // --- rendering an item -----------------------------------------------------------------------
  function cellText(value) {
    if (value === null || value === undefined) return "—";
    return typeof value === "object" ? JSON.stringify(value) : String(value);
  }

  function renderContent(content) {
    var box = el("work-content");
    box.textContent = "";
    if (content && typeof content.row === "object" && content.row !== null && !Array.isArray(content.row)) {
      var table = document.createElement("table");
      table.className = "table table--compact review-row";
      var body = document.createElement("tbody");
      Object.keys(content.row).forEach(function (key) {
        var tr = document.createElement("tr");
        var th = document.createElement("th");
        th.scope = "row";
        th.className = "mono";
        th.textContent = key;
        var td = document.createElement("td");
        td.className = "mono";
        td.textContent = cellText(content.row[key]);
        tr.appendChild(th);
        tr.appendChild(td);
        body.appendChild(tr);
      });
      table.appendChild(body);
      box.appendChild(table);
      return;
    }
    if (content && typeof content.text === "string") {
      var text = document.createElement("p");
      text.className = "review-text";
      text.textContent = content.text;
      box.appendChild(text);
      return;
    }
    var mediaType = content && String(content.media_type || "image/png").toLowerCase();
    if (content && typeof content.image === "string" && IMAGE_TYPES.indexOf(mediaType) !== -1) {
      var image = document.createElement("img");
      image.className = "review-image";
      image.alt = "The image to review";
      image.src = "data:" + mediaType + ";base64," + content.image.replace(/[^A-Za-z0-9+/=]/g, "");
      box.appendChild(image);
      return;
    }
    var pre = document.createElement("pre");
    pre.className = "review-json";
    pre.textContent = JSON.stringify(content, null, 2);
    box.appendChild(pre);
  }

  function renderLabels(labels) {
    labelsBox.textContent = "";
    labels.forEach(function (label, index) {
      var button = document.createElement("button");
      button.type = "button";
      button.className = "button review-label";
      button.setAttribute("aria-pressed", "false");
      button.setAttribute("data-index", String(index));
      if (index < 9) {
        var key = document.createElement("kbd");
        key.textContent = String(index + 1);
        button.appendChild(key);
        button.setAttribute("aria-keyshortcuts", String(index + 1));
      }
      var name = document.createElement("span");
      name.textContent = label;
      button.appendChild(name);
      labelsBox.appendChild(button);
    });
  }

  function show(item) {
    current = item;
    chosen = null;
    expired = false;
    showError("");
    nextButton.hidden = true;
    el("work-title").textContent = item.flow_definition.title || item.flow_definition.name;
    el("work-loop").textContent = item.human_loop;
    el("work-position").textContent = "Item " + (handled + 1).toLocaleString("en");
    refreshCounts();  // re-read after every answer and skip; it also sets "of N"
    var instructions = el("work-instructions");
    instructions.innerHTML = item.instructions || "";  // sanitised by the server (review.markdown)
    el("work-instructions-box").hidden = !item.instructions;
    renderContent(item.input_content);
    var prediction = el("work-prediction");
    if (item.prediction && item.prediction.label !== null && item.prediction.label !== undefined) {
      var confidence = typeof item.prediction.confidence === "number"
        ? " (confidence " + Math.round(item.prediction.confidence * 100) + " %)" : "";
      prediction.textContent = "The model says: " + item.prediction.label + confidence;
      prediction.hidden = false;
    } else {
      prediction.textContent = "";
      prediction.hidden = true;
    }
    var freeText = item.flow_definition.task_type === "free_text";
    textField.hidden = !freeText;
    labelsBox.hidden = freeText;
    textArea.value = "";
    renderLabels(freeText ? [] : item.labels || []);
    setWorking(true);
    list.hidden = true;
    done.hidden = true;
    work.hidden = false;
    startTimer(item);
    if (freeText) textArea.focus();
    else work.focus();
    announce("New item from " + el("work-title").textContent + ".");
  }

  // --- the lease timer --------------------------------------------------------------------------
  function startTimer(item) {
    stopTimer();
    // The server's own clock sets the length (lease − claimed_at); the local clock counts it
    // down, so a skewed client clock does not shorten or stretch the lease.
    var length = Date.parse(item.lease_expires_at) - Date.parse(item.claimed_at);
    if (isNaN(length)) length = (item.task_time_limit_seconds || 0) * 1000;
    deadline = Date.now() + length;
    tick();
    ticker = window.setInterval(tick, 250);
  }

  function stopTimer() {
    if (ticker) window.clearInterval(ticker);
    ticker = null;
  }

  function tick() {
    var left = Math.max(0, Math.ceil((deadline - Date.now()) / 1000));
    var minutes = Math.floor(left / 60), seconds = left % 60;
    el("lease-left").textContent = minutes + ":" + (seconds < 10 ? "0" : "") + seconds;
    var timer = el("lease-timer");
    timer.classList.toggle("is-ending", left <= AMBER_SECONDS && left > 0);
    timer.classList.toggle("is-over", left === 0);
    if (left === 0 && current && !expired) itemGone("This item's time ran out; it went back to the queue.");
  }

  // --- answering --------------------------------------------------------------------------------
  function pick(index) {
    if (!current || expired || busy) return;
    var buttons = labelsBox.querySelectorAll("button");
    if (index < 0 || index >= buttons.length) return;
    chosen = index;
    buttons.forEach(function (button, i) { button.setAttribute("aria-pressed", i === index ? "true" : "false"); });
    showError("");
    announce("Picked " + current.labels[index] + ". Enter submits.");
  }

  function answer() {
    if (!current || expired || busy) return;
    var body;
    if (current.flow_definition.task_type === "free_text") {
      if (!textArea.value.trim()) return showError("Write an answer first.");
      body = { answer: { text: textArea.value } };
    } else {
      if (chosen === null) {
        var count = Math.min(9, (current.labels || []).length);
        return showError("Pick a label first (keys 1–" + count + ").");
      }
      body = { answer: { label: current.labels[chosen] } };
    }
    send(urlFor(config.urls.answer, current.assignment), body, "Answer saved.");
  }

  function skip() {
    if (!current || expired || busy) return;
    send(urlFor(config.urls.release, current.assignment), {}, "Skipped; you will not get this item again.");
  }

  function send(url, body, doneText) {
    busy = true;
    setWorking(false);
    post(url, body).then(function (result) {
      busy = false;
      if (result.status === 200) {
        announce(doneText);
        stopTimer();
        current = null;
        handled += 1;
        return claim();
      }
      if (result.status === 409) {
        var message = errorMessage(result, "");
        return itemGone(/lease expired/i.test(message) || !message
          ? "This item's time ran out; it went back to the queue."
          : "This item can no longer be answered: " + message);
      }
      if (result.status === 404) return itemGone("This item is no longer yours.");
      setWorking(true);
      showError(errorMessage(result, "The answer was not saved (" + result.status + "). Try again."));
    }, function () {
      busy = false;
      setWorking(true);
      showError("The connection broke off; nothing was saved. Try again.");
    });
  }

  // --- counts ------------------------------------------------------------------------------------
  // Re-read from the server after every answer, skip and release (and on the list and done
  // views), never kept from the page load: the table, the heading's total and the work
  // view's "Item n of N" all come from the latest answer. N = the items done since Start +
  // the one on screen + those still waiting for this reviewer (in the flow Start was
  // pressed for, or in all of theirs).
  function plural(n, one, many) { return n === 1 ? one : many; }

  function refreshCounts() {
    var asked = ++countsAsked;
    return fetch(config.urls.counts, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) {
        if (!data || asked !== countsAsked) return;
        var waiting = 0, answered = 0, waitingHere = 0;
        data.flows.forEach(function (row) {
          waiting += Number(row.available) || 0;
          answered += Number(row.answered_today) || 0;
          if (!flowFilter || String(row.id) === String(flowFilter)) waitingHere += Number(row.available) || 0;
          var tr = document.querySelector('#inbox-table tr[data-flow="' + row.id + '"]');
          if (!tr) return;
          ["available", "held", "answered_today"].forEach(function (name) {
            var cell = tr.querySelector('[data-count="' + name + '"]');
            if (cell) cell.textContent = Number(row[name]).toLocaleString("en");
          });
        });
        var summary = el("inbox-summary");
        if (summary) {
          summary.textContent = ": " + waiting.toLocaleString("en") + plural(waiting, " item waits", " items wait") + " for you"
            + (answered ? ", and you answered " + answered.toLocaleString("en") + " today" : "");
        }
        if (current && !work.hidden) {
          var position = el("work-position");
          position.textContent = "Item " + (handled + 1).toLocaleString("en") + " of "
            + (handled + 1 + waitingHere).toLocaleString("en");
          position.title = handled.toLocaleString("en") + " done since Start, this one, and "
            + waitingHere.toLocaleString("en") + " more waiting for you";
        }
      })
      .catch(function () { /* the counts are a convenience; the next refresh tries again */ });
  }

  // --- events ------------------------------------------------------------------------------------
  document.addEventListener("click", function (event) {
    var target = event.target.closest ? event.target : null;
    if (!target) return;
    var start = target.closest("[data-start]");
    if (start) return startFrom(start);
    var label = target.closest(".review-label");
    if (label) return pick(Number(label.getAttribute("data-index")));
    if (target.closest("#work-submit")) return answer();
    if (target.closest("#work-skip")) return skip();
    if (target.closest("#work-next") || target.closest("#done-again")) return claim();
    if (target.closest("#work-close") || target.closest("#done-close")) {
      // An item still held goes back to the queue rather than waiting out its lease.
      if (current && !expired && !busy) {
        post(urlFor(config.urls.release, current.assignment), {}).then(showList, showList);
        current = null;
        return;
      }
      return showList();
    }
  });

  function startFrom(button) {
    if (busy) return;
    flowFilter = button.getAttribute("data-start") || null;
    handled = 0;
    var stale = el("inbox-error");
    if (stale) stale.remove();
    claim();
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    var target = event.target;
    if (work.hidden) {
      // N starts (the list's Start reviewing) or checks again (the done view).
      if (event.key !== "n" && event.key !== "N") return;
      if (target && (target.tagName === "INPUT" || target.tagName === "SELECT" || target.tagName === "TEXTAREA"
                     || target.isContentEditable)) return;
      event.preventDefault();
      if (!done.hidden) return claim();
      var startAll = el("start-all");
      if (!list.hidden && startAll) startFrom(startAll);
      return;
    }
    if (target === textArea) {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        answer();
      } else if (event.key === "Escape") {
        textArea.blur();
        work.focus();
      }
      return;
    }
    if (target && (target.tagName === "INPUT" || target.tagName === "SELECT" || target.tagName === "TEXTAREA")) return;
    // A focused action button keeps its own Enter (Skip, Next, Back); label buttons submit.
    var ownButton = target && target.tagName === "BUTTON" && !target.classList.contains("review-label");
    if (event.key >= "1" && event.key <= "9") {
      event.preventDefault();
      pick(Number(event.key) - 1);
    } else if (event.key === "Enter" && !ownButton) {
      event.preventDefault();
      if (expired) claim();
      else answer();
    } else if (event.key === "s" || event.key === "S") {
      event.preventDefault();
      skip();
    }
  });
})();
