//! The deployment files, checked by real tools: every Kubernetes manifest against the
//! Kubernetes schemas (`kubernetes-validate`, which `scripts/test` installs), the DaemonSet's
//! safety settings one by one, and the ConfigMap's config by `gpuwatch check-config`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn manifests() -> Vec<PathBuf> {
    common::files_in("deploy/kubernetes", "yaml")
}

/// Every document of every manifest, as JSON values.
fn documents() -> Vec<serde_json::Value> {
    let mut docs = Vec::new();
    for path in manifests() {
        let text = std::fs::read_to_string(&path).unwrap();
        for de in yaml_serde::Deserializer::from_str(&text) {
            let v: serde_json::Value = serde::Deserialize::deserialize(de).unwrap();
            docs.push(v);
        }
    }
    docs
}

fn kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deploy/kubernetes"))
}

#[test]
fn every_manifest_passes_the_kubernetes_schemas() {
    let tool = std::env::var_os("KUBERNETES_VALIDATE").unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(".venv/bin/kubernetes-validate")
            .into()
    });
    let files = manifests();
    assert!(files.len() >= 4, "{files:?}");
    let out = Command::new(&tool)
        .arg("--strict")
        .args(&files)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; scripts/test installs kubernetes-validate in .venv",
                Path::new(&tool).display()
            )
        });
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    // Each built-in resource passed; only the Prometheus operator's CRD has no schema there.
    for resource in [
        "namespace/gpuwatch",
        "serviceaccount/gpuwatch",
        "daemonset/gpuwatch",
        "service/gpuwatch",
        "configmap/gpuwatch",
        "serviceaccount/gpuwatch-controller",
        "clusterrole/gpuwatch-controller",
        "clusterrolebinding/gpuwatch-controller",
        "role/gpuwatch-controller",
        "rolebinding/gpuwatch-controller",
        "configmap/gpuwatch-controller",
        "deployment/gpuwatch-controller",
    ] {
        assert!(
            text.contains(&format!("passed for resource {resource}")),
            "{resource}:\n{text}"
        );
    }
    assert!(!text.contains("ERROR"), "{text}");
}

#[test]
fn the_daemonset_runs_gpuwatch_unprivileged_on_gpu_nodes_only() {
    let docs = documents();
    let ds = kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_array()
        .unwrap();
    let keys: Vec<&str> = terms
        .iter()
        .flat_map(|t| t["matchExpressions"].as_array().unwrap())
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert!(keys.contains(&"nvidia.com/gpu.present"), "{keys:?}");
    // Root only to reach the kubelet's root-only socket; no capability and no escalation.
    assert_eq!(pod["securityContext"]["runAsUser"], 0);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["runtimeClassName"], "nvidia");
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(c["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "NVIDIA_VISIBLE_DEVICES" && e["value"] == "all"));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/-/healthy");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/-/ready");
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());
    // The kubelet's pod-resources directory, read-only; the only host path.
    let mounts = c["volumeMounts"].as_array().unwrap();
    let pod_resources = mounts
        .iter()
        .find(|m| m["mountPath"] == "/var/lib/kubelet/pod-resources")
        .expect("the pod-resources directory is mounted");
    assert_eq!(pod_resources["readOnly"], true);
    // Of the host, only that directory and gpuwatch's own state directory.
    let mut host_paths: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    host_paths.sort_unstable();
    assert_eq!(
        host_paths,
        ["/var/lib/gpuwatch", "/var/lib/kubelet/pod-resources"]
    );
    // The Service and the ServiceMonitor find the pods by the DaemonSet's label.
    let selector = &ds["spec"]["selector"]["matchLabels"];
    assert_eq!(&kind(&docs, "Service")["spec"]["selector"], selector);
    let monitor = kind(&docs, "ServiceMonitor");
    assert_eq!(&monitor["spec"]["selector"]["matchLabels"], selector);
    // gpuwatch's pod labels must survive the scrape, not become exported_pod.
    assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true);
}

/// The mode the kubelet gives a volume's directory when it makes one: an `emptyDir` is 0777, a
/// `hostPath` of type `DirectoryOrCreate` is created 0755 (when it is not there yet). Any other
/// kind of volume is not a place for the state.
fn kubelet_made_mode(volume: &serde_json::Value) -> u32 {
    if volume.get("emptyDir").is_some() {
        0o777
    } else if volume["hostPath"]["type"] == "DirectoryOrCreate" {
        0o755
    } else {
        panic!(
            "the state volume is neither an emptyDir nor a hostPath the kubelet creates: {volume}"
        )
    }
}

/// The shipped DaemonSet with a rule in its ConfigMap (the README's pod rule): the daemon starts
/// on a state directory made as the kubelet makes the manifest's volume, and keeps its state
/// there. An `emptyDir` (0777) is refused as soon as a rule exists.
#[test]
fn the_daemonset_keeps_its_state_where_a_rule_can_use_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let docs = documents();
    let ds = kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let config = kind(&docs, "ConfigMap")["data"]["gpuwatch.toml"]
        .as_str()
        .unwrap()
        .to_string();
    let state_dir = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("state_dir = "))
        .expect("the ConfigMap names a state_dir")
        .trim_matches('"')
        .to_string();
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == state_dir.as_str())
        .unwrap_or_else(|| panic!("nothing is mounted at the state_dir {state_dir}"));
    assert_ne!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    // It outlives the pod: the node's own directory.
    assert_eq!(volume["hostPath"]["path"], state_dir.as_str(), "{volume}");

    let dir = tempfile::tempdir().unwrap();
    let made = dir.path().join("var-lib-gpuwatch");
    std::fs::create_dir(&made).unwrap();
    std::fs::set_permissions(
        &made,
        std::fs::Permissions::from_mode(kubelet_made_mode(volume)),
    )
    .unwrap();
    // The ConfigMap's config, pointed at that directory and at the fake NVML, with the
    // README's pod rule (the kubelet socket is absent here; the rule just has no pods).
    let config = config.replace(
        &format!("state_dir = \"{state_dir}\""),
        &format!("state_dir = \"{}\"", made.display()),
    ) + &format!(
        "\n[nvml]\nlibrary = \"{}\"\n\
         [[rules]]\nname = \"idle-pod\"\nscope = \"pod\"\nmetric = \"gpu_utilization\"\n\
         comparison = \"less_than\"\nthreshold = 0.05\nperiod = \"30m\"\nevaluation_periods = 2\n\
         action = \"exec\"\ncommand = [\"/usr/local/bin/notify-owner\"]\n",
        common::fake_library().display()
    );
    let config = config.replace("listen = \"0.0.0.0:9400\"", "listen = \"127.0.0.1:0\"");
    std::fs::write(
        dir.path().join("scenario.toml"),
        "[[gpu]]\nutilization = 50\n",
    )
    .unwrap();
    let d = common::Daemon::start_with(dir, &config);
    d.await_sample(std::time::Duration::from_secs(30), |s| {
        s["nvml"]["up"] == true
    });
    // The decision loop runs over that directory: its state and its audit log are kept there,
    // privately.
    let started = || {
        let audit = common::audit_records(&made.join("audit.jsonl"));
        common::events(&audit, "started").len() == 1
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !made.join("state.json").exists() || !started() {
        assert!(
            std::time::Instant::now() < deadline,
            "no state saved in the kubelet-made directory:\n{}",
            d.log()
        );
        d.await_sample(std::time::Duration::from_secs(5), |_| true);
    }
    let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{mode:o}");
    // The watch started with the one rule: its audit record says so (the log is read through a
    // pipe and may lag behind the file).
    let audit = common::audit_records(&made.join("audit.jsonl"));
    let started = common::events(&audit, "started");
    assert_eq!(
        started[0]["rules"],
        serde_json::json!(["idle-pod"]),
        "{}",
        d.log()
    );
}

#[test]
fn the_configmaps_config_is_valid() {
    let docs = documents();
    let text = kind(&docs, "ConfigMap")["data"]["gpuwatch.toml"]
        .as_str()
        .unwrap()
        .to_string();
    assert_valid_config(&text);
}

/// Each rule of a role as (group, resource, verb) triples.
fn grants(role: &serde_json::Value) -> std::collections::BTreeSet<(String, String, String)> {
    let mut out = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let list = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

fn table(t: &[(&str, &str, &[&str])]) -> std::collections::BTreeSet<(String, String, String)> {
    t.iter()
        .flat_map(|(g, r, verbs)| {
            verbs
                .iter()
                .map(move |v| (g.to_string(), r.to_string(), v.to_string()))
        })
        .collect()
}

/// The controller's ClusterRole grants exactly the calls its code makes, and its Role the
/// Lease's, in its own namespace only: no wildcard, nothing more, nothing less.
#[test]
fn the_controllers_roles_grant_exactly_what_the_code_calls() {
    use gpuwatch::controller::cluster::{CLUSTER_PERMISSIONS, LEASE_PERMISSIONS};
    let docs = documents();
    let named = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k && d["metadata"]["name"] == "gpuwatch-controller")
            .unwrap_or_else(|| panic!("no {k} gpuwatch-controller"))
    };
    assert_eq!(grants(named("ClusterRole")), table(CLUSTER_PERMISSIONS));
    let role = named("Role");
    assert_eq!(role["metadata"]["namespace"], "gpuwatch");
    assert_eq!(grants(role), table(LEASE_PERMISSIONS));
    for binding in ["ClusterRoleBinding", "RoleBinding"] {
        let b = named(binding);
        assert_eq!(b["subjects"][0]["name"], "gpuwatch-controller", "{binding}");
        assert_eq!(b["roleRef"]["name"], "gpuwatch-controller", "{binding}");
    }
}

/// The controller runs unprivileged: non-root, a read-only root filesystem, no capability,
/// its identity and namespace from the downward API, and its ConfigMap's config is valid.
#[test]
fn the_controller_runs_unprivileged_with_a_valid_config() {
    let docs = documents();
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "gpuwatch-controller")
        .unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["serviceAccountName"], "gpuwatch-controller");
    let c = &pod["containers"][0];
    assert_eq!(c["args"][0], "controller");
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let env: Vec<(&str, &str)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        env,
        [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace")
        ]
    );
    let config = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "gpuwatch-controller")
        .unwrap()["data"]["gpuwatch.toml"]
        .as_str()
        .unwrap()
        .to_string();
    assert_valid_config(&config);
}

/// `gpuwatch check-config` takes this config text.
fn assert_valid_config(text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuwatch.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(common::BIN)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
