//! Test certificates, generated in the test (no key is ever checked in): a CA, server
//! certificates for 127.0.0.1 and localhost, and client certificates, valid or expired.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, as PEM files.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: Vec<u8>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// Writes the CA certificate to `dir/name` and returns its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.cert.pem()).unwrap();
        path
    }

    /// Issues a server certificate (client: false) or a client certificate, valid now or
    /// expired yesterday, and writes it to `dir/stem.{crt,key}`.
    pub fn issue(&self, dir: &Path, stem: &str, client: bool, expired: bool) -> Issued {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = if client {
            vec![format!("{stem}.clients.test")]
        } else {
            vec!["127.0.0.1".into(), "localhost".into()]
        };
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, stem);
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let now = time::OffsetDateTime::now_utc();
        if expired {
            params.not_before = now - time::Duration::days(30);
            params.not_after = now - time::Duration::days(1);
        } else {
            params.not_before = now - time::Duration::days(1);
            params.not_after = now + time::Duration::days(30);
        }
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let issued = Issued {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&issued.cert, cert.pem()).unwrap();
        std::fs::write(&issued.key, key.serialize_pem()).unwrap();
        issued
    }
}

/// A TLS client's answer: the status (None when the handshake or the request failed), and the
/// server certificate it was shown.
pub struct TlsAnswer {
    pub status: Option<u16>,
    /// The response head, lowercased.
    pub head: String,
    pub error: Option<String>,
    pub server_cert: Option<Vec<u8>>,
}

/// GETs `path` over TLS, trusting `ca`, presenting `client` if given, with basic auth if given.
pub fn tls_get(
    addr: std::net::SocketAddr,
    path: &str,
    ca: &Path,
    client: Option<&Issued>,
    auth: Option<(&str, &str)>,
) -> TlsAnswer {
    use base64::Engine as _;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some(c) => builder
                .with_client_auth_cert(
                    CertificateDer::pem_file_iter(&c.cert)
                        .unwrap()
                        .map(Result::unwrap)
                        .collect(),
                    PrivateKeyDer::from_pem_file(&c.key).unwrap(),
                )
                .unwrap(),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let fail = |e: String| TlsAnswer {
            status: None,
            head: String::new(),
            error: Some(e),
            server_cert: None,
        };
        let tcp = match tokio::net::TcpStream::connect(addr).await {
            Ok(t) => t,
            Err(e) => return fail(e.to_string()),
        };
        let name = ServerName::try_from("127.0.0.1").unwrap();
        // A handshake that stalls is an answer too: none within 10 s.
        let handshake = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            connector.connect(name, tcp),
        );
        let mut tls = match handshake.await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return fail(e.to_string()),
            Err(_) => return fail("the handshake timed out".into()),
        };
        let server_cert = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec());
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        if let Some((u, p)) = auth {
            let enc = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            request.push_str(&format!("Authorization: Basic {enc}\r\n"));
        }
        request.push_str("\r\n");
        if let Err(e) = tls.write_all(request.as_bytes()).await {
            return fail(e.to_string());
        }
        let mut raw = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(15),
            tls.read_to_end(&mut raw),
        )
        .await;
        let text = String::from_utf8_lossy(&raw);
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok());
        TlsAnswer {
            status,
            head: text
                .split("\r\n\r\n")
                .next()
                .unwrap_or("")
                .to_ascii_lowercase(),
            error: match read {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some("timed out".into()),
            },
            server_cert,
        }
    })
}

/// The user and password the protected daemon accepts.
pub const USER: &str = "prom";
pub const PASSWORD: &str = "s3cret";

/// What `protect` wrote: the CA (to trust and to issue more), and two client certificates.
pub struct Protected {
    pub ca: PathBuf,
    pub issuer: Ca,
    pub client: Issued,
    pub expired: Issued,
}

/// Writes `web-config.yml` into `dir`: TLS with a server certificate for 127.0.0.1, client
/// certificates verified when given, basic auth for `USER`, and one security header.
pub fn protect(dir: &Path) -> Protected {
    let issuer = Ca::new("gpuwatch test CA");
    let ca = issuer.write(dir, "ca.crt");
    issuer.issue(dir, "server", false, false);
    let client = issuer.issue(dir, "client", true, false);
    let expired = issuer.issue(dir, "old-client", true, true);
    let hash = bcrypt::hash(PASSWORD, 4).unwrap();
    std::fs::write(
        dir.join("web-config.yml"),
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
             client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n\
             http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n\
             basic_auth_users:\n  {USER}: {hash}\n"
        ),
    )
    .unwrap();
    Protected {
        ca,
        issuer,
        client,
        expired,
    }
}
