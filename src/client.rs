//! gpuwatch's HTTP client side (the Prometheus budget queries, webhooks, `gpuwatch status`):
//! reqwest builders on the one crypto provider, and answers read with a cap.

use std::sync::Arc;

/// A reqwest client builder (IMDS, webhooks, `gpuwatch status`). reqwest is built without a
/// crypto provider of its own, which would link a second one (ring), so it takes the process's
/// default: this provider, installed on first use.
pub fn http_client() -> reqwest::ClientBuilder {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // An error means a default is installed already; reqwest takes that one.
        let _ = Arc::unwrap_or_clone(crate::crypto::provider()).install_default();
    });
    reqwest::Client::builder()
}

/// Reads a response's body, at most `max` bytes of it: `Ok(None)` when there is more (a
/// declared length over the bound is refused before any of it is read).
pub async fn read_body(
    mut response: reqwest::Response,
    max: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > max {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}
