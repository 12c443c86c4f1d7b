//! The cost watch loop, the I/O edge around the pure decision step: for each new snapshot it
//! reads the world, runs `step`, persists the state, carries out the decisions through the
//! executor, and publishes the views its metrics show. `cloud.rs` polls instance metadata for
//! spot notices and tag holds; `metrics.rs` holds the watch's series.

mod cloud;
mod edge;
mod events;
mod identify;
pub mod metrics;
mod observation;
pub mod progress;
mod start;

pub use start::{spawn, HeldBy, Started, WatchTask};

pub use cloud::{poll_cloud, CloudPoller};
pub use observation::observation;

use std::sync::{Arc, Mutex};

use self::metrics::{ActionResult, IdleGpu, SharedWatchView};
use crate::actions::Executor;
use crate::config::Config;
use crate::gpu::sampler::Snapshots;
use crate::gpu::Snapshot;
use crate::spend::metrics::{AlertKey, SharedCostView};
use gpuwatch_core::cost::budget::Crossing;
use gpuwatch_core::cost::ledger::Closed;
use gpuwatch_core::step::order::{drive, settle_in_flight};
use gpuwatch_core::step::{rule_views, step, Decision, Inputs, RuleView, Settings, View};

use crate::rules::{Observation, Scope};
use crate::state::{AuditRecord, HoldStatus, LoadError, Persisted, StateDir};

/// What the node is told from outside its GPUs (a hold tag, a spot interruption notice), as the
/// watch loop reads it each cycle.
#[derive(Debug, Default)]
pub struct NodeSignals {
    /// An instance-tag hold (`gpuwatch:hold`), refreshed by the cloud poller.
    pub tag_hold: Mutex<HoldStatus>,
    /// A spot interruption notice is in effect (a rebalance recommendation is not).
    pub interruption: Mutex<Option<f64>>,
}

impl NodeSignals {
    /// The instance-tag hold, as the cloud poller last read it. A lock poisoned by a panic
    /// while it was written is a hold that cannot be known, and unknown holds: every lock on
    /// the decision path reads so.
    pub fn tag_hold(&self) -> HoldStatus {
        match self.tag_hold.lock() {
            Ok(h) => h.clone(),
            Err(_) => HoldStatus::Unknown(POISONED.into()),
        }
    }

    /// When the spot interruption in effect takes effect, if one is. A poisoned lock is a
    /// notice that cannot be known: in effect, from an unknown time (`+Inf`).
    pub fn interruption(&self) -> Option<f64> {
        match self.interruption.lock() {
            Ok(i) => *i,
            Err(_) => Some(f64::INFINITY),
        }
    }
}

/// Why a signal whose lock is poisoned holds.
const POISONED: &str =
    "the lock on what the instance tags say is poisoned (a panic while it was written): unknown holds";

/// Unix time the machine booted, from /proc/stat.
fn boot_time() -> Option<f64> {
    let stat = crate::files::read_proc_text(std::path::Path::new("/proc/stat"), 1 << 20)?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

pub struct Watch {
    pub config: Config,
    pub state_dir: StateDir,
    pub executor: Arc<Executor>,
    pub metrics: Arc<SharedWatchView>,
    /// The cost and budget series, which each step updates.
    pub cost: Arc<SharedCostView>,
    pub signals: Arc<NodeSignals>,
    /// Hands health what `state.json` kept of it, once it is read.
    pub health_seed: Option<crate::gpu::health::Seed>,
    pub tracker: crate::spend::Tracker,
    /// The cloud's API for this instance, once metadata has named it.
    pub api: Option<std::sync::Arc<dyn crate::cloud::ControlPlane>>,
    /// The instance, when instance metadata did not answer at start: it is asked again in the
    /// background, and the loop takes the instance in once it answers.
    pub identified: Option<tokio::sync::oneshot::Receiver<identify::Identified>>,
    /// Budget alerts being published to a topic (SNS).
    pub publishes: tokio::task::JoinSet<()>,
    /// Who holds which GPU, on Kubernetes (for pod-scoped rules).
    pub pods: Option<Arc<crate::kubernetes::view::SharedKubernetesView>>,
    /// Which jobs and users hold which GPU (for job- and user-scoped rules).
    pub holders: Option<Arc<crate::slurm::holders::SharedHolders>>,
    /// How far the loop has come, for the systemd watchdog.
    pub progress: Arc<crate::watch::progress::Progress>,
    /// What this step changed of the view, published with the rest of it at the step's end, so
    /// that a scrape never sees an action counted while the rule still shows it pending.
    pub unpublished: std::sync::Mutex<Unpublished>,
}

/// The view's changes a step makes before it publishes.
#[derive(Debug, Default)]
pub struct Unpublished {
    actions: Vec<ActionResult>,
    holds: Vec<crate::state::Hold>,
}

impl Watch {
    /// Runs until `stop` turns true (or its sender is gone). A cycle in progress finishes
    /// first, so an action handed out is carried out or durably marked in flight.
    pub async fn run(mut self, snapshots: Snapshots, mut stop: tokio::sync::watch::Receiver<bool>) {
        let started = crate::time::now();
        // The machine's boot does not move while gpuwatch runs: read it once.
        let booted = boot_time();
        let grace_until = booted.map_or(started, |b| b.max(started))
            + self.config.actions.boot_grace.as_secs_f64();
        let settings = self.config.step_settings(
            self.config.sampling.interval,
            grace_until,
            booted.unwrap_or(0.0),
        );
        let mut persisted = {
            // Settling an action left in flight may retry the cloud for `retry_for`.
            let _acting = self
                .progress
                .acting(self.action_limit(), std::time::Duration::ZERO);
            self.start(&snapshots, &settings).await
        };
        self.tracker.seed_baselines(persisted.spot_price);
        // Health judges nothing until it knows the XIDs held against GPUs before the restart;
        // those from before the machine booted are gone with the boot, which resets every GPU.
        if let Some(b) = booted {
            persisted.health.forget_before(b);
        }
        if let Some(seed) = self.health_seed.take() {
            let _ = seed.send(persisted.health.clone());
        }
        self.progress.stepped(snapshots.latest().seq);
        let mut last_durable = started;
        // The unreadable hold last warned about, so that it is warned about once.
        let mut warned_hold = None;
        let mut seq = 0;
        loop {
            let snap = tokio::select! {
                s = snapshots.next_after(seq) => s,
                _ = stop.wait_for(|s| *s) => break,
            };
            if snap.seq == seq {
                continue;
            }
            seq = snap.seq;
            let now = snap.timestamp;
            self.take_identity();
            self.take_lifecycle();

            // Read.
            let (obs, mut inputs, interruption) = self.read(&snap, &mut warned_hold).await;
            self.tracker.fill(&persisted, &mut inputs);

            // When the step decided, for the age of its decision as its actions run.
            let decided = std::time::Instant::now();
            // Step. The core orders what it decided around the save (`step::order::drive`):
            // warnings (and the breaches, recoveries and postponements beside them) are on
            // record and sent before the state that makes their action possible is saved, so a
            // crash in between means a repeated warning after the restart, never an action
            // without one. Cancellations, actions and budget alerts follow a good save; after
            // a failed one the actions are withdrawn and the alerts withheld.
            let Decision {
                rules: judged,
                order,
                closed,
                view,
            } = step(&settings, &mut persisted, &obs, &inputs);
            // A new (or cleared) XID hold is saved durably at once: a crash must not forget it.
            let mut holds_changed = false;
            if let Some(holds) = &snap.health_holds {
                holds_changed = *holds != persisted.health.holds;
                persisted.health.holds.clone_from(holds);
            }
            self.record_closed(&closed);
            // SNS publishes that finished are reaped; the rest end with the watch.
            while self.publishes.try_join_next().is_some() {}

            // The safety order, as `simulate` runs it too: the before-save events, the save
            // (durably when anything was decided or alerted, and once a minute), then what it
            // lets through: budget alerts, cancellations, and actions, each one behind slow
            // ones of its step decided again on the next sample (`order::defer`).
            let mut live = edge::Live {
                watch: &mut self,
                rules: &judged,
                at: now,
                decided,
                durable: holds_changed || now - last_durable > 60.0,
                saved_durably: false,
            };
            let sent = drive(&settings, &mut persisted, order, &mut live).await;
            if live.saved_durably {
                last_durable = now;
            }
            self.withdraw_verdicts(&judged, &obs, &inputs);
            // Publish: an action withdrawn or completed above shows in this cycle's metrics.
            let rules = rule_views(&judged, &persisted, &settings, now);
            self.publish(&snap, view, &sent, rules, interruption);
            self.progress.stepped(seq);
        }
        self.save(&persisted, true).await;
        tracing::info!("cost watch stopped");
        let _ = self.executor.audit(AuditRecord::Stopped);
    }

    /// A reclaim verdict stands while every device of its pod is idle by its rule, and no
    /// hold of the node or activity veto says otherwise (holds win).
    fn withdraw_verdicts(&self, judged: &[crate::rules::Rule], obs: &Observation, inputs: &Inputs) {
        let verdicts = &self.executor.verdicts;
        if inputs.hold_until.is_some_and(|t| t > obs.t) {
            return verdicts.withdraw_all("the node is held");
        }
        if let Some(veto) = &obs.veto {
            return verdicts.withdraw_all(&format!("activity on the node ({veto})"));
        }
        verdicts.keep(|key, _| {
            judged.iter().any(|r| {
                r.name == key
                    && gpuwatch_core::step::verdict_stands(
                        r,
                        obs,
                        r.subject.as_deref().unwrap_or(""),
                    )
            })
        });
    }

    /// What the step needs to know of this sample and of the world beside it: the observation
    /// (with any activity veto), holds from the state directory and the instance tag, the
    /// lifecycle and a spot interruption notice (and when it takes effect). The price is filled
    /// in by the tracker.
    async fn read(
        &self,
        snap: &Snapshot,
        warned_hold: &mut Option<String>,
    ) -> (Observation, Inputs, Option<f64>) {
        // On Kubernetes, the pods holding each device, for pod-scoped rules.
        let held = self.pods.as_ref().map(|p| p.view().held(&snap.gpus));
        let mut obs = observation(snap, |g, m| {
            let Some(h) = &held else {
                return Vec::new();
            };
            // A MIG device is held by the pods holding it, and by any holding its whole GPU.
            let pods = match m {
                Some(m) => [h.mig.get(m.uuid.as_str()), h.whole.get(&g.index)],
                None => [h.gpus.get(&g.index), None],
            };
            let mut names: Vec<String> = pods
                .into_iter()
                .flatten()
                .flatten()
                .map(|p| format!("{}/{}", p.namespace, p.pod))
                .collect();
            names.sort_unstable();
            names.dedup();
            names
        });
        self.attach_holders(snap, &mut obs).await;
        // Scanning /proc and reading the hold files block: keep them off the async worker.
        let (vetoes, dir) = (Arc::clone(&self.config.vetoes), self.state_dir.clone());
        let subjects = self.holders.is_some();
        let (veto, local, subject_holds) = crate::state::on_io_thread(move || {
            let subject_holds = if subjects {
                dir.subject_holds()
            } else {
                Ok(Default::default())
            };
            (crate::vetoes::check(&vetoes), dir.hold(), subject_holds)
        })
        .await;
        obs.veto = veto;
        // Job and user holds that cannot all be known may hold any job or user: the node is
        // held, as by a hold file that cannot be read.
        let (subject_holds, local) = match subject_holds {
            Ok(h) => (h, local),
            Err(why) => (Default::default(), HoldStatus::Unreadable(why)),
        };
        let tag = self.signals.tag_hold();
        let unreadable = [&local, &tag].into_iter().find_map(|h| match h {
            HoldStatus::Unreadable(why) | HoldStatus::Unknown(why) => Some(why.clone()),
            _ => None,
        });
        if unreadable.is_some() && unreadable != *warned_hold {
            tracing::warn!(
                "a hold with an unreadable expiry counts as a hold: {}",
                unreadable.as_deref().unwrap_or_default()
            );
        }
        *warned_hold = unreadable;
        let holds = crate::state::holds_in_force(snap.timestamp, &local, &tag);
        if let Ok(mut u) = self.unpublished.lock() {
            u.holds = holds;
        }
        let interruption = self.signals.interruption();
        let inputs = Inputs {
            now: snap.timestamp,
            hold_until: [local.until(), tag.until()]
                .into_iter()
                .flatten()
                .reduce(f64::max),
            lifecycle: self.tracker.node.as_ref().and_then(|n| n.lifecycle),
            interruption: interruption.is_some(),
            subject_holds: subject_holds
                .iter()
                .filter_map(|(s, h)| Some((s.key(), h.until()?)))
                .collect(),
            suspended: crate::time::suspended(),
            monotonic: snap.monotonic,
            ..Inputs::default()
        };
        (obs, inputs, interruption)
    }

    /// The jobs and users holding each device, for their rules: this sample's, read just after
    /// it. Unknown while a process list failed, the mapping is not known whole (an entry not
    /// read may give any job any device), or they are late.
    async fn attach_holders(&self, snap: &Snapshot, obs: &mut Observation) {
        let Some(h) = &self.holders else {
            return;
        };
        let wait = self.config.sampling.interval.clamp(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(2),
        );
        let Some(h) = h.of_sample(snap.seq, wait).await else {
            obs.holders_unknown = true;
            return;
        };
        for r in &mut obs.gpus {
            if let Some(held) = h.of((r.index, r.mig.map(|m| m.gpu_instance))) {
                r.jobs.clone_from(&held.jobs);
                r.users.clone_from(&held.users);
            }
        }
        obs.holders_unknown = !processes_known(snap) || h.mapping_unknown.is_some();
    }

    /// Logs and audits the budget periods that closed.
    fn record_closed(&self, closed: &[Closed]) {
        for c in closed {
            tracing::info!(total = c.total, "budget period closed");
            let _ = self.executor.audit(AuditRecord::PeriodClosed {
                period_start: crate::time::rfc3339(c.period_start),
                period_end: crate::time::rfc3339(c.period_end),
                spent_usd: c.total,
            });
        }
    }

    /// Records and sends one budget alert. Returns whether it was on record (and so sent);
    /// `order::drive` takes one that was not back.
    fn alert(&mut self, c: &Crossing) -> bool {
        let budget = self.config.budgets.iter().find(|b| b.name == c.budget);
        crate::spend::send_alert(
            c,
            budget,
            &self.executor,
            self.api.as_ref(),
            &mut self.publishes,
        )
    }

    /// Swaps in the views the watch's and the cost series show.
    fn publish(
        &self,
        snap: &Snapshot,
        view: View,
        crossings: &[Crossing],
        rules: Vec<RuleView>,
        interruption: Option<f64>,
    ) {
        // Each job's user, as the holders last saw it.
        let job_users: std::collections::BTreeMap<String, Option<String>> = self
            .holders
            .as_ref()
            .map(|h| {
                h.view()
                    .jobs
                    .iter()
                    .map(|(j, job)| (j.clone(), job.user.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let gpu_idle = view
            .gpu_idle
            .iter()
            .filter_map(|i| {
                let g = snap.gpus.iter().find(|g| g.index == i.index && g.up)?;
                let mig = match i.mig {
                    Some(id) => Some(g.mig.iter().find(|m| {
                        m.gpu_instance == Some(id.gpu_instance)
                            && m.compute_instance == Some(id.compute_instance)
                    })?),
                    None => None,
                };
                Some(IdleGpu {
                    gpu: i.index,
                    uuid: mig.map_or(&g.uuid, |m| &m.uuid).clone(),
                    mig: mig.map(|m| crate::gpu::MigSample {
                        gpm: None,
                        ..m.clone()
                    }),
                    seconds: i.seconds,
                })
            })
            .collect();
        let implausible_prices = self
            .tracker
            .readings
            .implausible
            .load(std::sync::atomic::Ordering::Relaxed);
        self.cost.update(|v| {
            for c in crossings {
                let key = AlertKey {
                    budget: c.budget.clone(),
                    threshold: c.threshold.to_string(),
                };
                *v.alerts.entry(key).or_default() += 1;
            }
            v.price = view.price;
            v.spent = view.spent;
            v.forecast = view.forecast;
            v.budgets = view.budgets;
            v.idle_dollars = view.idle_dollars;
            v.implausible_prices = implausible_prices;
            v.unhealthy_dollars = view.unhealthy_dollars;
            v.jobs = view
                .jobs
                .iter()
                .map(|(j, t)| (j.clone(), job_users.get(j).cloned().flatten(), *t))
                .collect();
            v.users = view.users.iter().map(|(u, t)| (u.clone(), *t)).collect();
        });
        let unpublished = self
            .unpublished
            .lock()
            .map(|mut u| std::mem::take(&mut *u))
            .unwrap_or_default();
        let stamps_refused = self.executor.stamps_refused();
        self.metrics.update(|v| {
            for key in unpublished.actions {
                *v.actions.entry(key).or_default() += 1;
            }
            v.stamps_refused = stamps_refused;
            v.holds = unpublished.holds;
            v.rules = rules;
            v.gpu_idle = gpu_idle;
            v.interruption = interruption;
        });
    }

    /// Loads the state, settles actions that were in flight at a restart, drops the rules that
    /// left the config, and records the start.
    async fn start(&self, snapshots: &Snapshots, settings: &Settings) -> Persisted {
        crate::state::off_async(|| self.state_dir.remove_stale_temps());
        let mut persisted = self.load(snapshots).await;
        // Settled before the rules that left the config are dropped: an action in flight at
        // the restart is on record even when its rule is gone.
        self.resume_in_flight(&mut persisted).await;
        let rules = &settings.rules;
        persisted
            .engine
            .rules
            .retain(|name, _| rules.iter().any(|r| r.owns_state(name)));
        if self.pods.is_none() && rules.iter().any(|r| r.scope == Scope::Pod) {
            tracing::warn!(
                "pod-scoped rules judge the pods that hold GPUs, which gpuwatch learns from the kubelet: set [kubernetes] pod_resources_socket, or they never breach"
            );
        }
        let spoofable = crate::vetoes::spoofable(&self.config.vetoes);
        if !spoofable.is_empty() {
            tracing::warn!(
                names = ?spoofable,
                "[vetoes] processes names processes by name, which any local user can imitate to hold the node busy; name the executable's absolute path instead"
            );
        }
        let grace_until = crate::time::rfc3339(settings.grace_until);
        tracing::info!(
            rules = rules.len(),
            mode = self.config.actions.mode.as_str(),
            grace_until = %grace_until,
            "cost watch started"
        );
        let _ = self.executor.audit(AuditRecord::Started {
            rules: rules.iter().map(|r| r.name.clone()).collect(),
            grace_until,
        });
        persisted
    }

    /// Takes in the instance's lifecycle where its cloud's API told it after identity: its
    /// price counts from this step on, and `gpuwatch_node_info` says it.
    fn take_lifecycle(&mut self) {
        let Some(node) = self.tracker.node.as_mut().filter(|n| n.lifecycle.is_none()) else {
            return;
        };
        let Some(learnt) = self.tracker.readings.lifecycle.lock().ok().and_then(|l| *l) else {
            return;
        };
        node.lifecycle = Some(learnt);
        let node = node.clone();
        tracing::info!(
            lifecycle = node.lifecycle_label(),
            "the instance's lifecycle is known"
        );
        self.metrics.update(|v| v.node = Some(node));
    }

    /// Takes in the instance once instance metadata, which did not answer at start, has named
    /// it: its price and lifecycle count from this step on.
    fn take_identity(&mut self) {
        let Some(found) = &mut self.identified else {
            return;
        };
        match found.try_recv() {
            Ok(identify::Identified { node, api }) => {
                self.tracker.node = Some(node);
                self.tracker.seed_baselines(None);
                self.api = Some(api);
                self.identified = None;
            }
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => self.identified = None,
        }
    }

    /// An action that was handed out before a restart is never sent again. Its outcome is
    /// recorded from the instance's state where that can be read.
    async fn resume_in_flight(&self, persisted: &mut Persisted) {
        for (name, f) in settle_in_flight(persisted) {
            let state = match self.executor.cloud() {
                Some(c) => c.api.state().await.ok().flatten(),
                None => None,
            };
            tracing::warn!(
                rule = %name, action = %f.action, instance_state = state.as_deref().unwrap_or("unknown"),
                "an action was sent before the restart; it is not repeated"
            );
            let _ = self.executor.audit(AuditRecord::InFlightAtRestart {
                rule: name.clone(),
                action: f.action,
                sent_at: crate::time::rfc3339(f.at),
                instance_state: state,
                repeated: false,
            });
        }
        self.save(persisted, true).await;
    }

    /// Loads the persisted state. A state file that exists but cannot be read may hold an
    /// action in flight, so nothing is decided until it reads: this retries on every sample.
    async fn load(&self, snapshots: &Snapshots) -> Persisted {
        let mut seq = 0;
        let mut reported = None;
        loop {
            match crate::state::off_async(|| self.state_dir.load()) {
                Ok(p) => return p,
                Err(LoadError::Missing(line)) => {
                    tracing::info!("{line}");
                    return Persisted::default();
                }
                Err(LoadError::Corrupt(line)) => {
                    tracing::warn!("{line}");
                    let _ = self
                        .executor
                        .audit(AuditRecord::StateReset { reason: line });
                    return Persisted::default();
                }
                Err(LoadError::Unreadable(line)) => {
                    self.executor.audit.errors.count(crate::state::DiskOp::Load);
                    if reported.as_ref() != Some(&line) {
                        tracing::error!("{line}");
                        reported = Some(line);
                    }
                    seq = snapshots.next_after(seq).await.seq;
                    // Waiting for a readable disk is not a wedge.
                    self.progress.stepped(seq);
                }
            }
        }
    }

    /// Saves the state off the async workers (a durable save fsyncs). Returns whether it worked;
    /// a failure is logged and counted.
    async fn save(&self, persisted: &Persisted, durable: bool) -> bool {
        // Encoded here, so that only the bytes go to the I/O thread.
        let saved = match crate::state::encode(persisted) {
            Ok(body) => {
                let dir = self.state_dir.clone();
                crate::state::on_io_thread(move || dir.save_encoded(&body, durable)).await
            }
            Err(e) => Err(e),
        };
        match saved {
            Ok(()) => true,
            Err(e) => {
                self.executor.audit.errors.count(crate::state::DiskOp::Save);
                tracing::error!(error = %e, dir = %self.state_dir.path().display(), "cannot save state");
                false
            }
        }
    }
}

/// Whether every device that is up listed its processes (the holders are read from them).
fn processes_known(snap: &Snapshot) -> bool {
    snap.gpus.iter().filter(|g| g.up).all(|g| {
        if g.mig.is_empty() {
            g.processes.is_some()
        } else {
            g.mig.iter().all(|m| m.processes.is_some())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Poisons `lock`, as a panic while it is held does.
    fn poison<T: Send>(lock: &Mutex<T>) {
        std::thread::scope(|s| {
            let _ = s
                .spawn(|| {
                    let _held = lock.lock().unwrap();
                    panic!("poisoning the lock on purpose");
                })
                .join();
        });
        assert!(lock.is_poisoned());
    }

    /// Poisoned means unknown, and unknown holds: a tag hold that cannot be read holds, and a
    /// spot notice that cannot be read is in effect.
    #[test]
    fn a_poisoned_signal_holds() {
        let signals = NodeSignals::default();
        assert_eq!(signals.tag_hold(), HoldStatus::None);
        assert_eq!(signals.interruption(), None);
        poison(&signals.tag_hold);
        poison(&signals.interruption);
        match signals.tag_hold() {
            HoldStatus::Unknown(why) => assert!(why.contains("poisoned"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(signals.tag_hold().until(), Some(f64::INFINITY));
        assert_eq!(signals.interruption(), Some(f64::INFINITY));
    }
}
