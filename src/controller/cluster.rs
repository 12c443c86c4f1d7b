//! The cluster, through `kube`: which workload a pod belongs to (its controller
//! `ownerReferences`), what the workload says now (generation, replicas, holds), giving it back
//! (the `scale` subresource, `spec.suspend`, Kubeflow's stop annotation), each write made with
//! the `resourceVersion` it was decided on, and bringing it back (`restore`).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Pod};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::core::ObjectMeta;
use kube::Client;

use super::decide::{Hold, Kind, Workload};

/// Where a workload's replicas before a scale-down are kept, so that `restore` brings them back.
pub const SCALED_DOWN_FROM: &str = "gpuwatch.io/scaled-down-from";
/// A Job suspended, or a Notebook stopped, by the controller: when and by which rule.
pub const GIVEN_BACK_BY: &str = "gpuwatch.io/given-back-by";
/// A hold on a workload or its namespace: an RFC 3339 expiry, or `forever`.
pub const HOLD: &str = "gpuwatch.io/hold";
/// The label that opts a workload out, with the value `"false"`.
pub const RECLAIM_LABEL: &str = "gpuwatch.io/reclaim";
/// How Kubeflow's own culler stops a notebook.
pub const NOTEBOOK_STOPPED: &str = "kubeflow-resource-stopped";

/// Every kind of call the controller makes, as RBAC grants it: (API group, resource, verbs).
/// `deploy/kubernetes/controller.yaml`'s ClusterRole holds exactly these (`tests/deploy.rs`),
/// and every call of the end-to-end tests is one of them (`tests/controller.rs`).
pub const CLUSTER_PERMISSIONS: &[(&str, &str, &[&str])] = &[
    ("", "pods", &["list", "watch"]),
    ("", "namespaces", &["get"]),
    ("apps", "deployments", &["get", "patch"]),
    ("apps", "statefulsets", &["get", "patch"]),
    ("apps", "replicasets", &["get", "patch"]),
    ("apps", "deployments/scale", &["patch"]),
    ("apps", "statefulsets/scale", &["patch"]),
    ("apps", "replicasets/scale", &["patch"]),
    ("batch", "jobs", &["get", "patch"]),
    ("kubeflow.org", "notebooks", &["get", "patch"]),
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// The calls on the controller's own namespace: its Lease (a Role there).
pub const LEASE_PERMISSIONS: &[(&str, &str, &[&str])] = &[(
    "coordination.k8s.io",
    "leases",
    &["get", "create", "update"],
)];

/// A workload's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.namespace,
            self.kind.as_str().to_ascii_lowercase(),
            self.name
        )
    }
}

/// What owns a pod, as far as the controller follows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Owner {
    /// A workload the controller can give back; for a Job, the CronJob that made it.
    Workload(Key, Option<String>),
    /// Anything else (an InferenceService, a RayCluster, a LeaderWorkerSet, ...): never
    /// touched, only reported. `kind/name` of the pod's controller, or of its owner's.
    Other(String, ObjectReference),
    /// A pod without a controller.
    Bare,
}

/// A workload as read now: what `decide` needs, and what a write needs.
#[derive(Debug, Clone)]
pub struct Read {
    pub workload: Workload,
    pub resource_version: String,
    pub reference: ObjectReference,
    /// The annotation a scale-down left, for `restore`.
    pub annotations: BTreeMap<String, String>,
}

/// The cluster's API, as the controller uses it.
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
}

/// The Kubeflow Notebook resource (kubeflow.org/v1).
pub fn notebooks() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubeflow.org", "v1", "Notebook"),
        "notebooks",
    )
}

fn controller_of(
    meta: &ObjectMeta,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    meta.owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|o| o.controller == Some(true))
}

fn reference(api_version: &str, kind: &str, meta: &ObjectMeta) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..ObjectReference::default()
    }
}

/// The memo of one round: each owner read once.
pub type Owners = BTreeMap<(String, String, String), Owner>;

impl Cluster {
    /// What owns `pod`: its controller, followed through a ReplicaSet to its Deployment and
    /// through a StatefulSet to its Notebook.
    pub async fn owner(&self, pod: &Pod, memo: &mut Owners) -> Result<Owner, kube::Error> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let Some(c) = controller_of(&pod.metadata) else {
            return Ok(Owner::Bare);
        };
        let memo_key = (ns.clone(), c.kind.clone(), c.name.clone());
        if let Some(o) = memo.get(&memo_key) {
            return Ok(o.clone());
        }
        let key = |kind, name: &str| Key {
            kind,
            namespace: ns.clone(),
            name: name.to_string(),
        };
        let other = |kind: &str, name: &str, api_version: &str| {
            Owner::Other(
                format!("{kind}/{name}"),
                ObjectReference {
                    api_version: Some(api_version.into()),
                    kind: Some(kind.into()),
                    name: Some(name.into()),
                    namespace: Some(ns.clone()),
                    ..ObjectReference::default()
                },
            )
        };
        let owner = match (c.api_version.as_str(), c.kind.as_str()) {
            ("apps/v1", "ReplicaSet") => {
                let rs = Api::<ReplicaSet>::namespaced(self.client.clone(), &ns)
                    .get(&c.name)
                    .await?;
                match controller_of(&rs.metadata) {
                    None => Owner::Workload(key(Kind::ReplicaSet, &c.name), None),
                    Some(d) if d.api_version == "apps/v1" && d.kind == "Deployment" => {
                        // A Deployment that something else controls (a KServe
                        // InferenceService, a Knative Revision) is that owner's to scale.
                        let deployment = Api::<Deployment>::namespaced(self.client.clone(), &ns)
                            .get(&d.name)
                            .await?;
                        match controller_of(&deployment.metadata) {
                            None => Owner::Workload(key(Kind::Deployment, &d.name), None),
                            Some(o) => other(&o.kind, &o.name, &o.api_version),
                        }
                    }
                    Some(o) => other(&o.kind, &o.name, &o.api_version),
                }
            }
            ("apps/v1", "StatefulSet") => {
                let sts = Api::<StatefulSet>::namespaced(self.client.clone(), &ns)
                    .get(&c.name)
                    .await?;
                match controller_of(&sts.metadata) {
                    None => Owner::Workload(key(Kind::StatefulSet, &c.name), None),
                    Some(n) if n.api_version == "kubeflow.org/v1" && n.kind == "Notebook" => {
                        Owner::Workload(key(Kind::Notebook, &n.name), None)
                    }
                    Some(o) => other(&o.kind, &o.name, &o.api_version),
                }
            }
            ("batch/v1", "Job") => {
                let job = Api::<Job>::namespaced(self.client.clone(), &ns)
                    .get(&c.name)
                    .await?;
                // A Job a queue admits (Kueue) or another controller manages is theirs to
                // suspend and resume.
                let queued = job
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("kueue.x-k8s.io/queue-name"));
                let managed_by = job.spec.as_ref().and_then(|s| s.managed_by.clone());
                let foreign = managed_by.is_some_and(|m| m != "kubernetes.io/job-controller");
                match controller_of(&job.metadata) {
                    _ if queued || foreign => other("Job", &c.name, "batch/v1"),
                    None => Owner::Workload(key(Kind::Job, &c.name), None),
                    Some(cj) if cj.api_version == "batch/v1" && cj.kind == "CronJob" => {
                        Owner::Workload(key(Kind::Job, &c.name), Some(cj.name.clone()))
                    }
                    Some(o) => other(&o.kind, &o.name, &o.api_version),
                }
            }
            (api_version, kind) => other(kind, &c.name, api_version),
        };
        memo.insert(memo_key, owner.clone());
        Ok(owner)
    }

    /// Reads the workload now, with the hold on its namespace.
    pub async fn read(&self, key: &Key, excluded: bool) -> Result<Read, kube::Error> {
        let client = self.client.clone();
        let ns = key.namespace.as_str();
        // (metadata, the pods it should have, the pods its status counts, given back, API)
        let (meta, replicas, status_pods, given_back, api_version) = match key.kind {
            Kind::Deployment => {
                let d = Api::<Deployment>::namespaced(client, ns)
                    .get(&key.name)
                    .await?;
                let r = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let st = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
                (d.metadata, r, st, r == 0, "apps/v1")
            }
            Kind::StatefulSet => {
                let s = Api::<StatefulSet>::namespaced(client, ns)
                    .get(&key.name)
                    .await?;
                let r = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let st = s.status.as_ref().map_or(0, |s| s.replicas);
                (s.metadata, r, st, r == 0, "apps/v1")
            }
            Kind::ReplicaSet => {
                let s = Api::<ReplicaSet>::namespaced(client, ns)
                    .get(&key.name)
                    .await?;
                let r = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let st = s.status.as_ref().map_or(0, |s| s.replicas);
                (s.metadata, r, st, r == 0, "apps/v1")
            }
            Kind::Job => {
                // A Job's pods are its active ones.
                let j = Api::<Job>::namespaced(client, ns).get(&key.name).await?;
                let suspended = j.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
                let active = j.status.as_ref().and_then(|s| s.active).unwrap_or(0);
                (j.metadata, active, active, suspended, "batch/v1")
            }
            Kind::Notebook => {
                let n = Api::<DynamicObject>::namespaced_with(client, ns, &notebooks())
                    .get(&key.name)
                    .await?;
                let stopped = n
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(NOTEBOOK_STOPPED));
                (n.metadata, 1, 1, stopped, "kubeflow.org/v1")
            }
        };
        let namespace = Api::<Namespace>::all(self.client.clone()).get(ns).await?;
        let annotations = meta.annotations.clone().unwrap_or_default();
        let labels = meta.labels.clone().unwrap_or_default();
        let ns_hold = namespace
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HOLD).cloned());
        Ok(Read {
            workload: Workload {
                kind: key.kind,
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                generation: meta.generation.unwrap_or(0),
                replicas: i64::from(replicas),
                given_back,
                opted_out: labels.get(RECLAIM_LABEL).is_some_and(|v| v == "false"),
                hold: Hold::parse(annotations.get(HOLD).map(String::as_str)),
                namespace_hold: Hold::parse(ns_hold.as_deref()),
                excluded,
                pods: Vec::new(),
                seen: 0,
                status_pods: i64::from(status_pods),
            },
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            reference: reference(api_version, key.kind.as_str(), &meta),
            annotations,
        })
    }

    /// Gives the workload back, with the `resourceVersion` it was decided on: a 409 Conflict
    /// means it changed meanwhile. `note` says when and by which rule.
    pub async fn give_back(
        &self,
        read: &Read,
        note: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        let w = &read.workload;
        let ns = w.namespace.as_str();
        let pp = PatchParams::default();
        let rv = read.resource_version.as_str();
        if rv.is_empty() {
            // An empty resourceVersion is no precondition at all: never write blind.
            return Err(kube::Error::Api(Box::new(kube::core::Status::failure(
                "the workload was read without a resourceVersion; it is not written blind",
                "Invalid",
            ))));
        }
        match w.kind {
            Kind::Deployment | Kind::StatefulSet | Kind::ReplicaSet => {
                let mut from = note.clone();
                from["replicas"] = w.replicas.into();
                let annotate = serde_json::json!({"metadata": {
                    "resourceVersion": rv,
                    "annotations": {SCALED_DOWN_FROM: from.to_string()},
                }});
                let scale = |rv: &str| serde_json::json!({"metadata": {"resourceVersion": rv}, "spec": {"replicas": 0}});
                // The replicas are on record before the scale; a scale that fails takes the
                // record back (with the resourceVersion it left), so none is left behind.
                macro_rules! scale_down {
                    ($t:ty) => {{
                        let api = Api::<$t>::namespaced(self.client.clone(), ns);
                        let patched = api.patch(&w.name, &pp, &Patch::Merge(&annotate)).await?;
                        let rv = patched.metadata.resource_version.unwrap_or_default();
                        let scaled = api
                            .patch_scale(&w.name, &pp, &Patch::Merge(&scale(&rv)))
                            .await;
                        if let Err(e) = scaled {
                            let undo = serde_json::json!({"metadata": {
                                "resourceVersion": rv,
                                "annotations": {SCALED_DOWN_FROM: null},
                            }});
                            let _ = api.patch(&w.name, &pp, &Patch::Merge(&undo)).await;
                            return Err(e);
                        }
                    }};
                }
                match w.kind {
                    Kind::Deployment => scale_down!(Deployment),
                    Kind::StatefulSet => scale_down!(StatefulSet),
                    _ => scale_down!(ReplicaSet),
                }
            }
            Kind::Job => {
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": rv, "annotations": {GIVEN_BACK_BY: note.to_string()}},
                    "spec": {"suspend": true},
                });
                Api::<Job>::namespaced(self.client.clone(), ns)
                    .patch(&w.name, &pp, &Patch::Merge(&patch))
                    .await?;
            }
            Kind::Notebook => {
                let at = note["at"].as_str().unwrap_or_default();
                let patch = serde_json::json!({"metadata": {
                    "resourceVersion": rv,
                    "annotations": {NOTEBOOK_STOPPED: at, GIVEN_BACK_BY: note.to_string()},
                }});
                Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &notebooks())
                    .patch(&w.name, &pp, &Patch::Merge(&patch))
                    .await?;
            }
        }
        Ok(())
    }

    /// Brings a workload the controller gave back as it was: the replicas it had, the Job
    /// resumed, the Notebook started; the controller's annotation removed. Returns what it did.
    pub async fn restore(&self, key: &Key) -> Result<String, RestoreError> {
        let read = self.read(key, false).await.map_err(RestoreError::Api)?;
        // Only what gpuwatch gave back, and only while it still is: never a workload someone
        // scaled since, a Job a queue suspended, or a notebook its user stopped.
        let ours = match key.kind {
            Kind::Deployment | Kind::StatefulSet | Kind::ReplicaSet => SCALED_DOWN_FROM,
            Kind::Job | Kind::Notebook => GIVEN_BACK_BY,
        };
        if !read.annotations.contains_key(ours) {
            return Err(RestoreError::NotOurs(ours));
        }
        if !read.workload.given_back {
            return Err(RestoreError::NotGivenBack);
        }
        let ns = key.namespace.as_str();
        let pp = PatchParams::default();
        let forget = |name: &str| serde_json::json!({"metadata": {"annotations": {name: null}}});
        match key.kind {
            Kind::Deployment | Kind::StatefulSet | Kind::ReplicaSet => {
                let from = read
                    .annotations
                    .get(SCALED_DOWN_FROM)
                    .ok_or(RestoreError::NotOurs(SCALED_DOWN_FROM))?;
                let replicas = serde_json::from_str::<serde_json::Value>(from)
                    .ok()
                    .and_then(|v| v["replicas"].as_i64())
                    .filter(|r| (0..=100_000).contains(r))
                    .ok_or_else(|| RestoreError::Unreadable(crate::redact::brief(from, 200)))?;
                let scale = serde_json::json!({"spec": {"replicas": replicas}});
                macro_rules! scale_up {
                    ($t:ty) => {{
                        let api = Api::<$t>::namespaced(self.client.clone(), ns);
                        api.patch_scale(&key.name, &pp, &Patch::Merge(&scale))
                            .await
                            .map_err(RestoreError::Api)?;
                        api.patch(&key.name, &pp, &Patch::Merge(&forget(SCALED_DOWN_FROM)))
                            .await
                            .map_err(RestoreError::Api)?;
                    }};
                }
                match key.kind {
                    Kind::Deployment => scale_up!(Deployment),
                    Kind::StatefulSet => scale_up!(StatefulSet),
                    _ => scale_up!(ReplicaSet),
                }
                Ok(format!("{key}: scaled back to {replicas}"))
            }
            Kind::Job => {
                let mut patch = forget(GIVEN_BACK_BY);
                patch["spec"] = serde_json::json!({"suspend": false});
                Api::<Job>::namespaced(self.client.clone(), ns)
                    .patch(&key.name, &pp, &Patch::Merge(&patch))
                    .await
                    .map_err(RestoreError::Api)?;
                Ok(format!("{key}: resumed"))
            }
            Kind::Notebook => {
                let mut patch = forget(GIVEN_BACK_BY);
                patch["metadata"]["annotations"][NOTEBOOK_STOPPED] = serde_json::Value::Null;
                Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &notebooks())
                    .patch(&key.name, &pp, &Patch::Merge(&patch))
                    .await
                    .map_err(RestoreError::Api)?;
                Ok(format!("{key}: started"))
            }
        }
    }
}

/// Why `restore` could not bring a workload back.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{}", says(.0))]
    Api(kube::Error),
    #[error("it has no {0} annotation: gpuwatch did not scale it down")]
    NotOurs(&'static str),
    #[error("its annotation \"{0}\" does not say how many replicas it had")]
    Unreadable(String),
    #[error("it is running again (scaled up, resumed or started since): nothing to restore")]
    NotGivenBack,
}

/// Whether a pod may hold a GPU or another accelerator: a container (or init container) that
/// asks for any extended resource (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, a MIG profile,
/// `amd.com/gpu`, `habana.ai/gaudi`, ...), or a resource claim (dynamic resource allocation).
/// Only a pod that asks for nothing beyond CPU, memory, storage and huge pages is known not to.
pub fn holds_accelerator(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    let plain = |name: &str| {
        matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-")
    };
    let claims = spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty());
    claims
        || spec
            .containers
            .iter()
            .chain(spec.init_containers.as_deref().unwrap_or_default())
            .filter_map(|c| c.resources.as_ref())
            .flat_map(|r| {
                r.limits
                    .iter()
                    .chain(r.requests.iter())
                    .flat_map(|m| m.keys())
            })
            .any(|k| !plain(k))
}

/// Whether a pod is being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// A pod that is over (Succeeded or Failed) holds nothing; any other is live.
pub fn is_live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// An API error in words: the API server's own message (a 403 names the verb and the resource
/// the role lacks), or the client's.
pub fn says(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!(
            "{} ({} {})",
            crate::redact::brief(&s.message, 400),
            s.code,
            s.reason
        ),
        other => crate::redact::brief(&other.to_string(), 400),
    }
}

/// The HTTP status of an API error, if the API server answered one.
pub fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}
