//! AWS test harness: a moto server, an in-process IMDSv2 fake following the routes of
//! amazon-ec2-metadata-mock, an EC2 client for checking moto's state, and a fault proxy.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use aws_sdk_ec2::types::{
    InstanceMarketOptionsRequest, InstanceType, MarketType, SpotInstanceType, SpotMarketOptions,
};

pub const REGION: &str = "us-east-1";

/// Every process a test starts gets these, so nothing ever probes the real metadata address.
pub const SAFE_ENV: &[(&str, &str)] = &[
    ("AWS_EC2_METADATA_DISABLED", "true"),
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_REGION", REGION),
];

/// A runtime for the async parts of the harness.
pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// One moto server per test binary, stopped (by PID) when the process exits.
pub struct Moto {
    pub addr: SocketAddr,
    _child: Mutex<Child>,
}

fn moto_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("moto_server")
}

pub fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| {
        // moto takes a moment to import; it is ready once its own API answers.
        let (child, addr) = super::start_server(
            "moto_server",
            Duration::from_secs(60),
            |addr| {
                Command::new(moto_binary())
                    .args(["-H", "127.0.0.1", "-p", &addr.port().to_string()])
                    .envs(SAFE_ENV.iter().copied())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("moto_server not found: scripts/test installs moto[server] in .venv")
            },
            |addr| super::try_get(addr, "/moto-api/data.json").is_ok_and(|r| r.status == 200),
        );
        reap_at_exit(child.id());
        Moto {
            addr,
            _child: Mutex::new(child),
        }
    })
}

/// moto outlives a test binary unless killed; a guard thread cannot run at exit, so the PID is
/// remembered and killed by `libc::atexit`.
fn reap_at_exit(pid: u32) {
    static PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
    extern "C" fn kill_all() {
        if let Ok(pids) = PIDS.lock() {
            for pid in pids.iter() {
                // SAFETY: kill(2) on a PID we started.
                unsafe {
                    libc::kill(*pid as i32, libc::SIGKILL);
                }
            }
        }
    }
    let mut pids = PIDS.lock().unwrap();
    if pids.is_empty() {
        // SAFETY: registering a plain extern "C" function.
        unsafe {
            libc::atexit(kill_all);
        }
    }
    pids.push(pid);
}

/// An SDK configuration for a loopback endpoint, with static test credentials: the test
/// process never runs the default credential chain, which would probe the instance metadata
/// address.
pub fn sdk_config(endpoint: SocketAddr) -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(REGION))
        .credentials_provider(aws_sdk_ec2::config::SharedCredentialsProvider::new(
            aws_sdk_ec2::config::Credentials::new("testing", "testing", None, None, "test"),
        ))
        .endpoint_url(format!("http://{endpoint}"))
        .build()
}

pub fn ec2_client(endpoint: SocketAddr) -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::new(&sdk_config(endpoint))
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    OnDemand,
    OneTimeSpot,
    PersistentSpot,
}

/// An instance launched in moto.
pub struct Launched {
    pub id: String,
    pub spot_request: Option<String>,
}

pub fn launch(kind: Kind) -> Launched {
    if kind == Kind::PersistentSpot {
        return launch_tagged_spot_request(&[]);
    }
    let ec2 = ec2_client(moto().addr);
    rt().block_on(async {
        match kind {
            Kind::OnDemand | Kind::OneTimeSpot => {
                let mut req = ec2
                    .run_instances()
                    .image_id("ami-12c6146b")
                    .instance_type(InstanceType::P4d24xlarge)
                    .min_count(1)
                    .max_count(1);
                if kind == Kind::OneTimeSpot {
                    req = req.instance_market_options(
                        InstanceMarketOptionsRequest::builder()
                            .market_type(MarketType::Spot)
                            .spot_options(
                                SpotMarketOptions::builder()
                                    .spot_instance_type(SpotInstanceType::OneTime)
                                    .build(),
                            )
                            .build(),
                    );
                }
                let out = req.send().await.unwrap();
                Launched {
                    id: out.instances()[0].instance_id().unwrap().to_string(),
                    spot_request: None,
                }
            }
            Kind::PersistentSpot => unreachable!("launched above"),
        }
    })
}

/// The instance's state name in moto.
pub fn instance_state(id: &str) -> String {
    describe(id)
        .state()
        .unwrap()
        .name()
        .unwrap()
        .as_str()
        .to_string()
}

pub fn instance_tags(id: &str) -> BTreeMap<String, String> {
    describe(id)
        .tags()
        .iter()
        .map(|t| {
            (
                t.key().unwrap().to_string(),
                t.value().unwrap_or("").to_string(),
            )
        })
        .collect()
}

pub fn tag_instance(id: &str, key: &str, value: &str) {
    let ec2 = ec2_client(moto().addr);
    rt().block_on(async {
        ec2.create_tags()
            .resources(id)
            .tags(
                aws_sdk_ec2::types::Tag::builder()
                    .key(key)
                    .value(value)
                    .build(),
            )
            .send()
            .await
            .unwrap();
    });
}

/// The spot request's state in moto, or `None` once moto has dropped a cancelled request.
pub fn spot_request_state(id: &str) -> Option<String> {
    let ec2 = ec2_client(moto().addr);
    rt().block_on(async {
        let out = ec2.describe_spot_instance_requests().send().await.unwrap();
        out.spot_instance_requests()
            .iter()
            .find(|r| r.spot_instance_request_id() == Some(id))
            .and_then(|r| r.state().map(|s| s.as_str().to_string()))
    })
}

/// The config of a daemon on a (fake) EC2 instance: fake GPUs, the IMDS fake, AWS at `endpoint`,
/// quick sampling, no boot grace. `actions` goes into `[actions]`; `extra` follows it.
pub fn daemon_config(
    dir: &std::path::Path,
    imds: &Imds,
    endpoint: SocketAddr,
    actions: &str,
    extra: &str,
) -> String {
    format!(
        r#"[nvml]
library = "{lib}"
[sampling]
interval = "100ms"
timeout = "1s"
[cloud]
provider = "aws"
imds_endpoint = "http://{imds}"
endpoint_url = "http://{endpoint}"
region = "{REGION}"
poll_interval = "200ms"
tag_poll_interval = "200ms"
[actions]
boot_grace = "0s"
wall = false
retry_for = "60s"
state_dir = "{state}"
{actions}
{extra}
"#,
        lib = super::fake_library().display(),
        imds = imds.addr,
        state = dir.join("state").display(),
    )
}

/// The instance as moto describes it.
fn describe(id: &str) -> aws_sdk_ec2::types::Instance {
    let ec2 = ec2_client(moto().addr);
    rt().block_on(async {
        let out = ec2
            .describe_instances()
            .instance_ids(id)
            .send()
            .await
            .unwrap();
        out.reservations()[0].instances()[0].clone()
    })
}

// ---- IMDSv2 fake --------------------------------------------------------------------------------

#[derive(Debug, Clone, Default)]
pub struct ImdsState {
    pub instance_id: String,
    pub instance_type: String,
    pub lifecycle: String,
    pub tags: BTreeMap<String, String>,
    /// `spot/instance-action` JSON, when an interruption is announced.
    pub instance_action: Option<String>,
    pub rebalance: Option<String>,
    pub token_requests: usize,
    /// Tokens issued before the last revocation answer 401, as revoked or expired ones do.
    pub token_generation: u64,
}

/// The fake metadata service, on a loopback port, stopped when dropped.
pub struct Imds {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<ImdsState>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Imds {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

const TOKEN: &str = "AQAAAFakeTokenForTests==";

pub fn imds(instance_id: &str, lifecycle: &str) -> Imds {
    use axum::extract::{Path as AxPath, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, put};

    let state = Arc::new(Mutex::new(ImdsState {
        instance_id: instance_id.to_string(),
        instance_type: "p4d.24xlarge".into(),
        lifecycle: lifecycle.to_string(),
        ..ImdsState::default()
    }));
    type S = Arc<Mutex<ImdsState>>;
    async fn token(State(s): State<S>, headers: HeaderMap) -> (StatusCode, String) {
        if !headers.contains_key("x-aws-ec2-metadata-token-ttl-seconds") {
            return (StatusCode::BAD_REQUEST, String::new());
        }
        let mut st = s.lock().unwrap();
        st.token_requests += 1;
        (StatusCode::OK, format!("{TOKEN}{}", st.token_generation))
    }
    async fn meta(
        State(s): State<S>,
        headers: HeaderMap,
        AxPath(path): AxPath<String>,
    ) -> (StatusCode, String) {
        let st = s.lock().unwrap().clone();
        if headers
            .get("x-aws-ec2-metadata-token")
            .and_then(|v| v.to_str().ok())
            != Some(format!("{TOKEN}{}", st.token_generation).as_str())
        {
            return (StatusCode::UNAUTHORIZED, String::new());
        }
        let found = match path.as_str() {
            "instance-id" => Some(st.instance_id),
            "instance-type" => Some(st.instance_type),
            "placement/availability-zone" => Some(format!("{REGION}a")),
            "placement/region" => Some(REGION.to_string()),
            "instance-life-cycle" => Some(st.lifecycle),
            "tags/instance" if !st.tags.is_empty() => {
                Some(st.tags.keys().cloned().collect::<Vec<_>>().join("\n"))
            }
            "spot/instance-action" => st.instance_action,
            "events/recommendations/rebalance" => st.rebalance,
            p => p
                .strip_prefix("tags/instance/")
                .and_then(|k| st.tags.get(k).cloned()),
        };
        match found {
            Some(body) => (StatusCode::OK, body),
            None => (StatusCode::NOT_FOUND, String::new()),
        }
    }
    let app = axum::Router::new()
        .route("/latest/api/token", put(token))
        .route("/latest/meta-data/{*path}", get(meta))
        .with_state(Arc::clone(&state));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    rt().spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    });
    Imds {
        addr,
        state,
        stop: Some(stop),
    }
}

// ---- fault proxy --------------------------------------------------------------------------------

/// What the proxy does with each new connection.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(u8)]
pub enum ProxyMode {
    /// Close it at once: an unreachable endpoint.
    Refuse = 0,
    /// Answer every request with HTTP 503 and an AWS error body.
    Unavailable = 1,
    /// Pass it through to the upstream (moto, unless another was named).
    Forward = 2,
}

/// A loopback TCP proxy in front of moto (or another upstream) that can refuse, fail or forward.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    pub unavailable_answers: Arc<AtomicUsize>,
    /// Connections dropped in `Refuse` mode.
    pub refused: Arc<AtomicUsize>,
}

impl Proxy {
    /// A proxy in front of moto.
    pub fn start(mode: ProxyMode) -> Proxy {
        Proxy::to(moto().addr, mode)
    }

    /// A proxy in front of `upstream` (the fake instance metadata, say).
    pub fn to(upstream: SocketAddr, mode: ProxyMode) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(mode as u8));
        let answers = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let (m, a, r) = (
            Arc::clone(&mode),
            Arc::clone(&answers),
            Arc::clone(&refused),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let mode = m.load(Ordering::SeqCst);
                let a = Arc::clone(&a);
                if mode == 0 {
                    r.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::spawn(move || match mode {
                    0 => drop(conn),
                    1 => answer_unavailable(conn, &a),
                    _ => forward(conn, upstream),
                });
            }
        });
        Proxy {
            addr,
            mode,
            unavailable_answers: answers,
            refused,
        }
    }

    pub fn set(&self, mode: ProxyMode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }
}

fn answer_unavailable(conn: TcpStream, answers: &AtomicUsize) {
    let mut reader = BufReader::new(conn);
    loop {
        let mut length = 0usize;
        let mut first = true;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" && !first {
                break;
            }
            first = false;
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        answers.fetch_add(1, Ordering::SeqCst);
        let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error><Code>Unavailable</Code><Message>The service is unavailable</Message></Error></Errors><RequestID>fault-proxy</RequestID></Response>";
        let resp = format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\r\n{xml}",
            xml.len()
        );
        if reader.get_mut().write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

fn forward(conn: TcpStream, upstream: SocketAddr) {
    let Ok(up) = TcpStream::connect(upstream) else {
        return;
    };
    let (mut c2, mut u2) = (conn.try_clone().unwrap(), up.try_clone().unwrap());
    let (mut c1, mut u1) = (conn, up);
    let t = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c1, &mut u1);
        let _ = u1.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut u2, &mut c2);
    let _ = c2.shutdown(std::net::Shutdown::Write);
    let _ = t.join();
}

// ---- the IAM policy -----------------------------------------------------------------------------

#[path = "iam.rs"]
pub mod iam;

/// A persistent spot request and its instance (`launch(Kind::PersistentSpot)`), with `tags` on
/// the spot request (a tag specification of `RequestSpotInstances`, as an operator sets them).
pub fn launch_tagged_spot_request(tags: &[(&str, &str)]) -> Launched {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let ec2 = ec2_client(moto().addr);
    let mut spec = TagSpecification::builder().resource_type(ResourceType::SpotInstancesRequest);
    for (k, v) in tags {
        spec = spec.tags(Tag::builder().key(*k).value(*v).build());
    }
    rt().block_on(async {
        let out = ec2
            .request_spot_instances()
            .spot_price("10.0")
            .instance_count(1)
            .r#type(SpotInstanceType::Persistent)
            .set_tag_specifications((!tags.is_empty()).then(|| vec![spec.build()]))
            .launch_specification(
                aws_sdk_ec2::types::RequestSpotLaunchSpecification::builder()
                    .image_id("ami-12c6146b")
                    .instance_type(InstanceType::P4d24xlarge)
                    .build(),
            )
            .send()
            .await
            .unwrap();
        let req = &out.spot_instance_requests()[0];
        Launched {
            id: req
                .instance_id()
                .expect("moto fulfils spot requests")
                .to_string(),
            spot_request: Some(req.spot_instance_request_id().unwrap().to_string()),
        }
    })
}

/// How many `action` calls ended in `result`, by `gpuwatch_actions_total` (0 before any).
pub fn actions(s: &super::Scrape, action: &str, result: &str) -> f64 {
    super::metric("gpuwatch_actions_total")
        .label("action", action)
        .label("result", result)
        .get(s)
        .unwrap_or(0.0)
}
