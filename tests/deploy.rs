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
    // The allocator runs as the systemd unit runs it.
    let tunables = common::unit_environment("GLIBC_TUNABLES");
    assert_eq!(tunables, "glibc.malloc.tcache_count=0");
    assert!(c["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "GLIBC_TUNABLES" && e["value"] == tunables.as_str()));
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
    let host_paths: Vec<&serde_json::Value> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .collect();
    assert_eq!(host_paths.len(), 1, "{host_paths:?}");
    // The Service and the ServiceMonitor find the pods by the DaemonSet's label.
    let selector = &ds["spec"]["selector"]["matchLabels"];
    assert_eq!(&kind(&docs, "Service")["spec"]["selector"], selector);
    let monitor = kind(&docs, "ServiceMonitor");
    assert_eq!(&monitor["spec"]["selector"]["matchLabels"], selector);
    // gpuwatch's pod labels must survive the scrape, not become exported_pod.
    assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true);
}

#[test]
fn the_configmaps_config_is_valid() {
    let docs = documents();
    let text = kind(&docs, "ConfigMap")["data"]["gpuwatch.toml"]
        .as_str()
        .unwrap()
        .to_string();
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
