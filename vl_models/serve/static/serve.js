// vlprep serve: highlight a region on hover (picture <-> table), show a referred box, adapt the ask form.
(function () {
  "use strict";
  function scopeOf(el) { return el.closest(".scope") || document; }
  function mark(el, on) {
    var id = el.getAttribute("data-region");
    var scope = scopeOf(el);
    scope.querySelectorAll('[data-region="' + id + '"]').forEach(function (x) { x.classList.toggle("hl", on); });
    scope.querySelectorAll("svg.pic .region").forEach(function (x) {
      x.classList.toggle("dim", on && x.getAttribute("data-region") !== id);
    });
  }
  document.querySelectorAll(".scope [data-region]").forEach(function (el) {
    el.addEventListener("mouseenter", function () { mark(el, true); });
    el.addEventListener("mouseleave", function () { mark(el, false); });
  });
  var refbox = document.getElementById("refbox");
  document.querySelectorAll("li.item[data-box]").forEach(function (el) {
    el.addEventListener("mouseenter", function () {
      if (!refbox) { return; }
      var b = el.getAttribute("data-box").split(" ").map(Number);
      refbox.setAttribute("x", b[0]); refbox.setAttribute("y", b[1]);
      refbox.setAttribute("width", Math.max(b[2] - b[0], 0)); refbox.setAttribute("height", Math.max(b[3] - b[1], 0));
      refbox.classList.add("on"); el.classList.add("hl");
    });
    el.addEventListener("mouseleave", function () { if (refbox) { refbox.classList.remove("on"); } el.classList.remove("hl"); });
  });
  var form = document.getElementById("ask-form");
  if (form) {
    var kinds = JSON.parse(form.getAttribute("data-run-kinds") || "{}");
    var run = document.getElementById("a-run"), kind = document.getElementById("a-kind");
    var labels = { question: "question", expression: "referring expression", statement: "statement (about two images)",
                   caption: "caption (ranks the store's images)", captions: "captions (one a line, ranked for the image)", text: "text (does it describe the image?)" };
    function update() {
      var allowed = kinds[run.value] || [];
      Array.prototype.forEach.call(kind.options, function (o) { o.disabled = allowed.indexOf(o.value) < 0; });
      if (kind.selectedOptions.length && kind.selectedOptions[0].disabled) {
        var first = Array.prototype.find.call(kind.options, function (o) { return !o.disabled; });
        if (first) { kind.value = first.value; }
      }
      var k = kind.value;
      form.querySelectorAll(".for-image").forEach(function (e) { e.classList.toggle("hidden", k === "caption"); });
      form.querySelectorAll(".for-statement").forEach(function (e) { e.classList.toggle("hidden", k !== "statement"); });
      form.querySelectorAll(".for-caption").forEach(function (e) { e.classList.toggle("hidden", k !== "caption"); });
      form.querySelectorAll(".for-question").forEach(function (e) { e.classList.toggle("hidden", k !== "question"); });
      document.getElementById("a-text-label").textContent = labels[k] || "text";
    }
    run.addEventListener("change", update); kind.addEventListener("change", update); update();
  }
})();
