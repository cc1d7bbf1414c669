// Two evaluations side by side: each one's reliability diagram on its test part, before and
// after its temperature (equal-width bins), from json_script "compare-chart-data".
(function () {
  "use strict";

  var charts = window.Trainyard.evaluationCharts;

  function draw() {
    if (!window.Plotly) return;
    var data = charts.readJSON("compare-chart-data");
    if (!data) return;
    ["a", "b"].forEach(function (side) {
      var shown = data[side];
      charts.reliability(document.getElementById("reliability-" + side), (shown.before || {}).width, {
        name: "before", more: [{ bins: (shown.after || {}).width, name: "after", colour: "#23804a" }],
      });
    });
  }

  charts.whenReady(draw);
})();
