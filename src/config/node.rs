//! `[node]` labels and `[cloud] tag_labels`: the labels `gpuwatch_node_info` carries, so that
//! spend, idle GPUs and pending actions can be summed by team or project with one join; and
//! `[kubernetes]`, which labels GPU series with the pods that hold them.

use std::collections::BTreeMap;

use super::*;

/// The labels `gpuwatch_node_info` always has, and the target labels Prometheus adds (which
/// would rename a label of the same name to `exported_*`): a label of the user's own may not
/// take them.
pub const NODE_INFO_LABELS: [&str; 7] = [
    "provider",
    "instance_id",
    "instance_type",
    "availability_zone",
    "lifecycle",
    "instance",
    "job",
];

/// The longest label value from the config or an instance tag (the longest tag value the
/// clouds allow is 256 characters).
pub const MAX_LABEL_VALUE: usize = 256;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeConfig {
    /// Static labels, by label name.
    pub labels: BTreeMap<String, String>,
    /// Instance tags to copy, each with the label name it becomes.
    pub tag_labels: Vec<TagLabel>,
}

/// One instance tag copied onto `gpuwatch_node_info`.
#[derive(Debug, Clone, PartialEq)]
pub struct TagLabel {
    /// The tag key, as the cloud has it (`cost-center`).
    pub tag: String,
    /// The label name it becomes (`cost_center`).
    pub label: String,
}

/// Whether `name` is a label name Prometheus accepts and gpuwatch may use.
fn label_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

/// The label name a tag key becomes: every character a label name cannot hold is `_`, and a
/// leading digit gets a `_` before it.
pub fn tag_label_name(tag: &str) -> String {
    let mut name: String = tag
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// Validates `[node] labels` and `[cloud] tag_labels` together: label names are unique among
/// themselves and `gpuwatch_node_info`'s own.
pub(super) fn validate_labels(
    node: &RawNode,
    tags: &[String],
    invalid: &mut impl FnMut(&str, String),
) -> Option<NodeConfig> {
    let mut ok = true;
    let mut taken: Vec<String> = NODE_INFO_LABELS.map(String::from).to_vec();
    for (name, value) in &node.labels {
        let key = format!("node.labels.{name}");
        if !label_name_ok(name) {
            invalid(
                &key,
                format!("\"{name}\" is not a label name: letters, digits and _, not first a digit, not __"),
            );
            ok = false;
        } else if taken.contains(name) {
            invalid(
                &key,
                format!("\"{name}\" is a label gpuwatch_node_info or Prometheus has already"),
            );
            ok = false;
        }
        if value.chars().count() > MAX_LABEL_VALUE || value.chars().any(char::is_control) {
            let mut shown: String = value.chars().take(32).collect();
            if shown.len() < value.len() {
                shown.push_str("...");
            }
            invalid(
                &key,
                format!("{shown:?} is not one line of at most {MAX_LABEL_VALUE} characters"),
            );
            ok = false;
        }
        taken.push(name.clone());
    }
    let mut tag_labels = Vec::new();
    for (i, tag) in tags.iter().enumerate() {
        let key = format!("cloud.tag_labels[{i}]");
        let label = tag_label_name(tag);
        if tag.is_empty() || tag.chars().count() > 128 || tag.chars().any(char::is_control) {
            invalid(&key, format!("{tag:?} is not an instance tag key"));
            ok = false;
        } else if !label_name_ok(&label) {
            invalid(
                &key,
                format!("\"{tag}\" would be the label \"{label}\", which is not a label name"),
            );
            ok = false;
        } else if taken.contains(&label) {
            invalid(
                &key,
                format!("\"{tag}\" would be the label \"{label}\", which is taken already"),
            );
            ok = false;
        } else {
            taken.push(label.clone());
            tag_labels.push(TagLabel {
                tag: tag.clone(),
                label,
            });
        }
    }
    ok.then(|| NodeConfig {
        labels: node.labels.clone(),
        tag_labels,
    })
}

/// `[kubernetes]`: where the kubelet's PodResources API is, and how often it is read.
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesConfig {
    /// `None`: pod attribution is off.
    pub pod_resources_socket: Option<PathBuf>,
    pub refresh: Duration,
}

impl RawKubernetes {
    pub(super) fn validate(
        &self,
        invalid: &mut impl FnMut(&str, String),
    ) -> Option<KubernetesConfig> {
        let socket = &self.pod_resources_socket;
        let socket = if socket.is_empty() {
            Some(None)
        } else if socket.starts_with('/') && !socket.chars().any(char::is_control) {
            Some(Some(PathBuf::from(socket)))
        } else {
            invalid(
                "kubernetes.pod_resources_socket",
                format!(
                    "{socket:?} is not an absolute path, such as \"/var/lib/kubelet/pod-resources/kubelet.sock\""
                ),
            );
            None
        };
        let refresh = duration(
            invalid,
            "kubernetes.refresh",
            &self.refresh,
            Duration::from_millis(100)..=Duration::from_secs(3600),
        );
        Some(KubernetesConfig {
            pod_resources_socket: socket?,
            refresh: refresh?,
        })
    }
}
