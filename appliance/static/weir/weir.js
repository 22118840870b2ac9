/* Weir admin UI: the little JavaScript it has.
 * - [data-refresh]: fetch the URL every data-refresh-ms and swap the element's contents
 *   (server-rendered HTML; paused while the tab is hidden or a field in it has focus; a
 *   failed fetch keeps the last contents and marks them stale; an open <details> stays
 *   open).
 * - form[data-confirm]: ask before a destructive POST (one listener on the document, so
 *   forms inside a part that refreshed itself ask too).
 * No inline script or event handler anywhere: the Content-Security-Policy allows script
 * from files only (appliance/csp.py).
 */
(function () {
  "use strict";

  // What names a <details> across refreshes: its data-key (a summary whose text changes,
  // such as a count of folded runs, stays open as it grows), else its summary's text.
  function detailsKey(d) {
    return d.getAttribute("data-key") || d.querySelector("summary").textContent;
  }

  function refresh(el) {
    var url = el.getAttribute("data-refresh");
    var every = parseInt(el.getAttribute("data-refresh-ms") || "3000", 10);
    function tick() {
      // hidden tab, or the operator typing in a form of this part: try again later
      var typing = el.contains(document.activeElement) &&
        document.activeElement.matches("input, select, textarea");
      if (document.hidden || typing) { return setTimeout(tick, every); }
      fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (response) {
          if (response.redirected || !response.ok) { throw new Error(response.status); }
          return response.text();
        })
        .then(function (html) {
          var open = Array.prototype.map.call(el.querySelectorAll("details[open]"), detailsKey);
          el.innerHTML = html;
          el.querySelectorAll("details").forEach(function (d) {
            if (open.indexOf(detailsKey(d)) >= 0) { d.open = true; }
          });
          el.classList.remove("stale");
          el.setAttribute("data-refreshed", String(Date.now()));
        })
        .catch(function () { el.classList.add("stale"); })
        .finally(function () { setTimeout(tick, every); });
    }
    setTimeout(tick, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
  });

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.matches("form[data-confirm]") && !window.confirm(form.getAttribute("data-confirm"))) {
      event.preventDefault();
    }
  });
})();
