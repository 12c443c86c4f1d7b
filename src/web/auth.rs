//! Basic auth, response headers and the rate limit of the web configuration, as one layer over
//! every endpoint (`/-/healthy` included, as in the exporter toolkit).
//!
//! bcrypt is slow on purpose (about 70 ms at cost 10), so a client could spend the daemon's CPU
//! with wrong passwords. Verifications therefore run on the blocking pool, two at a time at
//! most; a request that cannot get a turn within a few seconds is answered 503. A password that
//! verified is remembered per user and compared in constant time afterwards, so a scraper with
//! the right password costs one bcrypt in all. An unknown user is verified against a hash of
//! the same cost, so that the answer takes as long as for a known user with a wrong password.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use super::{RateLimit, WebConfig};

/// How long a request waits for a turn at bcrypt.
const VERIFY_WAIT: Duration = Duration::from_secs(5);

/// The layer's state, built once from the web config.
pub struct Guard {
    users: BTreeMap<String, String>,
    /// A hash of a random password, of the users' cost, for unknown users.
    decoy: String,
    /// User to the password that last verified.
    verified: Mutex<BTreeMap<String, Vec<u8>>>,
    turns: Semaphore,
    headers: Vec<(HeaderName, HeaderValue)>,
    bucket: Option<Mutex<Bucket>>,
}

struct Bucket {
    limit: RateLimit,
    tokens: f64,
    at: Instant,
}

impl Guard {
    pub fn new(web: &WebConfig) -> Arc<Guard> {
        let cost = web
            .users
            .values()
            .filter_map(|h| h.parse::<bcrypt::HashParts>().ok())
            .map(|p| p.get_cost())
            .max()
            .unwrap_or(bcrypt::DEFAULT_COST);
        let decoy_password: [u8; 16] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x5a);
        let decoy = if web.users.is_empty() {
            String::new()
        } else {
            bcrypt::hash(decoy_password, cost).unwrap_or_default()
        };
        let headers = web
            .headers
            .iter()
            .filter_map(|(n, v)| Some((n.parse().ok()?, v.parse().ok()?)))
            .collect();
        Arc::new(Guard {
            users: web.users.clone(),
            decoy,
            verified: Mutex::new(BTreeMap::new()),
            turns: Semaphore::new(2),
            headers,
            bucket: web.rate_limit.map(|limit| {
                Mutex::new(Bucket {
                    limit,
                    tokens: f64::from(limit.burst),
                    at: Instant::now(),
                })
            }),
        })
    }

    /// Takes a token from the bucket; `false` when it is empty.
    fn admit(&self) -> bool {
        let Some(bucket) = &self.bucket else {
            return true;
        };
        let mut b = bucket.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(b.at).as_secs_f64() / b.limit.interval.as_secs_f64();
        b.tokens = (b.tokens + refill).min(f64::from(b.limit.burst));
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Checks an `Authorization` header value.
    async fn check(self: &Arc<Self>, authorization: Option<&HeaderValue>) -> Result<(), Response> {
        if self.users.is_empty() {
            return Ok(());
        }
        let Some((user, password)) = authorization.and_then(parse_basic) else {
            return Err(unauthorized());
        };
        let remembered = self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&user)
            .is_some_and(|p| bool::from(p.as_slice().ct_eq(&password)));
        if remembered {
            return Ok(());
        }
        let Ok(Ok(_turn)) = tokio::time::timeout(VERIFY_WAIT, self.turns.acquire()).await else {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                "too many logins in progress\n",
            )
                .into_response());
        };
        let known = self.users.get(&user).cloned();
        let hash = known.clone().unwrap_or_else(|| self.decoy.clone());
        let pw = password.clone();
        let ok = tokio::task::spawn_blocking(move || bcrypt::verify(pw, &hash).unwrap_or(false))
            .await
            .unwrap_or(false);
        if ok && known.is_some() {
            self.verified
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(user, password);
            Ok(())
        } else {
            Err(unauthorized())
        }
    }
}

/// `Basic base64(user:password)` into its parts.
fn parse_basic(value: &HeaderValue) -> Option<(String, Vec<u8>)> {
    let text = value.to_str().ok()?;
    let (scheme, encoded) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") || encoded.len() > 4096 {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Basic realm=\"gpuwatch\"")],
        "Unauthorized\n",
    )
        .into_response()
}

/// The middleware: rate limit, then basic auth, then the handler, then the headers.
pub async fn layer(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    if !guard.admit() {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "rate limit exceeded\n",
        )
            .into_response();
    }
    let mut response = match guard
        .check(request.headers().get(header::AUTHORIZATION))
        .await
    {
        Ok(()) => next.run(request).await,
        Err(refused) => refused,
    };
    for (name, value) in &guard.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_parse() {
        let v = HeaderValue::from_static("Basic YWxpY2U6czNjcjN0OndpdGg6Y29sb25z");
        assert_eq!(
            parse_basic(&v),
            Some(("alice".to_string(), b"s3cr3t:with:colons".to_vec()))
        );
        for bad in ["Bearer abc", "Basic !!!", "Basic YWxpY2U=", ""] {
            assert_eq!(
                parse_basic(&HeaderValue::from_str(bad).unwrap()),
                None,
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn right_wrong_and_unknown_credentials() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let web = WebConfig {
            tls: None,
            users: BTreeMap::from([("alice".to_string(), hash)]),
            headers: vec![],
            rate_limit: None,
        };
        let guard = Guard::new(&web);
        let basic = |u: &str, p: &str| {
            let enc = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            HeaderValue::from_str(&format!("Basic {enc}")).unwrap()
        };
        assert!(guard.check(Some(&basic("alice", "s3cret"))).await.is_ok());
        // Remembered: the second time needs no bcrypt, and a wrong one is still refused.
        assert!(guard.check(Some(&basic("alice", "s3cret"))).await.is_ok());
        for (u, p) in [("alice", "wrong"), ("mallory", "s3cret"), ("alice", "")] {
            let r = guard.check(Some(&basic(u, p))).await.unwrap_err();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{u}:{p}");
        }
        assert_eq!(
            guard.check(None).await.unwrap_err().status(),
            StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn the_bucket_refills() {
        let web = WebConfig {
            tls: None,
            users: BTreeMap::new(),
            headers: vec![],
            rate_limit: Some(RateLimit {
                interval: Duration::from_secs(3600),
                burst: 3,
            }),
        };
        let guard = Guard::new(&web);
        assert_eq!((0..5).filter(|_| guard.admit()).count(), 3);
    }
}
