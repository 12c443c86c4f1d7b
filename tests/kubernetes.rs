//! Pod attribution against a fake kubelet that speaks the real PodResources gRPC protocol on a
//! unix socket (grpcio, generated from `proto/podresources.proto`; `scripts/test` installs it):
//! GPU series carry the pod that holds them, by UUID or by index, one series per pod on a
//! time-sliced GPU; assignments refresh; a kubelet that goes away leaves no pod labels and
//! `gpuwatch_kubernetes_up 0`, and the daemon goes on.

mod common;

use std::time::Duration;

use common::kubelet::{fake_kubelet, pod, uuid};
use common::{metric, Daemon, Scrape};

const LIMIT: Duration = Duration::from_secs(60);
const SCENARIO: &str = "[[gpu]]\nutilization = 10\n[[gpu]]\nutilization = 20\n[[gpu]]\nutilization = 30\n[[gpu]]\nutilization = 40\n";

/// The pods on the series of `family` for GPU `gpu`, as (pod, namespace, container).
fn holders(s: &Scrape, family: &str, gpu: u32) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = s
        .named(family)
        .iter()
        .filter(|x| x.labels.get("gpu") == Some(&gpu.to_string()))
        .map(|x| {
            let l = |k: &str| x.labels.get(k).cloned().unwrap_or_default();
            (l("pod"), l("namespace"), l("container"))
        })
        .collect();
    out.sort();
    out
}

fn held(pod: &str, namespace: &str, container: &str) -> (String, String, String) {
    (pod.into(), namespace.into(), container.into())
}

#[test]
fn gpu_series_carry_the_pods_that_hold_them() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let pods = dir.path().join("pods.json");
    let write = |list: serde_json::Value| std::fs::write(&pods, list.to_string()).unwrap();
    write(serde_json::json!([
        // By UUID, the device plugin's default.
        pod("train-a", "ml", "trainer", "nvidia.com/gpu", &[&uuid(0)]),
        // By index.
        pod("infer-b", "serving", "server", "nvidia.com/gpu", &["1"]),
        // Time-slicing: two replicas of GPU 2, in two pods.
        pod(
            "nb-c",
            "ml",
            "jupyter",
            "nvidia.com/gpu",
            &[&format!("{}::0", uuid(2))]
        ),
        pod(
            "nb-d",
            "ml",
            "jupyter",
            "nvidia.com/gpu",
            &[&format!("{}::1", uuid(2))]
        ),
        // Not a GPU.
        pod("other", "default", "app", "example.com/fpga", &["0"]),
    ]));
    let kubelet = fake_kubelet(&socket, &pods);
    let d = Daemon::start(
        SCENARIO,
        &format!(
            "[kubernetes]\npod_resources_socket = \"{}\"\nrefresh = \"200ms\"\n",
            socket.display()
        ),
    );
    // Awaited on the GPU series themselves: within one scrape, the assignments may change
    // between the GPU collector and the kubelet's own.
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_kubernetes_up").get(s) == Some(1.0)
            && s.named("gpuwatch_pod_gpu_allocated").len() == 4
            && holders(s, "gpu_utilization_ratio", 2).len() == 2
    });
    assert_eq!(
        holders(&s, "gpu_utilization_ratio", 0),
        [held("train-a", "ml", "trainer")]
    );
    assert_eq!(
        holders(&s, "gpu_utilization_ratio", 1),
        [held("infer-b", "serving", "server")]
    );
    assert_eq!(
        holders(&s, "gpu_utilization_ratio", 2),
        [held("nb-c", "ml", "jupyter"), held("nb-d", "ml", "jupyter")]
    );
    // An unassigned GPU has no pod labels at all.
    assert_eq!(holders(&s, "gpu_utilization_ratio", 3), [held("", "", "")]);
    // The shared GPU's reading is on both series.
    for x in s.named("gpu_utilization_ratio") {
        if x.labels["gpu"] == "2" {
            assert_eq!(x.value, 0.3);
        }
    }
    let allocated = holders(&s, "gpuwatch_pod_gpu_allocated", 2);
    assert_eq!(allocated.len(), 2);
    let a = &s.named("gpuwatch_pod_gpu_allocated")[0];
    assert_eq!(a.labels["uuid"], uuid(a.labels["gpu"].parse().unwrap()));
    assert!(!s.text.contains("other"), "a non-GPU resource is not a GPU");
    // Counting GPUs counts each once, however many pods share one.
    metric("gpuwatch_gpus").value(4.0).assert_in(&s);
    assert_eq!(s.named("gpu_up").len(), 4);
    assert_eq!(s.named("gpu_info").len(), 4);
    common::assert_promtool_accepts(&s.text);

    // The assignments refresh: train-a is done.
    write(serde_json::json!([pod(
        "infer-b",
        "serving",
        "server",
        "nvidia.com/gpu",
        &["1"]
    )]));
    let s = d.await_scrape(LIMIT, |s| {
        s.named("gpuwatch_pod_gpu_allocated").len() == 1
            && holders(s, "gpu_utilization_ratio", 0) == [held("", "", "")]
    });
    assert_eq!(holders(&s, "gpu_utilization_ratio", 0), [held("", "", "")]);

    // The kubelet goes away: up 0 at once; the labels go after three failed calls in a row
    // (one slow answer would not strip them); the daemon goes on.
    drop(kubelet);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_kubernetes_up").get(s) == Some(0.0)
    });
    assert!(metric("gpuwatch_kubernetes_errors_total").get(&s).unwrap() >= 1.0);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_kubernetes_errors_total")
            .get(s)
            .unwrap_or(0.0)
            >= 3.0
            && s.named("gpuwatch_pod_gpu_allocated").is_empty()
    });
    metric("gpuwatch_kubernetes_up").value(0.0).assert_in(&s);
    assert!(!s.text.contains("pod=\""), "{}", s.text);
    assert!(metric("gpuwatch_kubernetes_errors_total").get(&s).unwrap() >= 1.0);
    assert_eq!(s.named("gpu_utilization_ratio").len(), 4);
}

/// Without a socket where one is configured, the daemon serves its GPUs, unlabelled.
#[test]
fn a_missing_kubelet_socket_is_survived() {
    let d = Daemon::start(
        SCENARIO,
        "[kubernetes]\npod_resources_socket = \"/nonexistent/kubelet.sock\"\nrefresh = \"200ms\"\n",
    );
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_kubernetes_errors_total")
            .get(s)
            .unwrap_or(0.0)
            >= 2.0
    });
    metric("gpuwatch_kubernetes_up").value(0.0).assert_in(&s);
    assert_eq!(s.named("gpu_utilization_ratio").len(), 4);
    assert!(!s.text.contains("pod=\""));
}

/// A fake kubelet in `dir` serving `pods`, and a daemon's config that asks it every 200 ms,
/// samples every 100 ms, enforces after a 1 s warning, keeps its state in `state`, and has one
/// pod-scoped rule `rule` on GPUs under 5% for 2 periods of 1 s, with `action` (the TOML after
/// `action = `, and any keys after it).
fn pod_rule(
    dir: &std::path::Path,
    pods: serde_json::Value,
    state: &std::path::Path,
    rule: &str,
    action: &str,
) -> (common::Killed, String) {
    let socket = dir.join("kubelet.sock");
    let file = dir.join("pods.json");
    std::fs::write(&file, pods.to_string()).unwrap();
    let kubelet = fake_kubelet(&socket, &file);
    let config = format!(
        "[kubernetes]\npod_resources_socket = \"{socket}\"\nrefresh = \"200ms\"\n\
         [sampling]\ninterval = \"100ms\"\n\
         [actions]\nmode = \"enforce\"\nboot_grace = \"0s\"\nwarning = \"1s\"\nwall = false\nstate_dir = \"{state}\"\n\
         [[rules]]\nname = \"{rule}\"\nscope = \"pod\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 2\naction = {action}\n",
        socket = socket.display(),
        state = state.display(),
    );
    (kubelet, config)
}

/// A pod-scoped rule judges each pod on the GPUs it holds: the pod that leaves its GPU idle is
/// acted on (here `exec`, told the pod), the busy one is not, though the node is busy.
#[test]
fn a_pod_scoped_rule_acts_on_the_idle_pod_only() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("acted");
    let (_kubelet, config) = pod_rule(
        dir.path(),
        serde_json::json!([
            pod("notebook", "ml", "jupyter", "nvidia.com/gpu", &[&uuid(0)]),
            pod("train", "ml", "trainer", "nvidia.com/gpu", &[&uuid(1)]),
        ]),
        &dir.path().join("state"),
        "pod-idle",
        &format!(
            "\"exec\"\ncommand = [\"/bin/sh\", \"-c\", \"echo \\\"$GPUWATCH_NAMESPACE/$GPUWATCH_POD $GPUWATCH_RULE\\\" >> {}\"]",
            marker.display()
        ),
    );
    let d = Daemon::start(
        "[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 90\n",
        &config,
    );
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_actions_total")
            .label("action", "exec")
            .label("result", "done")
            .get(s)
            .unwrap_or(0.0)
            >= 1.0
    });
    metric("gpuwatch_rule_breaching")
        .label("rule", "pod-idle ml/notebook")
        .value(1.0)
        .assert_in(&s);
    metric("gpuwatch_rule_breaching")
        .label("rule", "pod-idle ml/train")
        .value(0.0)
        .assert_in(&s);
    let acted = std::fs::read_to_string(&marker).unwrap();
    assert!(!acted.is_empty());
    for line in acted.lines() {
        assert_eq!(line, "ml/notebook pod-idle ml/notebook");
    }
    let audit = common::audit_records(&dir.path().join("state/audit.jsonl"));
    let attempts = common::events(&audit, "action_attempt");
    assert!(
        !attempts.is_empty() && attempts.iter().all(|a| a["rule"] == "pod-idle ml/notebook"),
        "{audit:?}"
    );
}

/// The device plugin names a MIG device by its own UUID: the pod holding it is attributed to
/// the GPU the MIG device is part of (NVML's MIG device handles, read each sample).
#[test]
fn a_mig_device_is_attributed_to_its_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let pods = dir.path().join("pods.json");
    let mig = "MIG-11111111-2222-4333-8444-555555555555";
    std::fs::write(
        &pods,
        serde_json::json!([pod(
            "small",
            "ml",
            "worker",
            "nvidia.com/mig-1g.10gb",
            &[mig]
        )])
        .to_string(),
    )
    .unwrap();
    let _kubelet = fake_kubelet(&socket, &pods);
    let scenario = format!(
        "[[gpu]]\nutilization = 10\nmig_devices = [\"MIG-00000000-0000-4000-8000-000000000000\", \"{mig}\"]\n[[gpu]]\nutilization = 20\n"
    );
    let d = Daemon::start(
        &scenario,
        &format!(
            "[kubernetes]\npod_resources_socket = \"{}\"\nrefresh = \"200ms\"\n",
            socket.display()
        ),
    );
    // In MIG mode the GPU has no utilization; its physical readings carry the pod.
    let s = d.await_scrape(LIMIT, |s| {
        s.named("gpuwatch_pod_gpu_allocated").len() == 1
            && holders(s, "gpu_temperature_celsius", 0) == [held("small", "ml", "worker")]
    });
    assert_eq!(holders(&s, "gpu_utilization_ratio", 1), [held("", "", "")]);
    let a = &s.named("gpuwatch_pod_gpu_allocated")[0];
    assert_eq!(a.labels["gpu"], "0");
    assert_eq!(a.labels["uuid"], uuid(0));
    let snap = d.snapshot_after(0);
    assert_eq!(snap["gpus"][0]["mig_uuids"][1], mig, "{snap}");
    assert!(snap["gpus"][1].get("mig_uuids").is_none(), "{snap}");
    // The MIG device's own series carry the pod; the other MIG device's carry none.
    let mig_holders = |uuid: &str| -> Vec<Option<String>> {
        s.named("gpu_memory_used_bytes")
            .iter()
            .filter(|x| x.labels.get("uuid").map(String::as_str) == Some(uuid))
            .map(|x| x.labels.get("pod").cloned())
            .collect()
    };
    assert_eq!(mig_holders(mig), [Some("small".to_string())], "{}", s.text);
    assert_eq!(
        mig_holders("MIG-00000000-0000-4000-8000-000000000000"),
        [None],
        "{}",
        s.text
    );
}

/// A kubelet that lists more assignments than the cap: the rest are ignored, and the warning
/// is logged once when it starts, not at every refresh.
#[test]
fn an_overflowing_kubelet_is_warned_of_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let pods = dir.path().join("pods.json");
    // Written whole (a rename), so that the kubelet never reads half a file.
    // 5000 pods, each holding a GPU: more assignments than the cap (4096).
    let write = |name: &str| {
        let list: Vec<serde_json::Value> = (0..5000)
            .map(|i| {
                let pod_name = if i == 0 {
                    name.to_string()
                } else {
                    format!("{name}-{i}")
                };
                pod(&pod_name, "ml", "c", "nvidia.com/gpu", &[&uuid(i % 4)])
            })
            .collect();
        let list = serde_json::Value::Array(list);
        let tmp = dir.path().join("pods.json.tmp");
        std::fs::write(&tmp, list.to_string()).unwrap();
        std::fs::rename(&tmp, &pods).unwrap();
    };
    write("flood-a");
    let _kubelet = fake_kubelet(&socket, &pods);
    let d = Daemon::start(
        SCENARIO,
        &format!(
            "[kubernetes]\npod_resources_socket = \"{}\"\nrefresh = \"200ms\"\n",
            socket.display()
        ),
    );
    // Three answers over the cap, each seen in the series: at least three refreshes.
    for name in ["flood-a", "flood-b", "flood-c"] {
        write(name);
        d.await_scrape(LIMIT, |s| {
            s.named("gpuwatch_pod_gpu_allocated")
                .iter()
                .any(|x| x.labels.get("pod").map(String::as_str) == Some(name))
        });
    }
    let log = d.log();
    assert_eq!(
        log.matches("more GPU assignments than any node has")
            .count(),
        1,
        "{log}"
    );
}

/// A pod-scoped `reclaim` rule writes nothing to the cluster: after its warning and re-check it
/// serves a verdict for the idle pod (`gpuwatch_pod_reclaim_verdict`, naming the pod, the rule
/// and the GPUs), none for the busy one, and withdraws the verdict as soon as the pod's GPU is
/// used again.
#[test]
fn a_reclaim_rule_serves_a_verdict_while_the_pod_stays_idle() {
    let dir = tempfile::tempdir().unwrap();
    let (_kubelet, config) = pod_rule(
        dir.path(),
        serde_json::json!([
            pod("notebook", "ml", "jupyter", "nvidia.com/gpu", &[&uuid(0)]),
            pod("train", "ml", "trainer", "nvidia.com/gpu", &[&uuid(1)]),
        ]),
        &dir.path().join("state"),
        "give-back",
        "\"reclaim\"",
    );
    // The notebook's GPU is idle until 8 s in, then busy.
    let d = Daemon::start(
        "[[gpu]]\nutilization = { kind = \"ramp\", from = 0, to = 90, over = \"1s\", start = \"8s\" }\n\
         [[gpu]]\nutilization = 90\n",
        &config,
    );
    let verdict = || {
        metric("gpuwatch_pod_reclaim_verdict")
            .label("namespace", "ml")
            .label("pod", "notebook")
            .label("rule", "give-back")
            .label("gpus", "0")
    };
    let s = d.await_scrape(LIMIT, |s| verdict().get(s).is_some());
    verdict().value(1.0).assert_in(&s);
    assert!(
        metric("gpuwatch_pod_reclaim_verdict")
            .label("pod", "train")
            .get(&s)
            .is_none(),
        "the busy pod has no verdict"
    );
    let since = metric("gpuwatch_pod_reclaim_verdict_since_seconds")
        .label("pod", "notebook")
        .get(&s)
        .unwrap();
    assert!(since > 1.0e9, "{since}");
    // Given after a warning, and audited as an action of the pod's rule.
    let audit = common::audit_records(&dir.path().join("state/audit.jsonl"));
    assert_eq!(common::events(&audit, "warning").len(), 1, "{audit:?}");
    let results = common::events(&audit, "action_result");
    assert_eq!(results.len(), 1, "{audit:?}");
    assert_eq!(results[0]["rule"], "give-back ml/notebook");
    assert_eq!(results[0]["action"], "reclaim");
    assert_eq!(results[0]["result"], "done");
    // The GPU is used again: the verdict is withdrawn.
    let s = d.await_scrape(LIMIT, |s| verdict().get(s).is_none());
    metric("gpuwatch_pod_reclaim_verdicts_total")
        .label("event", "withdrawn")
        .value(1.0)
        .assert_in(&s);
}

/// Holds win: a hold placed on the node withdraws every reclaim verdict it serves at once,
/// though the pod stays idle, and none is given while it holds.
#[test]
fn a_hold_on_the_node_withdraws_its_reclaim_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    // The daemon's own state directory, where the hold goes.
    let daemon_dir = tempfile::tempdir().unwrap();
    let (_kubelet, config) = pod_rule(
        dir.path(),
        serde_json::json!([pod(
            "notebook",
            "ml",
            "jupyter",
            "nvidia.com/gpu",
            &[&uuid(0)]
        )]),
        &daemon_dir.path().join("state"),
        "give-back",
        "\"reclaim\"",
    );
    let d = Daemon::start_in(daemon_dir, "[[gpu]]\nutilization = 0\n", &config);
    let verdict = || metric("gpuwatch_pod_reclaim_verdict").label("pod", "notebook");
    d.await_scrape(LIMIT, |s| verdict().get(s).is_some());
    let path = d.dir.path().join("gpuwatch.toml");
    common::gpuwatch(&[&"hold", &"1h", &"--reason", &"demo", &"--config", &path]);
    let s = d.await_scrape(LIMIT, |s| verdict().get(s).is_none());
    metric("gpuwatch_pod_reclaim_verdicts_total")
        .label("event", "withdrawn")
        .value(1.0)
        .assert_in(&s);
}
