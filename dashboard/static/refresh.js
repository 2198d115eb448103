// rowactor dashboard: reload the page every data-refresh seconds (never under 5) while
// it is visible and no form field has the focus, so an open tab costs the database its
// queries at most that often and never reloads under the operator's typing.
(function () {
  var el = document.currentScript;
  var every = Math.max(5, parseInt(el && el.getAttribute("data-refresh"), 10) || 0) * 1000;
  function tick() {
    var a = document.activeElement;
    var typing = a && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA");
    if (document.visibilityState === "visible" && !typing) {
      location.reload();
      return;
    }
    setTimeout(tick, every);
  }
  setTimeout(tick, every);
})();
