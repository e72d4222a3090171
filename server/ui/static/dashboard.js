// neffcache dashboard: refresh the page body in place (no flicker, filters and scroll kept),
// submit filters on change, and say so when the index cannot be reached. First-party, no CDN.
(function () {
  "use strict";
  var period = (parseInt(document.body.dataset.refresh, 10) || 60) * 1000;

  function setStatus(text, stale) {
    var el = document.getElementById("status");
    if (el) { el.textContent = text; el.classList.toggle("stale", !!stale); }
  }

  function refresh() {
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("main"), updated = doc.getElementById("updated");
        if (fresh) { document.getElementById("main").replaceWith(fresh); }
        if (updated) { document.getElementById("updated").replaceWith(updated); }
        setStatus("refreshes every " + period / 1000 + " s", false);
      })
      .catch(function (err) {
        setStatus("index unreachable (" + err.message + "), retrying", true);
      });
  }

  document.querySelectorAll(".filters select").forEach(function (select) {
    select.addEventListener("change", function () { select.form.submit(); });
  });
  window.setInterval(refresh, period);
})();
