//! The one crypto provider gpuwatch uses, for its TLS server and its HTTP clients (`client`):
//! aws-lc-rs, which a cloud's SDK builds already. A second provider (ring) would double the
//! crypto code.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// The provider, for a rustls configuration built here.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}
