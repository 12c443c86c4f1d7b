//! The cloud boundary. Each cloud is one folder behind one interface: [`InstanceMetadata`], what
//! instance metadata says about this instance (identity, notices, tags); [`ControlPlane`], what
//! the instance's control plane (the cloud's API) does for an action (a pure plan of the
//! core's), each call an [`Operation`] carried out and followed to its end; and the pollers its
//! prices and budgets need. The decision step, the safety order, holds,
//! the audit log and `simulate` know no cloud: the executor and the watch speak only this.
//!
//! Nothing of a cloud is set up before it is configured: [`open`] makes the one the config
//! names, and its API clients, credentials and pollers start only once metadata names the
//! instance.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::task::JoinSet;

use crate::config::{CloudConfig, CloudKeys, Config, ConfigErrors, Listed};
use crate::rules::{Action, Lifecycle};

pub mod client;
pub mod follow;
pub mod metadata;
pub mod poll;
pub mod rest;

pub use gpuwatch_core::node::Node;
pub use gpuwatch_core::plan;
pub use metadata::MetadataError;

/// A boxed future: the interface is object-safe, and a cloud's calls are large futures that
/// are better kept off the worker's stack.
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An instance's tags, as name and value.
pub type Tags = Vec<(String, String)>;

/// How long a cloud's operation (a deallocate, a stop) is followed to its end, at most.
pub const FOLLOW_FOR: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// One cloud, as the list of them ([`CLOUDS`]) holds it: each cloud's folder exports one.
pub struct Provider {
    /// `[cloud] provider`'s value, and the `provider` label of `gpuwatch_node_info`.
    pub name: &'static str,
    /// Makes the cloud for the config; nothing is called until metadata is asked.
    pub open: fn(&Config) -> Arc<dyn InstanceMetadata>,
    /// What an action leaves the node as, as the cloud's plan says, or why it is refused:
    /// `gpuwatch simulate`'s answer, which calls nothing. What only the cloud's API knows is
    /// taken at its most common.
    pub rehearse: fn(&CloudConfig, Action, Option<Lifecycle>, plan::SpotStop) -> Rehearsal,
    /// Whether its calls start operations that gpuwatch follows to their end (for at most
    /// [`FOLLOW_FOR`]), which an action's time limit must allow for.
    pub follows_operations: bool,
    /// Its own keys, `[cloud.<name>]`: the config hands it its table at load, and it reads its
    /// settings from the section when it opens.
    pub keys: CloudKeys,
    /// Environment variables its clients read credentials from, which no command gpuwatch runs
    /// inherits.
    pub credentials: &'static [&'static str],
}

/// What a rehearsed action leaves the node as, or why the plan refuses it.
pub type Rehearsal = Result<plan::Down, String>;

/// The list of clouds: each line names a cloud's cargo feature (also its `[cloud] provider`
/// value) and its folder, which is compiled where the build holds the feature. [`CLOUDS`] holds
/// each, and the cloud where it is built.
macro_rules! clouds {
    ($($feature:literal => $folder:ident,)*) => {
        $(
            #[cfg(feature = $feature)]
            pub mod $folder;
        )*

        /// Every cloud gpuwatch acts on, and the cloud itself where this build holds it (each
        /// is a cargo feature): the only list of them.
        pub const CLOUDS: &[(&str, Option<&Provider>)] = &[$(
            ($feature, {
                #[cfg(feature = $feature)]
                const BUILT: Option<&Provider> = Some(&$folder::PROVIDER);
                #[cfg(not(feature = $feature))]
                const BUILT: Option<&Provider> = None;
                BUILT
            }),
        )*];
    };
}

clouds! {
    "aws" => aws,
    "azure" => azure,
    "gcp" => gcp,
    "alibaba" => alibaba,
}

/// The clouds this build holds, in the list's order.
pub fn providers() -> impl Iterator<Item = &'static Provider> {
    CLOUDS.iter().filter_map(|(_, p)| *p)
}

/// Every built cloud's credential variables: a command gpuwatch runs (an `exec` action, the
/// interruption hook) inherits none of them, whichever cloud the node is on.
pub fn credentials() -> Vec<&'static str> {
    providers().flat_map(|p| p.credentials).copied().collect()
}

/// The list as the config reads it: each cloud's name and, where built, its keys.
pub fn listed() -> Vec<Listed> {
    CLOUDS
        .iter()
        .map(|(name, p)| Listed {
            name,
            keys: p.map(|p| &p.keys),
        })
        .collect()
}

/// Reads and checks the config file at `path`, each cloud's section by the cloud.
pub fn load_config(path: &std::path::Path) -> Result<Config, ConfigErrors> {
    Config::load(path, &listed())
}

/// Checks config text (`path` names it in messages), each cloud's section by the cloud.
pub fn parse_config(text: &str, path: &std::path::Path) -> Result<Config, ConfigErrors> {
    Config::parse(text, path, &listed())
}

/// Reads the config for a command that needs only the state directory (see
/// [`Config::load_for_state`]).
pub fn load_config_for_state(path: &std::path::Path) -> Result<Config, ConfigErrors> {
    Config::load_for_state(path, &listed())
}

/// The cloud the config names, if any (and if this build holds it: the config refuses one it
/// does not).
pub fn provider(cloud: &CloudConfig) -> Option<&'static Provider> {
    providers().find(|p| Some(p.name) == cloud.provider)
}

/// What `action` leaves the node as on the configured cloud, as its plan says, or why it is
/// refused (see [`Provider::rehearse`]). With no cloud configured, the first of the list's
/// (EC2's where the build holds it, the most common: an on-demand instance, a one-time spot
/// request refused a stop), as if the config named it.
pub fn rehearse(
    cloud: &CloudConfig,
    action: Action,
    lifecycle: Option<Lifecycle>,
    spot_stop: plan::SpotStop,
) -> Rehearsal {
    match provider(cloud).or(providers().next()) {
        Some(p) => (p.rehearse)(cloud, action, lifecycle, spot_stop),
        // A build with no cloud at all: what the action means, as no cloud refuses it.
        None => Ok(match action {
            Action::Hibernate => plan::Down::Hibernated,
            Action::Terminate => plan::Down::Terminated,
            _ => plan::Down::Stopped,
        }),
    }
}

/// Why an instance action is refused on a node with no cloud configured.
pub fn no_provider() -> String {
    let names: Vec<String> = providers().map(|p| format!("\"{}\"", p.name)).collect();
    format!(
        "no cloud provider: set [cloud] provider ({}) to the cloud this instance runs on",
        names.join(", ")
    )
}

/// What a plan leaves the instance as: what its last step leaves, or its refusal.
pub fn leaves<S>(plan: plan::Plan<S>, step_leaves: fn(&S) -> Option<plan::Down>) -> Rehearsal {
    match plan {
        plan::Plan::Refuse(why) => Err(why),
        plan::Plan::Steps(steps) => Ok(steps
            .last()
            .and_then(step_leaves)
            .unwrap_or(plan::Down::Stopped)),
    }
}

/// The one cloud the config names, or none.
pub fn open(config: &Config) -> Option<Arc<dyn InstanceMetadata>> {
    provider(&config.cloud).map(|p| (p.open)(config))
}

/// What one cloud's instance metadata tells, and how its API is reached once it has named the
/// instance.
pub trait InstanceMetadata: Send + Sync {
    /// `aws`, `azure`: the `provider` label of `gpuwatch_node_info`.
    fn name(&self) -> &'static str;
    /// This instance, as instance metadata names it.
    fn identity(&self) -> Fut<'_, Result<Node, MetadataError>>;
    /// An interruption notice in force, if any (a spot interruption on EC2; a `Preempt` or
    /// `Terminate` event for this VM on Azure). It blocks every action.
    fn interruption(&self) -> Fut<'_, Result<Option<Notice>, MetadataError>>;
    /// Notices that block nothing (a rebalance recommendation, a scheduled reboot): each is
    /// logged and audited once.
    fn advice(&self) -> Fut<'_, Result<Vec<Notice>, MetadataError>>;
    /// The instance's tags, as metadata has them; empty when metadata carries none (then the
    /// API's [`ControlPlane::tags`] is read, where the cloud has one).
    fn tags(&self) -> Fut<'_, Result<Tags, MetadataError>>;
    /// Where the instance's tags are read from, for people (`instance metadata tags, or
    /// ec2:DescribeInstances`).
    fn tag_sources(&self) -> &'static str;
    /// Registers this cloud's own series (AWS: CloudWatch publishing's).
    fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }
    /// Starts the API for `node`, and the price, budget and metric pollers the config asks of
    /// this cloud, in `tasks`.
    fn connect(
        &self,
        node: &Node,
        link: Link<'_>,
        tasks: &mut JoinSet<()>,
    ) -> Arc<dyn ControlPlane>;
}

/// What a cloud's pollers are handed when it connects.
pub struct Link<'a> {
    pub config: &'a Config,
    pub snapshots: &'a crate::gpu::sampler::Snapshots,
    pub readings: Arc<dyn Readings>,
}

/// Where a cloud's pollers hand what they learn: prices and budget readings, for the cost side.
pub trait Readings: Send + Sync {
    /// A price learnt, in USD per hour. One more than twentyfold from the last of its kind is
    /// implausible, and unknown.
    fn price(&self, kind: PriceKind, usd_per_hour: f64);
    /// A price the poller found implausible itself (far from every other row the price list
    /// gives the same size): the price of `kind` is unknown, counted, and said once with both
    /// figures.
    fn implausible(&self, kind: PriceKind, usd_per_hour: f64, beside: f64);
    /// A price known before the cloud's API answers (a built-in table's, of this instance's
    /// type): a first answer of `kind` far from it is implausible, never believed.
    fn baseline(&self, kind: PriceKind, usd_per_hour: f64);
    /// The instance's lifecycle, where the cloud tells it only through its API, after
    /// identity (Alibaba Cloud's `SpotStrategy`): read again until it is known.
    fn lifecycle(&self, lifecycle: crate::rules::Lifecycle);
    /// A cloud budget's answer (`name` is gpuwatch's name for it): its reading, and when its
    /// period ends.
    fn budget(&self, name: &str, reading: crate::cost::budget::Reading, period_end: f64);
}

/// Which price a poller learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriceKind {
    /// The spot market's price of a spot instance (kept across restarts).
    Spot,
    /// The cloud's price list's (the Pricing API, Azure's Retail Prices).
    List,
    /// A dated table's, built in (Compute Engine's).
    Table,
}

/// A notice from instance metadata. `key` tells one notice from the next (a hook runs once per
/// interruption); `kind` names it in the log and the audit log.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub key: String,
    pub kind: NoticeKind,
    /// When it takes effect (or was issued), in seconds since the epoch.
    pub time: f64,
    /// What the cloud says it is, for people.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoticeKind {
    /// The instance will be taken away: it blocks every action (each cloud's notice: see its
    /// `interruption`).
    Interruption,
    /// The cloud says the instance is at elevated risk of interruption, and advises moving its
    /// work (EC2's rebalance recommendation): it blocks nothing.
    AtRisk,
    /// Another scheduled event, by the cloud's name for its type (Azure's `Freeze`, `Reboot`,
    /// `Redeploy`).
    Event(String),
}

/// The instance's control plane: the cloud's API, for this one instance.
pub trait ControlPlane: Send + Sync {
    /// The instance's tags read through the API, for a cloud whose metadata may carry none
    /// (EC2 with metadata tags off); `None` where metadata is the only source.
    fn tags(&self) -> Option<Fut<'_, Result<Tags, CloudError>>>;
    /// The instance's state as the cloud names it (`running`, `stopped`, `deallocated`...).
    fn state(&self) -> Fut<'_, Result<Option<String>, CloudError>>;
    /// What `action` means here: the core's plan for this cloud, with what it needs read
    /// first (a spot request, a VM's hibernation setting).
    fn plan(
        &self,
        action: Action,
        spot_stop: plan::SpotStop,
    ) -> Fut<'_, Result<plan::Plan<Box<dyn Operation>>, CloudError>>;
    /// Stamps the instance with `gpuwatch:action` and `gpuwatch:rule`, before it acts.
    fn tag_action<'a>(
        &'a self,
        action: &'a str,
        rule: &'a str,
    ) -> Fut<'a, Result<Call, CloudError>>;
    /// Publishes a budget alert to a topic, where the cloud has topics (SNS on AWS); `None`
    /// where it has none.
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        subject: &'a str,
        text: &'a str,
    ) -> Option<Fut<'a, Result<Option<String>, CloudError>>> {
        let _ = (topic, subject, text);
        None
    }
    /// What to grant when the cloud denies a call, for the log.
    fn grant_hint(&self) -> &'static str;
}

/// One operation: a call of a plan, carried out (and followed to its end where the cloud
/// answers with an operation of its own).
pub trait Operation: Send + Sync {
    /// The call, as the audit log names it (`StopInstances (hibernate)`, `Deallocate`).
    fn describe(&self) -> String;
    /// What the instance is once it has run, for `simulate` and the log.
    fn leaves(&self) -> Option<plan::Down>;
    /// Makes the call, following it to its end where the cloud answers before it is done.
    fn run(&self) -> Fut<'_, Result<Call, CloudError>>;
}

/// A call that succeeded: its name for the audit log, and the cloud's id for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub operation: String,
    pub request_id: Option<String>,
}

/// A cloud call that failed, with what a person needs to act on it.
/// Shown, it is scrubbed of every credential the daemon holds (`redact::scrub`): a cloud's
/// words may quote what it was sent, and a poller's log line shows it as it is.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{operation}: {}", crate::redact::scrub(.message))]
pub struct CloudError {
    pub operation: &'static str,
    pub kind: ErrorKind,
    pub message: String,
    pub request_id: Option<String>,
    /// How long the cloud asked to be left alone before the call is tried again (its
    /// `Retry-After`), where it said: it sets the pace of the retries.
    pub retry_after: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Throttling, a 5xx, a timeout, no connection, or an operation of the cloud's own still
    /// running on the instance: worth retrying.
    Retryable,
    /// Credentials or permissions: retrying will not help.
    AccessDenied,
    /// The cloud refuses the call for a limit of its own on the instance (50 tags on Azure,
    /// 64 labels on Compute Engine, 20 on ECS): the call is refused, not what follows it. A
    /// refused `gpuwatch:action` stamp is recorded, and the action goes on.
    Limit,
    /// Anything else, such as an instance in the wrong state.
    Other,
}

impl ErrorKind {
    /// What an HTTP status means by itself, on an API that speaks HTTP as its spec says
    /// (Resource Manager, Compute Engine): throttling (429) and 5xx are retried, 401 and 403
    /// are permissions, the rest is the instance's state or the request. Each cloud reads its
    /// own error codes first (another operation in the way, a tag limit, a spent rate quota);
    /// ECS, which answers 403 for an instance's state, reads its codes alone.
    pub fn of_status(status: u16) -> ErrorKind {
        match status {
            429 | 500..=599 => ErrorKind::Retryable,
            401 | 403 => ErrorKind::AccessDenied,
            _ => ErrorKind::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `simulate` follows the configured cloud's plan: a spot stop is refused on EC2 (a
    /// one-time request cannot stop) and deallocates on Azure; Compute Engine and ECS never
    /// hibernate.
    #[test]
    #[cfg(all(
        feature = "aws",
        feature = "azure",
        feature = "gcp",
        feature = "alibaba"
    ))]
    fn a_rehearsal_follows_the_configured_cloud_s_plan() {
        use crate::config::SpotStop;
        let spot = Some(Lifecycle::Spot);
        let rehearse = |provider: &str, action| {
            let config = parse_config(
                &format!("[cloud]\nprovider = \"{provider}\"\n"),
                std::path::Path::new("t.toml"),
            )
            .unwrap();
            rehearse(&config.cloud, action, spot, SpotStop::Refuse)
        };
        assert!(rehearse("aws", Action::Stop)
            .unwrap_err()
            .contains("one-time spot"));
        assert_eq!(rehearse("azure", Action::Stop), Ok(plan::Down::Stopped));
        assert_eq!(
            rehearse("azure", Action::Terminate),
            Ok(plan::Down::Terminated)
        );
        assert_eq!(rehearse("gcp", Action::Stop), Ok(plan::Down::Stopped));
        assert!(rehearse("gcp", Action::Hibernate).is_err());
        assert!(rehearse("alibaba", Action::Hibernate).is_err());
        assert_eq!(
            rehearse("alibaba", Action::Terminate),
            Ok(plan::Down::Terminated)
        );
    }

    #[test]
    fn a_status_means_what_http_says() {
        for (status, kind) in [
            (429, ErrorKind::Retryable),
            (500, ErrorKind::Retryable),
            (503, ErrorKind::Retryable),
            (599, ErrorKind::Retryable),
            (401, ErrorKind::AccessDenied),
            (403, ErrorKind::AccessDenied),
            (400, ErrorKind::Other),
            (404, ErrorKind::Other),
            (409, ErrorKind::Other),
            (600, ErrorKind::Other),
        ] {
            assert_eq!(ErrorKind::of_status(status), kind, "{status}");
        }
    }

    /// The list is the only one: every cloud on it is a `[cloud] provider` the config takes,
    /// opened and rehearsed as itself, and no other name is taken.
    #[test]
    fn every_provider_on_the_list_is_one_the_config_takes() {
        let parse = |name: &str| {
            parse_config(
                &format!("[cloud]\nprovider = \"{name}\"\n"),
                std::path::Path::new("t.toml"),
            )
        };
        for p in providers() {
            let config = parse(p.name).unwrap();
            assert_eq!(provider(&config.cloud).map(|q| q.name), Some(p.name));
            assert_eq!(open(&config).unwrap().name(), p.name);
        }
        assert!(provider(&parse("none").unwrap().cloud).is_none());
        // With no cloud, an action is refused naming every cloud the build holds.
        let refusal = no_provider();
        assert!(providers().all(|p| refusal.contains(&format!("\"{}\"", p.name))));
        assert!(parse("nonesuch").is_err());
        let names: Vec<&str> = CLOUDS.iter().map(|(name, _)| *name).collect();
        for (name, p) in CLOUDS {
            assert!(p.is_none_or(|p| p.name == *name), "{name}");
        }
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    /// Each cloud is a cargo feature: a provider this build holds loads, and one it left out
    /// is refused at load, naming the key and the feature. (`scripts/test` runs this test in
    /// a build with one cloud alone, too.)
    #[test]
    fn a_cloud_left_out_of_the_build_is_refused_at_load() {
        let built = [
            ("aws", cfg!(feature = "aws")),
            ("azure", cfg!(feature = "azure")),
            ("gcp", cfg!(feature = "gcp")),
            ("alibaba", cfg!(feature = "alibaba")),
        ];
        for (name, built) in built {
            let loaded = parse_config(
                &format!("[cloud]\nprovider = \"{name}\"\n"),
                std::path::Path::new("t.toml"),
            );
            match loaded {
                Ok(c) => assert!(built && c.cloud.provider == Some(name), "{name}"),
                Err(e) => {
                    let said = e.to_string();
                    assert!(!built, "{name}: {said}");
                    assert!(
                        said.contains("cloud.provider")
                            && said.contains(&format!(
                                "\"{name}\" is not built into this gpuwatch: build it with `--features {name}`"
                            )),
                        "{said}"
                    );
                }
            }
        }
    }

    /// A command gpuwatch runs inherits no cloud's credentials: AWS's SDK reads its keys from
    /// the environment, and an `exec` action or the interruption hook gets none of them.
    #[cfg(feature = "aws")]
    #[tokio::test]
    async fn a_command_inherits_no_cloud_s_credentials() {
        std::env::set_var(
            "AWS_CONTAINER_AUTHORIZATION_TOKEN",
            "cloud-secret-not-passed",
        );
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("env");
        let argv = ["/bin/sh", "-c", &format!("env > {}", out.display())].map(String::from);
        let timeout = std::time::Duration::from_secs(10);
        let status = crate::exec::run(&argv, &[], &credentials(), timeout).await;
        assert!(status.unwrap().success());
        let env = std::fs::read_to_string(&out).unwrap();
        assert!(env.contains("PATH="), "{env}");
        assert!(!env.contains("cloud-secret-not-passed"), "{env}");
    }
}
