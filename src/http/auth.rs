//! Basic auth, response headers and the rate limit of the web configuration, as one layer over
//! every endpoint (`/-/healthy` included, as in the exporter toolkit).
//!
//! bcrypt is slow on purpose (about 70 ms at cost 10), so a client could spend the daemon's CPU
//! with wrong passwords. Verifications therefore run on the blocking pool, two at a time at
//! most and one per client address, and a request that finds no turn for it is answered 503
//! at once: it never waits, so
//! strangers' wrong passwords cannot pile up as busy connections that the listener may not
//! evict. A password that verified is remembered per user and compared in constant time
//! afterwards, before anything else: a scraper with the right password costs one bcrypt in
//! all, and never waits behind strangers, nor counts against the rate limit. Every user has the
//! same cost (the config says so), and an unknown user is verified against a decoy hash of that
//! cost, so that a refusal takes as long whoever is named.
//!
//! A second password that does not verify soon after another (`STRIKE_WINDOW`) bars its
//! client address from bcrypt for a while, doubling with each failure in a row (`BACKOFF_FIRST`
//! to `BACKOFF_MAX`), and the address is answered 429 meanwhile: wrong passwords from a few
//! addresses cannot keep both turns busy, so a scraper whose password is not remembered yet
//! (after a restart) still finds one free. (An attacker with a thousand addresses, or a /54 of
//! IPv6, each trying once a second, can still keep the turns busy while it lasts: a request
//! that finds no turn is not a failure, and bars nothing. Put such listeners behind a network
//! limit.) One typo, or a scraper retrying a wrong password at its interval, is never barred.
//!
//! The rate limit is a token bucket per client address (an IPv6 client by its /64): one
//! client's flood never makes another's requests wait or fail. Every refusal is sent after a
//! delay (`REFUSAL_DELAY`), while its connection counts as idle: a client guessing in a loop is
//! slowed to a request a second per connection, and cannot hold a connection the listener needs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use crate::config::web::{RateLimit, WebConfig};

/// How many client addresses the rate limit tracks at once; past that, the ones whose buckets
/// are full again (as good as new) are forgotten first, then the quietest eighth, in one pass.
const MAX_CLIENTS: usize = 4096;

/// The layer's state, built once from the web config.
pub struct Guard {
    users: BTreeMap<String, String>,
    /// A hash of the users' cost of a fixed password no user has, for unknown users.
    decoy: String,
    /// User to the password that last verified.
    verified: Mutex<BTreeMap<String, Vec<u8>>>,
    turns: Arc<Semaphore>,
    /// The client addresses (as the rate limit keys them) with a check in progress: one each,
    /// so that one address, however many connections it opens, never holds every turn.
    verifying: Mutex<HashSet<IpAddr>>,
    /// The client addresses whose last password did not verify, barred from bcrypt a while.
    failures: Mutex<Failures>,
    headers: Vec<(HeaderName, HeaderValue)>,
    limit: Option<Mutex<Buckets>>,
}

/// What a request's credentials are.
enum Credentials {
    /// No users are configured: nothing to check.
    Open,
    /// The password verified before (remembered, compared in constant time).
    Known,
    /// To verify with bcrypt: user and password.
    Unverified(String, Vec<u8>),
    /// Missing or malformed.
    Missing,
}

/// The token buckets, by client.
struct Buckets {
    limit: RateLimit,
    clients: HashMap<IpAddr, Bucket>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Buckets {
    /// Takes a token from `client`'s bucket; `false` when it is empty.
    fn admit(&mut self, client: IpAddr, now: Instant) -> bool {
        let limit = self.limit;
        let burst = f64::from(limit.burst);
        let refill = |b: &Bucket| {
            let gained = now.duration_since(b.at).as_secs_f64() / limit.interval.as_secs_f64();
            (b.tokens + gained).min(burst)
        };
        if !self.clients.contains_key(&client) && self.clients.len() >= MAX_CLIENTS {
            // Once per many newcomers, not per newcomer: the full buckets go, and if that is
            // not an eighth of them, the quietest eighth too.
            self.clients.retain(|_, b| refill(b) < burst);
            let keep = MAX_CLIENTS - MAX_CLIENTS / 8;
            if self.clients.len() > keep {
                let mut ats: Vec<Instant> = self.clients.values().map(|b| b.at).collect();
                let cut = ats.len() - keep;
                let (_, &mut oldest_kept, _) = ats.select_nth_unstable(cut);
                self.clients.retain(|_, b| b.at >= oldest_kept);
            }
        }
        let b = self.clients.entry(client).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        b.tokens = refill(b);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The address a client's bucket is kept under: an IPv4 address, or an IPv6 address's /64 (a
/// host is given a whole /64 to pick addresses from). An IPv4-mapped address is its IPv4 one.
fn client_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// How many bcrypt checks may run at once.
const TURNS: usize = 2;

/// How long an address is barred from bcrypt after a password that did not verify, in a row
/// with another: the first time, and at most (the bar doubles with each failure in a row).
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(32);
/// A failure within this long of the previous one's bar (or of the previous one, if it had no
/// bar), or within the bar's own length, is in a row with it.
const STRIKE_WINDOW: Duration = Duration::from_secs(3);

/// The addresses barred from bcrypt after a failure, by client key.
#[derive(Default)]
struct Failures {
    clients: HashMap<IpAddr, Bar>,
}

#[derive(Clone, Copy)]
struct Bar {
    /// The end of the bar (the time of the failure, for a first one that bars nothing).
    until: Instant,
    /// The length of the latest bar (zero after a first failure): the next failure in a row
    /// bars for twice as long (or for `BACKOFF_FIRST`).
    length: Duration,
}

impl Bar {
    /// Whether a failure at `now` is in a row with this one.
    fn in_a_row(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.until) < self.length.max(STRIKE_WINDOW)
    }
}

impl Failures {
    /// How long `client` stays barred, if it is barred at `now`.
    fn barred(&self, client: IpAddr, now: Instant) -> Option<Duration> {
        self.clients
            .get(&client)
            .map(|b| b.until.saturating_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    /// A password from `client` did not verify at `now`: alone, it bars nothing; in a row with
    /// the one before, it bars for the first length, or for twice the last bar's.
    fn failed(&mut self, client: IpAddr, now: Instant) {
        if !self.clients.contains_key(&client) && self.clients.len() >= MAX_CLIENTS {
            // Failures that nothing could follow in a row any more are forgotten first; past
            // that, a newcomer is not remembered (it meets the turns as before).
            self.clients.retain(|_, b| b.in_a_row(now));
            if self.clients.len() >= MAX_CLIENTS {
                return;
            }
        }
        let length = match self.clients.get(&client) {
            Some(b) if b.in_a_row(now) => (b.length * 2).clamp(BACKOFF_FIRST, BACKOFF_MAX),
            _ => Duration::ZERO,
        };
        self.clients.insert(
            client,
            Bar {
                until: now + length,
                length,
            },
        );
    }

    /// A password from `client` verified: its failures are forgotten.
    fn verified(&mut self, client: IpAddr) {
        self.clients.remove(&client);
    }
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
            turns: Arc::new(Semaphore::new(TURNS)),
            verifying: Mutex::new(HashSet::new()),
            failures: Mutex::new(Failures::default()),
            headers,
            limit: web.rate_limit.map(|limit| {
                Mutex::new(Buckets {
                    limit,
                    clients: HashMap::new(),
                })
            }),
        })
    }

    /// Takes a token from the client's bucket; `false` when it is empty.
    fn admit(&self, client: Option<IpAddr>) -> bool {
        let Some(buckets) = &self.limit else {
            return true;
        };
        // Without a peer address (never, behind our listener) all such requests share one.
        let client = client.map_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), client_key);
        let mut b = buckets.lock().unwrap_or_else(|e| e.into_inner());
        b.admit(client, Instant::now())
    }

    /// What an `Authorization` header value carries, without bcrypt.
    fn credentials(&self, authorization: Option<&HeaderValue>) -> Credentials {
        if self.users.is_empty() {
            return Credentials::Open;
        }
        let Some((user, password)) = authorization.and_then(parse_basic) else {
            return Credentials::Missing;
        };
        let remembered = self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&user)
            .is_some_and(|p| bool::from(p.as_slice().ct_eq(&password)));
        if remembered {
            Credentials::Known
        } else {
            Credentials::Unverified(user, password)
        }
    }

    /// Verifies a user's password with bcrypt, if a turn is free now and the client has no
    /// check in progress already (503 if not).
    async fn verify(
        self: &Arc<Self>,
        user: String,
        password: Vec<u8>,
        peer: Option<IpAddr>,
    ) -> Result<(), Response> {
        let busy = || {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                "too many logins in progress\n",
            )
                .into_response()
        };
        let client = peer.map(client_key);
        let failures = || self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(left) = client.and_then(|c| failures().barred(c, Instant::now())) {
            let seconds = left.as_secs_f64().ceil().max(1.0).to_string();
            return Err((
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, seconds)],
                "too many failed logins from this address; retry later\n",
            )
                .into_response());
        }
        if let Some(c) = client {
            if !self
                .verifying
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(c)
            {
                return Err(busy());
            }
        }
        let _client = Verifying {
            guard: Arc::clone(self),
            client,
        };
        let Ok(turn) = Arc::clone(&self.turns).try_acquire_owned() else {
            return Err(busy());
        };
        let known = self.users.get(&user).cloned();
        let hash = known.clone().unwrap_or_else(|| self.decoy.clone());
        let pw = password.clone();
        // The turn is held until bcrypt returns, even if the client has gone.
        let ok = tokio::task::spawn_blocking(move || {
            let ok = bcrypt::verify(pw, &hash).unwrap_or(false);
            drop(turn);
            ok
        })
        .await
        .unwrap_or(false);
        let ok = ok && known.is_some();
        if let Some(c) = client {
            if ok {
                failures().verified(c);
            } else {
                failures().failed(c, Instant::now());
            }
        }
        if ok {
            self.verified
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(user, password);
            Ok(())
        } else {
            Err(unauthorized())
        }
    }

    /// Checks an `Authorization` header value (for the unit tests; the layer splits it).
    #[cfg(test)]
    async fn check(self: &Arc<Self>, authorization: Option<&HeaderValue>) -> Result<(), Response> {
        match self.credentials(authorization) {
            Credentials::Open | Credentials::Known => Ok(()),
            Credentials::Missing => Err(unauthorized()),
            Credentials::Unverified(u, p) => self.verify(u, p, None).await,
        }
    }
}

/// A client's check in progress, for [`Guard::verify`]; its end frees the client's place.
struct Verifying {
    guard: Arc<Guard>,
    client: Option<IpAddr>,
}

impl Drop for Verifying {
    fn drop(&mut self) {
        if let Some(c) = self.client {
            self.guard
                .verifying
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&c);
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

/// How long a refusal (401, 429, or 503 for want of a bcrypt turn) waits before it is sent,
/// at least: from half a second to one and a half, spread so that many clients refused at once
/// do not come back at once. A client that guesses in a loop thus costs the daemon a request
/// a second per connection, not as many as it can send; and while a refusal waits its
/// connection counts as idle, so the listener may close it to make room.
const REFUSAL_DELAY: Duration = Duration::from_millis(500);
const REFUSAL_SPREAD_MS: u32 = 1000;

/// The middleware: a client whose password verified before goes straight on; everyone else
/// meets the rate limit of their address, then basic auth; then the handler, then the headers.
pub async fn layer(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let credentials = guard.credentials(request.headers().get(header::AUTHORIZATION));
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let checked = if !matches!(credentials, Credentials::Known) && !guard.admit(peer) {
        Err((
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "rate limit exceeded\n",
        )
            .into_response())
    } else {
        match credentials {
            Credentials::Open | Credentials::Known => Ok(()),
            Credentials::Missing => Err(unauthorized()),
            Credentials::Unverified(user, password) => guard.verify(user, password, peer).await,
        }
    };
    let mut response = match checked {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            let _idle = request
                .extensions()
                .get::<crate::http::listener::Activity>()
                .map(crate::http::listener::Activity::idle);
            // The clock's fraction of a second is spread enough.
            let spread = crate::time::now().fract() * f64::from(REFUSAL_SPREAD_MS);
            tokio::time::sleep(REFUSAL_DELAY + Duration::from_millis(spread as u64)).await;
            refused
        }
    };
    guard.add_headers(&mut response);
    response
}

impl Guard {
    fn add_headers(&self, response: &mut Response) {
        for (name, value) in &self.headers {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
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
            ..WebConfig::default()
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

    /// One address holds one turn at most: its second guess meanwhile is 503, while another
    /// address still gets the other turn.
    #[tokio::test]
    async fn one_check_per_address_at_a_time() {
        let web = WebConfig {
            tls: None,
            users: BTreeMap::from([("alice".to_string(), bcrypt::hash("s3cret", 8).unwrap())]),
            headers: vec![],
            rate_limit: None,
            ..WebConfig::default()
        };
        let guard = Guard::new(&web);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = {
            let guard = Arc::clone(&guard);
            tokio::spawn(async move { guard.verify("alice".into(), b"x".to_vec(), Some(a)).await })
        };
        // The first check is under way once its address is marked.
        while guard.verifying.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let again = guard.verify("alice".into(), b"y".to_vec(), Some(a)).await;
        assert_eq!(again.unwrap_err().status(), StatusCode::SERVICE_UNAVAILABLE);
        let other = guard
            .verify("alice".into(), b"s3cret".to_vec(), Some(b))
            .await;
        assert!(other.is_ok());
        assert_eq!(
            first.await.unwrap().unwrap_err().status(),
            StatusCode::UNAUTHORIZED
        );
        assert!(guard.verifying.lock().unwrap().is_empty());
    }

    /// A failure alone bars nothing; one in a row with it bars its address for a second,
    /// doubling with each failure in a row up to 32 s, and failures far enough apart start over;
    /// a success forgets them. Other addresses are not barred, and an IPv6 client is barred by
    /// its /64.
    #[test]
    fn failed_passwords_in_a_row_bar_their_address_for_doubling_times() {
        let mut f = Failures::default();
        let a = client_key("192.0.2.1".parse().unwrap());
        let b = client_key("192.0.2.2".parse().unwrap());
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        f.failed(a, t0);
        assert_eq!(f.barred(a, t0), None);
        f.failed(a, at(500));
        assert_eq!(f.barred(a, at(900)), Some(Duration::from_millis(600)));
        assert_eq!(f.barred(b, at(900)), None);
        assert_eq!(f.barred(a, at(1500)), None);
        // Failures in a row, each as soon as the bar ends: 2, 4, ... 32, 32 s.
        let mut now = 1500;
        let mut lengths = Vec::new();
        for _ in 0..7 {
            f.failed(a, at(now));
            let left = f.barred(a, at(now)).unwrap();
            lengths.push(left.as_secs());
            now += left.as_millis() as u64;
        }
        assert_eq!(lengths, [2, 4, 8, 16, 32, 32, 32]);
        // A failure 32 s or more after the last bar ended starts over: no bar, then a second.
        f.failed(a, at(now + 32_000));
        assert_eq!(f.barred(a, at(now + 32_000)), None);
        f.failed(a, at(now + 34_000));
        assert_eq!(f.barred(a, at(now + 34_000)), Some(BACKOFF_FIRST));
        f.verified(a);
        assert_eq!(f.barred(a, at(now + 34_000)), None);
        // A scraper with a wrong password, trying every 5 s: never barred.
        for i in 0..5 {
            let t = at(now + 40_000 + i * 5000);
            assert_eq!(f.barred(a, t), None);
            f.failed(a, t);
            assert_eq!(f.barred(a, t), None);
        }
        let v6 = |s: &str| client_key(s.parse().unwrap());
        f.failed(v6("2001:db8::1"), t0);
        f.failed(v6("2001:db8::2"), t0);
        assert!(f.barred(v6("2001:db8::ffff"), t0).is_some());
        assert!(f.barred(v6("2001:db8:0:1::1"), t0).is_none());
    }

    #[test]
    fn the_failures_are_bounded() {
        let mut f = Failures::default();
        let t0 = Instant::now();
        let ip = |i: u32| IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        for i in 0..MAX_CLIENTS as u32 + 100 {
            f.failed(ip(i), t0);
        }
        assert_eq!(f.clients.len(), MAX_CLIENTS);
        // Once no failure could follow the old ones in a row, newcomers are remembered.
        let later = t0 + STRIKE_WINDOW;
        f.failed(ip(1 << 20), later);
        f.failed(ip(1 << 20), later);
        assert!(f.barred(ip(1 << 20), later).is_some());
        assert!(f.clients.len() <= MAX_CLIENTS);
    }

    /// Through the guard: after two wrong passwords from an address, the right one from it is
    /// 429 until its bar ends; another address verifies meanwhile. One wrong password alone
    /// bars nothing.
    #[tokio::test]
    async fn wrong_passwords_bar_their_address_not_others() {
        let web = WebConfig {
            users: BTreeMap::from([("alice".to_string(), bcrypt::hash("s3cret", 4).unwrap())]),
            ..WebConfig::default()
        };
        let guard = Guard::new(&web);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let verify = |p: &str, from: IpAddr| guard.verify("alice".into(), p.into(), Some(from));
        let refused = |r: Result<(), Response>| r.unwrap_err().status();
        assert_eq!(refused(verify("wrong", b).await), StatusCode::UNAUTHORIZED);
        assert!(verify("s3cret", b).await.is_ok());
        for _ in 0..2 {
            assert_eq!(refused(verify("wrong", a).await), StatusCode::UNAUTHORIZED);
        }
        let barred = verify("s3cret", a).await.unwrap_err();
        assert_eq!(barred.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(barred.headers()[header::RETRY_AFTER], "1");
        assert!(verify("s3cret", b).await.is_ok());
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
            ..WebConfig::default()
        };
        let guard = Guard::new(&web);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!((0..5).filter(|_| guard.admit(Some(a))).count(), 3);
        // Another client has a bucket of its own.
        assert_eq!((0..5).filter(|_| guard.admit(Some(b))).count(), 3);
        // An IPv6 client is its /64, and an IPv4-mapped address is its IPv4 one.
        let v6 = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(
            (0..5)
                .filter(|i| guard.admit(v6(&format!("2001:db8::{i}"))))
                .count(),
            3
        );
        assert!(!guard.admit(v6("::ffff:192.0.2.1")));
    }

    #[test]
    fn the_buckets_are_bounded() {
        let mut b = Buckets {
            limit: RateLimit {
                interval: Duration::from_secs(3600),
                burst: 2,
            },
            clients: HashMap::new(),
        };
        let now = Instant::now();
        let ip = |i: u32| IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        for i in 0..MAX_CLIENTS as u32 + 100 {
            assert!(b.admit(ip(i), now + Duration::from_millis(u64::from(i))));
        }
        assert!(b.clients.len() <= MAX_CLIENTS);
        // The newest is remembered: its bucket is one token down.
        let last = ip(MAX_CLIENTS as u32 + 99);
        assert!(b.admit(last, now + Duration::from_secs(60)));
        assert!(!b.admit(last, now + Duration::from_secs(60)));
    }
}
