/* Weir event browser (templates/ui/events.html): what a body cell's buttons do.
 * - [data-show]: show the body as JSON (a foldable tree), text or hex (td.body[data-view]).
 * - .copy-body / .copy-curl: read the event whole from the per-partition events API (the
 *   page shows a cut preview), copy its body (text, or base64 when it is not UTF-8) or a
 *   curl command producing the same key, headers and body to this channel.
 * - table[data-tail]: the live tail. Every data-tail-ms it asks the server for the rows of
 *   the events after data-after (per-partition positions; the answer's X-Weir-After is the
 *   next), puts them on top and keeps at most MAX_ROWS. Paused by #tail-toggle and while
 *   the tab is hidden; resumed from where it stopped, so nothing is missed.
 * Listeners sit on the document, so rows added later (the live tail) work the same.
 * No inline script anywhere: the Content-Security-Policy allows script from files only.
 */
(function () {
  "use strict";

  function table() { return document.getElementById("events"); }

  function shellQuote(text) { return "'" + text.replace(/'/g, "'\\''") + "'"; }

  function readEvent(row) {
    var url = table().getAttribute("data-api") + "/partitions/" +
      row.getAttribute("data-partition") + "/events?limit=1&offset=" +
      row.getAttribute("data-offset");
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("the event could not be read (" + response.status + ")"); }
        return response.json();
      })
      .then(function (page) {
        if (!page.events.length) { throw new Error("the event is gone (retention)"); }
        return page.events[0];
      });
  }

  function curlFor(event) {
    var one = {};
    if (event.key !== null) { one.key = event.key; }
    if (Object.keys(event.headers).length) { one.headers = event.headers; }
    if (event.body !== null) { one.body = event.body; } else { one.body_base64 = event.body_base64; }
    var url = window.location.origin + table().getAttribute("data-produce");
    return "curl -X POST " + shellQuote(url) + " \\\n" +
      "  -H \"Authorization: Bearer $TOKEN\" \\\n" +
      "  -H 'Content-Type: application/json' \\\n" +
      "  --data-binary " + shellQuote(JSON.stringify({ events: [one] }));
  }

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    // plain http on another host: no Clipboard API; the older way still copies
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.appendChild(area);
    area.select();
    var done = document.execCommand("copy");
    area.remove();
    return done ? Promise.resolve() : Promise.reject(new Error("the browser refused to copy"));
  }

  function say(cell, text) {
    var status = cell.querySelector(".copied");
    status.textContent = text;
    setTimeout(function () { if (status.textContent === text) { status.textContent = ""; } }, 4000);
  }

  function copy(button, what) {
    var cell = button.closest("td.body");
    readEvent(button.closest("tr"))
      .then(function (event) {
        var text = what === "curl" ? curlFor(event)
          : event.body !== null ? event.body : event.body_base64;
        return copyText(text).then(function () {
          say(cell, what === "curl" ? "curl command copied" :
            event.body !== null ? "Body copied" : "Body copied as base64");
        });
      })
      .catch(function (error) { say(cell, "Not copied: " + error.message); });
  }

  var MAX_ROWS = 500;

  function tail(events) {
    var every = parseInt(events.getAttribute("data-tail-ms") || "3000", 10);
    var toggle = document.getElementById("tail-toggle");
    var state = document.getElementById("tail-state");
    var paused = false;
    function tick() {
      if (paused || document.hidden) { return setTimeout(tick, every); }
      var url = new URL(events.getAttribute("data-tail"), window.location.href);
      url.searchParams.set("after", events.getAttribute("data-after"));
      fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (response) {
          if (response.redirected || !response.ok) { throw new Error(response.status); }
          var after = response.headers.get("X-Weir-After");
          return response.text().then(function (html) {
            if (paused) { return; }  // paused meanwhile: these rows come again on resume
            var body = events.tBodies[0];
            if (html.trim()) {
              body.insertAdjacentHTML("afterbegin", html);
              var empty = document.getElementById("no-events");
              if (empty) { empty.remove(); }
              events.parentNode.classList.remove("empty-table");
              while (body.rows.length > MAX_ROWS) { body.deleteRow(-1); }
            }
            if (after) { events.setAttribute("data-after", after); }
            events.classList.remove("stale");
          });
        })
        .catch(function () { events.classList.add("stale"); })
        .finally(function () { setTimeout(tick, every); });
    }
    toggle.addEventListener("click", function () {
      paused = !paused;
      toggle.setAttribute("aria-pressed", String(!paused));
      toggle.textContent = paused ? "Resume live tail" : "Pause live tail";
      state.textContent = paused ? "Paused: new events wait until you resume."
        : "Live: new events appear at the top as they arrive.";
    });
    setTimeout(tick, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var events = table();
    if (events && events.hasAttribute("data-tail")) { tail(events); }
  });

  document.addEventListener("click", function (event) {
    var button = event.target.closest("#events button");
    if (!button) { return; }
    if (button.hasAttribute("data-show")) {
      button.closest("td.body").setAttribute("data-view", button.getAttribute("data-show"));
    } else if (button.classList.contains("copy-body")) {
      copy(button, "body");
    } else if (button.classList.contains("copy-curl")) {
      copy(button, "curl");
    }
  });
})();
