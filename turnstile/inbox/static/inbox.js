// The inbox's only script (no build step): relative times in the reviewer's
// time zone, the deadline counting down, and the list refreshed in place
// (fetch; the filters the reviewer is typing stay as they are).
(function () {
  "use strict";
  function relative(ms) {
    var s = Math.round(Math.abs(ms) / 1000), past = ms < 0, text;
    if (s < 45) text = s + " s";
    else if (s < 3600) text = Math.round(s / 60) + " min";
    else if (s < 86400) text = Math.round(s / 3600) + " h";
    else text = Math.round(s / 86400) + " d";
    return past ? text + " ago" : "in " + text;
  }
  function times(root) {
    var now = Date.now();
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (isNaN(at)) return;
      el.title = new Date(at).toLocaleString();  // the reviewer's own time zone
      el.textContent = relative(at - now);
    });
  }
  function countdown() {
    var el = document.getElementById("left");
    if (!el) return;
    var end = Date.parse(el.dataset.deadline);
    function tick() {
      var s = Math.round((end - Date.now()) / 1000);
      el.textContent = s > 0 ? Math.floor(s / 60) + " min " + (s % 60) + " s left" : "past the deadline";
    }
    tick(); setInterval(tick, 1000);
  }
  function live() {
    var table = document.getElementById("pending"), form = document.getElementById("filters");
    if (!table || !form) return;
    var stamp = document.getElementById("refreshed"), timer = null;
    function refresh() {
      var query = new URLSearchParams(new FormData(form)).toString();
      fetch(table.dataset.rows + "?" + query, {credentials: "same-origin"})
        .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
        .then(function (html) {
          var holder = document.createElement("table");
          holder.innerHTML = html;
          table.replaceChild(holder.tBodies[0], table.tBodies[0]);
          times(table);
          if (stamp) stamp.textContent = "updated " + new Date().toLocaleTimeString();
        })
        .catch(function (err) { if (stamp) stamp.textContent = "not updated: " + err.message; });
    }
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      history.replaceState(null, "", "?" + new URLSearchParams(new FormData(form)).toString());
      refresh();
    });
    form.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(refresh, 300); });
    setInterval(refresh, 5000);
  }
  document.addEventListener("DOMContentLoaded", function () { times(document); countdown(); live(); });
})();
