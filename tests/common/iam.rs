//! `config/iam-policy.json`, judged: a small evaluator of IAM identity policies, and a gate that
//! puts the policy between the daemon and moto.
//!
//! moto authenticates requests but evaluates neither the Resource nor the Condition element of a
//! policy, so the policy's bounds would pass untested there. The evaluator models exactly the
//! parts of IAM's policy language that the shipped policy uses, as the IAM User Guide describes
//! policy evaluation and condition operators:
//!
//! - statements with `"Effect": "Allow"`: a request is allowed when one of them matches it, and
//!   implicitly denied otherwise;
//! - `Action` and `Resource`, a string or a list, matched with the wildcards `*` (any run of
//!   characters, none included) and `?` (one character): actions ignoring case, resources not;
//! - `Condition`: every operator in it and every key under an operator must hold (AND); a key
//!   holds when one of its values matches (OR); key names ignore case. `StringEquals` (exact) and
//!   `StringLike` (wildcards) apply to a single-valued key and are false when the request lacks
//!   it. `ForAllValues:StringEquals` applies to a multivalued key and holds when every value in
//!   the request is listed, and so also when the request has no value at all (hence `Null`).
//!   `Null` is `"true"` when the request lacks the key, `"false"` when it has it;
//! - the policy variable `${key}` in a condition value, replaced by the request's value of that
//!   single-valued key; a variable the request lacks matches nothing.
//!
//! Anything else (a `Deny`, `NotAction`, `NotResource` or `Principal`, another operator, a plain
//! operator on a multivalued key, a variable in a resource) panics: a policy the evaluator cannot
//! judge fails the test instead of passing it.
//!
//! The gate is a loopback proxy in front of moto. It reads each request the daemon sends, builds
//! the request context AWS would build for the instance role of one instance (the resource ARNs,
//! `aws:ARN`, `ec2:SourceInstanceARN`, the resources' tags as moto holds them, the tag keys and
//! values a `CreateTags` asks for), and answers `UnauthorizedOperation` (HTTP 403) as EC2 does
//! when the policy denies it; what the policy allows is forwarded to moto.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::{moto, rt, REGION};

/// moto's account.
pub const ACCOUNT: &str = "123456789012";

/// The ARN of an EC2 resource in moto's account, by its id: an instance or a spot request.
pub fn ec2_arn(id: &str) -> String {
    let kind = if id.starts_with("sir-") {
        "spot-instances-request"
    } else if id.starts_with("i-") {
        "instance"
    } else {
        panic!("no ARN is modelled for the EC2 resource {id}")
    };
    format!("arn:aws:ec2:{REGION}:{ACCOUNT}:{kind}/{id}")
}

#[derive(Debug, Clone)]
enum ContextValue {
    Single(String),
    Multi(Vec<String>),
}

/// One authorization: an action on one resource (`*` for an action without resource-level
/// permissions), with its request context.
#[derive(Debug, Clone)]
pub struct Request {
    pub action: String,
    pub resource: String,
    /// By key, lowercased: IAM compares key names ignoring case.
    context: BTreeMap<String, ContextValue>,
}

impl Request {
    pub fn new(action: &str, resource: &str) -> Request {
        Request {
            action: action.to_string(),
            resource: resource.to_string(),
            context: BTreeMap::new(),
        }
    }

    /// A request by the instance role of `instance` on the EC2 resource `id`: the resource's
    /// ARN is its `aws:ARN`, and the caller's instance its `ec2:SourceInstanceARN`.
    pub fn ec2_by_instance(action: &str, id: &str, instance: &str) -> Request {
        let arn = ec2_arn(id);
        Request::new(action, &arn)
            .with("aws:ARN", &arn)
            .with("ec2:SourceInstanceARN", &ec2_arn(instance))
            .with("ec2:Region", REGION)
            .with("aws:RequestedRegion", REGION)
    }

    /// Sets the single-valued key `key`.
    pub fn with(mut self, key: &str, value: &str) -> Request {
        self.context.insert(
            key.to_ascii_lowercase(),
            ContextValue::Single(value.to_string()),
        );
        self
    }

    /// Sets the multivalued key `key`.
    pub fn with_all(mut self, key: &str, values: &[&str]) -> Request {
        self.context.insert(
            key.to_ascii_lowercase(),
            ContextValue::Multi(values.iter().map(|v| v.to_string()).collect()),
        );
        self
    }

    /// A resource tag, as both `aws:ResourceTag/KEY` and `ec2:ResourceTag/KEY`.
    pub fn with_resource_tag(self, key: &str, value: &str) -> Request {
        self.with(&format!("aws:ResourceTag/{key}"), value)
            .with(&format!("ec2:ResourceTag/{key}"), value)
    }

    /// The tags a `CreateTags` asks for: `aws:TagKeys` and each `aws:RequestTag/KEY`.
    pub fn with_request_tags(self, tags: &[(&str, &str)]) -> Request {
        let keys: Vec<&str> = tags.iter().map(|(k, _)| *k).collect();
        let mut req = self.with_all("aws:TagKeys", &keys);
        for (k, v) in tags {
            req = req.with(&format!("aws:RequestTag/{k}"), v);
        }
        req
    }

    fn get(&self, key: &str) -> Option<&ContextValue> {
        self.context.get(&key.to_ascii_lowercase())
    }
}

/// An identity policy.
#[derive(Debug, Clone)]
pub struct Policy(Value);

impl Policy {
    /// `config/iam-policy.json`.
    pub fn shipped() -> Policy {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/iam-policy.json");
        Policy::parse(&std::fs::read_to_string(path).unwrap())
    }

    pub fn parse(text: &str) -> Policy {
        let doc: Value = serde_json::from_str(text).unwrap();
        // Policy variables exist only in this version of the language.
        assert_eq!(doc["Version"], "2012-10-17", "the policy's Version");
        assert!(
            doc["Statement"].is_array(),
            "the evaluator models a list of statements"
        );
        Policy(doc)
    }

    /// The `Sid` of the first statement that allows `req`, or `None`: implicitly denied.
    pub fn allowing(&self, req: &Request) -> Option<String> {
        self.0["Statement"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| statement_allows(s, req))
            .map(|s| s["Sid"].as_str().unwrap_or("").to_string())
    }

    pub fn allows(&self, req: &Request) -> bool {
        self.allowing(req).is_some()
    }
}

fn statement_allows(statement: &Value, req: &Request) -> bool {
    let fields = statement.as_object().expect("a statement is an object");
    for key in fields.keys() {
        assert!(
            ["Sid", "Effect", "Action", "Resource", "Condition"].contains(&key.as_str()),
            "the evaluator does not model the statement element {key}"
        );
    }
    assert_eq!(
        statement["Effect"], "Allow",
        "the evaluator models Allow statements only"
    );
    let action = req.action.to_ascii_lowercase();
    if !strings(&statement["Action"])
        .iter()
        .any(|a| glob(&a.to_ascii_lowercase(), &action))
    {
        return false;
    }
    let resources = strings(&statement["Resource"]);
    for r in &resources {
        assert!(
            !r.contains("${"),
            "the evaluator does not model variables in resources: {r}"
        );
    }
    if !resources.iter().any(|r| glob(r, &req.resource)) {
        return false;
    }
    match statement.get("Condition") {
        None => true,
        Some(block) => block
            .as_object()
            .expect("a Condition is an object")
            .iter()
            .all(|(operator, keys)| {
                keys.as_object()
                    .expect("a condition operator maps keys to values")
                    .iter()
                    .all(|(key, values)| condition(operator, key, &strings(values), req))
            }),
    }
}

/// One key under one operator.
fn condition(operator: &str, key: &str, wanted: &[String], req: &Request) -> bool {
    let have = req.get(key);
    match operator {
        "Null" => {
            let absent = match have {
                None => true,
                Some(ContextValue::Multi(v)) => v.is_empty(),
                Some(ContextValue::Single(_)) => false,
            };
            wanted.iter().any(|w| match w.as_str() {
                "true" => absent,
                "false" => !absent,
                other => panic!("Null takes \"true\" or \"false\", not {other:?}"),
            })
        }
        "StringEquals" | "StringLike" => match have {
            None => false,
            Some(ContextValue::Multi(_)) => panic!(
                "{operator} on the multivalued key {key}: IAM wants ForAllValues or ForAnyValue"
            ),
            Some(ContextValue::Single(value)) => wanted
                .iter()
                .any(|w| substitute(w, req).is_some_and(|w| string_match(operator, &w, value))),
        },
        "ForAllValues:StringEquals" => match have {
            None => true,
            Some(ContextValue::Single(_)) => {
                panic!("{operator} on the single-valued key {key}")
            }
            Some(ContextValue::Multi(values)) => values.iter().all(|value| {
                wanted.iter().any(|w| {
                    substitute(w, req).is_some_and(|w| string_match("StringEquals", &w, value))
                })
            }),
        },
        other => panic!("the evaluator does not model the condition operator {other}"),
    }
}

fn string_match(operator: &str, wanted: &str, value: &str) -> bool {
    match operator {
        "StringEquals" => wanted == value,
        "StringLike" => glob(wanted, value),
        other => unreachable!("{other}"),
    }
}

/// `text` with each `${key}` replaced by the request's value of that single-valued key, or
/// `None` when the request lacks one.
fn substitute(text: &str, req: &Request) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .unwrap_or_else(|| panic!("an unclosed policy variable in {text:?}"));
        let key = &rest[start + 2..start + end];
        match req.get(key)? {
            ContextValue::Single(v) => out.push_str(v),
            ContextValue::Multi(_) => panic!("the multivalued key {key} as a policy variable"),
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// A policy element's values: a string, a list of strings, or (in `Null`) a boolean.
fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Bool(b) => vec![b.to_string()],
        Value::Array(a) => a.iter().flat_map(strings).collect(),
        other => panic!("a policy value must be a string or a list of them, not {other}"),
    }
}

/// IAM's wildcard match: `*` is any run of characters (none included), `?` is one.
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    // The last `*` seen, and where in the text its run ends so far.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if let Some((s, end)) = star {
            // Let the `*` take one more character, and match on from there.
            star = Some((s, end + 1));
            pi = s + 1;
            ti = end + 1;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

// ---- the gate -----------------------------------------------------------------------------------

/// What the gate decided about one request.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The API operation, such as `CancelSpotInstanceRequests`.
    pub operation: String,
    /// The resources authorized: ARNs, or `*`.
    pub resources: Vec<String>,
    pub allowed: bool,
}

/// A loopback proxy in front of moto that lets through only what the policy allows the instance
/// role of one instance.
pub struct Gate {
    pub addr: SocketAddr,
    decisions: Arc<Mutex<Vec<Decision>>>,
}

impl Gate {
    /// Judges every request by `policy`, as sent by the instance role of `instance`.
    pub fn start(policy: Policy, instance: &str) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let decisions = Arc::new(Mutex::new(Vec::new()));
        let (policy, instance, log) = (
            Arc::new(policy),
            instance.to_string(),
            Arc::clone(&decisions),
        );
        let upstream = moto().addr;
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let (policy, instance, log) =
                    (Arc::clone(&policy), instance.clone(), Arc::clone(&log));
                std::thread::spawn(move || serve(conn, upstream, &policy, &instance, &log));
            }
        });
        Gate { addr, decisions }
    }

    /// Every decision so far, in order.
    pub fn decisions(&self) -> Vec<Decision> {
        self.decisions.lock().unwrap().clone()
    }
}

/// A request as read off the wire.
struct HttpRequest {
    head: Vec<String>,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<HttpRequest> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            if head.is_empty() {
                continue;
            }
            break;
        }
        head.push(line.trim_end_matches(['\r', '\n']).to_string());
    }
    let headers: BTreeMap<String, String> = head[1..]
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    assert!(
        !headers.contains_key("transfer-encoding"),
        "the gate reads bodies by Content-Length only: {head:?}"
    );
    let length: usize = headers
        .get("content-length")
        .map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(HttpRequest {
        head,
        headers,
        body,
    })
}

fn serve(
    conn: TcpStream,
    upstream: SocketAddr,
    policy: &Policy,
    instance: &str,
    log: &Mutex<Vec<Decision>>,
) {
    let mut reader = BufReader::new(conn);
    while let Some(req) = read_request(&mut reader) {
        let decision = decide(&req, policy, instance);
        let allowed = decision.allowed;
        log.lock().unwrap().push(decision);
        if allowed {
            forward(&req, reader.get_mut(), upstream);
            // Forwarded with `Connection: close`: the client opens a new connection next time.
            return;
        }
        let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error><Code>UnauthorizedOperation</Code><Message>You are not authorized to perform this operation.</Message></Error></Errors><RequestID>policy-gate</RequestID></Response>";
        let resp = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\r\n{xml}",
            xml.len()
        );
        if reader.get_mut().write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// Sends the request to moto on a connection of its own, and its answer back, both marked
/// `Connection: close`.
fn forward(req: &HttpRequest, client: &mut TcpStream, upstream: SocketAddr) {
    let Ok(mut up) = TcpStream::connect(upstream) else {
        return;
    };
    let mut out = String::new();
    out.push_str(&req.head[0]);
    out.push_str("\r\n");
    for line in req.head[1..]
        .iter()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
    {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    if up.write_all(out.as_bytes()).is_err() || up.write_all(&req.body).is_err() {
        return;
    }
    let mut answer = Vec::new();
    if up.read_to_end(&mut answer).is_err() {
        return;
    }
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(answer.len());
    let head = String::from_utf8_lossy(&answer[..split]);
    let mut rewritten = String::new();
    for line in head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
    {
        rewritten.push_str(line);
        rewritten.push_str("\r\n");
    }
    rewritten.push_str("Connection: close");
    let _ = client.write_all(rewritten.as_bytes());
    let _ = client.write_all(&answer[split..]);
    let _ = client.flush();
}

/// `application/x-www-form-urlencoded` fields.
fn form(body: &[u8]) -> BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                    i += 2;
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8(out).unwrap()
    }
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// The values of a query-protocol list, `NAME.1`, `NAME.2`, ...
fn list(fields: &BTreeMap<String, String>, name: &str) -> Vec<String> {
    (1..)
        .map_while(|n| fields.get(&format!("{name}.{n}")).cloned())
        .collect()
}

/// The tags moto holds for the EC2 resource `id`.
fn resource_tags(id: &str) -> Vec<(String, String)> {
    let ec2 = super::ec2_client(moto().addr);
    rt().block_on(async {
        let out = ec2
            .describe_tags()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("resource-id")
                    .values(id)
                    .build(),
            )
            .send()
            .await
            .unwrap();
        out.tags()
            .iter()
            .map(|t| {
                (
                    t.key().unwrap_or("").to_string(),
                    t.value().unwrap_or("").to_string(),
                )
            })
            .collect()
    })
}

/// Builds the authorizations AWS would make for `req` and judges each: the request is allowed
/// when every one of them is. An operation outside `IAM_ACTIONS`, or one whose resources the
/// gate does not model, is denied.
fn decide(req: &HttpRequest, policy: &Policy, instance: &str) -> Decision {
    let fields = form(&req.body);
    let operation = fields
        .get("Action")
        .cloned()
        .or_else(|| {
            let target = req.headers.get("x-amz-target")?;
            Some(target.rsplit('.').next()?.to_string())
        })
        .unwrap_or_default();
    let denied = |resources: Vec<String>| Decision {
        operation: operation.clone(),
        resources,
        allowed: false,
    };
    let Some((_, action)) = gpuwatch::cloud::aws::services::IAM_ACTIONS
        .iter()
        .find(|(op, _)| *op == operation)
    else {
        return denied(vec![]);
    };
    let ids = match operation.as_str() {
        "CreateTags" => list(&fields, "ResourceId"),
        "StopInstances" | "TerminateInstances" => list(&fields, "InstanceId"),
        "CancelSpotInstanceRequests" => list(&fields, "SpotInstanceRequestId"),
        _ if action.starts_with("ec2:Describe") || *action == "pricing:GetProducts" => {
            let req = Request::new(action, "*")
                .with("ec2:SourceInstanceARN", &ec2_arn(instance))
                .with("aws:RequestedRegion", REGION);
            return Decision {
                operation: operation.clone(),
                resources: vec!["*".into()],
                allowed: policy.allows(&req),
            };
        }
        // Budgets, SNS and CloudWatch carry resources and keys of their own.
        _ => return denied(vec![]),
    };
    let tags: Vec<(String, String)> = (1..)
        .map_while(|n| {
            let key = fields.get(&format!("Tag.{n}.Key"))?;
            let value = fields.get(&format!("Tag.{n}.Value")).cloned();
            Some((key.clone(), value.unwrap_or_default()))
        })
        .collect();
    let mut allowed = !ids.is_empty();
    let mut resources = Vec::new();
    for id in &ids {
        if !(id.starts_with("i-") || id.starts_with("sir-")) {
            allowed = false;
            resources.push(id.clone());
            continue;
        }
        let mut auth = Request::ec2_by_instance(action, id, instance);
        for (k, v) in resource_tags(id) {
            auth = auth.with_resource_tag(&k, &v);
        }
        if operation == "CreateTags" {
            let pairs: Vec<(&str, &str)> =
                tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            auth = auth.with_request_tags(&pairs);
        }
        allowed &= policy.allows(&auth);
        resources.push(auth.resource);
    }
    Decision {
        operation,
        resources,
        allowed,
    }
}
