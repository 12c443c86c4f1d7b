//! `gpuwatch status`: the status page's facts for a terminal, from the running daemon or, with
//! `--state-dir`, from its state files. The exit status says the health: 0 ok, 1 an action is
//! pending, 2 NVML or a GPU is down, 3 the status cannot be read.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::Config;
use crate::state::{HoldStatus, StateDir};
use crate::status::{Health, PendingAction, RuleStatus, Status};

/// The exit status when the status cannot be read at all (as monitoring checks say UNKNOWN).
pub const UNKNOWN: u8 = 3;

/// Where the status comes from.
pub enum From {
    Daemon {
        url: Option<String>,
        user: Option<String>,
        cacert: Option<PathBuf>,
        /// A password may go over plain HTTP beyond loopback.
        insecure: bool,
    },
    StateDir(PathBuf),
}

pub fn run(config: &Config, from: From, json: bool) -> ExitCode {
    let status = match from {
        From::Daemon {
            url,
            user,
            cacert,
            insecure,
        } => ask_daemon(config, url, user, cacert, insecure),
        From::StateDir(dir) => read_state(config, &StateDir::new(&dir)),
    };
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            eprintln!("status: {e}");
            return UNKNOWN.into();
        }
    };
    let out = if json {
        serde_json::to_string_pretty(&status).unwrap_or_default() + "\n"
    } else {
        crate::status::text::render(&status, crate::time::now())
    };
    // A closed stdout (`| head`) is no failure of the status.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes());
    status.health.exit_code().into()
}

/// The daemon's URL: `--url`, else `[server] listen` with a wildcard address read as loopback,
/// and https when the web config has TLS.
fn base_url(config: &Config, url: Option<String>) -> String {
    if let Some(u) = url {
        return if u.ends_with('/') { u } else { u + "/" };
    }
    let mut addr = config.server.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let tls = config.server.web.as_ref().is_some_and(|w| w.tls.is_some());
    format!("{}://{addr}/", if tls { "https" } else { "http" })
}

fn ask_daemon(
    config: &Config,
    url: Option<String>,
    user: Option<String>,
    cacert: Option<PathBuf>,
    insecure: bool,
) -> Result<Status, String> {
    let base = base_url(config, url);
    let web = config.server.web.as_ref();
    let mut client = crate::client::http_client()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(3))
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none());
    // Trust what the daemon presents: the CA given, else its own certificate.
    let cert = match (&cacert, web.and_then(|w| w.tls.as_ref())) {
        (Some(path), _) => Some(read_pem(path)?),
        (None, Some(tls)) => match &tls.cert {
            crate::config::web::Pem::File(path) => read_pem(path).ok(),
            crate::config::web::Pem::Inline(text) => Some(text.as_bytes().to_vec()),
        },
        (None, None) => None,
    };
    if let Some(pem) = cert {
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("the CA certificate is not PEM: {e}"))?;
        for c in certs {
            client = client.add_root_certificate(c);
        }
    }
    let client = client
        .build()
        .map_err(|e| format!("cannot set up an HTTP client: {e}"))?;
    let password = std::env::var("GPUWATCH_PASSWORD").ok();
    // The scheme as the client reads it (`HTTP://` is plain HTTP too).
    let plain = reqwest::Url::parse(&base).map_or(true, |u| u.scheme() != "https");
    if password.is_some() && user.is_some() && plain && !loopback(&base) && !insecure {
        return Err(format!(
            "{base} is plain HTTP beyond this machine: the password would cross the network in the clear; use https (or --insecure)"
        ));
    }
    let needs_auth = web.is_some_and(|w| !w.users.is_empty());
    if needs_auth && (user.is_none() || password.is_none()) {
        return Err(
            "the daemon asks for basic auth: give --user NAME, with the password in GPUWATCH_PASSWORD"
                .into(),
        );
    }
    let url = format!("{base}api/v1/status");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let asked = async {
        let mut request = client.get(&url);
        if let Some(u) = &user {
            request = request.basic_auth(u, password.as_deref());
        }
        let response = request.send().await.map_err(|e| {
            format!(
                "cannot reach the daemon at {url}: {}; is it running? (--state-dir reads its state files instead)",
                crate::notify::error_chain(&e)
            )
        })?;
        let code = response.status();
        let body = read_body(response, &url).await?;
        if !code.is_success() {
            return Err(format!(
                "{url} answered {code}: {}",
                crate::redact::brief(body.trim(), 300)
            ));
        }
        serde_json::from_str(&body).map_err(|e| format!("{url} answered what is not a status: {e}"))
    };
    // The client's own timeout bounds each request; this bounds the whole exchange.
    runtime.block_on(async {
        tokio::time::timeout(ANSWER_TIME, asked)
            .await
            .unwrap_or_else(|_| Err(format!("{url} did not answer within {ANSWER_TIME:?}")))
    })
}

/// The largest status answer read: a node's status is a few KiB.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// The longest the whole exchange with the daemon may take.
const ANSWER_TIME: Duration = Duration::from_secs(15);

/// Reads an answer's body, at most `MAX_ANSWER_BYTES` of it, as text.
async fn read_body(response: reqwest::Response, url: &str) -> Result<String, String> {
    let body = crate::client::read_body(response, MAX_ANSWER_BYTES)
        .await
        .map_err(|e| format!("{url}: {}", crate::notify::error_chain(&e)))?
        .ok_or_else(|| {
            format!(
                "{url} answered more than {} MiB; that is no status",
                MAX_ANSWER_BYTES >> 20
            )
        })?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Whether the URL's host is this machine.
fn loopback(url: &str) -> bool {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            let host = u.host_str()?.trim_start_matches('[').trim_end_matches(']');
            Some(
                host == "localhost"
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback()),
            )
        })
        .unwrap_or(false)
}

fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, String> {
    crate::files::read_capped(
        path,
        crate::http::tls::MAX_PEM_BYTES,
        crate::files::Links::Follow,
    )
    .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The status from the state files, while the daemon is down: the rules' states and pending
/// actions, holds, idle dollars and the last events. The GPUs are not read, and not judged.
fn read_state(config: &Config, dir: &StateDir) -> Result<Status, String> {
    let persisted = dir.peek()?;
    let hold = crate::status::hold_command(&config.path);
    let mut status = Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        watching: true,
        ..Status::default()
    };
    status.node.hostname = format!("{} (state files only)", dir.path().display());
    status.rules = persisted
        .engine
        .rules
        .iter()
        .map(|(name, rs)| {
            let rule = config.rules.iter().find(|r| r.owns_state(name));
            RuleStatus {
                name: name.clone(),
                summary: rule.map_or_else(|| "not in this config".to_string(), |r| r.describe()),
                breaching: rs.breaching,
                counted: None,
                pending: rs.pending.as_ref().map(|p| PendingAction {
                    action: p.action.to_string(),
                    warned_at: p.warned_at,
                    due_at: p.due_at,
                    hold_command: hold.clone(),
                    unless: rule
                        .map_or_else(|| "the GPUs are used again".to_string(), |r| r.calls_off()),
                }),
            }
        })
        .collect();
    let now = crate::time::now();
    status.holds = crate::state::holds_in_force(now, &dir.hold(), &HoldStatus::None);
    status.cost.idle_dollars = persisted.idle_dollars;
    status.cost.unhealthy_dollars = persisted.unhealthy_dollars;
    status.events = crate::status::recent_events(&dir.audit_path(), crate::status::EVENTS);
    // With the daemon down nothing says all is well: unknown, unless an action is pending.
    status.health = if status.rules.iter().any(|r| r.pending.is_some()) {
        Health::Pending
    } else {
        Health::Unknown
    };
    status.nvml.error =
        Some("not read: the daemon is down, and the state files say nothing of the GPUs".into());
    Ok(status)
}
