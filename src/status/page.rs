//! The status page at `/`: rendered here, and only here, so that it reads without JavaScript
//! and `curl` shows the facts as text. `status.js` keeps it current: it long-polls
//! `/api/v1/status/live`, which answers with the live part rendered by `fragment` (the same
//! markup as the first paint), and swaps it in; the script only counts down pending actions
//! between samples. Nothing is fetched from anywhere but gpuwatch, and the page's
//! Content-Security-Policy says so to the browser.

use std::fmt::Write as _;

use super::text::{
    duration, gib, mig_name, percent, process_count, processes, spinning_hint, underutilized_hint,
};
use super::{BudgetStatus, GpuStatus, Health, MigStatus, RuleStatus, Status};

/// The page's Content-Security-Policy: its own script, style and API, nothing else.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub const SCRIPT: &str = include_str!("status.js");
pub const STYLE: &str = include_str!("status.css");

/// Escapes text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn health_word(h: Health) -> &'static str {
    match h {
        Health::Ok => "ok",
        Health::Pending => "action pending",
        Health::Down => "down",
        Health::Unknown => "unknown",
    }
}

/// The whole page for `s`. `now` is the server's clock, for the first countdowns.
pub fn render(s: &Status, now: f64) -> String {
    let mut o = String::with_capacity(8192);
    let _ = write!(
        o,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"color-scheme\" content=\"light dark\">\
         <title>{title}</title>\
         <link rel=\"stylesheet\" href=\"static/status.css\">\
         <script src=\"static/status.js\" defer></script></head>\n\
         <body data-seq=\"{seq}\" data-at=\"{now}\">\n<header><h1>gpuwatch <small>{version}</small> on {host}</h1>\
         <p class=\"links\"><a href=\"metrics\">metrics</a> · <a href=\"api/v1/status\">status JSON</a> · \
         <a href=\"api/v1/snapshot\">snapshot JSON</a></p></header>\n<main id=\"main\">\n",
        host = escape(&s.node.hostname),
        title = escape(&title(s)),
        seq = s.seq,
        version = escape(&s.version),
    );
    o.push_str(&fragment(s, now));
    o.push_str("</main>\n<footer id=\"live\">Updates live with JavaScript; without it, reload.</footer>\n</body></html>\n");
    o
}

/// The page's title: the node, and its health unless it is ok.
pub fn title(s: &Status) -> String {
    match s.health {
        Health::Ok => format!("gpuwatch on {}", s.node.hostname),
        h => format!("gpuwatch on {} ({})", s.node.hostname, health_word(h)),
    }
}

/// The live part of the page (inside `<main>`), for the first paint and for every update.
/// `now` is the server's clock, for the countdowns.
pub fn fragment(s: &Status, now: f64) -> String {
    let mut o = String::with_capacity(8192);
    summary_section(&mut o, s);
    gpus_section(&mut o, s);
    if s.watching {
        rules_section(&mut o, s, now);
    }
    cost_section(&mut o, s);
    if s.watching {
        events_section(&mut o, s);
    }
    o
}

/// Health, NVML, how many GPUs are up, and the node with its labels.
fn summary_section(o: &mut String, s: &Status) {
    let nvml = if s.nvml.up {
        format!(
            "NVML up, driver {}",
            s.nvml.driver.as_deref().unwrap_or("unknown")
        )
    } else if s.seq == 0 {
        "waiting for the first sample".into()
    } else {
        format!(
            "NVML down: {}",
            s.nvml.error.as_deref().unwrap_or("unknown")
        )
    };
    let up = s.gpus.iter().filter(|g| g.up).count();
    let _ = write!(
        o,
        "<section id=\"summary\"><p><span class=\"health {cls}\" id=\"health\">{word}</span> \
         <span id=\"nvml\">{nvml}</span>; <span id=\"gpus-up\">{up} of {n} GPUs up</span>.</p>",
        cls = health_word(s.health).replace(' ', "-"),
        word = health_word(s.health),
        nvml = escape(&nvml),
        n = s.gpus.len(),
    );
    let node = &s.node;
    if let Some(id) = &node.instance_id {
        let _ = write!(
            o,
            "<p id=\"node\">Instance {} ({}, {}, {})</p>",
            escape(id),
            escape(node.instance_type.as_deref().unwrap_or("?")),
            escape(node.availability_zone.as_deref().unwrap_or("?")),
            escape(node.lifecycle.as_deref().unwrap_or("unknown")),
        );
    }
    if !node.labels.is_empty() {
        o.push_str("<p id=\"labels\">");
        for (k, v) in &node.labels {
            let _ = write!(
                o,
                "<span class=\"label\">{}={}</span> ",
                escape(k),
                escape(v)
            );
        }
        o.push_str("</p>");
    }
    o.push_str("</section>\n");
}

/// The GPU table, a row per GPU and per MIG instance, then its health problems and hints.
fn gpus_section(o: &mut String, s: &Status) {
    o.push_str(
        "<section id=\"gpus\"><h2>GPUs</h2><div class=\"scroll\"><table><thead><tr>\
         <th>GPU</th><th>State</th><th>Utilization</th><th>Memory (GiB)</th><th>Temp</th>\
         <th>Power (W)</th><th>Idle for</th><th>Processes</th></tr></thead><tbody>",
    );
    for g in &s.gpus {
        gpu_row(o, g);
        for m in &g.mig {
            mig_row(o, g, m);
        }
    }
    o.push_str("</tbody></table></div>");
    gpu_notes(o, s);
    o.push_str("</section>\n");
}

fn gpu_row(o: &mut String, g: &GpuStatus) {
    let power = match (g.power_watts, g.power_limit_watts) {
        (Some(p), Some(l)) => format!("{p:.0} of {l:.0}"),
        (Some(p), None) => format!("{p:.0}"),
        _ => "-".into(),
    };
    let _ = write!(
        o,
        "<tr class=\"gpu{lost}\" data-index=\"{i}\"><td><b>{i}</b> <span class=\"name\">{name}</span></td>\
         <td class=\"state\">{state}</td>\
         <td class=\"util\"><meter min=\"0\" max=\"1\" value=\"{u}\"></meter> {util}{sm}</td>\
         <td class=\"memory\">{used} of {total}</td><td class=\"temp\">{temp}</td>\
         <td class=\"power\">{power}</td><td class=\"idle\" data-idle=\"{idle_s}\">{idle}</td>\
         <td class=\"procs\">{procs}</td></tr>",
        lost = if g.up { "" } else { " lost" },
        i = g.index,
        name = escape(g.name.as_deref().unwrap_or("")),
        state = match (&g.health, g.up) {
            (Some(h), _) => escape(&h.state),
            (None, true) => "up".into(),
            (None, false) => "lost".into(),
        },
        u = g.utilization.unwrap_or(0.0),
        util = percent(g.utilization),
        sm = g.sm_active.map_or(String::new(), |sm| format!(
            " <span class=\"sm{flag}\">SM {}</span>",
            percent(Some(sm)),
            flag = if g.spinning { " spinning" } else { "" }
        )),
        used = gib(g.memory_used_bytes),
        total = gib(g.memory_total_bytes),
        temp = g
            .temperature_celsius
            .map_or("-".into(), |t| format!("{t:.0} °C")),
        idle_s = g.idle_seconds.unwrap_or(0.0),
        idle = g.idle_seconds.map_or("-".into(), duration),
        procs = escape(&processes(g)),
    );
}

fn mig_row(o: &mut String, g: &GpuStatus, m: &MigStatus) {
    let _ = write!(
        o,
        "<tr class=\"mig\" data-index=\"{i}\"><td>↳ <span class=\"name\">{name}</span></td>\
         <td class=\"state\">MIG</td><td class=\"util\">SM {sm}</td>\
         <td class=\"memory\">{used} of {total}</td><td class=\"temp\">-</td>\
         <td class=\"power\">-</td><td class=\"idle\" data-idle=\"{idle_s}\">{idle}</td>\
         <td class=\"procs\">{procs}</td></tr>",
        i = g.index,
        name = escape(&mig_name(m)),
        sm = percent(m.sm_active),
        used = gib(m.memory_used_bytes),
        total = gib(m.memory_total_bytes),
        idle_s = m.idle_seconds.unwrap_or(0.0),
        idle = m.idle_seconds.map_or("-".into(), duration),
        procs = process_count(m.process_count),
    );
}

/// Under the table: each GPU's health problems, then the underutilized and spinning hints.
fn gpu_notes(o: &mut String, s: &Status) {
    for g in &s.gpus {
        let Some(h) = g.health.as_ref().filter(|h| !h.problems.is_empty()) else {
            continue;
        };
        let _ = write!(
            o,
            "<p class=\"gpu-health {state}\" data-index=\"{i}\">GPU {i} is {state}:",
            i = g.index,
            state = escape(&h.state)
        );
        for p in &h.problems {
            let _ = write!(
                o,
                " {} ({}).",
                escape(&p.words),
                super::GpuHealthStatus::action_words(p)
            );
        }
        o.push_str("</p>");
    }
    for g in s.gpus.iter().filter(|g| g.underutilized) {
        let _ = write!(
            o,
            "<p class=\"hint\">{}</p>",
            escape(&underutilized_hint(g))
        );
    }
    for g in s.gpus.iter().filter(|g| g.spinning) {
        let _ = write!(
            o,
            "<p class=\"hint spinning\" data-index=\"{}\">{}</p>",
            g.index,
            escape(&spinning_hint(g))
        );
    }
}

/// The rules with their pending actions, the jobs, the holds and a spot interruption.
fn rules_section(o: &mut String, s: &Status, now: f64) {
    o.push_str("<section id=\"rules\"><h2>Rules</h2>");
    if s.rules.is_empty() {
        o.push_str("<p>No rules.</p>");
    }
    for r in &s.rules {
        rule_div(o, r, now);
    }
    if !s.jobs.is_empty() {
        jobs_table(o, s);
    }
    holds_list(o, s);
    if let Some(t) = s.interruption {
        let _ = write!(
            o,
            "<p class=\"interruption\">Spot interruption: the instance goes at {}.</p>",
            crate::time::rfc3339(t)
        );
    }
    o.push_str("</section>\n");
}

fn rule_div(o: &mut String, r: &RuleStatus, now: f64) {
    let counted = r.counted.map_or(String::new(), |c| {
        format!(
            "{} of the last {} periods breach ({} needed)",
            c.breaching, c.of, c.needed
        )
    });
    let _ = write!(
        o,
        "<div class=\"rule{b}\" data-rule=\"{name}\"><h3>{name} <span class=\"state\">{state}</span></h3>\
         <p class=\"summary\">{summary}</p><p class=\"counted\">{counted}</p>",
        b = if r.breaching { " breaching" } else { "" },
        name = escape(&r.name),
        state = if r.breaching { "breaching" } else { "not breaching" },
        summary = escape(&r.summary),
        counted = escape(&counted),
    );
    if let Some(p) = &r.pending {
        let _ = write!(
            o,
            "<div class=\"pending\"><p><b>{action}</b> in <span class=\"countdown\" data-due=\"{due}\">{left}</span> \
             (at {at}) unless {unless}. To postpone it:</p><pre><code class=\"hold\">{cmd}</code></pre></div>",
            action = escape(&p.action),
            unless = escape(&p.unless),
            due = p.due_at,
            left = duration(p.due_at - now),
            at = crate::time::rfc3339(p.due_at),
            cmd = escape(&p.hold_command),
        );
    }
    o.push_str("</div>");
}

fn jobs_table(o: &mut String, s: &Status) {
    o.push_str("<h2>Jobs</h2><table id=\"jobs\"><tr><th>Job</th><th>User</th><th>GPUs</th><th>Idle GPU time</th><th>Idle cost</th></tr>");
    for j in &s.jobs {
        let _ = write!(
            o,
            "<tr class=\"job\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&j.job),
            escape(j.user.as_deref().unwrap_or("unknown")),
            escape(&j.gpus.join(", ")),
            escape(&super::text::duration(j.idle_seconds)),
            j.idle_dollars
                .map_or("unknown".into(), |d| format!("${d:.2}")),
        );
    }
    o.push_str("</table>");
}

fn holds_list(o: &mut String, s: &Status) {
    o.push_str("<h2>Holds</h2><ul id=\"holds\">");
    if s.holds.is_empty() {
        o.push_str("<li>None.</li>");
    }
    for h in &s.holds {
        let until = h
            .until
            .map_or("without end (its expiry cannot be read)".into(), |t| {
                format!("until {}", crate::time::rfc3339(t))
            });
        let _ = write!(
            o,
            "<li class=\"hold\">{} {}: {}</li>",
            escape(&h.source),
            escape(&until),
            escape(&h.reason)
        );
    }
    o.push_str("</ul>");
}

/// The price, this period's spend and forecast, and each budget; left out when there is none.
fn cost_section(o: &mut String, s: &Status) {
    let c = &s.cost;
    if c.usd_per_hour.is_none() && c.budgets.is_empty() {
        return;
    }
    let money = |v: Option<f64>| v.map_or("-".into(), |v| format!("${v:.2}"));
    let _ = write!(
        o,
        "<section id=\"cost\"><h2>Cost</h2><p>Price <b class=\"price\">{price}</b> per hour ({source}). \
         This period: spent <b class=\"spent\">{spent}</b>, forecast <b class=\"forecast\">{forecast}</b>; \
         on idle GPUs so far <b class=\"idle-dollars\">${idle:.2}</b>, on unhealthy ones \
         <b class=\"unhealthy-dollars\">${unhealthy:.2}</b>.</p>",
        price = money(c.usd_per_hour),
        source = escape(c.price_source.as_deref().unwrap_or("unknown")),
        spent = money(c.spent),
        forecast = money(c.forecast),
        idle = c.idle_dollars,
        unhealthy = c.unhealthy_dollars,
    );
    for b in &c.budgets {
        budget_div(o, b);
    }
    o.push_str("</section>\n");
}

fn budget_div(o: &mut String, b: &BudgetStatus) {
    let thresholds: Vec<String> = b.thresholds.iter().map(|t| percent(Some(*t))).collect();
    let low = b.thresholds.first().copied().unwrap_or(1.0);
    let high = b.thresholds.last().copied().unwrap_or(1.0);
    if let Some(why) = &b.unknown {
        let _ = write!(
            o,
            "<div class=\"budget unknown\" data-budget=\"{name}\"><p>{name}: spend <b>unknown</b>, so no rule tightens on it \
             (limit ${limit:.2}): <span class=\"why\">{why}</span></p></div>",
            name = escape(&b.name),
            limit = b.limit_usd,
            why = escape(why),
        );
        return;
    }
    let _ = write!(
        o,
        "<div class=\"budget\" data-budget=\"{name}\"><p>{name}: {spent} of ${limit:.2} spent, forecast {forecast}; \
         alerts at {th}</p><meter min=\"0\" max=\"1\" low=\"{low}\" high=\"{high}\" optimum=\"0\" value=\"{v}\"></meter></div>",
        name = escape(&b.name),
        spent = percent(b.spent_ratio),
        limit = b.limit_usd,
        forecast = percent(b.forecast_ratio),
        th = thresholds.join(", "),
        v = b.spent_ratio.unwrap_or(0.0).min(1.0),
    );
}

fn events_section(o: &mut String, s: &Status) {
    o.push_str("<section id=\"events\"><h2>Last events</h2><ol>");
    if s.events.is_empty() {
        o.push_str("<li>None yet.</li>");
    }
    for e in &s.events {
        let _ = write!(o, "<li>{}</li>", escape(&e.text));
    }
    o.push_str("</ol></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_outside_is_escaped() {
        let mut s = super::super::from_snapshot(&crate::gpu::Snapshot::default());
        s.node.hostname = "<script>alert(1)</script>".into();
        s.node.labels.insert("team".into(), "\"><img src=x>".into());
        s.gpus.push(super::super::GpuStatus {
            name: Some("<b>GPU</b>".into()),
            up: true,
            ..Default::default()
        });
        let page = render(&s, 0.0);
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("<img"), "{page}");
        assert!(!page.contains("<b>GPU"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn the_page_is_its_live_fragment_inside_the_frame() {
        let mut s = super::super::from_snapshot(&crate::gpu::Snapshot::default());
        s.gpus.push(super::super::GpuStatus {
            index: 1,
            up: true,
            utilization: Some(1.0),
            sm_active: Some(0.02),
            spinning: true,
            ..Default::default()
        });
        let live = fragment(&s, 0.0);
        assert!(render(&s, 0.0).contains(&format!("<main id=\"main\">\n{live}</main>")));
        assert!(
            live.contains("100% <span class=\"sm spinning\">SM 2%</span>"),
            "{live}"
        );
        assert!(
            live.contains("GPU 1 reads 100% busy, 2% SM active"),
            "{live}"
        );
    }

    #[test]
    fn a_budget_whose_spend_is_unknown_says_why_escaped() {
        let mut s = super::super::from_snapshot(&crate::gpu::Snapshot::default());
        s.cost.budgets.push(super::super::BudgetStatus {
            name: "team-ml".into(),
            limit_usd: 40000.0,
            thresholds: vec![0.5, 1.0],
            unknown: Some("the API answered <b>503</b>".into()),
            ..Default::default()
        });
        let live = fragment(&s, 0.0);
        assert!(
            live.contains(
                "team-ml: spend <b>unknown</b>, so no rule tightens on it (limit $40000.00): \
                 <span class=\"why\">the API answered &lt;b&gt;503&lt;/b&gt;</span>"
            ),
            "{live}"
        );
        assert!(!live.contains("<meter"), "{live}");
    }

    #[test]
    fn the_page_names_no_other_host() {
        for text in [render(&Status::default(), 0.0).as_str(), SCRIPT, STYLE] {
            assert!(!text.contains("http://"), "{text}");
            assert!(!text.contains("https://"), "{text}");
            assert!(!text.contains("//cdn"), "{text}");
            assert!(!text.contains("@import"), "{text}");
        }
    }
}
