// Sortable, filterable tables without a framework.
//   <table data-sortable> with <th data-sort="text|number">: click a header to sort;
//   a cell's data-value (when present) is what sorts, else its text.
//   <input data-filter-for="TABLE_ID">: hides rows that do not contain every typed word.
(function () {
  "use strict";

  function cellValue(row, index, numeric) {
    var cell = row.cells[index];
    if (!cell) return numeric ? -Infinity : "";
    var raw = cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent.trim();
    if (!numeric) return raw.toLowerCase();
    var number = parseFloat(raw.replace(/,/g, ""));
    return isNaN(number) ? -Infinity : number;
  }

  function sortBy(table, header) {
    var headers = Array.prototype.slice.call(header.parentNode.children);
    var index = headers.indexOf(header);
    var numeric = header.getAttribute("data-sort") === "number";
    var ascending = header.getAttribute("aria-sort") !== "ascending";
    headers.forEach(function (th) { if (th.hasAttribute("data-sort")) th.setAttribute("aria-sort", "none"); });
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
    rows.sort(function (a, b) {
      var x = cellValue(a, index, numeric), y = cellValue(b, index, numeric);
      var order = numeric ? (x < y ? -1 : x > y ? 1 : 0) : collator.compare(x, y);
      return ascending ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }

  function applyFilter(input) {
    var table = document.getElementById(input.getAttribute("data-filter-for"));
    if (!table) return;
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    var shown = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var text = row.textContent.toLowerCase();
      var match = words.every(function (word) { return text.indexOf(word) !== -1; });
      row.hidden = !match;
      if (match) shown += 1;
    });
    var empty = document.querySelector('[data-empty-for="' + table.id + '"]');
    if (empty) empty.hidden = shown !== 0;
    var count = document.querySelector('[data-count-for="' + table.id + '"]');
    if (count) {
      var total = table.tBodies[0].rows.length;
      var noun = count.getAttribute("data-noun") || "row";
      var label = total + " " + noun + (total === 1 ? "" : "s");
      count.textContent = words.length ? shown + " of " + label : label;
    }
  }

  function init() {
    document.querySelectorAll("table[data-sortable] th[data-sort]").forEach(function (header) {
      header.tabIndex = 0;
      header.setAttribute("role", "columnheader");
      if (!header.hasAttribute("aria-sort")) header.setAttribute("aria-sort", "none");
      var table = header.closest("table");
      header.addEventListener("click", function () { sortBy(table, header); });
      header.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sortBy(table, header); }
      });
    });
    document.querySelectorAll("input[data-filter-for]").forEach(function (input) {
      input.addEventListener("input", function () { applyFilter(input); });
      if (input.value) applyFilter(input);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
