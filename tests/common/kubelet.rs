//! The fake kubelet of `tests/kubelet/fake_kubelet.py`: the real PodResources gRPC protocol
//! on a unix socket (grpcio, generated from `proto/podresources.proto`; `scripts/test`
//! installs it), serving the assignments of a JSON file it re-reads.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// The fake NVML's default UUID of GPU `i`.
pub fn uuid(i: u32) -> String {
    format!("GPU-00000000-0000-4000-8000-{:012}", i + 1)
}

/// Starts the fake kubelet on `socket`, serving the assignments in `pods`.
pub fn fake_kubelet(socket: &Path, pods: &Path) -> super::Killed {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var_os("FAKE_KUBELET_PYTHON")
        .unwrap_or_else(|| root.join(".venv/bin/python").into());
    let mut child = Command::new(&python)
        .arg(root.join("tests/kubelet/fake_kubelet.py"))
        .arg(socket)
        .arg(pods)
        .arg(root.join("proto/podresources.proto"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; scripts/test installs grpcio and grpcio-tools in .venv",
                Path::new(&python).display()
            )
        });
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the fake kubelet did not start");
    super::Killed(child)
}

pub fn pod(
    name: &str,
    namespace: &str,
    container: &str,
    resource: &str,
    ids: &[&str],
) -> serde_json::Value {
    serde_json::json!({"name": name, "namespace": namespace, "containers": [
        {"name": container, "devices": [{"resource": resource, "ids": ids}]}]})
}
