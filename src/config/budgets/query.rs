//! `source = "prometheus"`: the team's spend, read from the fleet's Prometheus (or Thanos,
//! Mimir, VictoriaMetrics) with an instant query. The keys, their checks, and the keys that
//! belong to no other source.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::super::check::{duration, pick, url};
use super::RawBudget;
use crate::cost::calendar::Period;

/// Where a Prometheus budget's spend comes from, and how it is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct PrometheusSource {
    /// The API's base URL, without a trailing `/` (`/api/v1/query` is added).
    pub url: String,
    /// PromQL giving one value: USD spent this period.
    pub query: String,
    /// PromQL giving one value: USD forecast at the end of the period.
    pub forecast_query: Option<String>,
    /// The period the query's spend covers: a new period alerts afresh.
    pub period: Period,
    /// The longest one query may take, connection included.
    pub timeout: Duration,
    /// PEM certificates to trust for an `https://` URL, instead of the public roots.
    pub ca_file: Option<PathBuf>,
    pub auth: QueryAuth,
    /// Sent with every query (Mimir's `X-Scope-OrgID`, say), in name order.
    pub headers: Vec<(String, String)>,
}

/// How gpuwatch proves itself to the API. Secrets live in files, read at every query (so a
/// rotated token is picked up) and never logged.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryAuth {
    None,
    Basic {
        username: String,
        password_file: PathBuf,
    },
    Bearer {
        token_file: PathBuf,
    },
}

/// The longest query kept: a query is config, not data.
const MAX_QUERY: usize = 4096;
/// At most this many extra headers.
const MAX_HEADERS: usize = 16;
/// Headers gpuwatch sets itself, or that would change what the request means.
const RESERVED_HEADERS: [&str; 16] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "expect",
    "accept-encoding",
    // A part of the answer, or one that depends on a cache: not the whole, fresh answer.
    "range",
    "if-range",
    "if-modified-since",
    "if-none-match",
];

/// Checks the keys of a Prometheus budget.
pub(super) fn validate(
    raw: &RawBudget,
    invalid: &mut impl FnMut(&str, String),
) -> Option<PrometheusSource> {
    let base = base_url(raw, invalid);
    let query = check_query(invalid, "query", raw.query.as_deref(), true);
    let forecast_query = check_query(
        invalid,
        "forecast_query",
        raw.forecast_query.as_deref(),
        false,
    );
    let period = match raw.period.as_deref() {
        None => Some(None),
        Some(p) => pick(
            invalid,
            "period",
            p,
            &[
                ("day", Period::Day),
                ("daily", Period::Day),
                ("week", Period::Week),
                ("weekly", Period::Week),
                ("month", Period::Month),
                ("monthly", Period::Month),
            ],
        )
        .map(Some),
    };
    let timeout = timeout(raw, invalid);
    let ca_file = file(invalid, "ca_file", &raw.ca_file);
    let auth = auth(raw, invalid);
    let headers = check_headers(invalid, &raw.headers);
    match (
        base,
        query,
        forecast_query,
        period,
        timeout,
        ca_file,
        auth,
        headers,
    ) {
        (
            Some(base),
            Some(Some(query)),
            Some(forecast_query),
            Some(period),
            Some(timeout),
            Some(ca_file),
            Some(auth),
            Some(headers),
        ) => Some(PrometheusSource {
            url: base.trim_end_matches('/').to_string(),
            query,
            forecast_query,
            // A calendar month by default, as the shipped fleet rules count it.
            period: period.unwrap_or(Period::Month),
            timeout,
            ca_file,
            auth,
            headers,
        }),
        _ => None,
    }
}

/// The API's base URL, where one is given and it passes `check_base`.
fn base_url(raw: &RawBudget, invalid: &mut impl FnMut(&str, String)) -> Option<String> {
    let base = match raw.url.as_deref() {
        None => {
            invalid(
                "url",
                "a prometheus budget needs the url of the Prometheus that scrapes the fleet".into(),
            );
            None
        }
        Some(u) => url(invalid, "url", u, true).flatten(),
    };
    base.filter(|u| check_base(raw, u, invalid))
}

/// Whether a well-formed URL is a base URL fit for the budget's credentials and CA: without
/// credentials, path, query or fragment in it, and with TLS where a secret leaves the machine.
fn check_base(raw: &RawBudget, u: &str, invalid: &mut impl FnMut(&str, String)) -> bool {
    let rest = u.split_once("://").map_or("", |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let plain_http = u.starts_with("http://");
    if authority.contains('@') {
        invalid(
            "url",
            format!(
                "\"{}\" has credentials in it; give username and password_file instead, so that they are never logged",
                redact(u)
            ),
        );
    } else if let Some(at) = rest.find("/api/v1") {
        invalid(
            "url",
            format!(
                "\"{u}\" already names the API path (\"{}\"); give the base URL, such as https://prometheus.internal:9090 (gpuwatch adds /api/v1/query)",
                &rest[at..]
            ),
        );
    } else if rest.contains(['?', '#']) {
        let base = u.split(['?', '#']).next().unwrap_or("");
        invalid(
            "url",
            format!("\"{base}...\" has a query or fragment; give the API's base URL, such as https://prometheus.internal:9090"),
        );
    } else if plain_http && !loopback && (raw.username.is_some() || raw.bearer_token_file.is_some())
    {
        invalid(
            "url",
            format!("\"{u}\" is plain HTTP beyond this machine: the credentials would cross the network in the clear; use https"),
        );
    } else if plain_http && raw.ca_file.is_some() {
        invalid(
            "ca_file",
            format!("is given, but \"{u}\" is plain HTTP: a CA is for https"),
        );
    } else {
        return true;
    }
    false
}

/// The longest one query may take.
fn timeout(raw: &RawBudget, invalid: &mut impl FnMut(&str, String)) -> Option<Duration> {
    // Unset, a query may take 10 s, or the poll interval where that is shorter: a timeout
    // the user never set must not make their poll_interval wrong.
    let default_timeout = raw
        .poll_interval
        .as_deref()
        .and_then(|p| humantime::parse_duration(p).ok())
        .filter(|p| *p >= Duration::from_millis(100))
        .map_or(Duration::from_secs(10), |p| p.min(Duration::from_secs(10)));
    duration(
        invalid,
        "timeout",
        &raw.timeout
            .clone()
            .unwrap_or_else(|| humantime::format_duration(default_timeout).to_string()),
        Duration::from_millis(100)..=Duration::from_secs(300),
    )
}

/// A file key: `Some(None)` where it is unset, `None` where it is empty.
fn file(
    invalid: &mut impl FnMut(&str, String),
    key: &str,
    v: &Option<String>,
) -> Option<Option<PathBuf>> {
    match v {
        Some(p) if p.trim().is_empty() => {
            invalid(key, "\"\" is empty; name a file".into());
            None
        }
        Some(p) => Some(Some(PathBuf::from(p))),
        None => Some(None),
    }
}

/// Basic auth (username and password_file), a bearer token, or none; never two.
fn auth(raw: &RawBudget, invalid: &mut impl FnMut(&str, String)) -> Option<QueryAuth> {
    let password_file = file(invalid, "password_file", &raw.password_file);
    let token_file = file(invalid, "bearer_token_file", &raw.bearer_token_file);
    match (&raw.username, password_file, token_file) {
        (_, None, _) | (_, _, None) => None,
        (Some(_), _, Some(Some(_))) | (None, Some(Some(_)), Some(Some(_))) => {
            invalid(
                "bearer_token_file",
                "give username and password_file, or bearer_token_file, not both".into(),
            );
            None
        }
        (Some(u), Some(Some(password_file)), Some(None)) => {
            if u.is_empty() || u.contains(':') || u.chars().any(char::is_control) {
                invalid(
                    "username",
                    format!("{u:?} is not a basic auth user name (not empty, no ':' or control characters)"),
                );
                None
            } else {
                Some(QueryAuth::Basic {
                    username: u.clone(),
                    password_file,
                })
            }
        }
        (Some(_), Some(None), Some(None)) => {
            invalid(
                "password_file",
                "basic auth needs the file that holds the password, beside username".into(),
            );
            None
        }
        (None, Some(Some(_)), Some(None)) => {
            invalid(
                "username",
                "password_file is given without a username".into(),
            );
            None
        }
        (None, Some(None), Some(Some(token_file))) => Some(QueryAuth::Bearer { token_file }),
        (None, Some(None), Some(None)) => Some(QueryAuth::None),
    }
}

/// Resolves the source's files against the config's directory, and checks now that each can
/// be read (the CA as PEM certificates, a secret as one non-empty line), so that a typo is an
/// exit 64 at start, not an unknown spend later. The daemon reads the secrets again at every
/// query.
pub fn resolve_files(
    q: &mut PrometheusSource,
    base: &std::path::Path,
    key: &str,
) -> Result<(), crate::config::ConfigError> {
    use crate::config::{file_path, ConfigError};
    let resolve = |p: &mut PathBuf| *p = file_path(base, &p.to_string_lossy());
    if let Some(ca) = &mut q.ca_file {
        resolve(ca);
        read_ca(ca).map_err(|message| ConfigError::Invalid {
            key: format!("{key}.ca_file"),
            message,
        })?;
    }
    let (k, file) = match &mut q.auth {
        QueryAuth::None => return Ok(()),
        QueryAuth::Basic { password_file, .. } => ("password_file", password_file),
        QueryAuth::Bearer { token_file } => ("bearer_token_file", token_file),
    };
    resolve(file);
    read_secret(file).map_err(|message| ConfigError::Invalid {
        key: format!("{key}.{k}"),
        message,
    })?;
    Ok(())
}

/// The CA certificates in a PEM file.
pub fn read_ca(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, String> {
    let text = crate::files::read_text(
        path,
        crate::config::MAX_FILE_BYTES,
        crate::files::Links::Follow,
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(text.as_bytes())
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// A password or token file: its one line, trailing newline removed. The secret itself never
/// appears in an error.
pub fn read_secret(path: &std::path::Path) -> Result<String, String> {
    let text = crate::files::read_text(
        path,
        crate::config::MAX_SECRET_BYTES,
        crate::files::Links::Follow,
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() || secret.contains(['\n', '\r']) {
        return Err(format!(
            "{}: is not one non-empty line (the secret alone)",
            path.display()
        ));
    }
    // It goes into a header, where no control character may be.
    if secret.chars().any(char::is_control) {
        return Err(format!(
            "{}: holds a control character; a secret is one line of printable text",
            path.display()
        ));
    }
    Ok(secret.to_string())
}

fn check_query(
    invalid: &mut impl FnMut(&str, String),
    key: &str,
    value: Option<&str>,
    required: bool,
) -> Option<Option<String>> {
    match value.map(str::trim) {
        None if required => {
            invalid(
                key,
                "a prometheus budget needs the PromQL query that gives the spend this period, such as 'team:gpuwatch_spend_dollars:sum{team=\"ml\"}'".into(),
            );
            None
        }
        None => Some(None),
        Some("") => {
            invalid(key, "\"\" is empty; give a PromQL expression".into());
            None
        }
        Some(q) if q.len() > MAX_QUERY => {
            invalid(
                key,
                format!("is {} bytes long, more than {MAX_QUERY}", q.len()),
            );
            None
        }
        Some(q) if q.chars().any(|c| c.is_control() && c != '\n' && c != '\t') => {
            invalid(key, format!("{q:?} contains a control character"));
            None
        }
        Some(q) => Some(Some(q.to_string())),
    }
}

fn check_headers(
    invalid: &mut impl FnMut(&str, String),
    headers: &BTreeMap<String, String>,
) -> Option<Vec<(String, String)>> {
    if headers.len() > MAX_HEADERS {
        invalid(
            "headers",
            format!("has {} headers, more than {MAX_HEADERS}", headers.len()),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    for (name, value) in headers {
        let key = format!("headers.{}", crate::redact::plain(name));
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            invalid(&key, format!("{name:?} is not an HTTP header name"));
            ok = false;
        } else if out
            .iter()
            .any(|(n, _): &(String, String)| n.eq_ignore_ascii_case(name))
        {
            invalid(
                &key,
                format!("\"{name}\" is given twice (header names are not case-sensitive)"),
            );
            ok = false;
        } else if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            let lower = name.to_ascii_lowercase();
            let why =
                if ["authorization", "proxy-authorization", "cookie"].contains(&lower.as_str()) {
                    "credentials go in username and password_file, or bearer_token_file"
                } else if lower == "range" || lower.starts_with("if-") {
                    "the answer must be whole and fresh"
                } else {
                    "gpuwatch sets it, or it would change what the request means"
                };
            invalid(
                &key,
                format!("\"{name}\" is not a header the config may set ({why})"),
            );
            ok = false;
        } else if value.len() > 1024
            || !value
                .bytes()
                .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
        {
            // The value is not quoted: it may be a secret.
            invalid(
                &key,
                "is not a header value (at most 1024 bytes of printable ASCII)".into(),
            );
            ok = false;
        } else {
            out.push((name.clone(), value.clone()));
        }
    }
    ok.then_some(out)
}

/// Refuses the Prometheus keys on a budget of another source: a `query` on a local budget
/// would be ignored silently otherwise.
pub(super) fn refuse_elsewhere(raw: &RawBudget, invalid: &mut impl FnMut(&str, String)) {
    let given = [
        ("url", raw.url.is_some()),
        ("query", raw.query.is_some()),
        ("forecast_query", raw.forecast_query.is_some()),
        ("period", raw.period.is_some()),
        ("timeout", raw.timeout.is_some()),
        ("ca_file", raw.ca_file.is_some()),
        ("username", raw.username.is_some()),
        ("password_file", raw.password_file.is_some()),
        ("bearer_token_file", raw.bearer_token_file.is_some()),
        ("headers", !raw.headers.is_empty()),
    ];
    for (key, set) in given {
        if set {
            invalid(
                key,
                format!(
                    "belongs to source = \"prometheus\", and this budget's source is \"{}\"",
                    raw.source
                ),
            );
        }
    }
}

/// A URL with its credentials, if any, replaced: for messages.
fn redact(u: &str) -> String {
    match u.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => u.to_string(),
        },
        None => u.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BudgetSource, Config};

    fn load(dir: &std::path::Path, extra: &str) -> Result<Config, String> {
        let text = format!(
            "[cost]\nperiod = \"week\"\n[[budgets]]\nname = \"team-ml\"\nsource = \"prometheus\"\nurl = \"https://prom:9090/\"\nquery = \"sum(x)\"\nlimit_usd = 10\n{extra}"
        );
        Config::parse(&text, &dir.join("gpuwatch.toml"), &[]).map_err(|e| e.to_string())
    }

    fn source(c: &Config) -> &PrometheusSource {
        match &c.budgets[0].source {
            BudgetSource::Prometheus(q) => q,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_and_files_beside_the_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "s3cret\n").unwrap();
        let c = load(dir.path(), "bearer_token_file = \"token\"\n").unwrap();
        let b = &c.budgets[0];
        assert_eq!(b.poll_interval, Duration::from_secs(60));
        assert!(!b.notify, "a team budget's alerts are the fleet's");
        let q = source(&c);
        assert_eq!(q.url, "https://prom:9090");
        assert_eq!(q.timeout, Duration::from_secs(10));
        // No period of its own: a calendar month, as the fleet rules count, whatever the
        // node's own period.
        assert_eq!(q.period, Period::Month);
        assert_eq!(
            q.auth,
            QueryAuth::Bearer {
                token_file: dir.path().join("token")
            }
        );
        let c = load(dir.path(), "period = \"daily\"\nnotify = true\n").unwrap();
        assert_eq!(source(&c).period, Period::Day);
        assert!(c.budgets[0].notify);
    }

    #[test]
    fn a_missing_or_bad_file_is_an_error_naming_its_key_and_never_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let e = load(dir.path(), "bearer_token_file = \"token\"\n").unwrap_err();
        assert!(
            e.contains("budgets[0].bearer_token_file: ") && e.contains("token"),
            "{e}"
        );
        std::fs::write(dir.path().join("pw"), "hunter2\nhunter3\n").unwrap();
        let e = load(dir.path(), "username = \"u\"\npassword_file = \"pw\"\n").unwrap_err();
        assert!(
            e.contains("budgets[0].password_file: ") && e.contains("not one non-empty line"),
            "{e}"
        );
        assert!(!e.contains("hunter"), "{e}");
        std::fs::write(dir.path().join("ca.pem"), "not a certificate").unwrap();
        let e = load(dir.path(), "ca_file = \"ca.pem\"\n").unwrap_err();
        assert!(
            e.contains("budgets[0].ca_file: ") && e.contains("no PEM certificate"),
            "{e}"
        );
    }

    #[test]
    fn a_secret_with_a_control_character_is_refused_without_showing_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "s3cret\u{7}x\n").unwrap();
        let e = load(dir.path(), "bearer_token_file = \"token\"\n").unwrap_err();
        assert!(
            e.contains("budgets[0].bearer_token_file: ") && e.contains("control character"),
            "{e}"
        );
        assert!(!e.contains("s3cret"), "{e}");
    }

    /// A timeout the user never set follows a short poll interval down, so that setting
    /// poll_interval alone never makes the config wrong.
    #[test]
    fn an_unset_timeout_is_at_most_the_poll_interval() {
        let dir = tempfile::tempdir().unwrap();
        let c = load(dir.path(), "poll_interval = \"5s\"\n").unwrap();
        assert_eq!(source(&c).timeout, Duration::from_secs(5));
        let c = load(dir.path(), "poll_interval = \"5m\"\n").unwrap();
        assert_eq!(source(&c).timeout, Duration::from_secs(10));
    }

    #[test]
    fn a_timeout_longer_than_the_interval_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = load(dir.path(), "poll_interval = \"5s\"\ntimeout = \"6s\"\n").unwrap_err();
        assert!(
            e.contains("budgets[0].timeout: \"6s\" is longer than the poll_interval (5s)"),
            "{e}"
        );
    }
}
