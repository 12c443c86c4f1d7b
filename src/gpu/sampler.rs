//! The sampler: runs a `GpuSource` on a thread of its own, on a fixed interval, and publishes
//! each result as an immutable `Snapshot`.
//!
//! NVML never runs on the async runtime. A cycle that overruns its timeout is abandoned and
//! counted; its late result is thrown away, and no new cycle starts until the stuck call returns
//! (NVML calls cannot be cancelled). Scrapes keep answering from the last snapshot meanwhile.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use tokio::sync::{oneshot, watch};
use tokio::time::MissedTickBehavior;

use super::counters::{SampleError, SamplerCounters};
use super::health::{Judge, Seed};
use super::{GpuSource, Sample, Snapshot};

/// A way to read the latest snapshot and to await the next one.
#[derive(Clone, Debug)]
pub struct Snapshots(watch::Receiver<Arc<Snapshot>>);

/// Snapshots published through any channel (the sampler's, or one of a caller's own).
impl From<watch::Receiver<Arc<Snapshot>>> for Snapshots {
    fn from(rx: watch::Receiver<Arc<Snapshot>>) -> Self {
        Snapshots(rx)
    }
}

impl Snapshots {
    /// The latest snapshot. Cheap: clones an `Arc`, and never waits on the sampler.
    pub fn latest(&self) -> Arc<Snapshot> {
        Arc::clone(&self.0.borrow())
    }

    /// Waits until a snapshot with `seq > after` is published, and returns it. Once the
    /// sampler is gone no newer snapshot will come, and this waits forever (rather than return
    /// at once, which would set its callers spinning): bound it with a timeout or a shutdown.
    pub async fn next_after(&self, after: u64) -> Arc<Snapshot> {
        let mut rx = self.0.clone();
        let next = match rx.wait_for(|s| s.seq > after).await {
            Ok(s) => Some(Arc::clone(&s)),
            Err(_) => None,
        };
        match next {
            Some(s) => s,
            None => {
                let latest = self.latest();
                if latest.seq > after {
                    return latest;
                }
                std::future::pending().await
            }
        }
    }
}

type Reply = oneshot::Sender<(Sample, Duration)>;

/// Starts sampling as the config says: NVML (the library it names) on the `gpuwatch-nvml`
/// thread, driven from `tasks`, with the sampler's counters registered. Each GPU's health is
/// judged from the sample once the seed (what health remembered before a restart) is given.
pub fn start(
    config: &crate::config::Config,
    registry: &mut Registry,
    tasks: &mut tokio::task::JoinSet<()>,
) -> std::io::Result<(Snapshots, Seed)> {
    let counters = Arc::new(SamplerCounters::default());
    counters.register(registry);
    let nvml = super::nvml::NvmlSource::new(
        config.nvml.library.clone(),
        config.sampling.per_process_memory,
        Arc::clone(&counters),
    )
    .with_pids(config.slurm.enabled || config.sampling.process_owners)
    .with_slow_interval(config.sampling.slow_interval);
    let source = Node::new(config, nvml, Arc::clone(&counters));
    let (judge, seed) = Judge::new(config.health);
    let snapshots = spawn(
        source,
        config.sampling.interval,
        config.sampling.timeout,
        counters,
        judge,
        tasks,
    )?;
    Ok((snapshots, seed))
}

/// Every GPU of the node: NVIDIA's through NVML, then AMD's through the amdgpu driver, numbered
/// after NVIDIA's (after as many as NVML last counted, so that an NVML that goes down does not
/// renumber them).
pub struct Node {
    nvml: super::nvml::NvmlSource,
    amd: Option<super::amd::AmdSource>,
    nvidia: u32,
}

impl Node {
    /// The node's GPUs as the config says: NVIDIA's through `nvml`, and with `[amd] enabled`
    /// AMD's, their processes listed as `nvml`'s are.
    pub fn new(
        config: &crate::config::Config,
        nvml: super::nvml::NvmlSource,
        counters: Arc<SamplerCounters>,
    ) -> Node {
        Node {
            nvml,
            amd: amd(config, counters),
            nvidia: 0,
        }
    }
}

/// The AMD side of the node, where the config reads it.
fn amd(
    config: &crate::config::Config,
    counters: Arc<SamplerCounters>,
) -> Option<super::amd::AmdSource> {
    config.amd.enabled.then(|| {
        super::amd::AmdSource::new(config.amd.sysfs_root.clone(), counters).with_processes(
            config.amd.proc_root.clone(),
            config.sampling.per_process_memory,
            config.slurm.enabled || config.sampling.process_owners,
        )
    })
}

/// The node's GPUs read once, as the daemon reads them but without XID events: for the
/// commands that look at the node instead of watching it.
pub fn sample_once(config: &crate::config::Config) -> Sample {
    let counters = Arc::new(SamplerCounters::default());
    let nvml = super::nvml::NvmlSource::new(
        config.nvml.library.clone(),
        config.sampling.per_process_memory,
        Arc::clone(&counters),
    )
    .without_xid();
    Node::new(config, nvml, counters).sample()
}

/// Whether the node has GPUs that NVML does not read (cheap: NVML is not loaded).
pub fn has_other_gpus(config: &crate::config::Config) -> bool {
    config.amd.enabled && super::amd::count(&config.amd.sysfs_root) > 0
}

impl GpuSource for Node {
    fn sample(&mut self) -> Sample {
        let mut sample = self.nvml.sample();
        let Some(amd) = self.amd.as_mut() else {
            return sample;
        };
        if sample.nvml.up {
            self.nvidia = sample.gpus.len() as u32;
        }
        let first = self.nvidia.max(sample.gpus.len() as u32);
        let amd = amd.sample(first);
        sample.nvml.absent = !amd.is_empty() && self.nvml.never_present();
        sample.gpus.extend(amd);
        sample
    }
}

/// Runs `source` on a thread of its own, driven from `tasks` every `interval`, each sample's
/// health judged by `judge`.
pub fn spawn(
    source: impl GpuSource,
    interval: Duration,
    timeout: Duration,
    metrics: Arc<SamplerCounters>,
    judge: Judge,
    tasks: &mut tokio::task::JoinSet<()>,
) -> std::io::Result<Snapshots> {
    let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
    let requests = spawn_worker(source)?;
    tasks.spawn(drive(requests, tx, interval, timeout, metrics, judge));
    Ok(Snapshots(rx))
}

fn spawn_worker(mut source: impl GpuSource) -> std::io::Result<mpsc::Sender<Reply>> {
    let (tx, rx) = mpsc::channel::<Reply>();
    std::thread::Builder::new()
        .name("gpuwatch-nvml".into())
        .spawn(move || {
            for reply in rx {
                let started = Instant::now();
                let sample = source.sample();
                // The receiver is gone when the cycle was abandoned; the result is dropped.
                let _ = reply.send((sample, started.elapsed()));
            }
        })?;
    Ok(tx)
}

async fn drive(
    requests: mpsc::Sender<Reply>,
    tx: watch::Sender<Arc<Snapshot>>,
    interval: Duration,
    timeout: Duration,
    metrics: Arc<SamplerCounters>,
    mut judge: Judge,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut seq = 0u64;
    // A cycle that timed out and has not returned yet.
    let mut stuck: Option<oneshot::Receiver<(Sample, Duration)>> = None;
    loop {
        ticker.tick().await;
        if let Some(rx) = stuck.as_mut() {
            match rx.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => continue,
                _ => {
                    tracing::info!("the abandoned NVML cycle returned; sampling resumes");
                    stuck = None;
                }
            }
        }
        let (reply, mut rx) = oneshot::channel();
        if requests.send(reply).is_err() {
            publish_dead(&tx, seq + 1);
            return;
        }
        match tokio::time::timeout(timeout, &mut rx).await {
            Ok(Ok((sample, took))) => {
                seq += 1;
                let mut snapshot = Snapshot {
                    seq,
                    timestamp: crate::time::now(),
                    monotonic: crate::time::monotonic(),
                    duration_seconds: took.as_secs_f64(),
                    nvml: sample.nvml,
                    gpus: sample.gpus,
                    health_holds: Default::default(),
                };
                judge.judge(&mut snapshot);
                tx.send_replace(Arc::new(snapshot));
            }
            Ok(Err(_)) => {
                publish_dead(&tx, seq + 1);
                return;
            }
            Err(_) => {
                metrics.error(SampleError::Timeout);
                tracing::warn!(
                    timeout = ?timeout,
                    "an NVML sampling cycle overran its timeout and was abandoned; serving the last snapshot"
                );
                stuck = Some(rx);
            }
        }
    }
}

/// The NVML thread panicked. Rather than serve its last readings forever, publish a snapshot
/// with NVML down and no GPUs, so that dashboards and alerts see it.
fn publish_dead(tx: &watch::Sender<Arc<Snapshot>>, seq: u64) {
    tracing::error!("the NVML thread has died; serving gpuwatch_nvml_up 0 from now on");
    let (last, last_holds) = {
        let s = tx.borrow();
        (s.nvml.clone(), s.health_holds.clone())
    };
    tx.send_replace(Arc::new(Snapshot {
        seq,
        timestamp: crate::time::now(),
        monotonic: crate::time::monotonic(),
        duration_seconds: 0.0,
        nvml: super::NvmlStatus {
            up: false,
            error: Some("the NVML thread died; restart gpuwatch".to_string()),
            ..last
        },
        gpus: Vec::new(),
        health_holds: last_holds,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{GpuSample, NvmlStatus};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Counts its calls; the `n`th call reports `n` GPUs. Call 2 hangs for `hang`.
    struct Counting {
        calls: Arc<AtomicU32>,
        hang: Duration,
    }

    impl GpuSource for Counting {
        fn sample(&mut self) -> Sample {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == 2 {
                std::thread::sleep(self.hang);
            }
            Sample {
                nvml: NvmlStatus {
                    up: true,
                    ..NvmlStatus::default()
                },
                gpus: (0..n)
                    .map(|i| GpuSample {
                        index: i,
                        up: true,
                        ..GpuSample::default()
                    })
                    .collect(),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn publishes_in_order_and_abandons_a_stuck_cycle() {
        let calls = Arc::new(AtomicU32::new(0));
        let metrics = Arc::new(SamplerCounters::default());
        let source = Counting {
            calls: Arc::clone(&calls),
            hang: Duration::from_millis(400),
        };
        let mut tasks = tokio::task::JoinSet::new();
        let snaps = spawn(
            source,
            Duration::from_millis(20),
            Duration::from_millis(100),
            Arc::clone(&metrics),
            Judge::new(crate::health::Settings::default()).0,
            &mut tasks,
        )
        .unwrap();
        assert!(!snaps.latest().is_ready());

        let first = snaps.next_after(0).await;
        assert_eq!((first.seq, first.gpus.len()), (1, 1));

        // Call 2 hangs past the timeout: it is counted, its late result is discarded, and the
        // next snapshot is call 3's.
        let next = snaps.next_after(1).await;
        assert_eq!((next.seq, next.gpus.len()), (2, 3));
        assert_eq!(metrics.error_count(SampleError::Timeout), 1);
        assert!(calls.load(Ordering::SeqCst) >= 3);
    }

    /// Panics on its second call, as a bug in the NVML path would.
    struct Dying(u32);

    impl GpuSource for Dying {
        fn sample(&mut self) -> Sample {
            self.0 += 1;
            assert!(
                self.0 < 2,
                "the NVML thread dies here (a deliberate test panic)"
            );
            Sample {
                nvml: NvmlStatus {
                    up: true,
                    ..NvmlStatus::default()
                },
                gpus: vec![GpuSample {
                    up: true,
                    ..GpuSample::default()
                }],
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_nvml_thread_is_published_and_then_nothing_is_awaited_in_a_loop() {
        let metrics = Arc::new(SamplerCounters::default());
        let mut tasks = tokio::task::JoinSet::new();
        let snaps = spawn(
            Dying(0),
            Duration::from_millis(10),
            Duration::from_secs(5),
            metrics,
            Judge::new(crate::health::Settings::default()).0,
            &mut tasks,
        )
        .unwrap();
        let first = snaps.next_after(0).await;
        assert!(first.nvml.up);
        let dead = snaps.next_after(first.seq).await;
        assert!(!dead.nvml.up && dead.gpus.is_empty(), "{dead:?}");
        // No newer sample will come: awaiting one waits (it once returned at once, and the
        // loops that await samples spun at full speed).
        let waited =
            tokio::time::timeout(Duration::from_millis(300), snaps.next_after(dead.seq)).await;
        assert!(waited.is_err(), "next_after returned on a dead sampler");
    }
}
