/* Weir event browser (templates/ui/events.html): what a body cell's buttons do.
 * - [data-show]: show the body as JSON (a foldable tree), text or hex (td.body[data-view]).
 * - .copy-body / .copy-curl: read the event whole from the per-partition events API (the
 *   page shows a cut preview), copy its body (text, or base64 when it is not UTF-8) or a
 *   curl command producing the same key, headers and body to this channel.
 * - table[data-tail]: the live tail. Every data-tail-ms it asks the server for the rows of
 *   the events after data-after (per-partition positions; the answer's X-Weir-After is the
 *   next), puts them on top and keeps at most MAX_ROWS. Paused by #tail-toggle and while
 *   the tab is hidden; resumed from where it stopped, so nothing is missed.
 * - #search-form, with script on: the search runs as short steps against data-step (each
 *   bounded by data-step-ms and data-step-scan, going on from the previous step's cursor),
 *   hits appended newest first and "Scanned N of M" with a <progress> updated after each,
 *   until a page of hits (data-hits), the channel's oldest event, or #search-cancel (which
 *   aborts the step in flight and keeps the hits); then the live tail of the search starts
 *   from where its first step began (X-Weir-After). The address becomes the search's, so a
 *   reload or a shared link gives the same search server-side; a refused field reloads the
 *   form the ordinary way, so the server names it. Without script the form is a plain GET.
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
      if (!events.isConnected) { return; }  // a search run on the page replaced the table
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

  function number(text) { return Number(text).toLocaleString("en-US"); }

  function searchQuery(form) {
    var query = new URLSearchParams();
    new FormData(form).forEach(function (value, name) { query.append(name, value); });
    return query;
  }

  function hasFilter(query) {
    return ["key", "header", "contains", "regex"].some(function (name) {
      return query.getAll(name).some(function (value) { return value !== ""; });
    });
  }

  var stopRunning = function () {};  // the search the page runs, if any

  function runSearch(form) {
    stopRunning();
    var query = searchQuery(form);
    var results = document.getElementById("results");
    var live = document.getElementById("search-live").content.cloneNode(true);
    live.querySelectorAll("[data-part]").forEach(function (part) {
      part.id = part.getAttribute("data-part");
      part.removeAttribute("data-part");
    });
    results.replaceChildren(live);
    var next = document.getElementById("next-page");
    if (next) { next.parentNode.remove(); }
    var bar = document.getElementById("search-bar");
    var status = document.getElementById("scan-summary");
    var cancel = document.getElementById("search-cancel");
    var body = table().tBodies[0];
    var wanted = parseInt(form.getAttribute("data-hits"), 10);
    var controller = new AbortController();
    var state = { scanned: 0, total: 0, cursor: "", found: 0, over: false, after: "" };
    stopRunning = function () { state.over = true; controller.abort(); };
    window.history.pushState(null, "", "?" + query.toString());

    function figures() { return number(state.scanned) + " of " + number(state.total) + " events"; }

    function finish(text, more) {
      state.over = true;
      var focused = document.activeElement === cancel;  // hiding it drops the focus
      cancel.hidden = true;
      bar.hidden = true;
      status.textContent = text;
      document.getElementById("no-events").hidden = state.found > 0;
      if (state.after) { follow(); }
      if (more) {
        var older = new URLSearchParams(query);
        if (state.cursor) { older.set("cursor", state.cursor); }
        var link = document.getElementById("search-older");
        link.href = "?" + older.toString();
        link.textContent = hasFilter(query) ? "Search older events" : "Older events";
        link.parentNode.hidden = false;
        if (focused) { link.focus(); }
      }
    }

    function follow() {  // the live tail of the search, from where its first step began
      var events = table();
      var url = new URL(form.getAttribute("data-tail"), window.location.href);
      url.search = query.toString();
      events.setAttribute("data-tail", url.pathname + url.search);
      events.setAttribute("data-after", state.after);
      events.setAttribute("data-tail-ms", form.getAttribute("data-tail-ms"));
      results.querySelector(".tail-bar").hidden = false;
      tail(events);
    }

    function step() {
      var url = new URL(form.getAttribute("data-step"), window.location.href);
      url.search = query.toString();
      url.searchParams.set("limit", String(wanted - state.found));
      url.searchParams.set("budget_ms", form.getAttribute("data-step-ms"));
      url.searchParams.set("scan_limit", form.getAttribute("data-step-scan"));
      if (state.cursor) { url.searchParams.set("cursor", state.cursor); }
      return fetch(url, { credentials: "same-origin", signal: controller.signal,
                          headers: { "X-Requested-With": "fetch" } })
        .then(function (response) {
          if (response.status === 400) { return "refused"; }
          if (response.redirected || !response.ok) {
            throw new Error("the server answered " + response.status);
          }
          return response.text().then(function (html) {
            if (state.over) { return "cancelled"; }
            body.insertAdjacentHTML("beforeend", html);
            state.found = body.rows.length;
            state.scanned = parseInt(response.headers.get("X-Weir-Scanned"), 10);
            state.total = parseInt(response.headers.get("X-Weir-Total"), 10);
            state.cursor = response.headers.get("X-Weir-Cursor") || "";
            state.after = state.after || response.headers.get("X-Weir-After") || "";
            bar.max = Math.max(state.total, 1);
            bar.value = state.scanned;
            status.textContent = "Scanning: " + figures() + ", " + state.found + " found so far.";
            if (!state.cursor) { return "end"; }
            var full = response.headers.get("X-Weir-Stopped") === "bytes";  // a page's bytes
            return state.found >= wanted || full ? "page" : step();
          });
        });
    }

    cancel.addEventListener("click", function () {
      if (state.over) { return; }
      controller.abort();
      finish(state.total ? "Cancelled after scanning " + figures() + ": " + state.found +
             " shown." : "Cancelled before the first events were scanned.", true);
    });
    cancel.focus();
    step()
      .then(function (outcome) {
        if (outcome === "refused") { form.submit(); return; }  // the server names the field
        if (outcome === "end") {
          finish("Scanned " + figures() + ", newest first: " + state.found + " shown.", false);
        } else if (outcome === "page") {
          finish("Scanned " + figures() + ", newest first: " + state.found +
                 " shown; stopped at a page of hits.", true);
        }
      })
      .catch(function (error) {
        if (state.over) { return; }  // cancelled: the abort ends the step in flight
        finish("The search stopped after scanning " + figures() + ": " + error.message + ".",
               true);
      });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var events = table();
    if (events && events.hasAttribute("data-tail")) { tail(events); }
    var form = document.getElementById("search-form");
    if (form && window.AbortController && window.URLSearchParams) {
      // the address is each search's (pushState): going back shows the page it names
      window.addEventListener("popstate", function () { window.location.reload(); });
      form.addEventListener("submit", function (event) {
        event.preventDefault();
        runSearch(form);
      });
    }
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
