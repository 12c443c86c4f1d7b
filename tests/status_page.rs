//! The status page in a real browser (Debian's chromium, headless), over `gpuwatch demo`:
//! - the first paint is the server's: the facts are there as text, without JavaScript;
//! - with JavaScript the page updates itself in place from `/api/v1/status`, without a reload:
//!   four GPU rows, GPU 3's idle time growing, and during the demo's warning a countdown to the
//!   dry-run stop, with the `gpuwatch hold` command that postpones it;
//! - it asks nothing of any host but gpuwatch, and throws no exception;
//! - screenshots, wide and light, and phone-sized and dark, are kept as test artifacts
//!   (`target/tmp/status-page/`).
//!
//! The demo takes about 90 s to warn: GPU 3 winds down from 20 s to 60 s, then the rule needs two
//! idle 15 s periods.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::browser::Browser;

/// `gpuwatch demo` on a port the kernel chose, stopped when dropped.
struct Demo {
    child: Child,
    addr: SocketAddr,
}

impl Demo {
    fn start() -> Demo {
        let mut child = Command::new(common::BIN)
            .args(["demo", "--listen", "127.0.0.1:0"])
            .env("GPUWATCH_FAKE_NVML_LIB", common::fake_library())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let addr = stdout
            .lines()
            .map_while(Result::ok)
            .find_map(|l| common::ready_address(&l))
            .expect("the demo said where it listens");
        Demo { child, addr }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn number(v: &serde_json::Value) -> f64 {
    v.as_f64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// "1m 05s" or "17s" as seconds.
fn seconds(text: &str) -> f64 {
    text.split_whitespace()
        .map(|part| {
            let (n, unit) = part.split_at(part.len() - 1);
            let n: f64 = n.parse().unwrap_or(f64::NAN);
            match unit {
                "h" => n * 3600.0,
                "m" => n * 60.0,
                _ => n,
            }
        })
        .sum()
}

#[test]
fn the_status_page_shows_the_demo_live_in_a_real_browser() {
    let demo = Demo::start();
    let origin = format!("http://{}/", demo.addr);

    // Await the first status with the watch's view in it, through the long-poll.
    let mut seq = 0;
    loop {
        let r = common::get(
            demo.addr,
            &format!("/api/v1/status?after={seq}&timeout=10s"),
        );
        let s = r.json();
        // GPM's first reading needs two samples: wait for GPU 1's SM activity too.
        if !s["rules"].as_array().unwrap().is_empty()
            && s["cost"]["spent"].is_number()
            && s["gpus"][1]["sm_active"].is_number()
        {
            break;
        }
        seq = s["seq"].as_u64().unwrap();
        assert!(seq < 30, "no rules or spend in the status: {s}");
    }

    // Without JavaScript: the server's page holds the facts as text.
    let page = common::get(demo.addr, "/");
    assert_eq!(page.status, 200);
    assert!(
        page.headers
            .to_ascii_lowercase()
            .contains("content-security-policy: default-src 'none'"),
        "{}",
        page.headers
    );
    for fact in [
        "4 of 4 GPUs up",
        "NVML up, driver 550.54.15",
        "demo-any-gpu-idle",
        "stop when any GPU&#39;s average gpu_utilization is below 5%",
        "Price <b class=\"price\">$49.16</b>",
        "demo-monthly",
        "GPU 2 is underutilized",
        // GPU 1's SMs beside its utilization, and the flag: busy by utilization, idle SMs.
        "100% <span class=\"sm spinning\">SM 2%</span>",
        "GPU 1 reads 100% busy, 2% SM active: a process spins on a tiny kernel",
    ] {
        assert!(page.body.contains(fact), "{fact} not in\n{}", page.body);
    }
    // The live part comes rendered by the server too: the same markup as the first paint.
    let live = common::get(demo.addr, "/api/v1/status/live").json();
    let html = live["html"].as_str().unwrap();
    assert!(html.starts_with("<section id=\"summary\">"), "{html}");
    assert!(html.contains("GPU 1 reads 100% busy"), "{html}");
    assert!(live["title"].as_str().unwrap().starts_with("gpuwatch on "));

    let mut b = Browser::open(&origin, 1280, 1600);
    // A marker that a reload would lose.
    b.await_value(
        Duration::from_secs(20),
        "document.readyState === 'complete' && (window.__kept = 1)",
        |v| v == 1,
    );
    let rows = b.await_value(
        Duration::from_secs(20),
        "Number(document.body.dataset.updates || 0) >= 1 && document.querySelectorAll('tr.gpu').length",
        |v| v.as_u64().is_some_and(|n| n > 0),
    );
    assert_eq!(rows, 4, "GPU rows");
    // After an update from the fragment: SM activity beside utilization, and GPU 1 flagged.
    let sm = b.eval(
        "document.querySelector('tr.gpu[data-index=\"1\"] td.util .sm.spinning').textContent",
    );
    assert_eq!(sm, "SM 2%", "GPU 1's SM activity");
    let flag = b.eval("document.querySelector('p.hint.spinning[data-index=\"1\"]').textContent");
    assert!(
        flag.as_str()
            .unwrap()
            .contains("a process spins on a tiny kernel"),
        "{flag}"
    );
    assert_eq!(
        b.eval("document.querySelectorAll('p.hint.spinning').length"),
        1,
        "only GPU 1 spins"
    );

    // GPU 3 goes idle, and its idle time grows on the page as samples come.
    let idle = "Number(document.querySelector('tr.gpu[data-index=\"3\"] td.idle').dataset.idle)";
    let first = number(&b.await_value(Duration::from_secs(120), idle, |v| number(v) > 0.0));
    let later = number(&b.await_value(Duration::from_secs(20), idle, |v| number(v) >= first + 3.0));
    println!("GPU 3 idle for {first:.0} s, then {later:.0} s");

    // The warning: a countdown that counts down, and the command that postpones the action.
    let countdown = "(document.querySelector('.rule[data-rule=\"demo-any-gpu-idle\"] .pending .countdown') || {}).textContent || ''";
    let left = b.await_value(Duration::from_secs(90), countdown, |v| {
        v.as_str().is_some_and(|s| !s.is_empty())
    });
    let left = seconds(left.as_str().unwrap());
    let sooner = b.await_value(Duration::from_secs(10), countdown, |v| {
        v.as_str()
            .is_some_and(|s| !s.is_empty() && seconds(s) <= left - 2.0)
    });
    println!("countdown {left} s, then {sooner}");
    let hold = b.eval(
        "document.querySelector('.rule[data-rule=\"demo-any-gpu-idle\"] .pending code.hold').textContent",
    );
    let hold = hold.as_str().unwrap();
    assert!(
        hold.starts_with("gpuwatch hold 1h --reason") && hold.contains("--config "),
        "{hold}"
    );
    assert_eq!(b.eval("window.__kept"), 1, "the page reloaded");
    assert!(
        b.eval("document.querySelector('#events ol').textContent")
            .as_str()
            .unwrap()
            .contains("warns: stop at"),
        "the warning is among the last events"
    );

    // Screenshots: wide and light, phone-sized and dark.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page");
    std::fs::create_dir_all(&dir).unwrap();
    b.emulate(1280, 1600, false, false);
    b.screenshot(&dir.join("wide-light.png"));
    b.emulate(390, 844, true, true);
    let overflow = b.eval("document.documentElement.scrollWidth <= window.innerWidth");
    assert_eq!(overflow, true, "the page is wider than a phone");
    b.screenshot(&dir.join("phone-dark.png"));
    println!("screenshots in {}", dir.display());

    // Nothing but gpuwatch was asked for anything, and nothing threw.
    b.eval("1");
    assert!(b.requests.len() >= 4, "{:?}", b.requests);
    assert!(
        b.requests
            .iter()
            .any(|u| u.contains("api/v1/status/live?after=")),
        "the script long-polls the rendered fragment: {:?}",
        b.requests
    );
    for url in &b.requests {
        assert!(url.starts_with(&origin), "a request elsewhere: {url}");
    }
    assert!(b.exceptions.is_empty(), "{:?}", b.exceptions);
}
