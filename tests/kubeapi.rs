//! The fake Kubernetes API server (`tests/kubeapi/fake_apiserver.py`) checked against a real
//! client: the kubectl on PATH (KUBECTL names another; where there is none, scripts/test
//! installs Debian's kubernetes-client), and curl for raw requests. What kubectl prints here is
//! what it prints against a real API server for the same answers, so these tests hold the
//! fake's wire format (paths, verbs, discovery, Status objects and their wording, patches, the
//! scale subresource, watches, 410 Expired) to the documents it was written from. They pass
//! with kubectl 1.20 (Debian 12's kubernetes-client) and 1.32 and 1.33; where kubectl's own
//! wording changed between those, they accept each.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::kubeapi::{self, FakeApi};
use serde_json::{json, Value};

const TRAIN: &str = "/apis/apps/v1/namespaces/ml/deployments/train";

/// The fake with namespace `ml` and Deployment `ml/train` (3 replicas of 2 GPUs), its
/// ReplicaSet and one pod on node-a.
fn cluster(dir: &tempfile::TempDir) -> FakeApi {
    let api = FakeApi::start(dir.path());
    api.put(kubeapi::namespace(
        "ml",
        &[("gpuwatch.io/idle-after", "1h")],
    ));
    api.put(kubeapi::namespace(kubeapi::CONTEXT_NAMESPACE, &[]));
    let deploy = api.put(kubeapi::deployment("ml", "train", 3, 2));
    let rs = api.put(kubeapi::replicaset_of(&deploy, "5d4f8c7b9"));
    api.put(kubeapi::pod_of(
        "ReplicaSet",
        "train-5d4f8c7b9",
        kubeapi::uid(&rs),
        "ml",
        "train-5d4f8c7b9-abcde",
        "node-a",
        2,
    ));
    api
}

#[track_caller]
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "kubectl failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[track_caller]
fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "kubectl should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn replicas(api: &FakeApi) -> (i64, i64, i64) {
    let d = api.get(TRAIN).unwrap();
    (
        d["spec"]["replicas"].as_i64().unwrap(),
        d["status"]["replicas"].as_i64().unwrap(),
        d["metadata"]["generation"].as_i64().unwrap(),
    )
}

fn rv_of(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// curl with the fake's CA and token, at most 20 s.
fn curl(api: &FakeApi, path: &str) -> Command {
    let mut c = Command::new("curl");
    c.args(["-sS", "--max-time", "20", "--cacert"])
        .arg(&api.ca)
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", api.token))
        .arg(format!("{}{path}", api.url));
    c
}

#[test]
fn lists_pods_of_every_namespace_as_put() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    api.put(kubeapi::pod_of(
        "StatefulSet",
        "lab",
        "0b7c9a38-0000-4000-8000-000000000001",
        "research",
        "lab-0",
        "node-b",
        1,
    ));
    let list: Value =
        serde_json::from_str(&ok(&api.kubectl(&["get", "pods", "-A", "-o", "json"]))).unwrap();
    let items = list["items"].as_array().unwrap();
    let names: Vec<(&str, &str, &str, &str)> = items
        .iter()
        .map(|p| {
            (
                p["metadata"]["namespace"].as_str().unwrap(),
                p["metadata"]["name"].as_str().unwrap(),
                p["spec"]["nodeName"].as_str().unwrap(),
                p["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("ml", "train-5d4f8c7b9-abcde", "node-a", "Pod"),
            ("research", "lab-0", "node-b", "Pod")
        ]
    );
    assert_eq!(
        items[1]["metadata"]["ownerReferences"][0]["kind"],
        "StatefulSet"
    );
    // One list of the core group's pods across namespaces, in chunks of kubectl's default size.
    let lists: Vec<Value> = api
        .calls()
        .into_iter()
        .filter(|c| c["verb"] == "list")
        .collect();
    assert_eq!(lists.len(), 1, "{lists:?}");
    assert_eq!(lists[0]["path"], "/api/v1/pods");
    assert_eq!(lists[0]["query"]["limit"], "500");
    assert_eq!(lists[0]["code"], 200);
}

#[test]
fn lists_in_chunks_and_by_selectors() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    for (name, node) in [("train-5d4f8c7b9-fghij", "node-b"), ("other", "node-a")] {
        let mut pod = kubeapi::pod_of("ReplicaSet", "x", "u", "ml", name, node, 1);
        if name == "other" {
            pod["metadata"]["labels"] = json!({"app": "other"});
        }
        api.put(pod);
    }
    let all = ok(&api.kubectl(&["get", "pods", "-n", "ml", "--chunk-size=1", "-o", "name"]));
    assert_eq!(
        all.lines().collect::<Vec<_>>(),
        [
            "pod/other",
            "pod/train-5d4f8c7b9-abcde",
            "pod/train-5d4f8c7b9-fghij"
        ]
    );
    let continued: Vec<Value> = api
        .calls()
        .into_iter()
        .filter(|c| c["verb"] == "list" && c["query"]["continue"].is_string())
        .collect();
    assert_eq!(continued.len(), 2, "two more chunks after the first");
    let picked = ok(&api.kubectl(&[
        "get",
        "pods",
        "-A",
        "-l",
        "app=train",
        "--field-selector",
        "spec.nodeName=node-a,status.phase=Running",
        "-o",
        "name",
    ]));
    assert_eq!(picked.trim(), "pod/train-5d4f8c7b9-abcde");
    let unsupported = refused(&api.kubectl(&["get", "pods", "--field-selector", "spec.image=x"]));
    assert_eq!(
        unsupported.trim(),
        "Error from server (BadRequest): Unable to find \"/v1, Resource=pods\" that match label \
         selector \"\", field selector \"spec.image=x\": field label not supported: spec.image"
    );
}

#[test]
fn gets_one_deployment_by_jsonpath_and_as_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    let out = ok(&api.kubectl(&[
        "get",
        "deploy",
        "-n",
        "ml",
        "train",
        "-o",
        r"jsonpath={.spec.replicas}/{.spec.template.spec.containers[0].resources.limits.nvidia\.com/gpu}/{.metadata.generation}/{.kind}",
    ]));
    assert_eq!(out, "3/2/1/Deployment");
    // Without -o, kubectl asks for a Table: the default one of the API concepts page.
    let table = ok(&api.kubectl(&["get", "deployments.apps", "-n", "ml"]));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("CREATED AT"),
        "{table}"
    );
    assert!(lines[1].starts_with("train "), "{table}");
    let call = api.calls().into_iter().last().unwrap();
    assert!(
        call["accept"].as_str().unwrap().contains("as=Table"),
        "{call}"
    );
}

#[test]
fn scales_through_the_scale_subresource() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    let before = rv_of(&api.get(TRAIN).unwrap());
    api.clear_calls();
    let out = ok(&api.kubectl(&["scale", "deployment/train", "-n", "ml", "--replicas=0"]));
    assert_eq!(out.trim(), "deployment.apps/train scaled");
    assert_eq!(
        replicas(&api),
        (0, 0, 2),
        "spec, status (the hook), generation"
    );
    let after = api.get(TRAIN).unwrap();
    assert!(rv_of(&after) > before);
    assert_eq!(api.writes(), [format!("PATCH {TRAIN}/scale")]);
    let patch = api
        .calls()
        .into_iter()
        .find(|c| c["method"] == "PATCH")
        .unwrap();
    assert_eq!(patch["content_type"], "application/merge-patch+json");
    assert_eq!(patch["body"], json!({"spec": {"replicas": 0}}));
    assert_eq!(patch["verb"], "patch");
    assert_eq!(patch["code"], 200);
    // The Scale as the API reference describes it.
    let scale: Value = serde_json::from_str(&ok(&api.kubectl(&[
        "get",
        "--raw",
        &format!("{TRAIN}/scale"),
    ])))
    .unwrap();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["metadata"]["name"], "train");
    assert_eq!(scale["metadata"]["namespace"], "ml");
    assert_eq!(scale["metadata"]["uid"], after["metadata"]["uid"]);
    assert_eq!(
        scale["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );
    assert_eq!(scale["spec"], json!({"replicas": 0}));
    assert_eq!(
        scale["status"],
        json!({"replicas": 0, "selector": "app=train"})
    );
    // A StatefulSet scales the same way.
    api.put(kubeapi::statefulset("ml", "lab", 1, 1));
    ok(&api.kubectl(&["scale", "statefulset/lab", "-n", "ml", "--replicas=2"]));
    let sts = api
        .get("/apis/apps/v1/namespaces/ml/statefulsets/lab")
        .unwrap();
    assert_eq!(sts["spec"]["replicas"], 2);
    assert_eq!(sts["status"]["replicas"], 2);
}

#[test]
fn scale_preconditions_are_kubectls_and_the_servers() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    api.clear_calls();
    let err = refused(&api.kubectl(&[
        "scale",
        "deployment/train",
        "-n",
        "ml",
        "--current-replicas=5",
        "--replicas=1",
    ]));
    assert!(err.contains("Expected replicas to be 5, was 3"), "{err}");
    assert!(api.writes().is_empty(), "{:?}", api.writes());
    // --resource-version is kubectl's precondition too, on the Scale it reads first...
    let current = rv_of(&api.get(TRAIN).unwrap());
    let err = refused(&api.kubectl(&[
        "scale",
        "deployment/train",
        "-n",
        "ml",
        &format!("--resource-version={}", current - 1),
        "--replicas=1",
    ]));
    assert!(
        err.contains(&format!(
            "Expected resource version to be {}, was {current}",
            current - 1
        )),
        "{err}"
    );
    assert!(api.writes().is_empty(), "{:?}", api.writes());
    // ...and then the server's, on the Scale it PUTs with that resourceVersion: a concurrent
    // writer in between makes it a Conflict, after which kubectl reads the Scale again and
    // finds its own precondition broken.
    api.conflict_once(TRAIN);
    let err = refused(&api.kubectl(&[
        "scale",
        "deployment/train",
        "-n",
        "ml",
        &format!("--resource-version={current}"),
        "--replicas=1",
    ]));
    let bumped = rv_of(&api.get(TRAIN).unwrap());
    assert!(bumped > current);
    assert!(
        err.contains(&format!(
            "Expected resource version to be {current}, was {bumped}"
        )),
        "{err}"
    );
    assert_eq!(replicas(&api).0, 3);
    let current = rv_of(&api.get(TRAIN).unwrap());
    ok(&api.kubectl(&[
        "scale",
        "deployment/train",
        "-n",
        "ml",
        &format!("--resource-version={current}"),
        "--replicas=1",
    ]));
    assert_eq!(replicas(&api), (1, 1, 2));
    let puts: Vec<Value> = api
        .calls()
        .into_iter()
        .filter(|c| c["method"] == "PUT")
        .collect();
    assert_eq!(puts.len(), 2, "{puts:?}");
    assert!(puts.iter().all(|c| c["path"] == format!("{TRAIN}/scale")));
    assert_eq!(puts[0]["code"], 409);
    assert_eq!(puts[1]["code"], 200);
    assert_eq!(puts[1]["body"]["kind"], "Scale");
    assert_eq!(
        puts[1]["body"]["metadata"]["resourceVersion"],
        current.to_string()
    );
    // A negative count is refused by validation, as the real server words it.
    let out = curl(&api, &format!("{TRAIN}/scale"))
        .args([
            "-X",
            "PATCH",
            "-H",
            "Content-Type: application/merge-patch+json",
        ])
        .args([
            "--data",
            r#"{"spec":{"replicas":-1}}"#,
            "-w",
            "\n%{http_code}",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    assert_eq!(code, "422");
    let message = "Scale.autoscaling \"train\" is invalid: spec.replicas: Invalid value: -1: \
                   must be greater than or equal to 0";
    assert_eq!(
        serde_json::from_str::<Value>(body).unwrap(),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": "Invalid", "code": 422,
            "details": {"name": "train", "group": "autoscaling", "kind": "Scale", "causes": [{
                "reason": "FieldValueInvalid",
                "message": "Invalid value: -1: must be greater than or equal to 0",
                "field": "spec.replicas",
            }]},
        })
    );
    // kubectl words an Invalid Status from its details (kind, name and causes), where it has
    // `patch --subresource` (1.24 and later).
    let out = api.kubectl(&[
        "patch",
        "deployment/train",
        "-n",
        "ml",
        "--subresource=scale",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":-1}}"#,
    ]);
    let err = refused(&out);
    if !err.contains("unknown flag: --subresource") {
        assert_eq!(
            err.trim(),
            "The Scale \"train\" is invalid: spec.replicas: Invalid value: -1: must be greater \
             than or equal to 0"
        );
        let invalid = api.calls().into_iter().last().unwrap();
        assert_eq!(invalid["code"], 422);
        assert_eq!(invalid["path"], format!("{TRAIN}/scale"));
    }
    assert_eq!(replicas(&api).0, 1);
}

#[test]
fn annotates_with_a_merge_patch() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    api.clear_calls();
    let out = ok(&api.kubectl(&[
        "annotate",
        "deployment/train",
        "-n",
        "ml",
        "gpuwatch.io/x=1",
    ]));
    assert_eq!(out.trim(), "deployment.apps/train annotated");
    let d = api.get(TRAIN).unwrap();
    assert_eq!(d["metadata"]["annotations"]["gpuwatch.io/x"], "1");
    assert_eq!(
        d["metadata"]["generation"], 1,
        "metadata alone keeps the generation"
    );
    let patch = api
        .calls()
        .into_iter()
        .find(|c| c["method"] == "PATCH")
        .unwrap();
    assert_eq!(patch["path"], TRAIN);
    assert_eq!(patch["content_type"], "application/merge-patch+json");
    assert_eq!(
        patch["body"]["metadata"]["annotations"],
        json!({"gpuwatch.io/x": "1"})
    );
    // Removing it; and a patch that changes nothing writes nothing.
    ok(&api.kubectl(&["annotate", "deployment/train", "-n", "ml", "gpuwatch.io/x-"]));
    let d2 = api.get(TRAIN).unwrap();
    assert!(d2["metadata"]
        .get("annotations")
        .is_none_or(|a| a.get("gpuwatch.io/x").is_none()));
    let rv = api.rv();
    ok(&api.kubectl(&[
        "patch",
        "deployment/train",
        "-n",
        "ml",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":3}}"#,
    ]));
    assert_eq!(api.rv(), rv, "an unchanged object is not written");
}

#[test]
fn patches_of_each_type() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    ok(&api.kubectl(&[
        "patch",
        "deployment/train",
        "-n",
        "ml",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"team":"vision"}},"spec":{"replicas":4}}"#,
    ]));
    let d = api.get(TRAIN).unwrap();
    assert_eq!(
        d["metadata"]["labels"],
        json!({"app": "train", "team": "vision"})
    );
    assert_eq!(d["spec"]["replicas"], 4);
    assert_eq!(d["metadata"]["generation"], 2);
    // Strategic: containers merge by name, env by name.
    ok(&api.kubectl(&[
        "patch",
        "deployment/train",
        "-n",
        "ml",
        "--type=strategic",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"busybox"},{"name":"main","image":"pytorch:next","env":[{"name":"A","value":"1"}]}]}}}}"#,
    ]));
    let d = api.get(TRAIN).unwrap();
    let containers = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0]["name"], "main");
    assert_eq!(containers[0]["image"], "pytorch:next");
    assert_eq!(containers[0]["resources"]["limits"]["nvidia.com/gpu"], "2");
    assert_eq!(containers[0]["env"], json!([{"name": "A", "value": "1"}]));
    assert_eq!(
        containers[1],
        json!({"name": "sidecar", "image": "busybox"})
    );
    let strategic = api
        .calls()
        .into_iter()
        .rfind(|c| c["method"] == "PATCH")
        .unwrap();
    assert_eq!(
        strategic["content_type"],
        "application/strategic-merge-patch+json"
    );
    // $patch: delete removes one item by its key.
    ok(&api.kubectl(&[
        "patch",
        "deployment/train",
        "-n",
        "ml",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","$patch":"delete"}]}}}}"#,
    ]));
    let d = api.get(TRAIN).unwrap();
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // JSON patch: a failing test changes nothing.
    let rv = api.rv();
    let err = refused(&api.kubectl(&[
        "patch",
        "deployment/train",
        "-n",
        "ml",
        "--type=json",
        "-p",
        r#"[{"op":"test","path":"/spec/replicas","value":7},{"op":"replace","path":"/spec/replicas","value":9}]"#,
    ]));
    // (kubectl 1.20 stops at "The request is invalid"; later ones add the Status's message.)
    assert!(err.starts_with("The request is invalid"), "{err}");
    if err.trim() != "The request is invalid" {
        assert_eq!(
            err.trim(),
            "The request is invalid: the server rejected our request due to an error in our \
             request"
        );
    }
    assert_eq!(api.rv(), rv);
    assert_eq!(api.get(TRAIN).unwrap()["spec"]["replicas"], 4);
    let failed = api.calls().into_iter().last().unwrap();
    assert_eq!(failed["content_type"], "application/json-patch+json");
    assert_eq!(failed["code"], 422);
    ok(&api.kubectl(&[
        "patch",
        "deployment/train",
        "-n",
        "ml",
        "--type=json",
        "-p",
        r#"[{"op":"test","path":"/spec/replicas","value":4},{"op":"replace","path":"/spec/replicas","value":0},{"op":"add","path":"/metadata/annotations","value":{"a/b":"c"}}]"#,
    ]));
    let d = api.get(TRAIN).unwrap();
    assert_eq!(d["spec"]["replicas"], 0);
    assert_eq!(d["metadata"]["annotations"], json!({"a/b": "c"}));
    // A resourceVersion in a patch is a precondition.
    let err = refused(&api.kubectl(&[
        "patch",
        "deployment/train",
        "-n",
        "ml",
        "--type=merge",
        "-p",
        r#"{"metadata":{"resourceVersion":"1"},"spec":{"replicas":5}}"#,
    ]));
    assert!(
        err.contains(
            "Error from server (Conflict): Operation cannot be fulfilled on deployments.apps \
             \"train\": the object has been modified"
        ),
        "{err}"
    );
}

#[test]
fn custom_resources_through_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    api.put(kubeapi::notebook("ml", "jupyter", 1));
    api.put(kubeapi::inferenceservice("serving", "llm", 1));
    let out = ok(&api.kubectl(&["get", "notebooks.kubeflow.org", "-A"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("NAMESPACE"), "{out}");
    assert!(
        lines[1].starts_with("ml ") && lines[1].contains("jupyter"),
        "{out}"
    );
    let kind = ok(&api.kubectl(&[
        "get",
        "notebook",
        "jupyter",
        "-n",
        "ml",
        "-o",
        "jsonpath={.apiVersion} {.kind} {.spec.template.spec.containers[0].resources.limits.nvidia\\.com/gpu}",
    ]));
    assert_eq!(kind, "kubeflow.org/v1 Notebook 1");
    // A short name from discovery.
    assert_eq!(
        ok(&api.kubectl(&["get", "isvc", "-A", "-o", "name"])).trim(),
        "inferenceservice.serving.kserve.io/llm"
    );
    let resources = ok(&api.kubectl(&["api-resources", "--api-group=apps", "-o", "name"]));
    assert_eq!(
        resources.lines().collect::<Vec<_>>(),
        ["deployments.apps", "replicasets.apps", "statefulsets.apps"]
    );
    // Custom resources take no strategic merge patch.
    let err = refused(&api.kubectl(&[
        "patch",
        "notebook",
        "jupyter",
        "-n",
        "ml",
        "--type=strategic",
        "-p",
        r#"{"metadata":{"labels":{"a":"b"}}}"#,
    ]));
    assert!(
        err.contains(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, \
             application/apply-patch+yaml"
        ),
        "{err}"
    );
    let refusal = api.calls().into_iter().last().unwrap();
    assert_eq!(refusal["code"], 415);
    assert_eq!(
        refusal["content_type"],
        "application/strategic-merge-patch+json"
    );
    ok(&api.kubectl(&[
        "annotate",
        "notebook",
        "jupyter",
        "-n",
        "ml",
        "kubeflow-resource-stopped=2024-01-01T00:00:00Z",
    ]));
    let nb = api
        .get("/apis/kubeflow.org/v1/namespaces/ml/notebooks/jupyter")
        .unwrap();
    assert_eq!(
        nb["metadata"]["annotations"]["kubeflow-resource-stopped"],
        "2024-01-01T00:00:00Z"
    );
}

#[test]
fn leases_and_creation() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    api.put(kubeapi::lease("gpuwatch", "gpuwatch-controller", "pod-a"));
    // The context's namespace is gpuwatch.
    let out = ok(&api.kubectl(&[
        "get",
        "lease",
        "-o",
        "jsonpath={.items[*].spec.holderIdentity}",
    ]));
    assert_eq!(out, "pod-a");
    let table = ok(&api.kubectl(&["get", "lease"]));
    assert!(
        table
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("gpuwatch-controller "),
        "{table}"
    );
    // Create, then AlreadyExists.
    let file = dir.path().join("lease.json");
    std::fs::write(
        &file,
        kubeapi::lease("gpuwatch", "second", "pod-b").to_string(),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    ok(&api.kubectl(&["create", "--validate=false", "-f", file]));
    let created = api
        .get("/apis/coordination.k8s.io/v1/namespaces/gpuwatch/leases/second")
        .unwrap();
    assert_eq!(created["spec"]["holderIdentity"], "pod-b");
    assert!(created["metadata"]["uid"].is_string());
    assert!(created["metadata"]["creationTimestamp"].is_string());
    assert_eq!(rv_of(&created), api.rv());
    let err = refused(&api.kubectl(&["create", "--validate=false", "-f", file]));
    assert!(
        err.contains(&format!(
            "Error from server (AlreadyExists): error when creating \"{file}\": \
             leases.coordination.k8s.io \"second\" already exists"
        )),
        "{err}"
    );
    // Events of both APIs are kept, and listed apart.
    api.put(json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "train.1", "namespace": "ml"},
        "involvedObject": {"kind": "Deployment", "name": "train", "namespace": "ml"},
        "reason": "ScaledDown", "message": "idle", "type": "Normal",
    }));
    let event = dir.path().join("event.json");
    std::fs::write(
        &event,
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"generateName": "train.", "namespace": "ml"},
            "regarding": {"kind": "Deployment", "name": "train", "namespace": "ml"},
            "reason": "Idle", "note": "no GPU use", "type": "Normal",
            "action": "Scale", "reportingController": "gpuwatch.io/controller",
            "reportingInstance": "pod-a", "eventTime": "2024-01-01T00:00:00.000000Z",
        })
        .to_string(),
    )
    .unwrap();
    let created = ok(&api.kubectl(&["create", "--validate=false", "-f", event.to_str().unwrap()]));
    assert!(
        created.starts_with("event.events.k8s.io/train."),
        "{created}"
    );
    let events = api.events();
    assert_eq!(events.len(), 2);
    let reasons: Vec<&str> = events
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["ScaledDown", "Idle"]);
    let core = ok(&api.kubectl(&[
        "get",
        "events",
        "-n",
        "ml",
        "--field-selector",
        "involvedObject.name=train",
        "-o",
        "jsonpath={.items[*].reason}",
    ]));
    assert_eq!(core, "ScaledDown");
}

#[test]
fn refusals_are_worded_as_the_real_servers() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    api.deny("patch", "apps", "deployments/scale", Some("ml"));
    let err = refused(&api.kubectl(&["scale", "deployment/train", "-n", "ml", "--replicas=0"]));
    assert_eq!(
        err.trim(),
        "Error from server (Forbidden): deployments.apps \"train\" is forbidden: User \
         \"system:serviceaccount:gpuwatch:gpuwatch-controller\" cannot patch resource \
         \"deployments/scale\" in API group \"apps\" in the namespace \"ml\""
    );
    assert_eq!(replicas(&api).0, 3);
    // The parent's own patch is another permission.
    ok(&api.kubectl(&["annotate", "deployment/train", "-n", "ml", "a=b"]));
    let refusal = api.calls().into_iter().find(|c| c["code"] == 403).unwrap();
    assert_eq!(refusal["verb"], "patch");
    api.deny("list", "", "pods", None);
    let err = refused(&api.kubectl(&["get", "pods", "-A"]));
    assert_eq!(
        err.trim(),
        "Error from server (Forbidden): pods is forbidden: User \
         \"system:serviceaccount:gpuwatch:gpuwatch-controller\" cannot list resource \"pods\" \
         in API group \"\" at the cluster scope"
    );
    api.allow_all();
    ok(&api.kubectl(&["scale", "deployment/train", "-n", "ml", "--replicas=0"]));
    assert_eq!(replicas(&api).0, 0);

    let err = refused(&api.kubectl(&["get", "deploy", "nope", "-n", "ml"]));
    assert_eq!(
        err.trim(),
        "Error from server (NotFound): deployments.apps \"nope\" not found"
    );
    // kubectl looks the namespace up when the object is missing.
    let err = refused(&api.kubectl(&["get", "pod", "nope", "-n", "ghost"]));
    assert_eq!(
        err.trim(),
        "Error from server (NotFound): namespaces \"ghost\" not found"
    );
}

#[test]
fn a_token_the_server_does_not_accept() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    // With no discovery cached yet, kubectl meets the 401 in discovery (and kubectl 1.32 words
    // it "the server has asked for the client to provide credentials").
    let err = refused(&api.kubectl(&["--token=wrong", "get", "pods"]));
    assert!(
        err.contains("error: You must be logged in to the server ("),
        "{err}"
    );
    let refused_paths: Vec<Value> = api
        .calls()
        .into_iter()
        .filter(|c| c["code"] == 401)
        .map(|c| c["path"].clone())
        .collect();
    assert!(refused_paths.contains(&json!("/api")), "{refused_paths:?}");
    // With discovery cached (by a good token), it meets it in the list, the Status's words.
    ok(&api.kubectl(&["get", "pods"]));
    let err = refused(&api.kubectl(&["--token=wrong", "get", "pods"]));
    assert_eq!(
        err.trim(),
        "error: You must be logged in to the server (Unauthorized)"
    );
    api.set(json!({"tokens": ["rotated"]}));
    let err = refused(&api.kubectl(&["get", "pods"]));
    assert_eq!(
        err.trim(),
        "error: You must be logged in to the server (Unauthorized)"
    );
    let out = ok(&api.kubectl(&["--token=rotated", "get", "pods", "-n", "ml", "-o", "name"]));
    assert_eq!(out.trim(), "pod/train-5d4f8c7b9-abcde");
}

#[test]
fn replace_with_a_stale_resource_version_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    let file = dir.path().join("train.json");
    let file_s = file.to_str().unwrap();
    std::fs::write(
        &file,
        ok(&api.kubectl(&["get", "deploy", "train", "-n", "ml", "-o", "json"])),
    )
    .unwrap();
    // Another writer changes it.
    let mut newer = api.get(TRAIN).unwrap();
    newer["metadata"]["labels"]["by"] = json!("someone-else");
    api.put(newer);
    let err = refused(&api.kubectl(&["replace", "--validate=false", "-f", file_s]));
    assert_eq!(
        err.trim(),
        format!(
            "Error from server (Conflict): error when replacing \"{file_s}\": Operation cannot \
             be fulfilled on deployments.apps \"train\": the object has been modified; please \
             apply your changes to the latest version and try again"
        )
    );
    // With the current version it goes through, unless a concurrent writer gets there first.
    std::fs::write(
        &file,
        ok(&api.kubectl(&["get", "deploy", "train", "-n", "ml", "-o", "json"])),
    )
    .unwrap();
    api.conflict_once(TRAIN);
    let rv = api.rv();
    let err = refused(&api.kubectl(&["replace", "--validate=false", "-f", file_s]));
    assert!(err.contains("Error from server (Conflict)"), "{err}");
    assert_eq!(api.rv(), rv + 1, "the concurrent writer's write");
    std::fs::write(
        &file,
        ok(&api.kubectl(&["get", "deploy", "train", "-n", "ml", "-o", "json"])),
    )
    .unwrap();
    let out = ok(&api.kubectl(&["replace", "--validate=false", "-f", file_s]));
    assert_eq!(out.trim(), "deployment.apps/train replaced");
    // A patch with no resourceVersion is not held up by a concurrent writer.
    api.conflict_once(TRAIN);
    ok(&api.kubectl(&["annotate", "deployment/train", "-n", "ml", "x=y"]));
    assert_eq!(api.get(TRAIN).unwrap()["metadata"]["annotations"]["x"], "y");
    // Unless the test forces it.
    api.conflict_once_forced(TRAIN);
    let err = refused(&api.kubectl(&[
        "annotate",
        "deployment/train",
        "-n",
        "ml",
        "--overwrite",
        "x=z",
    ]));
    assert!(err.contains("Error from server (Conflict)"), "{err}");
}

#[test]
fn kubectl_watch_sees_an_object_put_by_the_test() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    let mut child = api
        .kubectl_command(&["get", "pods", "-n", "ml", "-w", "-o", "name"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl: scripts/test installs Debian's kubernetes-client");
    let stdout = child.stdout.take().unwrap();
    let _kubectl = common::Killed(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let recv = |want: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line == want => return,
                Ok(_) => {}
                Err(e) => panic!("kubectl never printed {want}: {e}"),
            }
        }
    };
    recv("pod/train-5d4f8c7b9-abcde");
    api.await_state(Duration::from_secs(20), |s| {
        !s["watches"].as_array().unwrap().is_empty()
    });
    api.put(kubeapi::pod_of(
        "ReplicaSet",
        "train-5d4f8c7b9",
        "u",
        "ml",
        "train-5d4f8c7b9-late1",
        "node-a",
        2,
    ));
    recv("pod/train-5d4f8c7b9-late1");
    let calls = api.calls();
    let list = calls.iter().find(|c| c["verb"] == "list").unwrap();
    let watch = calls.iter().find(|c| c["verb"] == "watch").unwrap();
    assert_eq!(watch["path"], "/api/v1/namespaces/ml/pods");
    assert_eq!(watch["query"]["watch"], "true");
    assert_eq!(list["path"], "/api/v1/namespaces/ml/pods");
    assert!(
        watch["query"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 1000
    );
}

#[test]
fn an_expired_resource_version_gets_410() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    let old = api.rv();
    api.put(kubeapi::pod_of(
        "ReplicaSet",
        "x",
        "u",
        "ml",
        "p2",
        "node-a",
        1,
    ));
    // Before compaction: the change after `old`, as one ADDED event.
    let out = curl(
        &api,
        &format!("/api/v1/namespaces/ml/pods?watch=true&resourceVersion={old}&timeoutSeconds=1"),
    )
    .output()
    .unwrap();
    let events: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "p2");
    assert_eq!(events[0]["object"]["kind"], "Pod");

    // A watch open when the history is compacted ends, as the server ends watches.
    let mut open = curl(&api, "/api/v1/namespaces/ml/pods?watch=true")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let open_stdout = open.stdout.take().unwrap();
    let open = common::Killed(open);
    api.await_state(Duration::from_secs(20), |s| {
        !s["watches"].as_array().unwrap().is_empty()
    });
    let started = Instant::now();
    let compacted = api.compact();
    assert_eq!(compacted, api.rv());
    let mut rest = String::new();
    let mut open_stdout = open_stdout;
    open_stdout.read_to_string(&mut rest).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the watch did not end"
    );
    drop(open);
    assert_eq!(rest.lines().count(), 2, "ADDED for the two pods: {rest}");

    let out = curl(
        &api,
        &format!("/api/v1/namespaces/ml/pods?watch=true&resourceVersion={old}&timeoutSeconds=5"),
    )
    .args(["-w", "\n%{http_code}"])
    .output()
    .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    assert_eq!(code, "200", "a watch's expiry comes as an event");
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines.len(), 1, "{body}");
    let event: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(
        event,
        json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {old} ({compacted})"),
            "reason": "Expired", "code": 410,
        }})
    );
    // An exact list from there is a 410 answer.
    let err = refused(&api.kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/namespaces/ml/pods?resourceVersion={old}&resourceVersionMatch=Exact"),
    ]));
    assert!(
        err.contains(&format!(
            "Error from server (Expired): too old resource version: {old} ({compacted})"
        )),
        "{err}"
    );
    // From the compacted version on, all is well.
    let list: Value = serde_json::from_str(&ok(&api.kubectl(&[
        "get",
        "--raw",
        &format!(
            "/api/v1/namespaces/ml/pods?resourceVersion={compacted}&resourceVersionMatch=Exact"
        ),
    ])))
    .unwrap();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert!(
        list["items"][0].get("kind").is_none(),
        "typed list items carry no kind"
    );
}

#[test]
fn deletes_answer_as_their_registries_do() {
    let dir = tempfile::tempdir().unwrap();
    let api = cluster(&dir);
    let out = ok(&api.kubectl(&["delete", "pod", "train-5d4f8c7b9-abcde", "-n", "ml"]));
    assert_eq!(out.trim(), "pod \"train-5d4f8c7b9-abcde\" deleted");
    assert!(api
        .get("/api/v1/namespaces/ml/pods/train-5d4f8c7b9-abcde")
        .is_none());
    // No garbage collector: the ReplicaSet stays when its Deployment goes.
    ok(&api.kubectl(&["delete", "deployment", "train", "-n", "ml"]));
    assert!(api.get(TRAIN).is_none());
    assert!(api
        .get("/apis/apps/v1/namespaces/ml/replicasets/train-5d4f8c7b9")
        .is_some());
    // A finalizer holds an object, marked for deletion, until it is removed.
    let mut nb = kubeapi::notebook("ml", "held", 1);
    nb["metadata"]["finalizers"] = json!(["kubeflow.org/cleanup"]);
    api.put(nb);
    let path = "/apis/kubeflow.org/v1/namespaces/ml/notebooks/held";
    ok(&api.kubectl(&["delete", "notebook", "held", "-n", "ml", "--wait=false"]));
    let held = api.get(path).unwrap();
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    ok(&api.kubectl(&[
        "patch",
        "notebook",
        "held",
        "-n",
        "ml",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]));
    assert!(api.get(path).is_none());
}
