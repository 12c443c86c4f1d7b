//! A real browser for tests: Debian's chromium, headless, driven over the DevTools protocol on
//! a pipe (`--remote-debugging-pipe`: JSON messages separated by NUL on fds 3 and 4), so no
//! websocket client is needed. It records every request the page makes and every uncaught
//! exception. Background networking (updates, sync, accounts) is off, so what it requests is
//! what the page asks for.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub struct Browser {
    child: Child,
    to: File,
    from: Receiver<Value>,
    /// Events not yet looked at.
    events: VecDeque<Value>,
    next_id: u64,
    session: String,
    /// Every URL the page requested.
    pub requests: Vec<String>,
    /// Every uncaught exception in the page.
    pub exceptions: Vec<Value>,
    _profile: tempfile::TempDir,
}

/// The chromium binary, or a failure that says how to get it.
fn chromium() -> &'static str {
    let ok = Command::new("chromium")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "this test drives Debian's chromium, headless: run scripts/test, which installs it \
         (apt-get install chromium)"
    );
    "chromium"
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into the array we pass.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    /// Starts chromium with a window of `width` x `height` and opens `url` in it.
    pub fn open(url: &str, width: u32, height: u32) -> Browser {
        use std::os::fd::AsRawFd;
        let profile = tempfile::tempdir().unwrap();
        let (cmd_read, cmd_write) = pipe();
        let (res_read, res_write) = pipe();
        let (r, w) = (cmd_read.as_raw_fd(), res_write.as_raw_fd());
        let mut command = Command::new(chromium());
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                "--mute-audio",
            ])
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                File::create(profile.path().join("stderr.txt")).unwrap(),
            ));
        // SAFETY: between fork and exec only dup2 runs, which is async-signal-safe. dup2 clears
        // close-on-exec on the copies, so chromium inherits exactly fds 3 and 4.
        unsafe {
            command.pre_exec(move || {
                // Moved above 4 first, so that neither is overwritten by the other's dup2.
                let r = libc::fcntl(r, libc::F_DUPFD_CLOEXEC, 10);
                let w = libc::fcntl(w, libc::F_DUPFD_CLOEXEC, 10);
                if r < 0 || w < 0 || libc::dup2(r, 3) < 0 || libc::dup2(w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("start chromium");
        drop(cmd_read);
        drop(res_write);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut reader = BufReader::new(File::from(res_read));
        std::thread::spawn(move || loop {
            let mut buf = Vec::new();
            match reader.read_until(0, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    buf.pop();
                    if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            to: File::from(cmd_write),
            from: rx,
            events: VecDeque::new(),
            next_id: 1,
            session: String::new(),
            requests: Vec::new(),
            exceptions: Vec::new(),
            _profile: profile,
        };
        let target = b.call("Target.createTarget", json!({"url": "about:blank"}));
        let target = target["targetId"].as_str().unwrap().to_string();
        let attached = b.call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        );
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        b.call("Network.enable", json!({}));
        b.call("Runtime.enable", json!({}));
        b.call("Page.enable", json!({}));
        b.call("Page.navigate", json!({"url": url}));
        b
    }

    /// Sends one command (to the page once attached) and returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        if let Err(e) = self.to.write_all(&bytes) {
            panic!(
                "chromium is gone ({e}): {}",
                std::fs::read_to_string(self._profile.path().join("stderr.txt"))
                    .unwrap_or_default()
            );
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = match self.from.recv_timeout(left) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => panic!("chromium did not answer {method}"),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "chromium exited during {method}: {}",
                    std::fs::read_to_string(self._profile.path().join("stderr.txt"))
                        .unwrap_or_default()
                ),
            };
            if m["id"] == json!(id) {
                if let Some(e) = m.get("error") {
                    panic!("{method}: {e}");
                }
                return m["result"].clone();
            }
            self.note(m);
        }
    }

    /// Records what an event says about requests and exceptions.
    fn note(&mut self, m: Value) {
        match m["method"].as_str() {
            Some("Network.requestWillBeSent") => {
                if let Some(url) = m["params"]["request"]["url"].as_str() {
                    self.requests.push(url.to_string());
                }
            }
            Some("Runtime.exceptionThrown") => self.exceptions.push(m["params"].clone()),
            _ => {}
        }
        self.events.push_back(m);
        if self.events.len() > 1000 {
            self.events.pop_front();
        }
    }

    /// Evaluates a JavaScript expression in the page and returns its value.
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Evaluates `expression` until `done` holds for its value, which it returns; fails after
    /// `limit`. The page updates itself; this only looks, twice a second.
    pub fn await_value(
        &mut self,
        limit: Duration,
        expression: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let v = self.eval(expression);
            if done(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{expression} never met the condition within {limit:?}; last: {v}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// A PNG of the page as it is now, written to `path`.
    pub fn screenshot(&mut self, path: &std::path::Path) {
        use base64::Engine as _;
        let r = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).unwrap();
    }

    /// Emulates a screen of this size (a phone with `mobile`) and colour scheme.
    pub fn emulate(&mut self, width: u32, height: u32, mobile: bool, dark: bool) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        );
        self.call(
            "Emulation.setEmulatedMedia",
            json!({"features": [{"name": "prefers-color-scheme",
                                 "value": if dark { "dark" } else { "light" }}]}),
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
