//! Google Compute Engine (`provider = "gcp"`): the metadata server for identity, preemption
//! and maintenance notices and the `gpuwatch-hold` attribute; the Compute Engine API, with
//! the VM's service account, for actions; a dated table for the price.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use reqwest::Method;
use tokio::task::JoinSet;

use super::{
    Call, CloudError, ControlPlane, Fut, InstanceMetadata, Link, MetadataError, Node, Notice,
    NoticeKind,
};
use crate::cloud::plan::{Down, Plan, SpotStop};
use crate::cloud::{Provider, Rehearsal};
use crate::config::{CloudConfig, CloudKeys};
use crate::rules::{Action, Lifecycle};
use plan::LocalSsd;

pub mod compute;
pub mod metadata;
pub mod operation;
pub mod plan;
pub mod settings;

use settings::Settings;
pub mod prices;

use compute::ComputeApi;
use metadata::GceMetadata;
use operation::Outcome;

/// The Compute Engine API's public endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://compute.googleapis.com";
/// The instance attribute that holds every action until the RFC 3339 time it gives.
pub const HOLD_ATTRIBUTE: &str = "gpuwatch-hold";

/// Compute Engine, on the cloud boundary's list of clouds.
pub const PROVIDER: Provider = Provider {
    name: "gcp",
    open: |config| Arc::new(Gcp::new(config)),
    rehearse,
    follows_operations: true,
    keys: CloudKeys::of::<Settings>(&["local_ssd"], plan::refused_everywhere),
    credentials: &[],
};

/// Compute Engine's plan for `action`, on a VM with no local SSD (which only the API tells).
fn rehearse(
    cloud: &CloudConfig,
    action: Action,
    _lifecycle: Option<Lifecycle>,
    _spot_stop: SpotStop,
) -> Rehearsal {
    crate::cloud::leaves(
        plan::plan(action, &plan::Vm::default(), local_ssd(cloud)),
        plan::Step::leaves,
    )
}

/// What a stop does with local SSD data, as `[cloud.gcp] local_ssd` says.
fn local_ssd(cloud: &CloudConfig) -> LocalSsd {
    cloud.section.settings::<Settings>().local_ssd()
}

pub struct Gcp {
    server: Arc<GceMetadata>,
    /// The project, zone and name, once metadata has named the VM.
    me: Mutex<Option<Me>>,
    /// Each notice in force, by key, with the time it was first seen.
    notices: Mutex<Vec<(String, f64)>>,
    local_ssd: LocalSsd,
    /// The API, once the VM is known: `[cloud] tag_labels` are its labels.
    compute: OnceLock<Arc<ComputeApi>>,
    /// The labels last read, and when, when `tag_labels` asks for them.
    labels: Mutex<Option<(Instant, super::Tags)>>,
    label_every: Option<Duration>,
}

#[derive(Clone, Default)]
struct Me {
    project: String,
    zone: String,
    name: String,
}

impl Gcp {
    pub fn new(config: &crate::config::Config) -> Gcp {
        Gcp {
            server: Arc::new(GceMetadata::new(&config.cloud.imds_endpoint)),
            me: Mutex::new(None),
            notices: Mutex::default(),
            local_ssd: local_ssd(&config.cloud),
            compute: OnceLock::new(),
            labels: Mutex::new(None),
            label_every: (!config.node.tag_labels.is_empty())
                .then_some(config.cloud.tag_poll_interval),
        }
    }

    /// When the notice `key` was first seen (now, if it is new): a notice without a time of
    /// its own keeps one, so that it is said and hooked once.
    fn first_seen(&self, key: Option<&str>) -> Option<f64> {
        let mut seen = self.notices.lock().unwrap_or_else(|e| e.into_inner());
        let Some(key) = key else {
            seen.clear();
            return None;
        };
        seen.retain(|(k, _)| k == key);
        if seen.is_empty() {
            seen.push((key.to_string(), crate::time::now()));
        }
        Some(seen[0].1)
    }
}

impl Gcp {
    /// The VM's labels for `tag_labels`, read again once `label_every` has passed.
    async fn labels(&self) -> super::Tags {
        let (Some(every), Some(compute)) = (self.label_every, self.compute.get()) else {
            return Vec::new();
        };
        let last = self.labels.lock().ok().and_then(|l| l.clone());
        if let Some((at, labels)) = &last {
            if at.elapsed() < every {
                return labels.clone();
            }
        }
        match compute.get().await {
            Ok(i) => {
                let labels: super::Tags = i.labels.into_iter().collect();
                if let Ok(mut l) = self.labels.lock() {
                    *l = Some((Instant::now(), labels.clone()));
                }
                labels
            }
            Err(e) => {
                // Asked again after `every`, not at every metadata poll.
                tracing::warn!(error = %e, "cannot read the VM's labels for [cloud] tag_labels");
                let kept = last.map(|(_, l)| l).unwrap_or_default();
                if let Ok(mut l) = self.labels.lock() {
                    *l = Some((Instant::now(), kept.clone()));
                }
                kept
            }
        }
    }
}

/// A metadata value that must be a name: a path segment, and nothing that could leave it.
fn name(what: &str, value: &str) -> Result<String, MetadataError> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' || c == ':');
    if ok {
        Ok(value.to_string())
    } else {
        Err(MetadataError::Invalid {
            path: format!("/computeMetadata/v1/{what}"),
            message: format!("{:?} is not a name", crate::redact::brief(value, 64)),
        })
    }
}

impl InstanceMetadata for Gcp {
    fn name(&self) -> &'static str {
        "gcp"
    }

    fn identity(&self) -> Fut<'_, Result<Node, MetadataError>> {
        Box::pin(async {
            let s = &self.server;
            let project = name(
                "project/project-id",
                &s.required("project/project-id").await?,
            )?;
            let id = name("instance/id", &s.required("instance/id").await?)?;
            let vm = name("instance/name", &s.required("instance/name").await?)?;
            let zone = s.required("instance/zone").await?;
            let zone = name("instance/zone", metadata::last(&zone))?;
            let machine = s.required("instance/machine-type").await?;
            let machine = name("instance/machine-type", metadata::last(&machine))?;
            let lifecycle = match s.get("instance/scheduling/provisioning-model").await? {
                Some(m) if m == "SPOT" => Some(Lifecycle::Spot),
                Some(m) if m == "STANDARD" => Some(Lifecycle::OnDemand),
                _ => match s.get("instance/scheduling/preemptible").await?.as_deref() {
                    Some("TRUE") => Some(Lifecycle::Spot),
                    Some("FALSE") => Some(Lifecycle::OnDemand),
                    _ => None,
                },
            };
            let node = Node {
                instance_id: id,
                instance_type: machine,
                region: metadata::region(&zone).to_string(),
                availability_zone: zone.clone(),
                lifecycle,
            };
            if let Ok(mut me) = self.me.lock() {
                *me = Some(Me {
                    project,
                    zone,
                    name: vm,
                });
            }
            Ok(node)
        })
    }

    /// Preemption (`instance/preempted` is `TRUE`) and host maintenance (a GPU VM is
    /// terminated for it: `instance/maintenance-event` other than `NONE`).
    fn interruption(&self) -> Fut<'_, Result<Option<Notice>, MetadataError>> {
        Box::pin(async {
            let preempted = self.server.required("instance/preempted").await?;
            let maintenance = self.server.required("instance/maintenance-event").await?;
            let (key, text) = if preempted == "TRUE" {
                (
                    "preempted".to_string(),
                    "the VM is being preempted".to_string(),
                )
            } else if maintenance != "NONE" {
                (
                    format!("maintenance {maintenance}"),
                    format!(
                        "host maintenance {}: a VM with GPUs is terminated for it",
                        crate::redact::brief(&maintenance, 64)
                    ),
                )
            } else {
                self.first_seen(None);
                return Ok(None);
            };
            let time = self.first_seen(Some(&key)).unwrap_or_else(crate::time::now);
            Ok(Some(Notice {
                key,
                kind: NoticeKind::Interruption,
                time,
                text,
            }))
        })
    }

    fn advice(&self) -> Fut<'_, Result<Vec<Notice>, MetadataError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// The hold attribute, as the tag the watch looks for; and, when `[cloud] tag_labels` asks
    /// for them, the VM's labels, read with `instances.get` every `tag_poll_interval` (the last
    /// ones read stand meanwhile, and while a read fails).
    fn tags(&self) -> Fut<'_, Result<super::Tags, MetadataError>> {
        Box::pin(async {
            let path = format!("instance/attributes/{HOLD_ATTRIBUTE}");
            let mut tags: super::Tags = self
                .server
                .get(&path)
                .await?
                .map(|v| vec![("gpuwatch:hold".to_string(), v)])
                .unwrap_or_default();
            tags.extend(self.labels().await);
            Ok(tags)
        })
    }

    fn tag_sources(&self) -> &'static str {
        "the instance's gpuwatch-hold metadata attribute"
    }

    fn connect(
        &self,
        node: &Node,
        link: Link<'_>,
        tasks: &mut JoinSet<()>,
    ) -> Arc<dyn ControlPlane> {
        let config = link.config;
        let me = self
            .me
            .lock()
            .ok()
            .and_then(|m| m.clone())
            .unwrap_or_default();
        tracing::info!(
            vm = %me.name,
            id = %node.instance_id,
            machine_type = %node.instance_type,
            zone = %node.availability_zone,
            project = %me.project,
            lifecycle = node.lifecycle_label(),
            "running on Compute Engine"
        );
        let base = config
            .cloud
            .endpoint_url
            .clone()
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let compute = Arc::new(ComputeApi::new(
            &base,
            &me.project,
            &me.zone,
            &me.name,
            Arc::clone(&self.server),
        ));
        let _ = self.compute.set(Arc::clone(&compute));
        if config.cost.hourly_price_usd.is_none() {
            tasks.spawn(price(
                Arc::clone(&compute),
                node.clone(),
                Arc::clone(&link.readings),
            ));
        }
        Arc::new(GcpApi {
            compute,
            local_ssd: self.local_ssd,
        })
    }
}

/// The VM's price from the table, once: an N1 VM's with the GPUs `instances.get` says are
/// attached (read again, backing off, until it answers).
async fn price(compute: Arc<ComputeApi>, node: Node, readings: Arc<dyn super::Readings>) {
    let spot = node.lifecycle == Some(Lifecycle::Spot);
    let gpus = std::sync::Mutex::new(Vec::new());
    if node.instance_type.starts_with("n1-") {
        let said = super::poll::Said {
            failing: "cannot read the VM's attached GPUs, so its price is unknown until it answers (or set [cost] hourly_price_usd); reading it again",
            recovered: None,
        };
        let pace = super::poll::Pace::until_answered(Duration::from_secs(300));
        super::poll::poll(pace, said, &node.instance_type, || async {
            match compute.get().await {
                Ok(i) => {
                    let attached = i.guest_accelerators.iter().map(|a| {
                        let kind = metadata::last(&a.accelerator_type).to_string();
                        (kind, a.accelerator_count)
                    });
                    *gpus.lock().unwrap_or_else(|e| e.into_inner()) = attached.collect();
                    super::poll::Read::Done
                }
                Err(e) => super::poll::Read::Failed(e.to_string()),
            }
        })
        .await;
    }
    let gpus = gpus.into_inner().unwrap_or_else(|e| e.into_inner());
    match prices::price(&node.instance_type, &node.region, spot, &gpus) {
        Ok(p) => {
            let as_of = prices::as_of(if spot { "spot" } else { "on-demand" });
            if spot {
                tracing::info!(usd_per_hour = p, machine_type = %node.instance_type, region = %node.region, as_of, "Spot price from the built-in Compute Engine table, as of {as_of}: Compute Engine changes Spot prices up to monthly, so set [cost] hourly_price_usd where it must be current");
            } else {
                tracing::info!(usd_per_hour = p, machine_type = %node.instance_type, region = %node.region, as_of, "price from the built-in Compute Engine table");
            }
            let kind = if spot {
                super::PriceKind::Spot
            } else {
                super::PriceKind::Table
            };
            readings.price(kind, p);
        }
        Err(why) => {
            tracing::warn!(reason = %why, "no price for this VM: spend is unknown unless [cost] hourly_price_usd is set")
        }
    }
}

/// Compute Engine, for this VM.
struct GcpApi {
    compute: Arc<ComputeApi>,
    local_ssd: LocalSsd,
}

impl ControlPlane for GcpApi {
    /// Labels are not holds here; the hold is a metadata attribute.
    fn tags(&self) -> Option<Fut<'_, Result<super::Tags, CloudError>>> {
        None
    }

    fn state(&self) -> Fut<'_, Result<Option<String>, CloudError>> {
        Box::pin(async {
            let i = self.compute.get().await?;
            Ok(Some(crate::redact::brief(&i.status, 32)).filter(|s| !s.is_empty()))
        })
    }

    fn plan(
        &self,
        action: Action,
        _spot_stop: SpotStop,
    ) -> Fut<'_, Result<Plan<Box<dyn super::Operation>>, CloudError>> {
        Box::pin(async move {
            // Whether local SSDs are attached decides what a stop says of their data.
            let local_ssd = match action {
                Action::Stop => self
                    .compute
                    .get()
                    .await?
                    .disks
                    .iter()
                    .any(|d| d.kind == "SCRATCH"),
                _ => false,
            };
            let vm = plan::Vm { local_ssd };
            Ok(plan::plan(action, &vm, self.local_ssd).map(|step| {
                Box::new(GcpStep {
                    compute: Arc::clone(&self.compute),
                    step,
                }) as Box<dyn super::Operation>
            }))
        })
    }

    fn tag_action<'a>(
        &'a self,
        action: &'a str,
        rule: &'a str,
    ) -> Fut<'a, Result<Call, CloudError>> {
        Box::pin(async move {
            Ok(Call {
                operation: "instances.setLabels".into(),
                request_id: self.compute.label(action, rule).await?,
            })
        })
    }

    fn grant_hint(&self) -> &'static str {
        "Compute Engine denied access: grant the role in config/gcp-role.yaml to the VM's service account on the VM (and config/gcp-operations-role.yaml on the project, to follow operations), and give the VM an access scope that allows Compute Engine writes"
    }
}

struct GcpStep {
    compute: Arc<ComputeApi>,
    step: plan::Step,
}

impl super::Operation for GcpStep {
    fn describe(&self) -> String {
        match self.step {
            plan::Step::Stop {
                discard_local_ssd: false,
            } => "instances.stop".into(),
            plan::Step::Stop {
                discard_local_ssd: true,
            } => "instances.stop (discarding local SSD data)".into(),
            plan::Step::Delete => "instances.delete".into(),
        }
    }

    fn leaves(&self) -> Option<Down> {
        self.step.leaves()
    }

    fn run(&self) -> Fut<'_, Result<Call, CloudError>> {
        Box::pin(async move {
            let c = &self.compute;
            let request_id = match self.step {
                // Said outright: Compute Engine refuses a stop of a VM with local SSDs that
                // does not say what becomes of their data.
                plan::Step::Stop { discard_local_ssd } => {
                    let url = format!("{}/stop?discardLocalSsd={discard_local_ssd}", c.instance);
                    c.act("instances.stop", Method::POST, &url, Outcome::Stopped)
                        .await?
                }
                plan::Step::Delete => {
                    c.act(
                        "instances.delete",
                        Method::DELETE,
                        &c.instance,
                        Outcome::Deleted,
                    )
                    .await?
                }
            };
            Ok(Call {
                operation: self.describe(),
                request_id,
            })
        })
    }
}
