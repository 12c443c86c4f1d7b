//! The cluster controller end to end, with real parts where they run here: node daemons on the
//! fake NVML with fake kubelets (the real PodResources protocol) give reclaim verdicts, the
//! real Prometheus that `scripts/test` installs scrapes them, and `gpuwatch controller` reads
//! it and acts on a fake Kubernetes API server written from the API reference
//! (`tests/kubeapi/fake_apiserver.py`, checked with the real `kubectl` in `tests/kubeapi.rs`),
//! reached through an ordinary kubeconfig.

mod common;

use std::time::Duration;

use common::kubeapi::{self, FakeApi};
use common::kubelet::{fake_kubelet, pod, uuid};
use common::prometheus::Prometheus;
use common::{metric, Daemon, Killed};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(90);

/// A node daemon with a reclaim rule, over its own fake NVML and fake kubelet.
struct Node {
    daemon: Daemon,
    _kubelet: Killed,
}

/// Starts a node whose GPU `i` has utilization `gpus[i].0` and is held by pod `gpus[i].1`
/// (`namespace/pod`), if any.
fn node(name: &str, gpus: &[(u32, Option<&str>)]) -> Node {
    node_with(name, gpus, "")
}

/// `node`, with `extra` config. The node daemon enforces (a controller that enforces acts
/// only on verdicts of nodes that do), and names itself `name`, as `NODE_NAME` does.
fn node_with(name: &str, gpus: &[(u32, Option<&str>)], extra: &str) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let pods_file = dir.path().join("pods.json");
    let pods: Vec<Value> = gpus
        .iter()
        .enumerate()
        .filter_map(|(i, (_, p))| {
            let (ns, name) = (*p)?.split_once('/').unwrap();
            Some(pod(name, ns, "main", "nvidia.com/gpu", &[&uuid(i as u32)]))
        })
        .collect();
    std::fs::write(&pods_file, Value::from(pods).to_string()).unwrap();
    let kubelet = fake_kubelet(&socket, &pods_file);
    let scenario: String = gpus
        .iter()
        .map(|(u, _)| format!("[[gpu]]\nutilization = {u}\n"))
        .collect();
    let config = format!(
        "[kubernetes]\npod_resources_socket = \"{socket}\"\nrefresh = \"200ms\"\n\
         [sampling]\ninterval = \"100ms\"\n\
         [exposition]\nhostname = \"{name}\"\n\
         [actions]\nmode = \"enforce\"\nboot_grace = \"0s\"\nwarning = \"1s\"\nwall = false\nstate_dir = \"{state}\"\n\
         [[rules]]\nname = \"give-back\"\nscope = \"pod\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"reclaim\"\n{extra}",
        socket = socket.display(),
        state = dir.path().join("state").display(),
    );
    let daemon = Daemon::start_in(dir, &scenario, &config);
    Node {
        daemon,
        _kubelet: kubelet,
    }
}

/// A Prometheus scraping the node daemons every second.
fn prometheus(nodes: &[&Node]) -> Prometheus {
    let targets: Vec<String> = nodes
        .iter()
        .map(|n| format!("'{}'", n.daemon.addr))
        .collect();
    Prometheus::start(
        tempfile::tempdir().unwrap(),
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gpuwatch\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
}

/// The controller's config on this API and Prometheus.
fn controller_config(api: &FakeApi, prom: &Prometheus, mode: &str, extra: &str) -> String {
    format!(
        "[controller]\nmode = \"{mode}\"\nprometheus_url = \"http://{prom}\"\nscrape_interval = \"2s\"\n\
         poll_interval = \"300ms\"\nwarning = \"2s\"\nlease_duration = \"9s\"\nkubeconfig = \"{kubeconfig}\"\n{extra}",
        prom = prom.addr,
        kubeconfig = api.kubeconfig.display(),
    )
}

fn controller(api: &FakeApi, prom: &Prometheus, mode: &str, identity: &str) -> Daemon {
    Daemon::controller(
        tempfile::tempdir().unwrap(),
        &controller_config(api, prom, mode, ""),
        &[("POD_NAME", identity), ("POD_NAMESPACE", "gpuwatch")],
    )
}

/// A Deployment `ns/name` whose pods are `pods` (each `node/pod`, with one GPU); returns its
/// path.
fn deployment(
    api: &FakeApi,
    ns: &str,
    name: &str,
    pods: &[&str],
    change: impl Fn(&mut Value),
) -> String {
    let mut d = kubeapi::deployment(ns, name, pods.len() as i64, 1);
    change(&mut d);
    let d = api.put(d);
    let rs = api.put(kubeapi::replicaset_of(&d, "7d9f8c"));
    let rs_name = rs["metadata"]["name"].as_str().unwrap();
    for p in pods {
        let (node, p) = p.split_once('/').unwrap();
        api.put(kubeapi::pod_of(
            "ReplicaSet",
            rs_name,
            kubeapi::uid(&rs),
            ns,
            p,
            node,
            1,
        ));
    }
    kubeapi::path_of(&d)
}

/// The API group and resource (with its subresource) a call's path names.
fn resource_of(path: &str) -> (String, String) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts[0] {
        "api" => ("", &parts[2..]),
        _ => (parts[1], &parts[3..]),
    };
    let rest = match rest {
        ["namespaces", _, r @ ..] if !r.is_empty() => r,
        r => r,
    };
    let resource = match rest {
        [r] | [r, _] => r.to_string(),
        [r, _, sub, ..] => format!("{r}/{sub}"),
        [] => String::new(),
    };
    (group.to_string(), resource)
}

/// Every call the controller made is one its roles grant (the code's own list, which
/// `tests/deploy.rs` holds the manifests to).
fn assert_granted(api: &FakeApi) {
    use gpuwatch::controller::cluster::{CLUSTER_PERMISSIONS, LEASE_PERMISSIONS};
    for call in api.calls() {
        let path = call["path"].as_str().unwrap();
        let verb = call["verb"].as_str().unwrap();
        let (group, resource) = resource_of(path);
        let granted = CLUSTER_PERMISSIONS
            .iter()
            .chain(LEASE_PERMISSIONS)
            .any(|(g, r, verbs)| *g == group && *r == resource && verbs.contains(&verb));
        assert!(granted, "{verb} {group}/{resource} ({path}) is not granted");
    }
}

/// The PATCH and PUT calls made to `path` (and its subresources).
fn writes_to(api: &FakeApi, path: &str) -> Vec<String> {
    api.writes()
        .into_iter()
        .filter(|w| {
            w.split_once(' ')
                .is_some_and(|(_, p)| p == path || p.starts_with(&format!("{path}/")))
        })
        .collect()
}

/// The reasons of the Events on the object named `name`.
fn reasons(api: &FakeApi, name: &str) -> Vec<String> {
    api.events()
        .iter()
        .filter(|e| e["regarding"]["name"] == name || e["involvedObject"]["name"] == name)
        .map(|e| e["reason"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Polls the controller's `/metrics` until `cond` holds (it has no long-poll of samples).
fn await_metrics(c: &Daemon, cond: impl Fn(&common::Scrape) -> bool) -> common::Scrape {
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let s = c.scrape();
        if cond(&s) {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the controller never got there:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for an Event `reason` on the object named `name` (published after the write it
/// tells of).
fn await_reason(api: &FakeApi, name: &str, reason: &str) {
    let deadline = std::time::Instant::now() + LIMIT;
    while !reasons(api, name).iter().any(|r| r == reason) {
        assert!(
            std::time::Instant::now() < deadline,
            "no {reason} on {name}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The note of the Event `reason` on the object named `name`.
fn note_of(api: &FakeApi, name: &str, reason: &str) -> String {
    let e = api
        .events()
        .into_iter()
        .find(|e| {
            (e["regarding"]["name"] == name || e["involvedObject"]["name"] == name)
                && e["reason"] == reason
        })
        .unwrap_or_else(|| panic!("no {reason} Event on {name}"));
    e["note"]
        .as_str()
        .or(e["message"].as_str())
        .unwrap_or("")
        .to_string()
}

fn rounds(c: &Daemon) -> f64 {
    metric("gpuwatch_controller_verdict_reads_total")
        .label("result", "ok")
        .get(&c.scrape())
        .unwrap_or(0.0)
}

/// Waits for `n` more rounds of the controller that read the verdicts.
fn await_rounds(c: &Daemon, n: f64) {
    let start = rounds(c);
    await_metrics(c, |s| {
        metric("gpuwatch_controller_verdict_reads_total")
            .label("result", "ok")
            .get(s)
            .unwrap_or(0.0)
            >= start + n
    });
}

/// An idle Deployment is warned, then scaled to 0 once, and the documented command brings it
/// back; a busy one, one with a busy replica, a held one and an opted-out one are untouched; an
/// idle Job is suspended and an idle Notebook stopped. Every call is one the roles grant.
#[test]
fn idle_workloads_are_warned_then_given_back_and_restored() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start(dir.path());
    for ns in ["ml", "batch", "gpuwatch"] {
        api.put(kubeapi::namespace(ns, &[]));
    }
    let train = deployment(
        &api,
        "ml",
        "train",
        &["node-a/train-a", "node-a/train-b"],
        |_| {},
    );
    let serve = deployment(&api, "ml", "serve", &["node-a/serve-a"], |_| {});
    let mixed = deployment(
        &api,
        "ml",
        "mixed",
        &["node-a/mixed-a", "node-b/mixed-b"],
        |_| {},
    );
    let held = deployment(&api, "ml", "held", &["node-b/held-a"], |d| {
        d["metadata"]["annotations"] = json!({"gpuwatch.io/hold": "forever"});
    });
    let optout = deployment(&api, "ml", "optout", &["node-b/optout-a"], |d| {
        d["metadata"]["labels"]["gpuwatch.io/reclaim"] = json!("false");
    });
    // A Deployment that KServe owns (an InferenceService in raw deployment mode) is KServe's:
    // reported, never scaled.
    let isvc = api.put(kubeapi::inferenceservice("ml", "llm", 1));
    let llm = deployment(&api, "ml", "llm", &["node-b/llm-a"], |d| {
        d["metadata"]["ownerReferences"] = json!([kubeapi::owner(
            "serving.kserve.io/v1beta1",
            "InferenceService",
            "llm",
            kubeapi::uid(&isvc)
        )]);
    });
    let nightly = api.put(kubeapi::cronjob("batch", "nightly", "0 2 * * *", 1));
    let mut job = kubeapi::job("batch", "finetune", 1);
    job["metadata"]["ownerReferences"] = json!([kubeapi::owner(
        "batch/v1",
        "CronJob",
        "nightly",
        kubeapi::uid(&nightly)
    )]);
    let job = api.put(job);
    api.put(kubeapi::pod_of(
        "Job",
        "finetune",
        kubeapi::uid(&job),
        "batch",
        "finetune-x7k2p",
        "node-b",
        1,
    ));
    let nb = api.put(kubeapi::notebook("ml", "nb", 1));
    let mut sts = kubeapi::statefulset("ml", "nb", 1, 1);
    sts["metadata"]["ownerReferences"] = json!([kubeapi::owner(
        "kubeflow.org/v1",
        "Notebook",
        "nb",
        kubeapi::uid(&nb)
    )]);
    let sts = api.put(sts);
    api.put(kubeapi::pod_of(
        "StatefulSet",
        "nb",
        kubeapi::uid(&sts),
        "ml",
        "nb-0",
        "node-b",
        1,
    ));
    // Node A costs $8 an hour: $2 per GPU.
    // The pods are in the cluster before the node daemons judge them: a verdict given
    // before a pod was created is not that pod's.
    let a = node_with(
        "node-a",
        &[
            (0, Some("ml/train-a")),
            (0, Some("ml/train-b")),
            (90, Some("ml/serve-a")),
            (0, Some("ml/mixed-a")),
        ],
        "[cost]\nhourly_price_usd = 8.0\n",
    );
    let b = node(
        "node-b",
        &[
            (90, Some("ml/mixed-b")),
            (0, Some("ml/held-a")),
            (0, Some("ml/optout-a")),
            (0, Some("batch/finetune-x7k2p")),
            (0, Some("ml/nb-0")),
            (0, Some("ml/llm-a")),
        ],
    );
    let prom = prometheus(&[&a, &b]);
    let mut c = controller(&api, &prom, "enforce", "controller-0");

    // The idle Deployment: warned first, then scaled to 0 through its scale subresource.
    let state = api.await_state(LIMIT, |s| s["objects"][&train]["spec"]["replicas"] == 0);
    let deployed = &state["objects"][&train];
    let from: Value = serde_json::from_str(
        deployed["metadata"]["annotations"]["gpuwatch.io/scaled-down-from"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(from["replicas"], 2, "{from}");
    assert_eq!(from["rule"], "give-back", "{from}");
    await_reason(&api, "train", "GpuIdleScaledDown");
    let said = reasons(&api, "train");
    let warned = said.iter().position(|r| r == "GpuIdleWarning");
    let scaled = said.iter().position(|r| r == "GpuIdleScaledDown");
    assert!(warned.is_some() && warned < scaled, "{said:?}");
    // The Events say what the idle GPUs cost, and how to bring the Deployment back.
    let note = note_of(&api, "train", "GpuIdleScaledDown");
    assert!(note.contains("their GPUs cost $4.00 an hour"), "{note}");
    assert!(
        note.contains("gpuwatch controller restore ml/deployment/train"),
        "{note}"
    );
    // The Job suspended, the Notebook stopped as Kubeflow's culler stops one.
    api.await_state(LIMIT, |s| {
        s["objects"]["/apis/batch/v1/namespaces/batch/jobs/finetune"]["spec"]["suspend"] == true
            && s["objects"]["/apis/kubeflow.org/v1/namespaces/ml/notebooks/nb"]["metadata"]
                ["annotations"]["kubeflow-resource-stopped"]
                .is_string()
    });
    await_reason(&api, "finetune", "GpuIdleSuspended");
    await_reason(&api, "nb", "GpuIdleStopped");
    let note = note_of(&api, "finetune", "GpuIdleSuspended");
    assert!(
        note.contains("a Job of CronJob nightly: this Job only"),
        "{note}"
    );
    assert_eq!(
        writes_to(&api, &kubeapi::path_of(&nightly)),
        Vec::<String>::new()
    );
    assert!(reasons(&api, "nb").contains(&"GpuIdleStopped".to_string()));
    // The KServe-owned Deployment: an Event on its InferenceService, and a series to alert on.
    await_reason(&api, "llm", "GpuIdleUnmanaged");
    let note = note_of(&api, "llm", "GpuIdleUnmanaged");
    assert!(
        note.contains("pod llm-a of InferenceService/llm holds GPUs"),
        "{note}"
    );
    await_metrics(&c, |s| {
        metric("gpuwatch_controller_unmanaged_idle")
            .label("namespace", "ml")
            .label("owner", "InferenceService/llm")
            .get(s)
            == Some(1.0)
    });
    // The held and the opted-out Deployments' pods were judged idle too: they are untouched
    // for their hold and label, not for want of a verdict.
    let verdicts = b.daemon.scrape();
    for pod in ["held-a", "optout-a"] {
        assert!(
            metric("gpuwatch_pod_reclaim_verdict")
                .label("pod", pod)
                .get(&verdicts)
                .is_some(),
            "{pod}"
        );
    }
    // A few rounds more: the others stay untouched, and the idle one was scaled once.
    await_rounds(&c, 5.0);
    for (path, replicas) in [
        (&serve, 1),
        (&mixed, 2),
        (&held, 1),
        (&optout, 1),
        (&llm, 1),
    ] {
        assert_eq!(writes_to(&api, path), Vec::<String>::new(), "{path}");
        assert_eq!(
            api.get(path).unwrap()["spec"]["replicas"],
            replicas,
            "{path}"
        );
    }
    assert_eq!(
        writes_to(&api, &format!("{train}/scale")).len(),
        1,
        "{:?}",
        api.writes()
    );
    let s = c.scrape();
    metric("gpuwatch_controller_actions_total")
        .label("kind", "Deployment")
        .label("result", "done")
        .value(1.0)
        .assert_in(&s);
    metric("gpuwatch_controller_leader")
        .value(1.0)
        .assert_in(&s);
    assert_granted(&api);

    // The documented command brings it back (the controller stopped first, or it would give
    // the still idle Deployment back again after a new warning).
    c.kill();
    let config = dir.path().join("controller.toml");
    std::fs::write(&config, controller_config(&api, &prom, "enforce", "")).unwrap();
    let out = common::gpuwatch(&[
        &"controller",
        &"restore",
        &"ml/deployment/train",
        &"--config",
        &config,
    ]);
    assert!(
        out.contains("ml/deployment/train: scaled back to 2"),
        "{out}"
    );
    let restored = api.get(&train).unwrap();
    assert_eq!(restored["spec"]["replicas"], 2);
    assert!(restored["metadata"]["annotations"]
        .get("gpuwatch.io/scaled-down-from")
        .is_none_or(Value::is_null));
    // Restoring what gpuwatch did not scale down says so, and changes nothing.
    let out = std::process::Command::new(common::daemon_binary())
        .args(["controller", "restore", "ml/deployment/serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpuwatch did not scale it down"), "{err}");
    // The Job resumed, the Notebook started, each without gpuwatch's record.
    for (what, said, path) in [
        (
            "batch/job/finetune",
            "resumed",
            "/apis/batch/v1/namespaces/batch/jobs/finetune",
        ),
        (
            "ml/notebook/nb",
            "started",
            "/apis/kubeflow.org/v1/namespaces/ml/notebooks/nb",
        ),
    ] {
        let out = common::gpuwatch(&[&"controller", &"restore", &what, &"--config", &config]);
        assert!(out.contains(&format!("{what}: {said}")), "{out}");
        let o = api.get(path).unwrap();
        let annotations = &o["metadata"]["annotations"];
        assert!(
            annotations
                .get("gpuwatch.io/given-back-by")
                .is_none_or(Value::is_null),
            "{o}"
        );
        assert!(
            annotations
                .get("kubeflow-resource-stopped")
                .is_none_or(Value::is_null),
            "{o}"
        );
    }
    assert_eq!(
        api.get("/apis/batch/v1/namespaces/batch/jobs/finetune")
            .unwrap()["spec"]["suspend"],
        false
    );
}

/// Dry-run writes nothing but Events saying what it would do.
#[test]
fn dry_run_writes_only_events() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start(dir.path());
    api.put(kubeapi::namespace("ml", &[]));
    let train = deployment(&api, "ml", "train", &["node-a/train-a"], |_| {});
    let a = node("node-a", &[(0, Some("ml/train-a"))]);
    let prom = prometheus(&[&a]);
    let c = controller(&api, &prom, "dry-run", "controller-0");
    await_metrics(&c, |s| {
        metric("gpuwatch_controller_actions_total")
            .label("result", "dry_run")
            .get(s)
            .is_some()
    });
    await_rounds(&c, 3.0);
    let said = reasons(&api, "train");
    assert_eq!(
        said.iter().filter(|r| *r == "GpuIdleDryRun").count(),
        1,
        "{said:?}"
    );
    assert!(said.contains(&"GpuIdleWarning".to_string()), "{said:?}");
    assert_eq!(writes_to(&api, &train), Vec::<String>::new());
    // The history is compacted: the pods' watch ends, meets 410 Gone, and the cache is listed
    // again; the controller goes on, and says nothing twice.
    let listed = |api: &FakeApi| {
        api.calls()
            .iter()
            .filter(|c| c["path"] == "/api/v1/pods" && c["verb"] == "list")
            .count()
    };
    let before = listed(&api);
    api.compact();
    api.await_state(LIMIT, |s| {
        s["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["path"] == "/api/v1/pods" && c["verb"] == "list")
            .count()
            > before
    });
    await_rounds(&c, 3.0);
    metric("gpuwatch_controller_pods_cached")
        .value(1.0)
        .assert_in(&c.scrape());
    metric("gpuwatch_controller_workloads_watched")
        .value(1.0)
        .assert_in(&c.scrape());
    let said = reasons(&api, "train");
    assert_eq!(
        said.iter().filter(|r| *r == "GpuIdleDryRun").count(),
        1,
        "{said:?}"
    );
    // Its only writes: Events and its Lease.
    for w in api.writes() {
        assert!(w.contains("/events") || w.contains("/leases"), "{w}");
    }
}

/// Nothing unknown acts: Prometheus stopped, a node daemon stopped (its last verdict stale),
/// or the API answering 403, and the 403 names the verb and resource the role lacks.
#[test]
fn nothing_unknown_acts() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start(dir.path());
    api.put(kubeapi::namespace("ml", &[]));
    let train = deployment(&api, "ml", "train", &["node-a/train-a"], |_| {});
    let mut a = node("node-a", &[(0, Some("ml/train-a"))]);
    let mut prom = prometheus(&[&a]);
    // The scale subresource is refused: the action fails, saying what the role lacks.
    api.deny("patch", "apps", "deployments/scale", Some("ml"));
    let c = controller(&api, &prom, "enforce", "controller-0");
    await_metrics(&c, |s| {
        metric("gpuwatch_controller_actions_total")
            .label("result", "failed")
            .get(s)
            .is_some()
    });
    let failed = api
        .events()
        .into_iter()
        .find(|e| e["reason"] == "GpuIdleActionFailed")
        .unwrap();
    let note = failed["note"]
        .as_str()
        .unwrap_or(failed["message"].as_str().unwrap_or(""));
    assert!(
        note.contains("cannot patch resource \"deployments/scale\" in API group \"apps\""),
        "{note}"
    );
    // The replicas put on record before the scale were taken back when it failed.
    let deployed = api.get(&train).unwrap();
    assert_eq!(deployed["spec"]["replicas"], 1);
    assert!(
        deployed["metadata"]["annotations"]
            .get("gpuwatch.io/scaled-down-from")
            .is_none_or(Value::is_null),
        "{deployed}"
    );

    // Prometheus stopped: no verdict is known, and nothing is given back, though the API
    // would now allow it.
    prom.stop();
    await_metrics(&c, |s| {
        metric("gpuwatch_controller_errors_total")
            .label("what", "prometheus")
            .get(s)
            .is_some()
    });
    api.allow_all();
    let errors = || {
        metric("gpuwatch_controller_errors_total")
            .label("what", "prometheus")
            .get(&c.scrape())
            .unwrap_or(0.0)
    };
    let before = errors();
    await_metrics(&c, |s| {
        metric("gpuwatch_controller_errors_total")
            .label("what", "prometheus")
            .get(s)
            .unwrap_or(0.0)
            >= before + 5.0
    });
    assert_eq!(api.get(&train).unwrap()["spec"]["replicas"], 1);

    // The node daemon dies while Prometheus is down, so no staleness marker ends its series:
    // Prometheus comes back answering with its last verdict, older than two scrape intervals
    // by then (the wait ages it), which counts as busy.
    a.daemon.kill();
    std::thread::sleep(Duration::from_secs(5));
    prom.restart();
    await_metrics(&c, |s| {
        metric("gpuwatch_controller_verdicts")
            .label("state", "stale")
            .get(s)
            .unwrap_or(0.0)
            >= 1.0
    });
    await_rounds(&c, 5.0);
    assert_eq!(api.get(&train).unwrap()["spec"]["replicas"], 1);
}

/// Of two controllers only the leader acts; a Conflict (the Deployment written by another
/// client between the read and the write) is read again and decided again.
#[test]
fn only_the_leader_acts_and_a_conflict_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start(dir.path());
    api.put(kubeapi::namespace("ml", &[]));
    let train = deployment(&api, "ml", "train", &["node-a/train-a"], |_| {});
    let a = node("node-a", &[(0, Some("ml/train-a"))]);
    api.conflict_once(&train);
    let prom = prometheus(&[&a]);
    let one = controller(&api, &prom, "enforce", "controller-0");
    let two = controller(&api, &prom, "enforce", "controller-1");
    api.await_state(LIMIT, |s| s["objects"][&train]["spec"]["replicas"] == 0);
    let leads = |c: &Daemon| metric("gpuwatch_controller_leader").get(&c.scrape()) == Some(1.0);
    let (leader, other) = if leads(&one) {
        (&one, &two)
    } else {
        (&two, &one)
    };
    await_rounds(leader, 5.0);
    assert!(leads(leader) && !leads(other));
    // The other never read the verdicts, nor wrote anything but to take the Lease.
    assert_eq!(rounds(other), 0.0);
    let lease = api
        .get("/apis/coordination.k8s.io/v1/namespaces/gpuwatch/leases/gpuwatch-controller")
        .unwrap();
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        holder == "controller-0" || holder == "controller-1",
        "{lease}"
    );
    // Scaled once, after one Conflict that was read again.
    assert_eq!(
        writes_to(&api, &format!("{train}/scale")).len(),
        1,
        "{:?}",
        api.writes()
    );
    let conflicts: f64 = [&one, &two]
        .iter()
        .filter_map(|c| {
            metric("gpuwatch_controller_actions_total")
                .label("result", "conflict")
                .get(&c.scrape())
        })
        .sum();
    assert_eq!(conflicts, 1.0);
    // The leader dies: once its Lease has gone unrenewed for its duration, the other takes it.
    let one_led = leads(&one);
    let (mut gone, stays, successor) = if one_led {
        (one, two, "controller-1")
    } else {
        (two, one, "controller-0")
    };
    gone.kill();
    await_metrics(&stays, |s| {
        metric("gpuwatch_controller_leader").get(s) == Some(1.0)
    });
    let lease = api
        .get("/apis/coordination.k8s.io/v1/namespaces/gpuwatch/leases/gpuwatch-controller")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], successor, "{lease}");
    assert_eq!(lease["spec"]["leaseTransitions"], 1, "{lease}");
}

/// A role that cannot list the pods sees none of them: nothing is given back while the watch
/// is refused (the controller is not ready), and once the role allows it, the idle Deployment is.
#[test]
fn pods_it_may_not_list_give_nothing_back() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start(dir.path());
    api.put(kubeapi::namespace("ml", &[]));
    let train = deployment(&api, "ml", "train", &["node-a/train-a"], |_| {});
    api.deny("list", "", "pods", None);
    api.deny("watch", "", "pods", None);
    let a = node("node-a", &[(0, Some("ml/train-a"))]);
    let prom = prometheus(&[&a]);
    let c = controller(&api, &prom, "enforce", "controller-0");
    await_metrics(&c, |s| {
        metric("gpuwatch_controller_errors_total")
            .label("what", "kubernetes")
            .get(s)
            .unwrap_or(0.0)
            >= 3.0
    });
    // The node judges the pod idle all along; the controller cannot see its pods, so it
    // reads no verdict and acts on nothing.
    a.daemon.await_scrape(LIMIT, |s| {
        metric("gpuwatch_pod_reclaim_verdict")
            .label("pod", "train-a")
            .get(s)
            .is_some()
    });
    await_metrics(&c, |s| {
        metric("gpuwatch_controller_errors_total")
            .label("what", "kubernetes")
            .get(s)
            .unwrap_or(0.0)
            >= 4.0
    });
    assert_eq!(c.get("/-/ready").status, 503);
    metric("gpuwatch_controller_pods_cached")
        .value(0.0)
        .assert_in(&c.scrape());
    assert_eq!(writes_to(&api, &train), Vec::<String>::new());
    assert_eq!(api.get(&train).unwrap()["spec"]["replicas"], 1);
    // Allowed, it lists them, warns, and gives the Deployment back.
    api.allow_all();
    api.await_state(LIMIT, |s| s["objects"][&train]["spec"]["replicas"] == 0);
    assert_eq!(c.get("/-/ready").status, 200);
}

/// The controller is an executable of its own, so that the node daemon never maps the
/// Kubernetes client: the node binary holds no code of `kube` or `k8s-openapi` (the
/// controller's does, so the check can fail), and `gpuwatch controller` without its executable
/// beside it says what is missing and exits 69 (`EX_UNAVAILABLE`).
#[test]
fn the_node_daemon_holds_no_kubernetes_client() {
    fn kubernetes_code(binary: &str) -> usize {
        let out = std::process::Command::new("nm")
            .args(["--defined-only", binary])
            .output()
            .expect("nm (binutils)");
        assert!(out.status.success(), "nm {binary}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| {
                let mut f = l.split_whitespace();
                let (_, kind, name) = (f.next(), f.next(), f.next().unwrap_or(""));
                matches!(kind, Some("T" | "t" | "W" | "w"))
                    && (name.contains("kube_client") || name.contains("k8s_openapi"))
            })
            .count()
    }
    assert_eq!(kubernetes_code(common::BIN), 0, "{}", common::BIN);
    assert!(kubernetes_code(common::CONTROLLER_BIN) > 100);

    // Alone in a directory (a hard link: the same file system as the build).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let alone = dir.path().join("gpuwatch");
    std::fs::hard_link(common::BIN, &alone).unwrap();
    let out = std::process::Command::new(&alone)
        .args(["controller", "--config", "/nonexistent.toml"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{said}");
    assert!(
        said.contains(&format!(
            "cannot run {}",
            dir.path().join("gpuwatch-controller").display()
        )) && said.contains("installed beside gpuwatch"),
        "{said}"
    );
}

/// Events say what is true now: a warning with a new due time (or a failure with a new cause)
/// on the same workload is an Event of its own, not folded into the series of the first, whose
/// note `kube`'s recorder would keep; the same note again adds to its Event's series.
#[test]
fn a_new_note_is_an_event_of_its_own_and_the_same_note_a_series() {
    use gpuwatch::controller::events::Recorders;
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::{Event, EventType, Reporter};

    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi::start(dir.path());
    let config = gpuwatch::cloud::parse_config(
        &format!(
            "[controller]\nprometheus_url = \"http://127.0.0.1:9\"\nkubeconfig = \"{}\"\n",
            api.kubeconfig.display()
        ),
        std::path::Path::new("t.toml"),
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, _, _) = gpuwatch::controller::connect(config.controller.as_ref().unwrap())
            .await
            .unwrap();
        let recorders = Recorders::new(
            client,
            Reporter {
                controller: "gpuwatch-controller".into(),
                instance: Some("test".into()),
            },
        );
        let train = ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("Deployment".into()),
            name: Some("train".into()),
            namespace: Some("ml".into()),
            uid: Some("0b7d9c0e-1d2e-4f5a-8b6c-7d8e9f0a1b2c".into()),
            ..Default::default()
        };
        let warning = |due: &str| Event {
            type_: EventType::Warning,
            reason: "GpuIdleWarning".into(),
            note: Some(format!("idle: scaled to 0 at {due}")),
            action: "Warning".into(),
            secondary: None,
        };
        for due in ["10:00", "10:00", "10:07"] {
            recorders.publish(&warning(due), &train).await.unwrap();
        }
    });
    let mut notes: Vec<(String, i64)> = api
        .events()
        .into_iter()
        .filter(|e| e["regarding"]["name"] == "train" && e["reason"] == "GpuIdleWarning")
        .map(|e| {
            let count = e["series"]["count"].as_i64().unwrap_or(1);
            (e["note"].as_str().unwrap_or_default().to_string(), count)
        })
        .collect();
    notes.sort();
    assert_eq!(
        notes,
        [
            ("idle: scaled to 0 at 10:00".to_string(), 2),
            ("idle: scaled to 0 at 10:07".to_string(), 1)
        ]
    );
}

/// `gpuwatch-controller` answers `--version` as `gpuwatch` does, and refuses to run for a
/// `gpuwatch` of another build (exit 69, naming both), so that a controller replaced by hand
/// never runs beside a node binary of another release.
#[test]
fn the_controller_is_of_the_same_build_as_the_gpuwatch_that_runs_it() {
    let version = |bin: &str| {
        let out = std::process::Command::new(bin)
            .arg("--version")
            .output()
            .unwrap();
        assert!(out.status.success(), "{bin} --version");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let ours = version(common::BIN);
    assert!(ours.starts_with("gpuwatch "), "{ours}");
    assert_eq!(version(common::CONTROLLER_BIN), ours);

    let out = std::process::Command::new(common::CONTROLLER_BIN)
        .args(["--config", "/nonexistent.toml"])
        .env("GPUWATCH_CALLER_VERSION", "0.0.1 (revision older)")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{said}");
    assert!(
        said.contains("is not of the same build as gpuwatch 0.0.1 (revision older)"),
        "{said}"
    );
    // Run by its own gpuwatch, it goes on (to a config it cannot find: 64, not 69).
    let out = std::process::Command::new(common::BIN)
        .args(["controller", "--config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
