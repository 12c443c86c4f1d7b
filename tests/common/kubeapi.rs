//! Kubernetes test harness: the fake API server of `tests/kubeapi/fake_apiserver.py` (written
//! from the Kubernetes API documents, checked with Debian's kubectl by `tests/kubeapi.rs`), one
//! process per test, serving HTTPS with a certificate from a CA of the test's own; a kubeconfig
//! for it; and builders of the objects a cluster controller looks at.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use super::fake::Process;

/// The user the fake's token authenticates as, unless a test sets `user`.
pub const USER: &str = "system:serviceaccount:gpuwatch:gpuwatch-controller";

/// The namespace of the kubeconfig's context.
pub const CONTEXT_NAMESPACE: &str = "gpuwatch";

/// The longest a `kubectl` command may run before the test kills it and fails.
const KUBECTL_LIMIT: Duration = Duration::from_secs(60);

/// The fake API server, stopped (by PID) when dropped.
pub struct FakeApi {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The API's address.
    pub addr: SocketAddr,
    /// A kubeconfig for the fake: its CA, a user with `token`, and a current context whose
    /// namespace is `gpuwatch`.
    pub kubeconfig: PathBuf,
    /// The bearer token the fake accepts.
    pub token: String,
    /// The CA certificate (PEM) that issued the fake's certificate.
    pub ca: PathBuf,
    dir: PathBuf,
    process: Process,
}

impl std::ops::Deref for FakeApi {
    type Target = Process;
    fn deref(&self) -> &Process {
        &self.process
    }
}

impl FakeApi {
    /// Starts the fake, with its certificates and kubeconfig in `dir`.
    pub fn start(dir: &Path) -> FakeApi {
        let issuer = super::certs::Ca::new("gpuwatch test cluster CA");
        let ca = issuer.write(dir, "cluster-ca.crt");
        let server = issuer.issue(dir, "apiserver", false, false);
        let token = format!("gpuwatch-test-{}", std::process::id());
        let process = Process::start_with_args(
            "kubeapi/fake_apiserver.py",
            1,
            &[
                "--cert",
                server.cert.to_str().unwrap(),
                "--key",
                server.key.to_str().unwrap(),
                "--token",
                &token,
            ],
        );
        let addr = process.ports[0];
        let url = format!("https://{addr}");
        let ca_data = base64::engine::general_purpose::STANDARD
            .encode(std::fs::read(&ca).expect("the CA certificate"));
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    \
                 server: {url}\n    certificate-authority-data: {ca_data}\nusers:\n- name: \
                 gpuwatch\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  context:\n    \
                 cluster: fake\n    user: gpuwatch\n    namespace: {CONTEXT_NAMESPACE}\n\
                 current-context: fake\n"
            ),
        )
        .unwrap();
        FakeApi {
            url,
            addr,
            kubeconfig,
            token,
            ca,
            dir: dir.to_path_buf(),
            process,
        }
    }

    /// A request to the control port: (status, body).
    fn control(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut s = TcpStream::connect(self.process.control).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.process.control,
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, text) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {raw:?}"));
        let value = serde_json::from_str(text).unwrap_or(Value::Null);
        (status, value)
    }

    /// Creates or replaces an object as another client would (a new resourceVersion and a
    /// watch event), and returns it as stored (with uid, resourceVersion, creationTimestamp).
    pub fn put(&self, obj: Value) -> Value {
        let (status, stored) = self.control("PUT", "/_fake/object", Some(&obj));
        assert_eq!(status, 200, "PUT /_fake/object {obj}: {stored}");
        stored
    }

    /// The stored object at an API path such as `/apis/apps/v1/namespaces/ml/deployments/x`.
    pub fn get(&self, path: &str) -> Option<Value> {
        let state = self.state();
        state["objects"].get(path).cloned()
    }

    /// All stored objects, by API path.
    pub fn objects(&self) -> serde_json::Map<String, Value> {
        self.state()["objects"]
            .as_object()
            .cloned()
            .unwrap_or_default()
    }

    /// Removes the object at `path` at once (finalizers ignored), with a DELETED event;
    /// returns it, or None when there was none.
    pub fn delete(&self, path: &str) -> Option<Value> {
        let (status, obj) = self.control("DELETE", &format!("/_fake/object?path={path}"), None);
        (status == 200).then_some(obj)
    }

    /// Merges `changes` into the fake's state (`denied`, `tokens`, `user`, `conflicts`,
    /// `fail`, `latency_ms`, `mirror_replicas`, `bookmark_seconds`, `require_namespaces`).
    pub fn set(&self, changes: Value) {
        self.process.set(changes);
    }

    /// Refuses `verb` on `resource` (with `/subresource` if any) of `group` ("" for core) in
    /// `namespace`, or everywhere with None, as RBAC refuses a permission the user lacks; a
    /// namespaced refusal also refuses the cluster-wide request.
    pub fn deny(&self, verb: &str, group: &str, resource: &str, namespace: Option<&str>) {
        let mut rules = self.state()["denied"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut rule = json!({"verb": verb, "group": group, "resource": resource});
        if let Some(ns) = namespace {
            rule["namespace"] = json!(ns);
        }
        rules.push(rule);
        self.set(json!({ "denied": rules }));
    }

    /// Drops every refusal that `deny` added.
    pub fn allow_all(&self) {
        self.set(json!({"denied": []}));
    }

    /// Before the next write to the object at `path` (or one of its subresources), the fake
    /// writes it itself, as a concurrent writer would, bumping its resourceVersion: that write
    /// then gets 409 Conflict if it carries the resourceVersion it read (a PUT, or a patch with
    /// metadata.resourceVersion), and goes through otherwise, as on a real server.
    pub fn conflict_once(&self, path: &str) {
        let mut list = self.state()["conflicts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        list.push(json!(path));
        self.set(json!({ "conflicts": list }));
    }

    /// Like `conflict_once`, but the next write to `path` gets 409 whatever it carries.
    pub fn conflict_once_forced(&self, path: &str) {
        let mut list = self.state()["conflicts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        list.push(json!({"path": path, "force": true}));
        self.set(json!({ "conflicts": list }));
    }

    /// Forgets the history of changes up to now, as etcd's compaction does, and ends every
    /// open watch: a watch or an exact list from an older resourceVersion then gets 410
    /// Expired. Returns the resourceVersion compacted to.
    pub fn compact(&self) -> u64 {
        let (status, body) = self.control("POST", "/_fake/compact", None);
        assert_eq!(status, 200, "{body}");
        body["compacted"].as_str().unwrap().parse().unwrap()
    }

    /// The current resourceVersion.
    pub fn rv(&self) -> u64 {
        self.state()["rv"].as_str().unwrap().parse().unwrap()
    }

    /// Every API call made so far: method, path, query, verb, content_type, accept, body,
    /// code, user_agent.
    pub fn calls(&self) -> Vec<Value> {
        self.state()["calls"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Forgets the calls recorded so far.
    pub fn clear_calls(&self) {
        let (status, body) = self.control("DELETE", "/_fake/calls", None);
        assert_eq!(status, 200, "{body}");
    }

    /// The API calls other than GET, as `METHOD path`.
    pub fn writes(&self) -> Vec<String> {
        super::fake::mutations(&self.calls())
    }

    /// The stored events, core/v1 and events.k8s.io/v1 alike, in the order of their paths.
    pub fn events(&self) -> Vec<Value> {
        self.objects()
            .into_iter()
            .filter(|(path, _)| path.contains("/events/"))
            .map(|(_, e)| e)
            .collect()
    }

    /// The watches open now (path and query of each).
    pub fn watches(&self) -> Vec<Value> {
        self.state()["watches"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `kubectl` (KUBECTL names another binary) on this fake, with `args`: its kubeconfig, a
    /// discovery cache of the test's own, and `--request-timeout=20s`. Killed, and the test
    /// failed, after a minute.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        let mut child = self
            .kubectl_command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("kubectl: {e}; scripts/test installs Debian's kubernetes-client")
            });
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = stdout.read_to_end(&mut b);
            b
        });
        let err = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = stderr.read_to_end(&mut b);
            b
        });
        let deadline = Instant::now() + KUBECTL_LIMIT;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("kubectl {args:?} ran for over {KUBECTL_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Output {
            status,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        }
    }

    /// The `kubectl` command of `kubectl()`, for a test that runs it itself (a watch).
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let binary = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
        let mut command = Command::new(binary);
        command
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("kubectl-cache"))
            .arg("--request-timeout=20s")
            .args(args);
        command
    }
}

/// The API path of an object (from its apiVersion, kind, namespace and name), as the fake keys
/// its objects.
pub fn path_of(obj: &Value) -> String {
    let api_version = obj["apiVersion"].as_str().expect("apiVersion");
    let kind = obj["kind"].as_str().expect("kind");
    let name = obj["metadata"]["name"].as_str().expect("metadata.name");
    let plural = match kind {
        "Pod" => "pods",
        "Namespace" => "namespaces",
        "Node" => "nodes",
        "Event" => "events",
        "Deployment" => "deployments",
        "StatefulSet" => "statefulsets",
        "ReplicaSet" => "replicasets",
        "Job" => "jobs",
        "CronJob" => "cronjobs",
        "Lease" => "leases",
        "Notebook" => "notebooks",
        "InferenceService" => "inferenceservices",
        "RayCluster" => "rayclusters",
        other => panic!("the fake serves no kind {other}"),
    };
    let base = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) if !matches!(kind, "Namespace" | "Node") => {
            format!("{base}/namespaces/{ns}/{plural}/{name}")
        }
        _ => format!("{base}/{plural}/{name}"),
    }
}

/// The image the builders' containers run.
pub const IMAGE: &str = "nvcr.io/nvidia/pytorch:24.05-py3";

/// A pod spec with one container `main` that asks for `gpus` GPUs (none when 0).
fn pod_spec(gpus: u32) -> Value {
    let mut container = json!({"name": "main", "image": IMAGE});
    if gpus > 0 {
        let n = gpus.to_string();
        container["resources"] = json!({
            "limits": {"nvidia.com/gpu": n},
            "requests": {"nvidia.com/gpu": n},
        });
    }
    json!({"containers": [container], "restartPolicy": "Always"})
}

fn template(labels: &Value, gpus: u32) -> Value {
    json!({"metadata": {"labels": labels}, "spec": pod_spec(gpus)})
}

/// A Deployment `ns/name` of `replicas` pods that each ask for `gpus` GPUs, all ready.
pub fn deployment(ns: &str, name: &str, replicas: i64, gpus: u32) -> Value {
    let labels = json!({ "app": name });
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": template(&labels, gpus),
        },
        "status": {
            "replicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "updatedReplicas": replicas,
            "observedGeneration": 1,
        },
    })
}

/// The ReplicaSet `<deployment>-<hash>` of a Deployment as stored (by `put`, which gave it a
/// uid), owned by it.
pub fn replicaset_of(deploy: &Value, hash: &str) -> Value {
    let name = deploy["metadata"]["name"].as_str().unwrap();
    let ns = deploy["metadata"]["namespace"].as_str().unwrap();
    let mut labels = deploy["spec"]["template"]["metadata"]["labels"].clone();
    labels["pod-template-hash"] = json!(hash);
    let mut tmpl = deploy["spec"]["template"].clone();
    tmpl["metadata"]["labels"] = labels.clone();
    let replicas = deploy["spec"]["replicas"].clone();
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": format!("{name}-{hash}"),
            "namespace": ns,
            "labels": labels,
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "ownerReferences": [owner("apps/v1", "Deployment", name, uid(deploy))],
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": tmpl},
        "status": {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas},
    })
}

/// A running pod `ns/name` on `node`, asking for `gpus` GPUs, controlled by the owner
/// `owner_kind/owner_name` (ReplicaSet, StatefulSet, Job, Notebook, RayCluster, ...), with the
/// labels that owner (as these builders make it) selects: a ReplicaSet `<deployment>-<hash>`'s
/// `app=<deployment>` and `pod-template-hash=<hash>`, a Job's `job-name`, else `app=<owner>`.
pub fn pod_of(
    owner_kind: &str,
    owner_name: &str,
    owner_uid: &str,
    ns: &str,
    name: &str,
    node: &str,
    gpus: u32,
) -> Value {
    let api_version = match owner_kind {
        "ReplicaSet" | "StatefulSet" | "Deployment" | "DaemonSet" => "apps/v1",
        "Job" | "CronJob" => "batch/v1",
        "Notebook" => "kubeflow.org/v1",
        "RayCluster" => "ray.io/v1",
        "InferenceService" => "serving.kserve.io/v1beta1",
        _ => "v1",
    };
    // The labels the builders' owners select their pods by.
    let labels = match (owner_kind, owner_name.rsplit_once('-')) {
        ("ReplicaSet", Some((deploy, hash))) => json!({"app": deploy, "pod-template-hash": hash}),
        ("Job", _) => json!({"job-name": owner_name, "batch.kubernetes.io/job-name": owner_name}),
        _ => json!({ "app": owner_name }),
    };
    let mut spec = pod_spec(gpus);
    spec["nodeName"] = json!(node);
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "ownerReferences": [owner(api_version, owner_kind, owner_name, owner_uid)],
        },
        "spec": spec,
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "podIP": "10.0.0.10",
        },
    })
}

/// A controller owner reference.
pub fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// The uid of a stored object.
pub fn uid(obj: &Value) -> &str {
    obj["metadata"]["uid"]
        .as_str()
        .expect("a stored object (put gives it a uid)")
}

/// A StatefulSet `ns/name` of `replicas` pods that each ask for `gpus` GPUs, all ready.
pub fn statefulset(ns: &str, name: &str, replicas: i64, gpus: u32) -> Value {
    let labels = json!({ "app": name });
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": template(&labels, gpus),
        },
        "status": {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas},
    })
}

/// A running Job `ns/name` of one pod asking for `gpus` GPUs.
pub fn job(ns: &str, name: &str, gpus: u32) -> Value {
    let labels = json!({ "job-name": name });
    let mut tmpl = template(&labels, gpus);
    tmpl["spec"]["restartPolicy"] = json!("Never");
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0, "suspend": false,
                 "template": tmpl},
        "status": {"active": 1, "startTime": "2024-01-01T00:00:00Z"},
    })
}

/// A CronJob `ns/name` on `schedule` whose jobs ask for `gpus` GPUs.
pub fn cronjob(ns: &str, name: &str, schedule: &str, gpus: u32) -> Value {
    let job = job(ns, name, gpus);
    json!({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"schedule": schedule, "suspend": false, "jobTemplate": {"spec": job["spec"]}},
        "status": {},
    })
}

/// A Kubeflow Notebook `ns/name` whose server asks for `gpus` GPUs.
pub fn notebook(ns: &str, name: &str, gpus: u32) -> Value {
    let mut spec = pod_spec(gpus);
    spec["containers"][0]["name"] = json!(name);
    json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"template": {"spec": spec}},
        "status": {"readyReplicas": 1, "containerState": {"running": {}}},
    })
}

/// A KServe InferenceService `ns/name` whose predictor asks for `gpus` GPUs.
pub fn inferenceservice(ns: &str, name: &str, gpus: u32) -> Value {
    let mut model = json!({"modelFormat": {"name": "pytorch"}, "storageUri": "s3://models/m"});
    if gpus > 0 {
        model["resources"] = json!({"limits": {"nvidia.com/gpu": gpus.to_string()}});
    }
    json!({
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"predictor": {"minReplicas": 1, "model": model}},
        "status": {},
    })
}

/// A Namespace with these annotations.
pub fn namespace(name: &str, annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "annotations": annotations},
    })
}

/// A Lease `ns/name` held by `holder`.
pub fn lease(ns: &str, name: &str, holder: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "acquireTime": "2024-01-01T00:00:00.000000Z",
            "renewTime": "2024-01-01T00:00:00.000000Z",
            "leaseTransitions": 0,
        },
    })
}
