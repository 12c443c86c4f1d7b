//! The rustls server configuration for `tls_server_config`, with a certificate that is reloaded
//! when its files change. A handshake never touches a file: it takes the certificate loaded
//! last, and asks for a check if none is under way. The check runs on the blocking pool: it
//! compares the files' modification times and sizes with those last loaded (two `stat` calls),
//! and reads them again only when they differ, as regular files of at most `MAX_PEM_BYTES`. A
//! certificate that fails to load (a FIFO, a huge or half-written file) is logged, and the
//! previous one stays in use. So the first handshake after a renewal may still get the old
//! certificate; the next ones get the new.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::web::{ClientAuth, Pem, TlsSettings, Version, WebConfig};
use crate::config::ConfigErrors;
use crate::crypto::provider;

/// The TLS configuration the web config asks for, built once (the daemon at start, and
/// `check-config`); `None` serves plain HTTP. A certificate, key or CA that cannot be loaded is a
/// config error that names the web config file.
pub fn load(web: Option<&WebConfig>) -> Result<Option<Arc<ServerConfig>>, ConfigErrors> {
    let Some(web) = web else { return Ok(None) };
    match &web.tls {
        None => Ok(None),
        Some(t) => server_config(t)
            .map(Some)
            .map_err(|e| ConfigErrors(vec![web.tls_error(e)])),
    }
}

/// Builds the server configuration. Errors are sentences for a person.
pub fn server_config(t: &TlsSettings) -> Result<Arc<ServerConfig>, String> {
    let provider = provider();
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = [
        (Version::Tls12, &rustls::version::TLS12),
        (Version::Tls13, &rustls::version::TLS13),
    ]
    .into_iter()
    .filter(|(v, _)| (t.min_version..=t.max_version).contains(v))
    .map(|(_, p)| p)
    .collect();
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .map_err(|e| e.to_string())?;
    let builder = match (t.client_auth, &t.client_ca) {
        (ClientAuth::NoClientCert, _) | (_, None) => builder.with_no_client_auth(),
        (auth, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca).map_err(|e| format!("client_ca: {e}"))? {
                roots.add(cert).map_err(|e| format!("client_ca: {e}"))?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider));
            let verifier = if auth == ClientAuth::VerifyClientCertIfGiven {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder
                .with_client_cert_verifier(verifier.build().map_err(|e| format!("client_ca: {e}"))?)
        }
    };
    let resolver = Reloading::new(t.cert.clone(), t.key.clone(), provider)?;
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The largest certificate, key or CA file read: a chain of a few certificates is a few KiB.
pub const MAX_PEM_BYTES: u64 = 1 << 20;

fn read(pem: &Pem) -> Result<Vec<u8>, String> {
    match pem {
        Pem::Inline(text) => Ok(text.as_bytes().to_vec()),
        Pem::File(path) => {
            crate::files::read_capped(path, MAX_PEM_BYTES, crate::files::Links::Follow)
                .map_err(|e| format!("{}: {e}", path.display()))
        }
    }
}

fn certificates(pem: &Pem) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read(pem)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e:?}", describe(pem)))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate found", describe(pem)));
    }
    Ok(certs)
}

fn certified_key(cert: &Pem, key: &Pem, provider: &CryptoProvider) -> Result<CertifiedKey, String> {
    let chain = certificates(cert)?;
    let key_bytes = read(key)?;
    // The key's own bytes never reach a message.
    let key_der = PrivateKeyDer::from_pem_slice(&key_bytes)
        .map_err(|_| format!("{}: no PEM private key found", describe(key)))?;
    CertifiedKey::from_der(chain, key_der, provider)
        .map_err(|e| format!("{} and {}: {e}", describe(cert), describe(key)))
}

fn describe(pem: &Pem) -> String {
    match pem {
        Pem::File(p) => p.display().to_string(),
        Pem::Inline(_) => "the inline PEM".to_string(),
    }
}

/// What identifies the loaded files: modification time and size of each.
type Stamp = Option<[(SystemTime, u64); 2]>;

fn stamp(cert: &Pem, key: &Pem) -> Stamp {
    let one = |pem: &Pem| match pem {
        Pem::File(p) => std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len())),
        Pem::Inline(_) => Some((SystemTime::UNIX_EPOCH, 0)),
    };
    Some([one(cert)?, one(key)?])
}

/// The certificate resolver: what a handshake reads, and how a reload is asked for.
struct Reloading {
    files: Arc<Files>,
    /// A check is under way on the blocking pool.
    checking: Arc<AtomicBool>,
    /// When the check under way began, and whether its slowness was reported.
    began: Mutex<(Instant, bool)>,
}

/// A check running longer than this (a hung network file system, say) is reported, once.
const SLOW_CHECK: Duration = Duration::from_secs(10);

/// Clears the check-under-way flag however the check ends, a panic included.
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The files, and what was loaded from them last.
struct Files {
    cert: Pem,
    key: Pem,
    provider: Arc<CryptoProvider>,
    current: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

impl fmt::Debug for Reloading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("cert", &describe(&self.files.cert))
            .finish()
    }
}

impl Reloading {
    fn new(cert: Pem, key: Pem, provider: Arc<CryptoProvider>) -> Result<Reloading, String> {
        let stamp = stamp(&cert, &key);
        let loaded = certified_key(&cert, &key, &provider)?;
        Ok(Reloading {
            files: Arc::new(Files {
                cert,
                key,
                provider,
                current: Mutex::new((stamp, Arc::new(loaded))),
            }),
            checking: Arc::new(AtomicBool::new(false)),
            began: Mutex::new((Instant::now(), false)),
        })
    }

    /// Starts a check of the files on the blocking pool, unless one is under way (or there is no
    /// runtime to run it on).
    fn check_soon(&self) {
        let inline = matches!(
            (&self.files.cert, &self.files.key),
            (Pem::Inline(_), Pem::Inline(_))
        );
        if inline {
            return;
        }
        if self.checking.swap(true, Ordering::AcqRel) {
            let mut began = self.began.lock().unwrap_or_else(|e| e.into_inner());
            if !began.1 && began.0.elapsed() > SLOW_CHECK {
                began.1 = true;
                tracing::warn!(cert = %describe(&self.files.cert), "checking the TLS certificate's files has taken over {SLOW_CHECK:?}; the certificate loaded last stays in use, and no reload happens until the check returns");
            }
            return;
        }
        *self.began.lock().unwrap_or_else(|e| e.into_inner()) = (Instant::now(), false);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.checking.store(false, Ordering::Release);
            return;
        };
        let files = Arc::clone(&self.files);
        let checking = Arc::clone(&self.checking);
        runtime.spawn_blocking(move || {
            let _done = Done(checking);
            files.check();
        });
    }
}

impl Files {
    /// Reloads the certificate if its files changed since they were loaded last.
    fn check(&self) {
        let now = stamp(&self.cert, &self.key);
        let last = self.current.lock().unwrap_or_else(|e| e.into_inner()).0;
        if now.is_none() || now == last {
            return;
        }
        let loaded = certified_key(&self.cert, &self.key, &self.provider);
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        match loaded {
            Ok(k) => {
                tracing::info!(cert = %describe(&self.cert), "reloaded the TLS certificate");
                *current = (now, Arc::new(k));
            }
            Err(e) => {
                // Half-written files are normal during a renewal: keep serving the certificate
                // that worked, and try again when the files change again.
                tracing::warn!(error = %e, "cannot reload the TLS certificate; keeping the previous one");
                current.0 = now;
            }
        }
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let key = Arc::clone(
            &self
                .files
                .current
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .1,
        );
        self.check_soon();
        Some(key)
    }
}
