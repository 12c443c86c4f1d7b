// gpuwatch status page: keeps the server-rendered page current. It long-polls
// api/v1/status/live, which answers with the live part of the page as the server renders it
// (the same markup as the first paint, every outside string escaped there), and swaps it in.
// Between samples it only counts pending actions down. Requests go to gpuwatch only,
// relative to the page.
"use strict";
(function () {
  const body = document.body;
  const main = document.getElementById("main");
  const live = document.getElementById("live");
  let seq = Number(body.dataset.seq || 0);
  // The server's clock minus ours, so that countdowns follow the server.
  let skew = Number(body.dataset.at || 0) - Date.now() / 1000;
  let updates = 0;

  // The countdown's words, as the server writes them (status::text::duration).
  const two = (n) => String(n).padStart(2, "0");
  function duration(secs) {
    const s = Math.max(0, Math.round(secs));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + two(s % 60) + "s";
    return Math.floor(s / 3600) + "h " + two(Math.floor((s % 3600) / 60)) + "m";
  }

  function tick() {
    const now = Date.now() / 1000 + skew;
    for (const e of document.querySelectorAll(".countdown[data-due]")) {
      e.textContent = duration(Number(e.dataset.due) - now);
    }
  }

  // The server's fragment, parsed inert (a template runs no script) and swapped in whole.
  function swap(html) {
    const t = document.createElement("template");
    t.innerHTML = html;
    main.replaceChildren(t.content);
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  async function poll() {
    for (;;) {
      try {
        const r = await fetch("api/v1/status/live?after=" + seq + "&timeout=25s", { cache: "no-store", credentials: "same-origin" });
        // A restarted daemon counts its samples from 1 again: start over from its latest.
        if (r.status === 400) { seq = 0; continue; }
        if (!r.ok) throw new Error("HTTP " + r.status);
        const s = await r.json();
        skew = s.now - Date.now() / 1000;
        seq = s.seq;
        swap(s.html);
        tick();
        document.title = s.title;
        updates += 1;
        body.dataset.seq = String(seq);
        body.dataset.updates = String(updates);
        live.textContent = "Live: updated " + new Date().toLocaleTimeString() + ".";
        live.className = "";
      } catch (e) {
        live.textContent = "Not updating (" + e.message + "); retrying.";
        live.className = "stale";
        await sleep(2000);
      }
    }
  }

  setInterval(tick, 1000);
  poll();
})();
