// Behaviour every page shares: relative times that stay current, confirmation before
// destructive forms, selects that submit on change (the project switcher), and the CSRF
// token for the pages' scripts that post (window.Trainyard.csrfToken), the JSON a page
// hands its script in a <script type="application/json"> (Trainyard.pageData), and fields
// shown only for one choice of a select (data-shown-for). Loaded first.
(function () {
  "use strict";

  function csrfToken() {
    var field = document.querySelector("input[name=csrfmiddlewaretoken]");  // the sign-out form has one
    if (field) return field.value;
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  var Trainyard = window.Trainyard = window.Trainyard || {};
  Trainyard.csrfToken = csrfToken;
  // The page's JSON in the element with this id, or null on a page without it.
  Trainyard.pageData = function (id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  };

  function phrase(date, now) {
    var seconds = (now - date) / 1000;
    var future = seconds < 0;
    seconds = Math.abs(seconds);
    var amount;
    if (seconds < 5) return "just now";
    if (seconds < 60) amount = Math.floor(seconds) + " s";
    else if (seconds < 3600) amount = Math.floor(seconds / 60) + " min";
    else if (seconds < 86400) amount = Math.floor(seconds / 3600) + " h";
    else if (seconds < 30 * 86400) {
      var days = Math.floor(seconds / 86400);
      amount = days + (days === 1 ? " day" : " days");
    } else {
      return null; // past a month the server's date is right as it is
    }
    return future ? "in " + amount : amount + " ago";
  }

  function refreshTimes(root) {
    var now = Date.now();
    (root || document).querySelectorAll("time.reltime[datetime]").forEach(function (el) {
      var date = Date.parse(el.getAttribute("datetime"));
      if (isNaN(date)) return;
      var text = phrase(date, now);
      if (text && el.textContent !== text) el.textContent = text;
    });
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  // Confirm dialogs (templates/includes/delete_button.html): a button opens its <dialog>;
  // a [data-dialog-close] inside one closes it.
  document.addEventListener("click", function (event) {
    var opener = event.target.closest && event.target.closest("[data-dialog-open]");
    if (opener) {
      var dialog = document.getElementById(opener.getAttribute("data-dialog-open"));
      if (dialog && !dialog.open) dialog.showModal();
      return;
    }
    var closer = event.target.closest && event.target.closest("[data-dialog-close]");
    if (closer && closer.closest("dialog")) closer.closest("dialog").close();
  });

  // <div data-shown-for="SELECT_ID=VALUE[,VALUE]"> is shown only while that select has one of
  // those values (the channel form's URL for a webhook, its addresses for e-mail). Hidden
  // fields keep what was typed; the server ignores the other kind's field.
  function applyShownFor(root) {
    (root || document).querySelectorAll("[data-shown-for]").forEach(function (el) {
      var rule = el.getAttribute("data-shown-for").split("=");
      var select = document.getElementById(rule[0]);
      if (!select) return;
      var shown = (rule[1] || "").split(",").indexOf(select.value) !== -1;
      el.hidden = !shown;
    });
  }

  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el.matches && el.matches("select[data-autosubmit], input[type=checkbox][data-autosubmit]") && el.form) el.form.submit();
    if (el.id && document.querySelector('[data-shown-for^="' + el.id + '="]')) applyShownFor();
  });

  document.addEventListener("DOMContentLoaded", function () {
    refreshTimes();
    applyShownFor();
    window.setInterval(refreshTimes, 5000);  // the phrases count seconds
  });
  // Fragments swapped in by htmx (the validation status) carry their own times.
  document.addEventListener("htmx:afterSwap", function (event) { refreshTimes(event.target); });
})();
