// gpuwatch status page: keeps the server-rendered page current from api/v1/status (long-poll),
// renders the same markup, and counts down pending actions every second. Text is set with
// textContent only, never parsed as HTML. Requests go to gpuwatch only, relative to the page.
"use strict";
(function () {
  const body = document.body;
  let seq = Number(body.dataset.seq || 0);
  // The server's clock minus ours, so that countdowns follow the server.
  let skew = Number(body.dataset.at || 0) - Date.now() / 1000;
  let updates = 0;

  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) e.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const pct = (r) => (r === null || r === undefined ? "-" : Math.round(r * 100) + "%");
  const gib = (b) => (b === null || b === undefined ? "-" : (b / 1073741824).toFixed(1));
  const money = (v) => (v === null || v === undefined ? "-" : "$" + v.toFixed(2));
  const two = (n) => String(n).padStart(2, "0");
  function duration(secs) {
    const s = Math.max(0, Math.round(secs));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + two(s % 60) + "s";
    return Math.floor(s / 3600) + "h " + two(Math.floor((s % 3600) / 60)) + "m";
  }
  const rfc3339 = (t) => new Date(t * 1000).toISOString().replace(/\.\d+Z$/, "Z");
  const health = { ok: "ok", pending: "action pending", down: "down", unknown: "unknown" };
  function processes(g) {
    if (g.processes.length) {
      return g.processes.map((p) => (p.name ? p.name + " (" + p.pid + ")" : String(p.pid))).join(", ");
    }
    if (g.process_count === null || g.process_count === undefined) return "-";
    if (g.process_count === 0) return "none";
    return g.process_count + (g.process_count === 1 ? " process" : " processes");
  }

  function summary(s) {
    let nvml;
    if (s.nvml.up) nvml = "NVML up, driver " + (s.nvml.driver || "unknown");
    else if (s.seq === 0) nvml = "waiting for the first sample";
    else nvml = "NVML down: " + (s.nvml.error || "unknown");
    const up = s.gpus.filter((g) => g.up).length;
    const word = health[s.health];
    const sec = h("section", { id: "summary" },
      h("p", {}, h("span", { class: "health " + word.replace(" ", "-"), id: "health" }, word), " ",
        h("span", { id: "nvml" }, nvml), "; ",
        h("span", { id: "gpus-up" }, up + " of " + s.gpus.length + " GPUs up"), "."));
    const n = s.node;
    if (n.instance_id) {
      sec.append(h("p", { id: "node" }, "Instance " + n.instance_id + " (" + (n.instance_type || "?") +
        ", " + (n.availability_zone || "?") + ", " + (n.lifecycle || "unknown") + ")"));
    }
    const labels = Object.entries(n.labels);
    if (labels.length) {
      sec.append(h("p", { id: "labels" }, labels.map(([k, v]) => [h("span", { class: "label" }, k + "=" + v), " "])));
    }
    return sec;
  }

  const count = (n) => (n === null || n === undefined ? "-" : n === 0 ? "none" : n + (n === 1 ? " process" : " processes"));
  const id = (v) => (v === null || v === undefined ? "?" : v);

  function migRow(g, m) {
    const name = ("GI " + id(m.gpu_instance) + " · CI " + id(m.compute_instance) + " " + (m.profile || "")).trim();
    return h("tr", { class: "mig", "data-index": g.index },
      h("td", {}, "↳ ", h("span", { class: "name" }, name)),
      h("td", { class: "state" }, "MIG"),
      h("td", { class: "util" }, "SM " + pct(m.sm_active)),
      h("td", { class: "memory" }, gib(m.memory_used_bytes) + " of " + gib(m.memory_total_bytes)),
      h("td", { class: "temp" }, "-"),
      h("td", { class: "power" }, "-"),
      h("td", { class: "idle", "data-idle": m.idle_seconds || 0 }, m.idle_seconds === null ? "-" : duration(m.idle_seconds)),
      h("td", { class: "procs" }, count(m.process_count)));
  }

  function gpus(s) {
    const rows = s.gpus.flatMap((g) => {
      let power = "-";
      if (g.power_watts !== null && g.power_limit_watts !== null) {
        power = g.power_watts.toFixed(0) + " of " + g.power_limit_watts.toFixed(0);
      } else if (g.power_watts !== null) power = g.power_watts.toFixed(0);
      return [h("tr", { class: "gpu" + (g.up ? "" : " lost"), "data-index": g.index },
        h("td", {}, h("b", {}, g.index), " ", h("span", { class: "name" }, g.name || "")),
        h("td", { class: "state" }, g.up ? "up" : "lost"),
        h("td", { class: "util" }, h("meter", { min: 0, max: 1, value: g.utilization || 0 }), " " + pct(g.utilization)),
        h("td", { class: "memory" }, gib(g.memory_used_bytes) + " of " + gib(g.memory_total_bytes)),
        h("td", { class: "temp" }, g.temperature_celsius === null ? "-" : g.temperature_celsius.toFixed(0) + " °C"),
        h("td", { class: "power" }, power),
        h("td", { class: "idle", "data-idle": g.idle_seconds || 0 }, g.idle_seconds === null ? "-" : duration(g.idle_seconds)),
        h("td", { class: "procs" }, processes(g)))].concat((g.mig || []).map((m) => migRow(g, m)));
    });
    const head = ["GPU", "State", "Utilization", "Memory (GiB)", "Temp", "Power (W)", "Idle for", "Processes"];
    const sec = h("section", { id: "gpus" }, h("h2", {}, "GPUs"),
      h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))),
        h("tbody", {}, rows))));
    for (const g of s.gpus.filter((g) => g.underutilized)) {
      sec.append(h("p", { class: "hint" }, "GPU " + g.index + " is underutilized: " + pct(g.utilization) +
        " busy with a process running; larger batches or faster data loading would use it better"));
    }
    return sec;
  }

  function rules(s) {
    const sec = h("section", { id: "rules" }, h("h2", {}, "Rules"));
    if (!s.rules.length) sec.append(h("p", {}, "No rules."));
    for (const r of s.rules) {
      const c = r.counted;
      const div = h("div", { class: "rule" + (r.breaching ? " breaching" : ""), "data-rule": r.name },
        h("h3", {}, r.name + " ", h("span", { class: "state" }, r.breaching ? "breaching" : "not breaching")),
        h("p", { class: "summary" }, r.summary),
        h("p", { class: "counted" }, c ? c.breaching + " of the last " + c.of + " periods breach (" + c.needed + " needed)" : ""));
      const p = r.pending;
      if (p) {
        div.append(h("div", { class: "pending" },
          h("p", {}, h("b", {}, p.action), " in ",
            h("span", { class: "countdown", "data-due": p.due_at }, duration(p.due_at - (Date.now() / 1000 + skew))),
            " (at " + rfc3339(p.due_at) + ") unless the GPUs are used again. To postpone it:"),
          h("pre", {}, h("code", { class: "hold" }, p.hold_command))));
      }
      sec.append(div);
    }
    sec.append(h("h2", {}, "Holds"));
    const holds = h("ul", { id: "holds" });
    if (!s.holds.length) holds.append(h("li", {}, "None."));
    for (const x of s.holds) {
      const until = x.until === null ? "without end (its expiry cannot be read)" : "until " + rfc3339(x.until);
      holds.append(h("li", { class: "hold" }, x.source + " " + until + ": " + x.reason));
    }
    sec.append(holds);
    if (s.interruption !== null) {
      sec.append(h("p", { class: "interruption" }, "Spot interruption: the instance goes at " + rfc3339(s.interruption) + "."));
    }
    return sec;
  }

  function cost(s) {
    const c = s.cost;
    const sec = h("section", { id: "cost" }, h("h2", {}, "Cost"),
      h("p", {}, "Price ", h("b", { class: "price" }, money(c.usd_per_hour)), " per hour (" + (c.price_source || "unknown") +
        "). This period: spent ", h("b", { class: "spent" }, money(c.spent)), ", forecast ",
        h("b", { class: "forecast" }, money(c.forecast)), "; on idle GPUs so far ",
        h("b", { class: "idle-dollars" }, money(c.idle_dollars)), "."));
    for (const b of c.budgets) {
      const low = b.thresholds.length ? b.thresholds[0] : 1;
      const high = b.thresholds.length ? b.thresholds[b.thresholds.length - 1] : 1;
      sec.append(h("div", { class: "budget", "data-budget": b.name },
        h("p", {}, b.name + ": " + pct(b.spent_ratio) + " of $" + b.limit_usd.toFixed(2) + " spent, forecast " +
          pct(b.forecast_ratio) + "; alerts at " + b.thresholds.map(pct).join(", ")),
        h("meter", { min: 0, max: 1, low: low, high: high, optimum: 0, value: Math.min(b.spent_ratio || 0, 1) })));
    }
    return sec;
  }

  function events(s) {
    const list = h("ol", {});
    if (!s.events.length) list.append(h("li", {}, "None yet."));
    for (const e of s.events) list.append(h("li", {}, e.text));
    return h("section", { id: "events" }, h("h2", {}, "Last events"), list);
  }

  function render(s) {
    const parts = [summary(s), gpus(s)];
    if (s.watching) parts.push(rules(s));
    if (s.cost.usd_per_hour !== null || s.cost.budgets.length) parts.push(cost(s));
    if (s.watching) parts.push(events(s));
    document.getElementById("main").replaceChildren(...parts);
    document.title = "gpuwatch on " + s.node.hostname + (s.health === "ok" ? "" : " (" + health[s.health] + ")");
  }

  function tick() {
    const now = Date.now() / 1000 + skew;
    for (const e of document.querySelectorAll(".countdown[data-due]")) {
      e.textContent = duration(Number(e.dataset.due) - now);
    }
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const live = document.getElementById("live");

  async function poll() {
    for (;;) {
      try {
        const r = await fetch("api/v1/status?after=" + seq + "&timeout=25s", { cache: "no-store", credentials: "same-origin" });
        // A restarted daemon counts its samples from 1 again: start over from its latest.
        if (r.status === 400) { seq = 0; continue; }
        if (!r.ok) throw new Error("HTTP " + r.status);
        const s = await r.json();
        skew = s.now - Date.now() / 1000;
        seq = s.seq;
        render(s);
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
