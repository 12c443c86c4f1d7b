//! One round of the controller: read the verdicts, group the GPU pods of each workload that
//! has an idle one, decide each workload, and warn, act or call a warning off.

use std::collections::{BTreeMap, BTreeSet};

use super::cluster::{
    holds_accelerator, is_live, is_terminating, says, status_code, Key, Owner, Owners, Read,
};
use super::decide::{decide, Decision, Kind, Pod, Warned};
use super::verdicts::{Verdict, Verdicts};
use super::Controller;
use crate::config::Mode;

/// Each workload's pods that may hold an accelerator (or are ending), and how many live pods
/// it has in all.
type Groups = BTreeMap<Key, (Vec<Pod>, i64)>;

impl Controller {
    /// One round; a failure to read anything skips it whole, and acts on nothing.
    pub async fn round(&mut self) {
        let leads = self.elector.leads();
        let cached = self.pods.state();
        self.stats.with(|s| {
            s.leader = leads;
            s.pods = cached.len() as u64;
        });
        if !leads {
            // Another controller leads: what this one warned is its to decide again.
            self.warned.clear();
            self.rehearsed.clear();
            self.stats.with(|s| s.unmanaged.clear());
            return;
        }
        if !self.pods_healthy.load(std::sync::atomic::Ordering::Acquire) {
            self.failed("the pods' watch has failed since it last listed them, so the cache may be behind: nothing is given back until it lists again".into());
            return;
        }
        let now = crate::time::now();
        self.verdicts_read = std::time::Instant::now();
        let read = super::verdicts::read(&self.http, &self.config, now).await;
        let mut verdicts = match read {
            Ok(v) => {
                self.stats.with(|s| {
                    *s.reads.entry("ok").or_default() += 1;
                    s.fresh = v.fresh.len() as u64;
                    s.stale = v.stale as u64;
                });
                v
            }
            Err(u) => {
                self.stats
                    .with(|s| *s.reads.entry(u.reason).or_default() += 1);
                self.stats.error("prometheus");
                self.failed(format!(
                    "cannot read the verdicts, so nothing is given back this round: {}",
                    u.detail
                ));
                return;
            }
        };
        super::verdicts::price(&self.http, &self.config.prometheus, &mut verdicts).await;
        let groups = match self.group(&cached, &verdicts).await {
            Ok(g) => g,
            Err(e) => {
                self.stats.error("kubernetes");
                self.failed(format!("cannot follow the idle pods to their workloads, so nothing is given back this round: {}", says(&e)));
                return;
            }
        };
        self.last_failure = None;
        // Warned workloads with no idle pod now: their pods are busy again, or gone.
        let gone: Vec<Key> = self
            .warned
            .keys()
            .filter(|k| !groups.contains_key(k))
            .cloned()
            .collect();
        for key in gone {
            self.warned.remove(&key);
            self.rehearsed.remove(&key);
            tracing::info!(workload = %key, "no pod of it is idle any more: its warning is off");
        }
        let watched = groups.len() as u64;
        for (key, pods) in groups {
            self.consider(key, pods, &verdicts, now).await;
        }
        let pending = self.warned.len() as u64;
        self.stats.with(|s| {
            s.watched = watched;
            s.pending = pending;
        });
    }

    /// Logs a failure once until it changes.
    fn failed(&mut self, text: String) {
        if self.last_failure.as_deref() != Some(text.as_str()) {
            tracing::warn!("{text}");
            self.last_failure = Some(text);
        }
    }

    fn excluded(&self, namespace: &str) -> bool {
        self.config
            .exclude_namespaces
            .iter()
            .any(|n| n == namespace)
    }

    /// The GPU pods of each workload that has an idle pod; idle pods of owners the controller
    /// never touches are reported.
    async fn group(
        &mut self,
        cached: &[std::sync::Arc<k8s_openapi::api::core::v1::Pod>],
        verdicts: &Verdicts,
    ) -> Result<Groups, kube::Error> {
        let namespaces: BTreeSet<&str> = verdicts.fresh.keys().map(|(n, _)| n.as_str()).collect();
        let mut memo = Owners::new();
        self.cronjobs.clear();
        let mut unmanaged = BTreeMap::new();
        let mut groups = Groups::new();
        for pod in cached {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("");
            let name = pod.metadata.name.as_deref().unwrap_or("");
            if !namespaces.contains(ns) || !is_live(pod) {
                continue;
            }
            // A node in dry-run rehearses: its verdicts give nothing back under an enforcing
            // controller.
            let enforcing = self.config.mode == Mode::Enforce;
            let verdict = verdicts
                .fresh
                .get(&(ns.to_string(), name.to_string()))
                .filter(|v| of_this_pod(v, pod) && !(enforcing && v.mode != "enforce"));
            match self.cluster.owner(pod, &mut memo).await? {
                Owner::Workload(key, cronjob) => {
                    if let Some(c) = cronjob {
                        self.cronjobs.insert(key.clone(), c);
                    }
                    let (pods, seen) = groups.entry(key).or_default();
                    *seen += 1;
                    let terminating = is_terminating(pod);
                    if holds_accelerator(pod) || terminating {
                        pods.push(Pod {
                            name: name.to_string(),
                            idle: verdict.and_then(|v| Some((v.rule.clone(), v.since?))),
                            terminating,
                        });
                    }
                }
                Owner::Other(what, reference) => {
                    if let Some(v) = verdict.filter(|_| !self.excluded(ns)) {
                        let cost = unmanaged
                            .entry((ns.to_string(), what.clone()))
                            .or_insert(Some(0.0));
                        *cost = cost.zip(v.usd_per_hour).map(|(a, b)| a + b);
                        let said = format!("{ns}/{what}");
                        let note = format!("pod {name} of {what} holds GPUs ({} GPUs {}{}) that rule \"{}\" judges idle; gpuwatch does not give back a {}: scale it down or stop it yourself", v.instance, v.gpus, dollars(v), v.rule, reference.kind.as_deref().unwrap_or("workload"));
                        self.report(said, &reference, note).await;
                    }
                }
                Owner::Bare => {
                    if let Some(v) = verdict.filter(|_| !self.excluded(ns)) {
                        unmanaged.insert((ns.to_string(), format!("Pod/{name}")), v.usd_per_hour);
                        let reference = k8s_openapi::api::core::v1::ObjectReference {
                            api_version: Some("v1".into()),
                            kind: Some("Pod".into()),
                            name: Some(name.into()),
                            namespace: Some(ns.into()),
                            uid: pod.metadata.uid.clone(),
                            ..Default::default()
                        };
                        let note = format!("pod {name} holds GPUs ({} GPUs {}{}) that rule \"{}\" judges idle; it has no controller, and gpuwatch never deletes a pod: delete it yourself", v.instance, v.gpus, dollars(v), v.rule);
                        self.report(format!("{ns}/pod/{name}"), &reference, note)
                            .await;
                    }
                }
            }
        }
        groups.retain(|_, (pods, _)| pods.iter().any(|p| p.idle.is_some()));
        self.stats.with(|s| s.unmanaged = unmanaged);
        // Owners reported in a namespace with no idle pod now may be reported again later.
        self.reported
            .retain(|r| namespaces.iter().any(|n| r.starts_with(&format!("{n}/"))));
        Ok(groups)
    }

    /// An idle pod of an owner the controller never touches: an Event and a log line, once.
    async fn report(
        &mut self,
        said: String,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        note: String,
    ) {
        if self.excluded(reference.namespace.as_deref().unwrap_or(""))
            || !self.reported.insert(said)
        {
            return;
        }
        self.event(reference, true, "GpuIdleUnmanaged", note).await;
    }

    /// Decides one workload and does what the decision says.
    async fn consider(
        &mut self,
        key: Key,
        (pods, seen): (Vec<Pod>, i64),
        verdicts: &Verdicts,
        now: f64,
    ) {
        let excluded = self.excluded(&key.namespace);
        let mut read = match self.cluster.read(&key, excluded).await {
            Ok(r) => r,
            Err(e) => {
                self.stats.error("kubernetes");
                self.failed(format!(
                    "cannot read {key}, so it is not given back: {}",
                    says(&e)
                ));
                return;
            }
        };
        read.workload.pods = pods;
        read.workload.seen = seen;
        let decision = decide(
            &read.workload,
            self.warned.get(&key),
            now,
            self.config.warning,
        );
        match decision {
            Decision::Keep(why) => {
                self.rehearsed.remove(&key);
                if self.warned.remove(&key).is_some() {
                    let note = format!("the warning is off: {why}");
                    self.event(&read.reference, false, "GpuIdleCancelled", note)
                        .await;
                }
            }
            Decision::Wait => {}
            Decision::Warn { due } => {
                let will = match self.config.mode {
                    Mode::DryRun => "dry-run: gpuwatch would",
                    Mode::Enforce => "gpuwatch will",
                };
                let note = format!(
                    "{}: {will} {} {key} at {} unless a pod of it is busy again, it changes, or it is held (annotation {}: an RFC 3339 time or \"forever\")",
                    idle_pods(&read, verdicts),
                    read.workload.kind.verb(),
                    gpuwatch_core::time::rfc3339(due),
                    super::cluster::HOLD,
                );
                // No warning on record, no action: one that could not be published is given
                // again next round, and the action waits for it.
                if self
                    .event(&read.reference, true, "GpuIdleWarning", note)
                    .await
                {
                    self.stats
                        .with(|s| *s.warnings.entry(key.kind.as_str()).or_default() += 1);
                    self.warned
                        .insert(key, Warned::of(&read.workload, now, due));
                } else {
                    self.warned.remove(&key);
                }
            }
            Decision::Act => self.act(key, &read, verdicts, now).await,
        }
    }

    /// Gives the workload back (or says what it would do, in dry-run).
    async fn act(&mut self, key: Key, read: &Read, verdicts: &Verdicts, now: f64) {
        // Leadership and the verdicts' age are checked again right before the write: a round
        // slowed by the API server acts on nothing older than a scrape interval.
        if !self.elector.leads() {
            return;
        }
        let elapsed = self.verdicts_read.elapsed().as_secs_f64();
        let most = 2.0 * self.config.scrape_interval.as_secs_f64();
        let ns = &read.workload.namespace;
        let stale = read.workload.pods.iter().any(|p| {
            verdicts
                .fresh
                .get(&(ns.clone(), p.name.clone()))
                .is_none_or(|v| v.age + elapsed > most)
        });
        if stale {
            tracing::info!(workload = %key, "its verdicts are older than two scrape intervals by now: it is decided again next round");
            return;
        }
        let w = &read.workload;
        let kind = w.kind.as_str();
        let what = match w.kind {
            Kind::Deployment | Kind::StatefulSet | Kind::ReplicaSet => {
                format!("scale {key} to 0 (from {} replicas)", w.replicas)
            }
            Kind::Job => match self.cronjobs.get(&key) {
                Some(cronjob) => format!("suspend {key}, a Job of CronJob {cronjob}: this Job only (its pods end; `spec.suspend: false` resumes it), and the CronJob still starts its next Job on schedule"),
                None => format!("suspend {key} (its pods end; `spec.suspend: false` resumes it)"),
            },
            Kind::Notebook => format!(
                "stop {key} ({}, as Kubeflow's culler does)",
                super::cluster::NOTEBOOK_STOPPED
            ),
        };
        let rules: BTreeSet<&str> = w
            .pods
            .iter()
            .filter_map(|p| Some(p.idle.as_ref()?.0.as_str()))
            .collect();
        let rules: Vec<&str> = rules.into_iter().collect();
        let idle = idle_pods(read, verdicts);
        if self.config.mode == Mode::DryRun {
            let state = (w.generation, w.replicas);
            if self.rehearsed.insert(key, state) != Some(state) {
                self.stats
                    .with(|s| *s.actions.entry((kind, "dry_run")).or_default() += 1);
                let note = format!("dry-run: would {what}; {idle}");
                self.event(&read.reference, false, "GpuIdleDryRun", note)
                    .await;
            }
            return;
        }
        let note = serde_json::json!({
            "at": gpuwatch_core::time::rfc3339(now),
            "rule": rules.join(","),
            "by": self.identity,
        });
        match self.cluster.give_back(read, &note).await {
            Ok(()) => {
                self.stats
                    .with(|s| *s.actions.entry((kind, "done")).or_default() += 1);
                self.warned.remove(&key);
                let reason = match w.kind {
                    Kind::Job => "GpuIdleSuspended",
                    Kind::Notebook => "GpuIdleStopped",
                    _ => "GpuIdleScaledDown",
                };
                let restore = format!("gpuwatch controller restore {key}");
                let note = format!("{what}: {idle}; bring it back with `{restore}`");
                self.event(&read.reference, false, reason, note).await;
            }
            Err(e) if status_code(&e) == Some(409) => {
                // Changed since it was read: read again and decided again next round.
                self.stats
                    .with(|s| *s.actions.entry((kind, "conflict")).or_default() += 1);
                tracing::info!(workload = %key, "it changed while it was being given back (409 Conflict): it is read and decided again");
            }
            Err(e) => {
                self.stats
                    .with(|s| *s.actions.entry((kind, "failed")).or_default() += 1);
                let note = format!("cannot {what}: {}", says(&e));
                self.event(&read.reference, true, "GpuIdleActionFailed", note)
                    .await;
            }
        }
    }
}

/// The idle pods of a workload in words: which rule, which node and GPUs.
fn idle_pods(read: &Read, verdicts: &Verdicts) -> String {
    let ns = &read.workload.namespace;
    let of = |pod: &String| verdicts.fresh.get(&(ns.clone(), pod.clone()));
    let pods = &read.workload.pods;
    let named: Vec<String> = pods
        .iter()
        .map(|p| &p.name)
        .map(|pod| match of(pod) {
            Some(v) => format!(
                "{pod} (rule \"{}\", {} GPUs {})",
                v.rule, v.instance, v.gpus
            ),
            None => pod.clone(),
        })
        .collect();
    // The workload's cost, where every pod's is known.
    let priced: Option<Vec<f64>> = pods.iter().map(|p| of(&p.name)?.usd_per_hour).collect();
    let cost = match priced {
        Some(usd) if !usd.is_empty() => {
            format!("; their GPUs cost ${:.2} an hour", usd.iter().sum::<f64>())
        }
        _ => String::new(),
    };
    format!("every GPU pod of it is idle: {}{cost}", named.join(", "))
}

/// ", $4.10 an hour" where the verdict's price is known.
fn dollars(v: &super::verdicts::Verdict) -> String {
    v.usd_per_hour
        .map(|usd| format!(", ${usd:.2} an hour"))
        .unwrap_or_default()
}

/// Whether a verdict is of this pod: given on the node the pod runs on, after the pod was
/// created (a pod recreated under the same name is not its predecessor).
fn of_this_pod(v: &Verdict, pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    let created = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| serde_json::to_value(t).ok())
        .and_then(|t| t.as_str().and_then(gpuwatch_core::time::parse_rfc3339));
    node.is_some_and(|n| n == v.node)
        && matches!((v.since, created), (Some(since), Some(created)) if since >= created)
}
