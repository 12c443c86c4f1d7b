//! Alibaba Cloud ECS (`provider = "alibaba"`): instance metadata in hardened mode for identity,
//! spot reclaim notices and the RAM role's credentials; the ECS API, signed with signature V3
//! (`sign.rs`), for tags, holds, actions and prices.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::metadata::TokenSession;
use super::{
    Call, CloudError, ControlPlane, Fut, InstanceMetadata, Link, MetadataError, Node, Notice,
    NoticeKind,
};
use crate::cloud::plan::{Down, Plan, SpotStop};
use crate::cloud::{Provider, Rehearsal};
use crate::config::{CloudConfig, CloudKeys};
use crate::rules::{Action, Lifecycle};

pub mod ecs;
pub mod plan;
pub mod settings;

use settings::Settings;
pub mod sign;

use super::follow::{follow, Look, Pace};
use ecs::Ecs;

/// Alibaba Cloud, on the cloud boundary's list of clouds.
pub const PROVIDER: Provider = Provider {
    name: "alibaba",
    open: |config| Arc::new(Alibaba::new(config)),
    rehearse,
    follows_operations: true,
    keys: CloudKeys::of::<Settings>(&["ram_role", "keep_charging"], plan::refused_everywhere),
    credentials: &[],
};

/// ECS's plan for `action`, on an instance of a family that stops in economical mode (which
/// only the API tells).
fn rehearse(
    cloud: &CloudConfig,
    action: Action,
    _lifecycle: Option<Lifecycle>,
    _spot_stop: SpotStop,
) -> Rehearsal {
    crate::cloud::leaves(
        plan::plan(
            action,
            &plan::Instance::default(),
            cloud.section.settings::<Settings>().keep_charging,
        ),
        plan::Step::leaves,
    )
}

pub struct Alibaba {
    metadata: Arc<TokenSession>,
    /// The API, made when identity is first read (the region names the default endpoint).
    ecs: Mutex<Option<Arc<Ecs>>>,
    endpoint_url: Option<String>,
    ram_role: String,
    keep_charging: bool,
    /// The reclaim notice in force (its text), with when it was first seen.
    notice: Mutex<Option<(String, f64)>>,
}

impl Alibaba {
    pub fn new(config: &crate::config::Config) -> Alibaba {
        let settings: Settings = config.cloud.section.settings();
        Alibaba {
            metadata: Arc::new(TokenSession::new(
                &config.cloud.imds_endpoint,
                "X-aliyun-ecs-metadata-token-ttl-seconds",
                "X-aliyun-ecs-metadata-token",
            )),
            ecs: Mutex::new(None),
            endpoint_url: config.cloud.endpoint_url.clone(),
            ram_role: settings.ram_role.trim().to_string(),
            keep_charging: settings.keep_charging,
            notice: Mutex::new(None),
        }
    }
}

/// A metadata value that must be a name: nothing that could leave a query value or a path.
fn name(path: &str, value: String) -> Result<String, MetadataError> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.*".contains(c));
    if ok {
        Ok(value)
    } else {
        Err(MetadataError::Invalid {
            path: format!("/latest/meta-data/{path}"),
            message: format!("{:?} is not a name", crate::redact::brief(&value, 64)),
        })
    }
}

impl InstanceMetadata for Alibaba {
    fn name(&self) -> &'static str {
        "alibaba"
    }

    /// Identity from metadata alone, so that nothing waits on the ECS API before the daemon
    /// serves; whether the instance is spot (`SpotStrategy`) comes from `DescribeInstances`
    /// once connected, read again until it answers (`learn`): until then the lifecycle is
    /// unknown.
    fn identity(&self) -> Fut<'_, Result<Node, MetadataError>> {
        Box::pin(async {
            let m = &self.metadata;
            let id = name("instance-id", m.required("instance-id").await?)?;
            let region = name("region-id", m.required("region-id").await?)?;
            let zone = name("zone-id", m.required("zone-id").await?)?;
            let instance_type = name(
                "instance/instance-type",
                m.required("instance/instance-type").await?,
            )?;
            let base = self
                .endpoint_url
                .clone()
                .unwrap_or_else(|| format!("https://ecs-vpc.{region}.aliyuncs.com"));
            let ecs = Arc::new(Ecs::new(
                &base,
                &region,
                Arc::clone(&self.metadata),
                &self.ram_role,
            ));
            if let Ok(mut e) = self.ecs.lock() {
                *e = Some(ecs);
            }
            Ok(Node {
                instance_id: id,
                instance_type,
                availability_zone: zone,
                region,
                lifecycle: None,
            })
        })
    }

    /// `instance/spot/termination-time`: present once the spot instance is to be reclaimed. A
    /// time that is present is a notice, whether or not it parses (`reclaim`).
    fn interruption(&self) -> Fut<'_, Result<Option<Notice>, MetadataError>> {
        Box::pin(async {
            let at = self.metadata.get("instance/spot/termination-time").await?;
            let mut kept = self.notice.lock().unwrap_or_else(|e| e.into_inner());
            let Some(text) = at else {
                *kept = None;
                return Ok(None);
            };
            let seen = match kept.as_ref() {
                Some((known, seen)) if *known == text => *seen,
                _ => crate::time::now(),
            };
            *kept = Some((text.clone(), seen));
            Ok(Some(reclaim(&text, seen)))
        })
    }

    fn advice(&self) -> Fut<'_, Result<Vec<Notice>, MetadataError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Tags are read with `DescribeInstances` (the API's `tags`).
    fn tags(&self) -> Fut<'_, Result<super::Tags, MetadataError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn tag_sources(&self) -> &'static str {
        "ecs:DescribeInstances"
    }

    fn connect(
        &self,
        node: &Node,
        link: Link<'_>,
        tasks: &mut JoinSet<()>,
    ) -> Arc<dyn ControlPlane> {
        let config = link.config;
        tracing::info!(
            instance = %node.instance_id,
            instance_type = %node.instance_type,
            zone = %node.availability_zone,
            lifecycle = node.lifecycle_label(),
            "running on Alibaba Cloud ECS"
        );
        let ecs = self
            .ecs
            .lock()
            .ok()
            .and_then(|e| e.clone())
            .unwrap_or_else(|| {
                let base = self.endpoint_url.clone().unwrap_or_default();
                Arc::new(Ecs::new(
                    &base,
                    &node.region,
                    Arc::clone(&self.metadata),
                    &self.ram_role,
                ))
            });
        tasks.spawn(learn(
            Arc::clone(&ecs),
            node.clone(),
            Arc::clone(&link.readings),
            config
                .cost
                .hourly_price_usd
                .is_none()
                .then_some(config.cost.spot_price_refresh),
        ));
        Arc::new(AlibabaApi {
            ecs,
            id: node.instance_id.clone(),
            keep_charging: self.keep_charging,
        })
    }
}

/// The longest wait between two reads of what is not known yet (the lifecycle, a price that
/// failed): one throttled answer never leaves it unknown for long.
const MOST_WAIT: Duration = Duration::from_secs(60);

/// Reads the instance's lifecycle (`SpotStrategy`) until it is known, with backoff (1 s, then
/// twice as long each time, at most `MOST_WAIT` apart), and hands it to the cost side; then,
/// where `price_every` is given, polls the price.
async fn learn(
    ecs: Arc<Ecs>,
    mut node: Node,
    readings: Arc<dyn super::Readings>,
    price_every: Option<Duration>,
) {
    if node.lifecycle.is_none() {
        let said = super::poll::Said {
            failing: "cannot tell yet whether the instance is spot (DescribeInstances): its lifecycle and price stay unknown until it answers; asking again",
            recovered: None,
        };
        let pace = super::poll::Pace::until_answered(MOST_WAIT);
        let learnt = std::sync::Mutex::new(None);
        super::poll::poll(pace, said, &node.instance_id, || async {
            match lifecycle(&ecs, &node.instance_id).await {
                Ok(l) => {
                    readings.lifecycle(l);
                    *learnt.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
                    super::poll::Read::Done
                }
                Err(why) => super::poll::Read::Failed(why),
            }
        })
        .await;
        node.lifecycle = learnt.into_inner().unwrap_or_else(|e| e.into_inner());
    }
    if let Some(every) = price_every {
        poll_price(ecs, node, readings, every).await;
    }
}

/// The lifecycle `SpotStrategy` says.
async fn lifecycle(ecs: &Ecs, id: &str) -> Result<Lifecycle, String> {
    let i = ecs.instance(id).await.map_err(|e| e.to_string())?;
    match i["SpotStrategy"].as_str() {
        Some("NoSpot") => Ok(Lifecycle::OnDemand),
        Some("SpotWithPriceLimit" | "SpotAsPriceGo") => Ok(Lifecycle::Spot),
        other => Err(format!(
            "SpotStrategy is {:?}, which names no lifecycle",
            other.map(|o| crate::redact::brief(o, 32))
        )),
    }
}

/// The price, then again every `every`: `DescribeSpotPriceHistory`'s latest for a spot
/// instance, `DescribePrice` by the hour otherwise. A read that fails is tried again sooner,
/// with backoff. gpuwatch accounts in USD: a price in another currency (CNY on Alibaba
/// Cloud's China site) is no price, with the reason.
async fn poll_price(
    ecs: Arc<Ecs>,
    node: Node,
    readings: Arc<dyn super::Readings>,
    every: Duration,
) {
    let said = super::poll::Said {
        failing:
            "no price for this instance: spend is unknown unless [cost] hourly_price_usd is set",
        recovered: Some("the ECS API gives a price again"),
    };
    let pace = super::poll::Pace {
        every,
        retry: Duration::from_secs(1),
        most: MOST_WAIT.min(every),
    };
    super::poll::poll(pace, said, &node.instance_type, || async {
        match price(&ecs, &node).await {
            Ok((kind, p)) => {
                tracing::info!(usd_per_hour = p, instance_type = %node.instance_type, "price from the ECS API");
                readings.price(kind, p);
                super::poll::Read::Again
            }
            Err(why) => super::poll::Read::Failed(why),
        }
    })
    .await
}

async fn price(ecs: &Ecs, node: &Node) -> Result<(super::PriceKind, f64), String> {
    let usd = |currency: &str, value: &serde_json::Value| -> Result<f64, String> {
        if currency != "USD" {
            return Err(format!(
                "the ECS API prices this account in {}, not USD (gpuwatch never converts currencies)",
                crate::redact::brief(currency, 8)
            ));
        }
        value
            .as_f64()
            .and_then(|p| crate::cost::parse_hourly_usd(&p.to_string()))
            .ok_or_else(|| "the ECS API's price is not an hourly price".to_string())
    };
    match node.lifecycle {
        Some(Lifecycle::Spot) => {
            let a = ecs
                .call(
                    "DescribeSpotPriceHistory",
                    &[
                        ("RegionId", ecs.region()),
                        ("ZoneId", &node.availability_zone),
                        ("InstanceType", &node.instance_type),
                        ("NetworkType", "vpc"),
                        ("OSType", "linux"),
                    ],
                )
                .await
                .map_err(|e| e.to_string())?;
            let latest = a["SpotPrices"]["SpotPriceType"]
                .as_array()
                .and_then(|p| {
                    p.iter()
                        .max_by_key(|p| p["Timestamp"].as_str().unwrap_or("").to_string())
                })
                .ok_or("DescribeSpotPriceHistory lists no price")?;
            Ok((
                super::PriceKind::Spot,
                usd(a["Currency"].as_str().unwrap_or(""), &latest["SpotPrice"])?,
            ))
        }
        Some(Lifecycle::OnDemand) => {
            let p = list_price(ecs, node).await?;
            let p = &p["PriceInfo"]["Price"];
            Ok((
                super::PriceKind::List,
                usd(p["Currency"].as_str().unwrap_or(""), instance_alone(p))?,
            ))
        }
        None => Err("whether the instance is spot is unknown, so is its price".into()),
    }
}

/// `DescribePrice`'s answer for this pay-as-you-go instance by the hour. ECS prices an instance
/// with a system disk, of a category the current families refuse unless told
/// (`InvalidSystemDiskCategory.ValueNotSupported`): this instance's own, from `DescribeDisks`.
/// Where that cannot be read, the categories the current families take are tried in turn:
/// only the instance type's own row of the answer is the price, whatever the disk.
async fn list_price(ecs: &Ecs, node: &Node) -> Result<serde_json::Value, String> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    let disks: Vec<(String, String, String)> = match ecs.system_disk(&node.instance_id).await {
        Ok(d) => vec![(
            text(&d["Category"]),
            d["Size"]
                .as_u64()
                .map(|s| s.to_string())
                .unwrap_or_default(),
            text(&d["PerformanceLevel"]),
        )],
        Err(e) => {
            tracing::debug!(error = %e, "the system disk is not known: DescribePrice is asked with the categories current families take");
            ["", "cloud_essd", "cloud_auto"]
                .iter()
                .map(|c| (c.to_string(), String::new(), String::new()))
                .collect()
        }
    };
    let mut refused = String::new();
    for (category, size, level) in &disks {
        let mut params = vec![
            ("RegionId", ecs.region()),
            ("ResourceType", "instance"),
            ("InstanceType", node.instance_type.as_str()),
            ("PriceUnit", "Hour"),
            ("Period", "1"),
            ("SystemDisk.Category", category.as_str()),
            ("SystemDisk.Size", size.as_str()),
            ("SystemDisk.PerformanceLevel", level.as_str()),
        ];
        params.retain(|(_, v)| !v.is_empty());
        match ecs.call("DescribePrice", &params).await {
            Ok(answer) => return Ok(answer),
            Err(e) if e.message.starts_with("InvalidSystemDiskCategory") => {
                refused = e.to_string();
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(refused)
}

/// The price of the instance type alone, without the system disk `DescribePrice` adds: its
/// `instanceType` row where the answer breaks the price down, else the whole.
fn instance_alone(price: &serde_json::Value) -> &serde_json::Value {
    let details = &price["DetailInfos"];
    [&details["DetailInfo"], &details["ResourcePriceModel"]]
        .into_iter()
        .filter_map(|rows| rows.as_array())
        .flatten()
        .find(|r| matches!(r["Resource"].as_str(), Some("instanceType" | "instance")))
        .map_or(&price["TradePrice"], |r| &r["TradePrice"])
}

/// The spot reclaim notice that `instance/spot/termination-time` gives, first seen `seen`. ECS
/// writes UTC (`2026-12-06T10:00:00Z`); a time written otherwise (a space for the `T`, no
/// `Z`) is read as UTC, and one that does not parse at all is a notice still, in effect since
/// it was first seen: unknown holds.
fn reclaim(text: &str, seen: f64) -> Notice {
    let shown = crate::redact::brief(text.trim(), 64);
    let time = lenient_utc(text.trim());
    Notice {
        key: shown.clone(),
        kind: NoticeKind::Interruption,
        time: time.unwrap_or(seen),
        text: match time {
            Some(t) => format!(
                "the spot instance is to be reclaimed at {}",
                crate::time::rfc3339(t)
            ),
            None => format!(
                "the spot instance is to be reclaimed (its termination time {shown:?} does not parse)"
            ),
        },
    }
}

/// An RFC 3339 time, or one with a space for the `T` or without a zone (taken as UTC).
fn lenient_utc(text: &str) -> Option<f64> {
    if let Some(t) = crate::time::parse_rfc3339(text) {
        return Some(t);
    }
    let mut t = text.replacen(' ', "T", 1);
    let zoned =
        t.ends_with(['Z', 'z']) || t.get(19..).is_some_and(|tail| tail.contains(['+', '-']));
    if !zoned {
        t.push('Z');
    }
    crate::time::parse_rfc3339(&t)
}

/// ECS, for this instance.
struct AlibabaApi {
    ecs: Arc<Ecs>,
    id: String,
    keep_charging: bool,
}

impl ControlPlane for AlibabaApi {
    fn tags(&self) -> Option<Fut<'_, Result<super::Tags, CloudError>>> {
        Some(Box::pin(async {
            let i = self.ecs.instance(&self.id).await?;
            Ok(i["Tags"]["Tag"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| {
                    Some((
                        t["TagKey"].as_str()?.to_string(),
                        t["TagValue"].as_str().unwrap_or("").to_string(),
                    ))
                })
                .collect())
        }))
    }

    fn state(&self) -> Fut<'_, Result<Option<String>, CloudError>> {
        Box::pin(async {
            let i = self.ecs.instance(&self.id).await?;
            Ok(i["Status"].as_str().map(|s| crate::redact::brief(s, 32)))
        })
    }

    fn plan(
        &self,
        action: Action,
        _spot_stop: SpotStop,
    ) -> Fut<'_, Result<Plan<Box<dyn super::Operation>>, CloudError>> {
        Box::pin(async move {
            let i = self.ecs.instance(&self.id).await?;
            // How the instance is billed decides the plan: a value ECS does not document is
            // unknown, and unknown holds.
            let prepaid = match i["InstanceChargeType"].as_str() {
                Some("PrePaid") => true,
                Some("PostPaid") => false,
                other => {
                    return Err(CloudError {
                        operation: "DescribeInstances",
                        kind: super::ErrorKind::Other,
                        message: format!(
                            "InstanceChargeType is {:?}, neither PrePaid nor PostPaid: how the instance is billed is unknown, so nothing is planned",
                            other.map(|o| crate::redact::brief(o, 32))
                        ),
                        request_id: None,
                        retry_after: None,
                    })
                }
            };
            let instance = plan::Instance {
                instance_type: i["InstanceType"].as_str().unwrap_or("").to_string(),
                prepaid,
            };
            Ok(
                plan::plan(action, &instance, self.keep_charging).map(|step| {
                    Box::new(AlibabaStep {
                        ecs: Arc::clone(&self.ecs),
                        id: self.id.clone(),
                        step,
                    }) as Box<dyn super::Operation>
                }),
            )
        })
    }

    fn tag_action<'a>(
        &'a self,
        action: &'a str,
        rule: &'a str,
    ) -> Fut<'a, Result<Call, CloudError>> {
        Box::pin(async move {
            let a = self
                .ecs
                .call(
                    "TagResources",
                    &[
                        ("RegionId", self.ecs.region()),
                        ("ResourceType", "instance"),
                        ("ResourceId.1", &self.id),
                        ("Tag.1.Key", "gpuwatch:action"),
                        ("Tag.1.Value", action),
                        ("Tag.2.Key", "gpuwatch:rule"),
                        ("Tag.2.Value", &rule.chars().take(128).collect::<String>()),
                    ],
                )
                .await?;
            Ok(Call {
                operation: "TagResources".into(),
                request_id: request_id(&a),
            })
        })
    }

    fn grant_hint(&self) -> &'static str {
        "ECS denied access: attach config/alibaba-ram-policy.json to the instance's RAM role"
    }
}

use ecs::request_id;

struct AlibabaStep {
    ecs: Arc<Ecs>,
    id: String,
    step: plan::Step,
}

impl AlibabaStep {
    /// Waits until the instance is `Stopped`, then says in which mode: a stop that ECS made
    /// without economical mode is said as the failure it is for an idle rule. ECS accepted
    /// the stop: a read that fails for throttling or an outage, or an answer that does not
    /// name the instance, is read again (every 2 s, for at most `FOLLOW_FOR`), never taken as
    /// the stop's outcome.
    async fn stopped(&self, economical: bool) -> Result<(), CloudError> {
        let unknown = |last: &str| {
            CloudError {
            operation: "StopInstance",
            kind: crate::cloud::ErrorKind::Other,
            message: format!(
                "ECS accepted the stop, but the instance is still {} after {}: its outcome is unknown",
                if last == "running" { "not Stopped" } else { last },
                humantime::format_duration(crate::cloud::FOLLOW_FOR)
            ),
            request_id: None,
            retry_after: None,
        }
        };
        let pace = Pace {
            first: Duration::ZERO,
            every: Duration::from_secs(2),
            most: Duration::from_secs(2),
        };
        let deadline = Instant::now() + crate::cloud::FOLLOW_FOR;
        let instance = follow(deadline, pace, unknown, || async {
            match self.read_back().await {
                Ok(Some(i)) => Look::Ended(Ok(i)),
                Ok(None) => Look::Running(None),
                Err(e) if e.kind == crate::cloud::ErrorKind::Retryable => {
                    Look::Again(None, e.to_string())
                }
                Err(e) => Look::Ended(Err(e)),
            }
        })
        .await?;
        let mode = instance["StoppedMode"].as_str().unwrap_or_default();
        if economical && mode != "StopCharging" {
            return Err(CloudError {
                operation: "StopInstance",
                kind: crate::cloud::ErrorKind::Other,
                message: format!("the instance stopped, but not in economical mode: StoppedMode is {:?}, so it is still billed", crate::redact::brief(mode, 32)),
                request_id: None,
                retry_after: None,
            });
        }
        tracing::info!(stopped_mode = %mode, "the instance is stopped");
        Ok(())
    }

    /// The instance once `DescribeInstanceStatus` says it is `Stopped` and `DescribeInstances`
    /// names it; `None` while it is not stopped yet.
    async fn read_back(&self) -> Result<Option<serde_json::Value>, CloudError> {
        let a = self
            .ecs
            .call(
                "DescribeInstanceStatus",
                &[("RegionId", self.ecs.region()), ("InstanceId.1", &self.id)],
            )
            .await?;
        let status = ecs::named(
            &a["InstanceStatuses"]["InstanceStatus"],
            "InstanceId",
            &self.id,
        )
        .and_then(|s| s["Status"].as_str());
        if status != Some("Stopped") {
            return Ok(None);
        }
        self.ecs.instance(&self.id).await.map(Some)
    }
}

impl super::Operation for AlibabaStep {
    fn describe(&self) -> String {
        match self.step {
            plan::Step::Stop { .. } => "StopInstance".into(),
            plan::Step::Delete => "DeleteInstance".into(),
        }
    }

    fn leaves(&self) -> Option<Down> {
        self.step.leaves()
    }

    fn run(&self) -> Fut<'_, Result<Call, CloudError>> {
        Box::pin(async move {
            let answer = match self.step {
                plan::Step::Stop { economical } => {
                    let mode = if economical {
                        "StopCharging"
                    } else {
                        "KeepCharging"
                    };
                    let a = self
                        .ecs
                        .call(
                            "StopInstance",
                            &[
                                ("InstanceId", &self.id),
                                ("StoppedMode", mode),
                                ("ForceStop", "false"),
                            ],
                        )
                        .await?;
                    self.stopped(economical).await?;
                    a
                }
                plan::Step::Delete => {
                    self.ecs
                        .call(
                            "DeleteInstance",
                            &[("InstanceId", &self.id), ("Force", "true")],
                        )
                        .await?
                }
            };
            Ok(Call {
                operation: self.describe(),
                request_id: request_id(&answer),
            })
        })
    }
}

#[cfg(test)]
mod tests;
