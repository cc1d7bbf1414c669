// Draws the class distribution of a dataset version with plotly, from the JSON that the
// page embeds with Django's json_script (never from inline script).
(function () {
  "use strict";

  function draw() {
    var container = document.querySelector("[data-chart-source]");
    if (!container || !window.Plotly) return;
    var source = document.getElementById(container.getAttribute("data-chart-source"));
    if (!source) return;
    var data = JSON.parse(source.textContent);
    // plotly reads a few HTML tags in labels (<b>, <a href>, <br>); class names are user data,
    // so turn them into entities, which plotly shows as the literal characters.
    var labels = data.labels.map(function (label) {
      return String(label).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
    });
    var styles = getComputedStyle(document.documentElement);
    var accent = styles.getPropertyValue("--accent").trim() || "#2f4fc7";
    var font = styles.getPropertyValue("--font").trim() || "system-ui, sans-serif";
    var many = data.labels.length > 12;
    var largest = Math.max.apply(null, data.counts.concat([0]));
    window.Plotly.newPlot(container, [{
      type: "bar",
      x: labels,
      y: data.counts,
      marker: { color: accent, opacity: 0.85 },
      hovertemplate: "%{x}<br>%{y:,} records<extra></extra>",
    }], {
      margin: { l: 56, r: 12, t: 8, b: many ? 96 : 40 },
      font: { family: font, size: 12, color: "#4a5565" },
      xaxis: { type: "category", tickangle: many ? -40 : 0, automargin: true },
      // Counts are whole numbers: with small counts, step by one so no tick repeats.
      yaxis: { title: { text: "records" }, gridcolor: "#eef0f3", rangemode: "tozero", tickformat: ",d",
               dtick: largest <= 8 ? 1 : undefined },
      bargap: data.labels.length < 4 ? 0.55 : 0.35,
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
    }, { displayModeBar: false, responsive: true });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
