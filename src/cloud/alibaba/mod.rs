//! Alibaba Cloud ECS (`provider = "alibaba"`): instance metadata in hardened mode for identity,
//! spot reclaim notices and the RAM role's credentials; the ECS API, signed with signature V3
//! (`sign.rs`), for tags, holds, actions and prices.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::metadata::Session;
use super::{Api, Call, Cloud, CloudError, Fut, Link, MetadataError, Node, Notice, NoticeKind};
use crate::cloud::plan::{self, Plan, SpotStop};
use crate::rules::{Action, Lifecycle};

pub mod ecs;
pub mod sign;

use ecs::Ecs;

pub struct Alibaba {
    metadata: Arc<Session>,
    /// The API, made when identity is first read (the region names the default endpoint).
    ecs: Mutex<Option<Arc<Ecs>>>,
    endpoint_url: Option<String>,
    ram_role: String,
    keep_charging: bool,
}

impl Alibaba {
    pub fn new(config: &crate::config::Config) -> Alibaba {
        Alibaba {
            metadata: Arc::new(Session::new(
                &config.cloud.imds_endpoint,
                "X-aliyun-ecs-metadata-token-ttl-seconds",
                "X-aliyun-ecs-metadata-token",
            )),
            ecs: Mutex::new(None),
            endpoint_url: config.cloud.endpoint_url.clone(),
            ram_role: config.cloud.ram_role.clone(),
            keep_charging: config.cloud.keep_charging,
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

impl Cloud for Alibaba {
    fn name(&self) -> &'static str {
        "alibaba"
    }

    /// Identity from metadata; whether the instance is spot from `DescribeInstances`
    /// (`SpotStrategy`): until that answers, the lifecycle is unknown.
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
            let lifecycle = match ecs.describe(&id).await {
                Ok(Some(i)) => match i["SpotStrategy"].as_str() {
                    Some("NoSpot") => Some(Lifecycle::OnDemand),
                    Some("SpotWithPriceLimit" | "SpotAsPriceGo") => Some(Lifecycle::Spot),
                    _ => None,
                },
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot tell whether the instance is spot (DescribeInstances): its lifecycle is unknown");
                    None
                }
            };
            if let Ok(mut e) = self.ecs.lock() {
                *e = Some(ecs);
            }
            Ok(Node {
                instance_id: id,
                instance_type,
                availability_zone: zone,
                region,
                lifecycle,
            })
        })
    }

    /// `instance/spot/termination-time`: a time once the spot instance is to be reclaimed.
    fn interruption(&self) -> Fut<'_, Result<Option<Notice>, MetadataError>> {
        Box::pin(async {
            let at = self.metadata.get("instance/spot/termination-time").await?;
            Ok(at.and_then(|text| {
                let time = crate::time::parse_rfc3339(&text)?;
                Some(Notice {
                    key: text.clone(),
                    kind: NoticeKind::Interruption,
                    time,
                    text: format!(
                        "the spot instance is to be reclaimed at {}",
                        crate::time::rfc3339(time)
                    ),
                })
            }))
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

    fn connect(&self, node: &Node, link: Link<'_>, tasks: &mut JoinSet<()>) -> Arc<dyn Api> {
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
        if config.cost.hourly_price_usd.is_none() {
            tasks.spawn(poll_price(
                Arc::clone(&ecs),
                node.clone(),
                Arc::clone(&link.readings),
                config.cost.spot_price_refresh,
            ));
        }
        Arc::new(AlibabaApi {
            ecs,
            id: node.instance_id.clone(),
            keep_charging: self.keep_charging,
        })
    }
}

/// The price, then again every `every`: `DescribeSpotPriceHistory`'s latest for a spot
/// instance, `DescribePrice` by the hour otherwise. gpuwatch accounts in USD: a price in
/// another currency (CNY on Alibaba Cloud's China site) is no price, with the reason.
async fn poll_price(
    ecs: Arc<Ecs>,
    node: Node,
    readings: Arc<dyn super::Readings>,
    every: Duration,
) {
    let mut said = false;
    loop {
        match price(&ecs, &node).await {
            Ok((kind, p)) => {
                tracing::info!(usd_per_hour = p, instance_type = %node.instance_type, "price from the ECS API");
                readings.price(kind, p);
                said = false;
            }
            Err(why) if !said => {
                said = true;
                tracing::warn!(reason = %why, "no price for this instance: spend is unknown unless [cost] hourly_price_usd is set");
            }
            Err(_) => {}
        }
        tokio::time::sleep(every).await;
    }
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
            let a = ecs
                .call(
                    "DescribePrice",
                    &[
                        ("RegionId", ecs.region()),
                        ("ResourceType", "instance"),
                        ("InstanceType", &node.instance_type),
                        ("PriceUnit", "Hour"),
                        ("Period", "1"),
                    ],
                )
                .await
                .map_err(|e| e.to_string())?;
            let p = &a["PriceInfo"]["Price"];
            Ok((
                super::PriceKind::List,
                usd(p["Currency"].as_str().unwrap_or(""), &p["TradePrice"])?,
            ))
        }
        None => Err("whether the instance is spot is unknown, so is its price".into()),
    }
}

/// ECS, for this instance.
struct AlibabaApi {
    ecs: Arc<Ecs>,
    id: String,
    keep_charging: bool,
}

impl Api for AlibabaApi {
    fn tags(&self) -> Option<Fut<'_, Result<super::Tags, CloudError>>> {
        Some(Box::pin(async {
            let i = self.ecs.describe(&self.id).await?.unwrap_or_default();
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
            let i = self.ecs.describe(&self.id).await?;
            Ok(i.and_then(|i| Some(crate::redact::brief(i["Status"].as_str()?, 32))))
        })
    }

    fn plan(
        &self,
        action: Action,
        _spot_stop: SpotStop,
    ) -> Fut<'_, Result<Plan<Box<dyn super::Step>>, CloudError>> {
        Box::pin(async move {
            let i = self.ecs.describe(&self.id).await?.unwrap_or_default();
            let instance = plan::alibaba::Instance {
                instance_type: i["InstanceType"].as_str().unwrap_or("").to_string(),
                prepaid: i["InstanceChargeType"] == "PrePaid",
            };
            Ok(
                plan::alibaba::plan(action, &instance, self.keep_charging).map(|step| {
                    Box::new(AlibabaStep {
                        ecs: Arc::clone(&self.ecs),
                        id: self.id.clone(),
                        step,
                    }) as Box<dyn super::Step>
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

fn request_id(answer: &serde_json::Value) -> Option<String> {
    answer["RequestId"]
        .as_str()
        .map(|r| crate::redact::brief(r, 64))
}

struct AlibabaStep {
    ecs: Arc<Ecs>,
    id: String,
    step: plan::alibaba::Step,
}

impl AlibabaStep {
    /// Waits until the instance is `Stopped`, then says in which mode: a stop that ECS made
    /// without economical mode is said as the failure it is for an idle rule.
    async fn stopped(&self, economical: bool) -> Result<(), CloudError> {
        let started = Instant::now();
        loop {
            let a = self
                .ecs
                .call(
                    "DescribeInstanceStatus",
                    &[("RegionId", self.ecs.region()), ("InstanceId.1", &self.id)],
                )
                .await?;
            let status = a["InstanceStatuses"]["InstanceStatus"]
                .as_array()
                .and_then(|s| s.iter().find(|s| s["InstanceId"] == self.id.as_str()))
                .and_then(|s| s["Status"].as_str())
                .unwrap_or("")
                .to_string();
            if status == "Stopped" {
                break;
            }
            if started.elapsed() > crate::cloud::FOLLOW_FOR {
                return Err(CloudError {
                    operation: "StopInstance",
                    kind: crate::cloud::ErrorKind::Other,
                    message: format!(
                        "the instance is still {status:?} after {}: its outcome is unknown",
                        humantime::format_duration(crate::cloud::FOLLOW_FOR)
                    ),
                    request_id: None,
                    retry_after: None,
                });
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let mode = self
            .ecs
            .describe(&self.id)
            .await?
            .and_then(|i| i["StoppedMode"].as_str().map(str::to_string))
            .unwrap_or_default();
        if economical && mode != "StopCharging" {
            return Err(CloudError {
                operation: "StopInstance",
                kind: crate::cloud::ErrorKind::Other,
                message: format!("the instance stopped, but not in economical mode: StoppedMode is {:?}, so it is still billed", crate::redact::brief(&mode, 32)),
                request_id: None,
                retry_after: None,
            });
        }
        tracing::info!(stopped_mode = %mode, "the instance is stopped");
        Ok(())
    }
}

impl super::Step for AlibabaStep {
    fn describe(&self) -> String {
        match self.step {
            plan::alibaba::Step::Stop { .. } => "StopInstance".into(),
            plan::alibaba::Step::Delete => "DeleteInstance".into(),
        }
    }

    fn leaves(&self) -> Option<plan::Down> {
        self.step.leaves()
    }

    fn run(&self) -> Fut<'_, Result<Call, CloudError>> {
        Box::pin(async move {
            let answer = match self.step {
                plan::alibaba::Step::Stop { economical } => {
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
                plan::alibaba::Step::Delete => {
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
