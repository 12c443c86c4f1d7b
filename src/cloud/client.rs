//! What every cloud's API client shares: one HTTP client, made on the first call (timeouts, no
//! redirects, so that a credential goes only to the endpoint), one cap on an answer's size, and
//! one cache for a credential (a bearer token, STS credentials) with one renewal margin.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use super::{CloudError, ErrorKind};

/// The largest answer of a cloud's API that is read; real ones are a few KiB.
pub const MAX_BODY: usize = 1024 * 1024;

/// A credential is renewed this long before it expires.
pub const RENEW_BEFORE: f64 = 300.0;

/// A cloud API's HTTP client, made on the first call: 5 s to connect, 30 s for an answer, and
/// redirects not followed.
#[derive(Default)]
pub struct Http(OnceLock<reqwest::Client>);

impl Http {
    /// The client; `operation` names the call that needed it, should it fail to build.
    pub fn get(&self, operation: &'static str) -> Result<&reqwest::Client, CloudError> {
        if let Some(c) = self.0.get() {
            return Ok(c);
        }
        let client = crate::client::http_client()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| CloudError {
                operation,
                kind: ErrorKind::Other,
                message: e.to_string(),
                request_id: None,
                retry_after: None,
            })?;
        Ok(self.0.get_or_init(|| client))
    }
}

/// A credential and when it expires (Unix seconds), kept until [`RENEW_BEFORE`] it does. One
/// fetch at a time: callers that find none fresh wait for the one fetching.
pub struct Cached<T>(tokio::sync::Mutex<Option<(T, f64)>>);

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Cached(tokio::sync::Mutex::new(None))
    }
}

impl<T: Clone> Cached<T> {
    /// The credential held, or a new one from `fetch` when none is fresh or `renew` asks (the
    /// cloud refused the one held).
    pub async fn get<F, Fut>(&self, renew: bool, fetch: F) -> Result<T, CloudError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, f64), CloudError>>,
    {
        let mut held = self.0.lock().await;
        if let Some((value, expires)) = held.as_ref() {
            if !renew && expires - RENEW_BEFORE > crate::time::now() {
                return Ok(value.clone());
            }
        }
        let (value, expires) = fetch().await?;
        *held = Some((value.clone(), expires));
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A credential is fetched once while fresh, again within [`RENEW_BEFORE`] of its expiry,
    /// and again when a refusal asks; a failed fetch keeps nothing.
    #[tokio::test]
    async fn a_credential_is_kept_until_shortly_before_it_expires() {
        let cached = Cached::default();
        let fetches = std::sync::atomic::AtomicU32::new(0);
        let fetch = |expires_in: f64| {
            let n = fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move { Ok((n, crate::time::now() + expires_in)) }
        };
        assert_eq!(cached.get(false, || fetch(3600.0)).await.unwrap(), 1);
        assert_eq!(cached.get(false, || fetch(3600.0)).await.unwrap(), 1);
        assert_eq!(
            cached
                .get(true, || fetch(RENEW_BEFORE - 1.0))
                .await
                .unwrap(),
            2
        );
        // Within the margin: fetched again.
        assert_eq!(cached.get(false, || fetch(3600.0)).await.unwrap(), 3);
        let failed = cached
            .get(true, || async {
                Err(CloudError {
                    operation: "Token",
                    kind: ErrorKind::Retryable,
                    message: "down".into(),
                    request_id: None,
                    retry_after: None,
                })
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(cached.get(false, || fetch(3600.0)).await.unwrap(), 3);
    }
}
