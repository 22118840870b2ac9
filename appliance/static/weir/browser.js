/* Weir event browser (templates/ui/events.html): what a body cell's buttons do.
 * - [data-show]: show the body as JSON (a foldable tree), text or hex (td.body[data-view]).
 * - .copy-body / .copy-curl: read the event whole from the per-partition events API (the
 *   page shows a cut preview), copy its body (text, or base64 when it is not UTF-8) or a
 *   curl command producing the same key, headers and body to this channel.
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
