// The jobs list: "Compare selected" says how many jobs are ticked and is enabled only for
// 2 to 10 of them (the compare page refuses other counts too, for links typed by hand).
(function () {
  "use strict";

  function init() {
    var form = document.getElementById("compare-form");
    var button = document.getElementById("compare-submit");
    var label = document.getElementById("compare-count");
    if (!form || !button || !label) return;
    var max = parseInt(form.getAttribute("data-compare-max"), 10) || 10;
    var hint = label.textContent;

    function update() {
      var ticked = document.querySelectorAll('input[name="ids"][form="compare-form"]:checked').length;
      button.disabled = ticked < 2 || ticked > max;
      if (!ticked) label.textContent = hint;
      else if (ticked > max) label.textContent = ticked + " selected — at most " + max;
      else label.textContent = ticked + " selected";
    }

    document.addEventListener("change", function (event) {
      if (event.target.matches && event.target.matches('input[name="ids"]')) update();
    });
    update();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
