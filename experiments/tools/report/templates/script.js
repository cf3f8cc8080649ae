// Filters over the case list: run, model, outcome and free text. Pure DOM, no network.
(function () {
  var cases = Array.prototype.slice.call(document.querySelectorAll("details.case"));
  var byId = function (id) { return document.getElementById(id); };
  var fRun = byId("f-run"), fModel = byId("f-model"), fOutcome = byId("f-outcome"), fText = byId("f-text");
  var count = byId("case-count");

  function apply() {
    var run = fRun.value, model = fModel.value, outcome = fOutcome.value, text = fText.value.toLowerCase();
    var shown = 0;
    cases.forEach(function (c) {
      var ok = (!run || c.dataset.run === run) && (!model || c.dataset.model === model) &&
               (!outcome || c.dataset.outcome === outcome) && (!text || c.textContent.toLowerCase().indexOf(text) >= 0);
      c.classList.toggle("hidden", !ok);
      if (ok) shown += 1;
    });
    document.querySelectorAll("section.run").forEach(function (s) {
      s.classList.toggle("hidden", !!run && s.dataset.run !== run);
    });
    count.textContent = shown + " of " + cases.length + " cases shown";
  }
  [fRun, fModel, fOutcome].forEach(function (el) { el.addEventListener("change", apply); });
  fText.addEventListener("input", apply);
  byId("f-expand").addEventListener("click", function () {
    cases.forEach(function (c) { if (!c.classList.contains("hidden")) c.open = true; });
  });
  // filters can be preset from the address: report.html#run=run0&model=embedded&outcome=error&text=cough
  (location.hash || "").replace(/^#/, "").split("&").forEach(function (kv) {
    var parts = kv.split("="), el = byId("f-" + parts[0]);
    if (parts.length === 2 && el) { el.value = decodeURIComponent(parts[1].replace(/\+/g, " ")); }
  });
  byId("f-collapse").addEventListener("click", function () { cases.forEach(function (c) { c.open = false; }); });
  apply();
  document.body.setAttribute("data-ready", "1");
})();
