//! Microsoft Azure (`provider = "azure"`): the Instance Metadata Service for identity, tags and
//! Scheduled Events; Resource Manager, with the VM's managed identity, for actions; the Retail
//! Prices API for the price.

use std::sync::{Arc, Mutex};
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

pub mod arm;
mod budgets;
pub mod imds;
pub mod plan;
pub mod settings;

use settings::Settings;
pub mod prices;

use arm::Arm;
use imds::{AzureMetadata, Event, VmDocument};

/// Resource Manager's public endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://management.azure.com";
/// The Retail Prices API's.
pub const DEFAULT_PRICES: &str = "https://prices.azure.com";

/// Azure, on the cloud boundary's list of clouds.
pub const PROVIDER: Provider = Provider {
    name: "azure",
    open: |config| Arc::new(Azure::new(config)),
    rehearse,
    follows_operations: true,
    keys: CloudKeys {
        budgets: Some(budgets::SOURCE),
        ..CloudKeys::of::<Settings>(&["client_id"], |_| None)
    },
    credentials: &[],
};

/// Azure's plan for `action`, on a VM with hibernation enabled and in no scale set (which only
/// the API tells).
fn rehearse(
    _cloud: &CloudConfig,
    action: Action,
    lifecycle: Option<Lifecycle>,
    spot_stop: SpotStop,
) -> Rehearsal {
    let vm = plan::Vm {
        spot: lifecycle == Some(Lifecycle::Spot),
        hibernation: Some(true),
        scale_set: None,
    };
    crate::cloud::leaves(plan::plan(action, &vm, spot_stop), plan::Step::leaves)
}

pub struct Azure {
    imds: Arc<AzureMetadata>,
    /// The instance document's `compute`, once read.
    compute: Mutex<Option<VmDocument>>,
    /// The last Scheduled Events answer, kept by the events poller.
    events: Arc<Mutex<Scheduled>>,
    /// How often Scheduled Events are read.
    every: Duration,
}

/// What Scheduled Events said last.
struct Scheduled {
    /// This VM's events in force, each with the time it takes effect: its `NotBefore`, or,
    /// once it has started (and `NotBefore` is empty), the time it was first seen.
    events: Vec<(Event, f64)>,
    /// Why the last read failed, while it does.
    failing: Option<String>,
    /// When the last read succeeded.
    answered: Option<Instant>,
}

impl Default for Scheduled {
    /// Before the first answer, the events are unknown, and unknown holds.
    fn default() -> Scheduled {
        Scheduled {
            events: Vec::new(),
            failing: Some(
                "Scheduled Events have not answered yet (Azure enables them on the first request, which can take two minutes)".into(),
            ),
            answered: None,
        }
    }
}

impl Azure {
    pub fn new(config: &crate::config::Config) -> Azure {
        Azure {
            imds: Arc::new(AzureMetadata::new(
                &config.cloud.imds_endpoint,
                config.cloud.section.settings::<Settings>().client_id(),
                &imds::resource_for(config.cloud.endpoint_url.as_deref()),
            )),
            compute: Mutex::new(None),
            events: Arc::default(),
            every: config.cloud.poll_interval,
        }
    }

    /// The events of this VM that `keep` picks, as notices. An answer older than `stale_after`
    /// is no answer: a read that hangs must not leave the last one in force.
    fn notices(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<Notice>, MetadataError> {
        let scheduled = self.events.lock().map_err(|_| poisoned())?;
        let failing = |message: String| MetadataError::Invalid {
            path: "/metadata/scheduledevents".into(),
            message,
        };
        if let Some(why) = &scheduled.failing {
            return Err(failing(why.clone()));
        }
        let most = stale_after(self.every);
        if scheduled.answered.is_none_or(|t| t.elapsed() > most) {
            return Err(failing(format!(
                "Scheduled Events have not answered for {}",
                humantime::format_duration(most)
            )));
        }
        Ok(scheduled
            .events
            .iter()
            .filter(|(e, _)| keep(&e.event_type))
            .map(|(e, time)| Notice {
                key: e.event_id.clone(),
                kind: if is_interruption(&e.event_type) {
                    NoticeKind::Interruption
                } else {
                    NoticeKind::Event(crate::redact::brief(&e.event_type, 32))
                },
                time: *time,
                text: crate::redact::brief(
                    &format!(
                        "{} {} ({}): {}",
                        e.event_type, e.event_status, e.event_source, e.description
                    ),
                    512,
                ),
            })
            .collect())
    }
}

/// How old the last Scheduled Events answer may be: three poll intervals and a read's timeout.
/// Past it, the events are unknown, and unknown holds.
fn stale_after(every: Duration) -> Duration {
    every * 3 + imds::events_read_timeout(every)
}

/// A lock that a panic poisoned is unknown, and unknown holds: its read fails.
fn poisoned() -> MetadataError {
    MetadataError::Invalid {
        path: "/metadata/scheduledevents".into(),
        message: "the last answer is unknown (a lock was poisoned)".into(),
    }
}

/// `Preempt` (a Spot VM evicted) and `Terminate` (a scale set deleting it) end the VM.
fn is_interruption(event_type: &str) -> bool {
    matches!(event_type, "Preempt" | "Terminate")
}

/// The lifecycle `priority` says: `Spot` (and the scale sets' older `Low`) or `Regular`.
fn lifecycle(priority: &str) -> Option<Lifecycle> {
    match priority {
        "Spot" | "Low" => Some(Lifecycle::Spot),
        "Regular" => Some(Lifecycle::OnDemand),
        other => {
            tracing::warn!(
                priority = %crate::redact::brief(other, 32),
                "instance metadata does not say whether the VM is regular or Spot: spend is unknown unless [cost] hourly_price_usd is set"
            );
            None
        }
    }
}

impl InstanceMetadata for Azure {
    fn name(&self) -> &'static str {
        "azure"
    }

    fn identity(&self) -> Fut<'_, Result<Node, MetadataError>> {
        Box::pin(async {
            let c = self.imds.compute().await?;
            let node = Node {
                instance_id: c.vm_id.clone(),
                instance_type: c.vm_size.clone(),
                availability_zone: c.zone.clone(),
                region: c.location.clone(),
                lifecycle: lifecycle(&c.priority),
            };
            if let Ok(mut kept) = self.compute.lock() {
                *kept = Some(c);
            }
            Ok(node)
        })
    }

    fn interruption(&self) -> Fut<'_, Result<Option<Notice>, MetadataError>> {
        Box::pin(async { Ok(self.notices(is_interruption)?.into_iter().next()) })
    }

    fn advice(&self) -> Fut<'_, Result<Vec<Notice>, MetadataError>> {
        Box::pin(async { self.notices(|t| !is_interruption(t)) })
    }

    fn tags(&self) -> Fut<'_, Result<super::Tags, MetadataError>> {
        Box::pin(async { Ok(self.imds.compute().await?.tag_pairs()) })
    }

    fn tag_sources(&self) -> &'static str {
        "the instance metadata's tagsList (or its tags string)"
    }

    fn connect(
        &self,
        node: &Node,
        link: Link<'_>,
        tasks: &mut JoinSet<()>,
    ) -> Arc<dyn ControlPlane> {
        let config = link.config;
        let c = self
            .compute
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .unwrap_or_default();
        tracing::info!(
            vm = %c.name,
            vm_id = %node.instance_id,
            size = %node.instance_type,
            region = %node.region,
            zone = %node.availability_zone,
            subscription = %c.subscription_id,
            resource_group = %c.resource_group_name,
            lifecycle = node.lifecycle_label(),
            "running on Azure"
        );
        tasks.spawn(poll_events(
            Arc::clone(&self.imds),
            Arc::clone(&self.events),
            c.name.clone(),
            config.cloud.poll_interval,
        ));
        if config.cost.hourly_price_usd.is_none() && config.cost.pricing_api {
            tasks.spawn(poll_price(
                config
                    .cost
                    .pricing_endpoint_url
                    .clone()
                    .unwrap_or_else(|| DEFAULT_PRICES.into()),
                node.clone(),
                Arc::clone(&link.readings),
                config.cost.spot_price_refresh,
            ));
        }
        let base = config
            .cloud
            .endpoint_url
            .clone()
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let vm = format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{}",
            c.subscription_id, c.resource_group_name, c.name
        );
        // A scale set's instance says so in any of three ways; a Uniform one only in its
        // `resourceId`.
        let in_set = !c.vm_scale_set_name.is_empty()
            || c.resource_id
                .to_ascii_lowercase()
                .contains("/virtualmachinescalesets/")
            || c.virtual_machine_scale_set
                .as_ref()
                .is_some_and(|s| !s.id.is_empty());
        let scale_set = in_set.then(|| {
            if c.vm_scale_set_name.is_empty() {
                "unnamed".to_string()
            } else {
                c.vm_scale_set_name.clone()
            }
        });
        let arm = Arc::new(Arm::new(&base, vm, Arc::clone(&self.imds)));
        for b in &config.budgets {
            if let Some(keys) = b.source.cloud_keys(budgets::SOURCE.source) {
                let Ok(target) = budgets::Target::read(&b.name, keys) else {
                    continue;
                };
                tasks.spawn(budgets::poll(
                    Arc::clone(&arm),
                    b.clone(),
                    target,
                    Arc::clone(&link.readings),
                ));
            }
        }
        Arc::new(AzureApi {
            arm,
            vm: plan::Vm {
                spot: node.lifecycle == Some(Lifecycle::Spot),
                hibernation: match c.additional_capabilities.hibernation_enabled.as_str() {
                    "true" | "True" => Some(true),
                    "false" | "False" => Some(false),
                    _ => None,
                },
                scale_set,
            },
        })
    }
}

/// Reads Scheduled Events every `every`, on a task of its own: sampling, serving and deciding
/// never wait for it. Until the first answer each read may take `EVENTS_TIMEOUT` (Azure enables
/// the service on the first request, which can take minutes); after it, a short timeout. Only
/// the events whose `Resources` name this VM (`name`) are kept: an availability set's events
/// list every VM of the set.
async fn poll_events(
    imds: Arc<AzureMetadata>,
    kept: Arc<Mutex<Scheduled>>,
    name: String,
    every: Duration,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticker.tick().await;
        let Ok(answered) = kept.lock().map(|s| s.answered.is_some()) else {
            return;
        };
        let timeout = if answered {
            imds::events_read_timeout(every)
        } else {
            imds::EVENTS_TIMEOUT
        };
        let answer = imds.events(timeout).await;
        let Ok(mut s) = kept.lock() else { return };
        match answer {
            Ok(doc) => {
                let now = crate::time::now();
                let events = doc
                    .events
                    .into_iter()
                    .filter(|e| e.resources.iter().any(|r| r.eq_ignore_ascii_case(&name)))
                    .take(64)
                    .map(|e| {
                        let seen = s
                            .events
                            .iter()
                            .find(|(old, _)| old.event_id == e.event_id)
                            .map(|(_, t)| *t);
                        let time = crate::time::parse_http_date(&e.not_before)
                            .or(seen)
                            .unwrap_or(now);
                        (e, time)
                    })
                    .collect();
                s.events = events;
                s.failing = None;
                s.answered = Some(Instant::now());
            }
            Err(e) => s.failing = Some(e.to_string()),
        }
    }
}

/// Reads the Retail price of this VM's size, then again every `every`, and keeps the last one
/// known: a Spot VM's as the spot price (kept across restarts), a regular VM's as the pricing
/// API's. A price far from every other row of its size is handed over as implausible.
async fn poll_price(base: String, node: Node, readings: Arc<dyn super::Readings>, every: Duration) {
    let spot = node.lifecycle == Some(Lifecycle::Spot);
    let kind = if spot {
        super::PriceKind::Spot
    } else {
        super::PriceKind::List
    };
    let said = super::poll::Said {
        failing: "no price from the Azure Retail Prices API; keeping the last known one (set [cost] hourly_price_usd to give one)",
        recovered: Some("the Azure Retail Prices API answers again"),
    };
    let pace = super::poll::Pace::steady(every);
    super::poll::poll(pace, said, &node.instance_type, || async {
        match prices::price(&base, &node.region, &node.instance_type, spot).await {
            Ok(prices::Listed::Price(p)) => {
                tracing::info!(usd_per_hour = p, size = %node.instance_type, region = %node.region, spot, "price from the Azure Retail Prices API");
                readings.price(kind, p);
                super::poll::Read::Again
            }
            Ok(prices::Listed::Implausible {
                usd_per_hour,
                beside,
            }) => {
                readings.implausible(kind, usd_per_hour, beside);
                super::poll::Read::Again
            }
            Err(why) => super::poll::Read::Failed(why),
        }
    })
    .await
}

/// Resource Manager, for this VM.
struct AzureApi {
    arm: Arc<Arm>,
    vm: plan::Vm,
}

impl ControlPlane for AzureApi {
    /// Tags are read from instance metadata only.
    fn tags(&self) -> Option<Fut<'_, Result<super::Tags, CloudError>>> {
        None
    }

    fn state(&self) -> Fut<'_, Result<Option<String>, CloudError>> {
        Box::pin(self.arm.power_state())
    }

    fn plan(
        &self,
        action: Action,
        spot_stop: SpotStop,
    ) -> Fut<'_, Result<Plan<Box<dyn super::Operation>>, CloudError>> {
        Box::pin(async move {
            Ok(plan::plan(action, &self.vm, spot_stop).map(|step| {
                Box::new(AzureStep {
                    arm: Arc::clone(&self.arm),
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
            let url = format!(
                "{}/providers/Microsoft.Resources/tags/default?api-version={}",
                self.arm.vm,
                arm::TAGS_API_VERSION
            );
            // Merge: the VM's other tags stay as they are.
            let body = serde_json::json!({
                "operation": "Merge",
                "properties": {"tags": {"gpuwatch:action": action, "gpuwatch:rule": rule}},
            });
            let request_id = self
                .arm
                .act("Tags_UpdateAtScope", Method::PATCH, &url, Some(&body))
                .await?;
            Ok(Call {
                operation: "Tags_UpdateAtScope".into(),
                request_id,
            })
        })
    }

    fn grant_hint(&self) -> &'static str {
        "Azure denied access: assign the role in config/azure-role.json to the VM's managed identity at the VM's scope, config/azure-operations-role.json at the subscription's and config/azure-budgets-role.json at each budget's (the error names the permission missing)"
    }
}

/// The VM's power state once the deallocate it accepted has settled: read again (every 2 s,
/// at most 15 times) while it is still `deallocating` or the read fails for throttling or an
/// outage. A read that fails is never a reason to send the deallocate again: the operation has
/// succeeded, and only its result is unknown.
async fn settled_power(arm: &Arm) -> Option<String> {
    let mut power = None;
    for read in 0..15 {
        if read > 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        match arm.power_state().await {
            Ok(Some(p)) if p == "deallocating" => power = Some(p),
            Ok(p) => return p,
            Err(e) if e.kind == super::ErrorKind::Retryable => {
                tracing::warn!(error = %e, "cannot read the VM's power state after its deallocate; reading it again");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the VM's power state after its deallocate");
                return None;
            }
        }
    }
    power
}

/// A deallocate is done once the VM says it is deallocated, not on its operation's word alone:
/// a VM that is only stopped keeps its compute reserved and billed.
fn deallocated(power: Option<String>) -> Result<(), CloudError> {
    if power.as_deref() == Some("deallocated") {
        return Ok(());
    }
    Err(CloudError {
        operation: "VirtualMachines_Deallocate",
        kind: super::ErrorKind::Other,
        message: format!(
            "the deallocate operation succeeded, but the VM's power state is {}, not deallocated, so it may still be billed: check it with az vm get-instance-view",
            power.map_or("unknown".to_string(), |p| format!("{p:?}"))
        ),
        request_id: None,
        retry_after: None,
    })
}

struct AzureStep {
    arm: Arc<Arm>,
    step: plan::Step,
}

impl super::Operation for AzureStep {
    fn describe(&self) -> String {
        match self.step {
            plan::Step::Deallocate { hibernate: false } => "VirtualMachines_Deallocate".into(),
            plan::Step::Deallocate { hibernate: true } => {
                "VirtualMachines_Deallocate (hibernate)".into()
            }
            plan::Step::Delete => "VirtualMachines_Delete".into(),
        }
    }

    fn leaves(&self) -> Option<Down> {
        self.step.leaves()
    }

    fn run(&self) -> Fut<'_, Result<Call, CloudError>> {
        Box::pin(async move {
            let v = arm::COMPUTE_API_VERSION;
            let request_id = match self.step {
                plan::Step::Deallocate { hibernate } => {
                    let url = format!(
                        "{}/deallocate?api-version={v}{}",
                        self.arm.vm,
                        if hibernate { "&hibernate=true" } else { "" }
                    );
                    let id = self
                        .arm
                        .act("VirtualMachines_Deallocate", Method::POST, &url, None)
                        .await?;
                    deallocated(settled_power(&self.arm).await)?;
                    id
                }
                // `forceDeletion=false` said outright: left out, Azure may force the delete.
                plan::Step::Delete => {
                    let url = format!("{}?api-version={v}&forceDeletion=false", self.arm.vm);
                    self.arm
                        .act("VirtualMachines_Delete", Method::DELETE, &url, None)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A Scheduled Events answer counts for three poll intervals and a read's timeout, whatever
    /// the first read's long timeout: a read that hangs leaves no answer in force for minutes.
    #[test]
    fn an_answer_counts_for_three_polls_and_a_short_read() {
        let s = Duration::from_secs;
        assert_eq!(stale_after(s(5)), s(20));
        assert_eq!(
            stale_after(Duration::from_millis(200)),
            Duration::from_millis(1600)
        );
        assert!(stale_after(s(5)) < imds::EVENTS_TIMEOUT);
    }

    /// A deallocate whose operation succeeded is done only once the VM says it is deallocated.
    #[test]
    fn a_deallocate_is_done_once_the_vm_is_deallocated() {
        assert!(deallocated(Some("deallocated".into())).is_ok());
        for (power, said) in [
            (
                Some("stopped".to_string()),
                "power state is \"stopped\", not deallocated",
            ),
            (Some("deallocating".into()), "\"deallocating\""),
            (None, "power state is unknown"),
        ] {
            let e = deallocated(power).unwrap_err();
            assert_eq!(e.kind, super::super::ErrorKind::Other);
            assert!(e.message.contains(said), "{}", e.message);
        }
    }
}
