//! CloudWatch publishing: every sample goes into a statistic set (SampleCount, Sum, Minimum,
//! Maximum) per metric and GPU; each interval the sets are queued and sent with PutMetricData.
//! CloudWatch then sees the true minute average and peak at a sixtieth of the calls. During an
//! outage the queue keeps at most `max_queue` worth of data and drops the oldest, counted.

pub mod metrics;

use gpuwatch_core::node::Node;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StandardUnit, StatisticSet};

use super::services::Services;
use super::settings::CloudWatchConfig;
use crate::gpu::sampler::Snapshots;
use crate::gpu::{GpuSample, Snapshot};

/// PutMetricData takes at most 1,000 datums per call; stay well inside the 1 MB payload too.
const BATCH: usize = 500;

/// The metrics published, their unit, and how to read them from a GPU sample.
type Reader = fn(&GpuSample) -> Option<f64>;
const METRICS: &[(&str, StandardUnit, Reader)] = &[
    ("GPUUtilization", StandardUnit::Percent, |g| {
        g.utilization_ratio.map(|r| r * 100.0)
    }),
    ("GPUMemoryUtilization", StandardUnit::Percent, |g| {
        g.memory_utilization_ratio.map(|r| r * 100.0)
    }),
    ("GPUMemoryUsed", StandardUnit::Bytes, |g| {
        g.memory_used_bytes.map(|b| b as f64)
    }),
    ("GPUTemperature", StandardUnit::None, |g| {
        g.temperature_celsius
    }),
    ("GPUPowerDraw", StandardUnit::None, |g| g.power_watts),
    // GPM (Hopper and later): what the SMs really do; only where it is known.
    ("GPUSMActivity", StandardUnit::Percent, |g| {
        g.gpm.as_ref()?.sm_active.map(|r| r * 100.0)
    }),
];

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub count: f64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    fn add(&mut self, v: f64) {
        self.count += 1.0;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    fn new(v: f64) -> Stat {
        Stat {
            count: 1.0,
            sum: v,
            min: v,
            max: v,
        }
    }
}

/// Which series a statistic set belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Series {
    /// One GPU: dimensions InstanceId, InstanceType, GPU.
    Gpu(usize, u32),
    /// The instance, average across GPUs per sample: dimension InstanceId.
    Average(usize),
    /// The instance, maximum across GPUs per sample (`<Metric>Max`): dimension InstanceId.
    Max(usize),
}

/// Aggregates samples into statistic sets. Pure.
#[derive(Debug, Default)]
pub struct Aggregator {
    sets: BTreeMap<Series, Stat>,
}

impl Aggregator {
    pub fn add(&mut self, snap: &Snapshot) {
        for (m, (_, _, read)) in METRICS.iter().enumerate() {
            let values: Vec<(u32, f64)> = snap
                .gpus
                .iter()
                .filter(|g| g.up)
                .filter_map(|g| read(g).map(|v| (g.index, v)))
                .collect();
            for (gpu, v) in &values {
                self.put(Series::Gpu(m, *gpu), *v);
            }
            if !values.is_empty() {
                let avg = values.iter().map(|(_, v)| v).sum::<f64>() / values.len() as f64;
                let max = values
                    .iter()
                    .map(|(_, v)| *v)
                    .fold(f64::NEG_INFINITY, f64::max);
                self.put(Series::Average(m), avg);
                self.put(Series::Max(m), max);
            }
        }
    }

    fn put(&mut self, s: Series, v: f64) {
        self.sets
            .entry(s)
            .and_modify(|st| st.add(v))
            .or_insert_with(|| Stat::new(v));
    }

    pub fn take(&mut self) -> BTreeMap<Series, Stat> {
        std::mem::take(&mut self.sets)
    }
}

/// Turns statistic sets into datums stamped with `at` (Unix seconds).
pub fn datums(
    sets: BTreeMap<Series, Stat>,
    instance: &Node,
    at: f64,
    resolution: i32,
) -> Vec<MetricDatum> {
    let dim = |n: &str, v: &str| Dimension::builder().name(n).value(v).build();
    let ts = aws_sdk_cloudwatch::primitives::DateTime::from_secs(at as i64);
    sets.into_iter()
        .map(|(series, st)| {
            let (m, name, dims) = match series {
                Series::Gpu(m, gpu) => (
                    m,
                    METRICS[m].0.to_string(),
                    vec![
                        dim("InstanceId", &instance.instance_id),
                        dim("InstanceType", &instance.instance_type),
                        dim("GPU", &gpu.to_string()),
                    ],
                ),
                Series::Average(m) => (
                    m,
                    METRICS[m].0.to_string(),
                    vec![dim("InstanceId", &instance.instance_id)],
                ),
                Series::Max(m) => (
                    m,
                    format!("{}Max", METRICS[m].0),
                    vec![dim("InstanceId", &instance.instance_id)],
                ),
            };
            MetricDatum::builder()
                .metric_name(name)
                .set_dimensions(Some(dims))
                .timestamp(ts)
                .unit(METRICS[m].1.clone())
                .storage_resolution(resolution)
                .statistic_values(
                    StatisticSet::builder()
                        .sample_count(st.count)
                        .sum(st.sum)
                        .minimum(st.min)
                        .maximum(st.max)
                        .build(),
                )
                .build()
        })
        .collect()
}

/// The publisher's own counters, for `gpuwatch_cloudwatch_*`.
#[derive(Debug, Default)]
pub struct Counters {
    pub datums: AtomicU64,
    pub errors: AtomicU64,
    pub dropped: AtomicU64,
    pub queued: AtomicU64,
}

/// A bounded queue of datums that drops the oldest.
#[derive(Debug, Default)]
pub struct Queue {
    items: VecDeque<MetricDatum>,
}

impl Queue {
    /// Adds `batch`; keeps at most `bound` datums. Returns how many old ones were dropped.
    pub fn push(&mut self, batch: Vec<MetricDatum>, bound: usize) -> usize {
        self.items.extend(batch);
        let over = self.items.len().saturating_sub(bound);
        self.items.drain(..over);
        over
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

pub async fn run(
    cfg: CloudWatchConfig,
    services: Services,
    instance: Node,
    snapshots: Snapshots,
    counters: Arc<Counters>,
) {
    let mut agg = Aggregator::default();
    let mut queue = Queue::default();
    let mut ticker = tokio::time::interval(cfg.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let resolution = if cfg.interval < Duration::from_secs(60) {
        1
    } else {
        60
    };
    let intervals_kept = (cfg.max_queue.as_secs_f64() / cfg.interval.as_secs_f64())
        .ceil()
        .max(1.0) as usize;
    let mut window_start = crate::time::now();
    let mut seq = snapshots.latest().seq;
    let mut failing = false;
    loop {
        tokio::select! {
            snap = snapshots.next_after(seq) => {
                if snap.seq > seq {
                    seq = snap.seq;
                    agg.add(&snap);
                }
            }
            _ = ticker.tick() => {
                let batch = datums(agg.take(), &instance, window_start, resolution);
                window_start = crate::time::now();
                let bound = intervals_kept * batch.len().max(1);
                let dropped = queue.push(batch, bound);
                if dropped > 0 {
                    counters.dropped.fetch_add(dropped as u64, Ordering::Relaxed);
                    tracing::warn!(dropped, "CloudWatch queue full; dropped the oldest datums");
                }
                while !queue.is_empty() {
                    let n = queue.len().min(BATCH);
                    let send: Vec<MetricDatum> = queue.items.iter().take(n).cloned().collect();
                    match services.put_metric_data(&cfg.namespace, send).await {
                        Ok(()) => {
                            queue.items.drain(..n);
                            counters.datums.fetch_add(n as u64, Ordering::Relaxed);
                            if failing {
                                tracing::info!("CloudWatch publishing recovered");
                                failing = false;
                            }
                        }
                        Err(e) => {
                            counters.errors.fetch_add(1, Ordering::Relaxed);
                            if !failing {
                                tracing::warn!(error = %e, queued = queue.len(), "PutMetricData failed; datums stay queued");
                                failing = true;
                            }
                            break;
                        }
                    }
                }
                counters.queued.store(queue.len() as u64, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(utils: &[Option<f64>]) -> Snapshot {
        Snapshot {
            seq: 1,
            gpus: utils
                .iter()
                .enumerate()
                .map(|(i, u)| GpuSample {
                    index: i as u32,
                    up: true,
                    utilization_ratio: *u,
                    ..GpuSample::default()
                })
                .collect(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn statistic_sets_per_gpu_and_per_instance() {
        let mut a = Aggregator::default();
        a.add(&snap(&[Some(0.10), Some(0.90)]));
        a.add(&snap(&[Some(0.30), None]));
        let sets = a.take();
        assert_eq!(
            sets[&Series::Gpu(0, 0)],
            Stat {
                count: 2.0,
                sum: 40.0,
                min: 10.0,
                max: 30.0
            }
        );
        assert_eq!(
            sets[&Series::Gpu(0, 1)],
            Stat {
                count: 1.0,
                sum: 90.0,
                min: 90.0,
                max: 90.0
            }
        );
        // Per instance: the average across GPUs of each sample (50, then 30), and the maximum.
        assert_eq!(
            sets[&Series::Average(0)],
            Stat {
                count: 2.0,
                sum: 80.0,
                min: 30.0,
                max: 50.0
            }
        );
        assert_eq!(
            sets[&Series::Max(0)],
            Stat {
                count: 2.0,
                sum: 120.0,
                min: 30.0,
                max: 90.0
            }
        );
        assert!(a.take().is_empty());
        let d = datums(
            sets,
            &Node {
                instance_id: "i-1".into(),
                instance_type: "p5.48xlarge".into(),
                availability_zone: "us-east-1a".into(),
                region: "us-east-1".into(),
                lifecycle: None,
            },
            60.0,
            60,
        );
        let max = d
            .iter()
            .find(|d| d.metric_name() == Some("GPUUtilizationMax"))
            .unwrap();
        assert_eq!(max.dimensions().len(), 1);
        let gpu1 = d
            .iter()
            .find(|d| {
                d.metric_name() == Some("GPUUtilization")
                    && d.dimensions().iter().any(|x| x.value() == Some("1"))
            })
            .unwrap();
        assert_eq!(gpu1.dimensions().len(), 3);
        assert_eq!(gpu1.statistic_values().unwrap().sample_count(), Some(1.0));
    }

    #[test]
    fn the_queue_is_bounded_and_drops_the_oldest() {
        let mut q = Queue::default();
        let d = |n: &str| MetricDatum::builder().metric_name(n).build();
        assert_eq!(q.push(vec![d("a"), d("b")], 3), 0);
        assert_eq!(q.push(vec![d("c"), d("d")], 3), 1);
        assert_eq!(q.len(), 3);
        assert_eq!(q.items[0].metric_name(), Some("b"));
    }
}
