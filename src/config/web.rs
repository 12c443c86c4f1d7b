//! The web configuration: TLS and basic auth, configured by the web configuration file of the Prometheus exporter
//! toolkit (`web-config.yml`), so that a file that already protects a node_exporter protects
//! gpuwatch too. `[server] web_config_file` names it.
//!
//! What is supported: `tls_server_config` (`cert_file`/`cert`, `key_file`/`key`,
//! `client_auth_type`, `client_ca_file`/`client_ca`, `min_version`, `max_version`),
//! `http_server_config.headers`, `basic_auth_users` (bcrypt) and `rate_limit`. Settings that
//! would weaken TLS or that rustls does not offer (TLS 1.0 and 1.1, `RequestClientCert`,
//! `RequireAnyClientCert`, explicit cipher suites and curves, `client_allowed_sans`) are refused
//! with a message, never silently ignored. Relative paths are read from the file's directory,
//! and a leading `${CREDENTIALS_DIRECTORY}` is systemd's credentials directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{read_config_file, ConfigError, ConfigErrors};

/// A validated web configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebConfig {
    /// The file, and the config key that named it, for messages.
    pub path: PathBuf,
    pub key: String,
    pub tls: Option<TlsSettings>,
    /// User name to bcrypt hash. Empty: no basic auth.
    pub users: BTreeMap<String, String>,
    /// Headers added to every response.
    pub headers: Vec<(String, String)>,
    pub rate_limit: Option<RateLimit>,
}

/// Where a PEM document comes from: a file (re-read when it changes) or the config itself.
#[derive(Debug, Clone, PartialEq)]
pub enum Pem {
    File(PathBuf),
    Inline(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    NoClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    Tls12,
    Tls13,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TlsSettings {
    pub cert: Pem,
    pub key: Pem,
    pub client_auth: ClientAuth,
    pub client_ca: Option<Pem>,
    pub min_version: Version,
    pub max_version: Version,
}

/// A token bucket per client address (an IPv6 client by its /64): `burst` at once, then one
/// per `interval`. A client whose password verified before is not limited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub interval: Duration,
    pub burst: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWeb {
    tls_server_config: Option<RawTls>,
    http_server_config: Option<RawHttp>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
    rate_limit: Option<RawRate>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
    #[serde(default)]
    client_allowed_sans: Vec<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    #[serde(default)]
    cipher_suites: Vec<String>,
    prefer_server_cipher_suites: Option<bool>,
    #[serde(default)]
    curve_preferences: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    /// Accepted for compatibility; gpuwatch serves HTTP/1.1.
    http2: Option<bool>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRate {
    interval: String,
    burst: u32,
}

/// The highest bcrypt cost accepted: cost 16 is about 5 s of CPU per check.
const MAX_COST: u32 = 16;

/// The headers the toolkit allows in `http_server_config.headers`.
const HEADERS: [&str; 5] = [
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
];

impl WebConfig {
    /// Reads and validates the file; `key` is the config key that named it, for messages.
    /// Certificates and keys are not read here: the HTTP layer loads them once, when it builds
    /// the TLS configuration (`check-config` does the same, so a bad one is reported there too).
    pub fn load(path: &Path, key: &str) -> Result<WebConfig, ConfigErrors> {
        let text = read_config_file(path)?;
        WebConfig::parse(&text, path, key)
    }

    /// The error for a TLS setting that cannot be loaded (a certificate or key that does not
    /// read or parse), naming the web config file as every other error of it does.
    pub fn tls_error(&self, message: impl ToString) -> ConfigError {
        invalid(&self.key, &self.path, "tls_server_config", message)
    }

    /// Parses and validates the text; relative paths are resolved against `path`'s directory.
    pub fn parse(text: &str, path: &Path, key: &str) -> Result<WebConfig, ConfigErrors> {
        let raw = read_raw(text, path, key)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut errors = Vec::new();
        let mut bad = |k: &str, message: String| errors.push(invalid(key, path, k, message));
        let tls = raw
            .tls_server_config
            .and_then(|t| tls_settings(t, dir, &mut bad));
        let users = users(raw.basic_auth_users, &mut bad);
        let headers = raw
            .http_server_config
            .map_or_else(Vec::new, |http| headers(http, &mut bad));
        let rate_limit = raw.rate_limit.and_then(|r| rate_limit(r, &mut bad));
        if errors.is_empty() {
            Ok(WebConfig {
                path: path.to_path_buf(),
                key: key.to_string(),
                tls,
                users,
                headers,
                rate_limit,
            })
        } else {
            Err(ConfigErrors(errors))
        }
    }
}

/// The file's YAML, read into its keys; an empty file has none.
fn read_raw(text: &str, path: &Path, key: &str) -> Result<RawWeb, ConfigError> {
    if text.trim().is_empty() {
        return Ok(RawWeb::default());
    }
    let de = yaml_serde::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        // The YAML parser may name the key itself too: once is enough.
        let message = e.into_inner().to_string().replace('`', "\"");
        let message = message.strip_prefix(&format!("{at}: ")).unwrap_or(&message);
        invalid(key, path, &at, message)
    })
}

/// `basic_auth_users`: each a user name and a bcrypt hash, every hash of one cost.
fn users(
    raw: BTreeMap<String, String>,
    bad: &mut impl FnMut(&str, String),
) -> BTreeMap<String, String> {
    let mut users = BTreeMap::new();
    for (user, hash) in raw {
        let k = format!("basic_auth_users.{user}");
        if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
            bad(
                &k,
                format!("{user:?} is not a user name (no colon, no control characters)"),
            );
        } else if let Ok(parts) = hash.parse::<bcrypt::HashParts>() {
            if parts.get_cost() > MAX_COST {
                bad(&k, format!("has cost {}; above {MAX_COST} one check takes seconds of CPU, which any client could make the daemon spend", parts.get_cost()));
            } else {
                users.insert(user, hash);
            }
        } else {
            // The hash is a secret: say what is wrong, not what it is.
            bad(&k, "is not a bcrypt hash, such as the output of `htpasswd -nBC 10 \"\" | tr -d ':\\n'`".into());
        }
    }
    // One cost for every user: a check against a cheaper hash answers sooner, and so would
    // tell which users exist (unknown users are checked against a decoy of that one cost).
    let costs: BTreeMap<&String, u32> = users
        .iter()
        .filter_map(|(u, h)| Some((u, h.parse::<bcrypt::HashParts>().ok()?.get_cost())))
        .collect();
    if let Some((first, &cost)) = costs.iter().next() {
        for (user, &other) in &costs {
            if other != cost {
                bad(
                    &format!("basic_auth_users.{user}"),
                    format!("has bcrypt cost {other}, and {first:?} has cost {cost}: every user must have the same cost, or the time of a refusal tells which users exist"),
                );
            }
        }
    }
    users
}

/// `http_server_config.headers`: the toolkit's headers, each with a value to send.
fn headers(http: RawHttp, bad: &mut impl FnMut(&str, String)) -> Vec<(String, String)> {
    let _ = http.http2;
    let mut headers = Vec::new();
    for (name, value) in http.headers {
        let k = format!("http_server_config.headers.{name}");
        if !HEADERS.contains(&name.as_str()) {
            bad(&k, format!("{name:?} is not one of {HEADERS:?}"));
        } else if axum::http::HeaderValue::from_str(&value).is_err() {
            bad(&k, format!("{value:?} is not a header value"));
        } else if !value.is_empty() {
            headers.push((name, value));
        }
    }
    headers
}

/// `rate_limit`: none with a zero interval.
fn rate_limit(r: RawRate, bad: &mut impl FnMut(&str, String)) -> Option<RateLimit> {
    match crate::time::parse_duration(&r.interval) {
        Some(d) if d.is_zero() => None,
        Some(d) if d <= Duration::from_secs(3600) && (1..=100_000).contains(&r.burst) => {
            Some(RateLimit {
                interval: d,
                burst: r.burst,
            })
        }
        Some(_) => {
            bad(
                "rate_limit",
                format!(
                    "interval {:?} must be at most 1h and burst {} between 1 and 100000",
                    r.interval, r.burst
                ),
            );
            None
        }
        None => {
            bad(
                "rate_limit.interval",
                format!("{:?} is not a duration, such as \"1s\"", r.interval),
            );
            None
        }
    }
}

fn invalid(key: &str, path: &Path, at: &str, message: impl ToString) -> ConfigError {
    ConfigError::Invalid {
        key: format!("{key}: {}: {at}", path.display()),
        message: message.to_string(),
    }
}

fn tls_settings(t: RawTls, dir: &Path, bad: &mut impl FnMut(&str, String)) -> Option<TlsSettings> {
    let cert = pem(t.cert, t.cert_file, "cert", dir, bad);
    let key = pem(t.key, t.key_file, "key", dir, bad);
    let client_ca = pem(t.client_ca, t.client_ca_file, "client_ca", dir, bad);
    if cert.is_none() {
        bad(
            "tls_server_config.cert_file",
            "TLS needs a certificate: cert_file or cert".into(),
        );
    }
    if key.is_none() {
        bad(
            "tls_server_config.key_file",
            "TLS needs a key: key_file or key".into(),
        );
    }
    let client_auth = client_auth(t.client_auth_type.as_deref(), bad);
    if client_auth.is_some_and(|c| c != ClientAuth::NoClientCert) && client_ca.is_none() {
        bad(
            "tls_server_config.client_ca_file",
            "verifying client certificates needs the CA that signs them".into(),
        );
    }
    let min_version = version(t.min_version, Version::Tls12, "min_version", bad);
    let max_version = version(t.max_version, Version::Tls13, "max_version", bad);
    if let (Some(lo), Some(hi)) = (min_version, max_version) {
        if lo > hi {
            bad(
                "tls_server_config.min_version",
                "is above max_version".into(),
            );
        }
    }
    for (name, list) in [
        ("cipher_suites", &t.cipher_suites),
        ("curve_preferences", &t.curve_preferences),
        ("client_allowed_sans", &t.client_allowed_sans),
    ] {
        if !list.is_empty() {
            bad(
                &format!("tls_server_config.{name}"),
                "is not supported; gpuwatch uses rustls' safe defaults, and refuses rather than ignores a setting".into(),
            );
        }
    }
    let _ = t.prefer_server_cipher_suites;
    Some(TlsSettings {
        cert: cert?,
        key: key?,
        client_auth: client_auth?,
        client_ca,
        min_version: min_version?,
        max_version: max_version?,
    })
}

/// A PEM document given inline as `name` or in a file as `{name}_file`, not both.
fn pem(
    inline: Option<String>,
    file: Option<String>,
    name: &str,
    dir: &Path,
    bad: &mut impl FnMut(&str, String),
) -> Option<Pem> {
    match (inline, file) {
        (Some(_), Some(_)) => {
            bad(
                &format!("tls_server_config.{name}_file"),
                format!("give {name} or {name}_file, not both"),
            );
            None
        }
        (Some(i), None) => Some(Pem::Inline(i)),
        (None, Some(f)) if !f.is_empty() => Some(Pem::File(super::file_path(dir, &f))),
        _ => None,
    }
}

/// `client_auth_type`: the ones that verify what they accept.
fn client_auth(text: Option<&str>, bad: &mut impl FnMut(&str, String)) -> Option<ClientAuth> {
    match text.unwrap_or("NoClientCert") {
        "NoClientCert" => Some(ClientAuth::NoClientCert),
        "VerifyClientCertIfGiven" => Some(ClientAuth::VerifyClientCertIfGiven),
        "RequireAndVerifyClientCert" => Some(ClientAuth::RequireAndVerifyClientCert),
        other @ ("RequestClientCert" | "RequireAnyClientCert") => {
            bad(
                "tls_server_config.client_auth_type",
                format!("{other:?} accepts certificates nobody verified; use \"RequireAndVerifyClientCert\" (or \"VerifyClientCertIfGiven\") with client_ca_file"),
            );
            None
        }
        other => {
            bad(
                "tls_server_config.client_auth_type",
                format!("{other:?} is not one of \"NoClientCert\", \"VerifyClientCertIfGiven\", \"RequireAndVerifyClientCert\""),
            );
            None
        }
    }
}

/// `min_version` or `max_version` (`name`): TLS 1.2 or 1.3, `default` where unset.
fn version(
    v: Option<String>,
    default: Version,
    name: &str,
    bad: &mut impl FnMut(&str, String),
) -> Option<Version> {
    match v.as_deref() {
        None | Some("") => Some(default),
        Some("TLS12") => Some(Version::Tls12),
        Some("TLS13") => Some(Version::Tls13),
        Some(other @ ("TLS10" | "TLS11")) => {
            bad(
                &format!("tls_server_config.{name}"),
                format!("{other:?} is not supported: TLS 1.0 and 1.1 are broken; use \"TLS12\" or \"TLS13\""),
            );
            None
        }
        Some(other) => {
            bad(
                &format!("tls_server_config.{name}"),
                format!("{other:?} is not one of \"TLS12\", \"TLS13\""),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> String {
        WebConfig::parse(
            text,
            Path::new("/etc/gpuwatch/web.yml"),
            "server.web_config_file",
        )
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn the_toolkit_example_parses() {
        let web = WebConfig::parse(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n\
             basic_auth_users:\n  alice: $2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze\n\
             rate_limit:\n  interval: 1s\n  burst: 20\n",
            Path::new("/etc/gpuwatch/web.yml"),
            "server.web_config_file",
        )
        .unwrap();
        let tls = web.tls.unwrap();
        assert_eq!(tls.cert, Pem::File("/etc/gpuwatch/server.crt".into()));
        assert_eq!(tls.client_auth, ClientAuth::NoClientCert);
        assert_eq!(tls.min_version, Version::Tls12);
        assert!(web.users.contains_key("alice"));
        assert_eq!(
            web.rate_limit,
            Some(RateLimit {
                interval: Duration::from_secs(1),
                burst: 20
            })
        );
    }

    #[test]
    fn bad_settings_name_their_key() {
        let cases = [
            ("tls_server_config:\n  cert_file: a\n", "tls_server_config.key_file: TLS needs a key"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n", "tls_server_config.min_version: \"TLS10\" is not supported"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n", "tls_server_config.client_auth_type: \"RequireAnyClientCert\" accepts certificates nobody verified"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n", "tls_server_config.client_ca_file: verifying client certificates needs the CA"),
            ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "tls_server_config.cipher_suites: is not supported"),
            ("basic_auth_users:\n  bob: hunter2\n", "basic_auth_users.bob: is not a bcrypt hash"),
            ("basic_auth_users:\n  bob: $2y$20$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze\n", "basic_auth_users.bob: has cost 20"),
            // One cost for all: a cheaper hash would answer sooner, and tell who exists.
            ("basic_auth_users:\n  alice: $2y$12$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze\n  bob: $2y$04$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze\n", "basic_auth_users.bob: has bcrypt cost 4, and \"alice\" has cost 12: every user must have the same cost"),
            ("tls_server_config:\n  cert_fil: a\n", "tls_server_config: unknown field \"cert_fil\""),
            ("rate_limit:\n  interval: soon\n  burst: 1\n", "rate_limit.interval: \"soon\" is not a duration"),
        ];
        for (text, want) in cases {
            let got = errors(text);
            assert!(got.contains(want), "{text}\n{got}");
            assert!(
                got.starts_with("config: server.web_config_file: /etc/gpuwatch/web.yml: "),
                "{got}"
            );
            assert!(!got.contains("hunter2"), "{got}");
        }
    }
}
