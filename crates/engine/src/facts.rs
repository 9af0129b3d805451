//! What the engine knows about the world outside the pod: the namespace and the cluster. The shell
//! fills these from a watched cache (webhook), from flags (CLI) or leaves them unknown.

use std::collections::BTreeMap;

use crate::injection::image_volumes::ImageVolumeSupport;
use crate::injection::node_features::FeatureReach;

/// Labels and annotations of the pod's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamespaceFacts {
    /// Namespace name.
    pub name: String,
    /// Namespace labels.
    pub labels: BTreeMap<String, String>,
    /// Namespace annotations.
    pub annotations: BTreeMap<String, String>,
    /// Whether the labels are known. When they are not (no cluster, no flags), the namespace counts
    /// as opted in: the API server's namespaceSelector has already filtered the request.
    pub labels_known: bool,
    /// On a cluster: why the namespace could be read neither from the watched cache nor by a
    /// direct lookup. Its labels are then unknown although they matter, so a template that
    /// chooses by them is never judged on them: the pod is refused, to be retried.
    pub unavailable: Option<String>,
}

impl NamespaceFacts {
    /// A namespace whose labels are not known.
    pub fn unknown(name: &str) -> Self {
        NamespaceFacts { name: name.to_owned(), labels_known: false, ..NamespaceFacts::default() }
    }

    /// A namespace with known labels and annotations.
    pub fn known(name: &str, labels: BTreeMap<String, String>, annotations: BTreeMap<String, String>) -> Self {
        NamespaceFacts { name: name.to_owned(), labels, annotations, labels_known: true, unavailable: None }
    }

    /// A namespace of a cluster that could not be read (`reason`): see [`NamespaceFacts::unavailable`].
    pub fn unavailable(name: &str, reason: String) -> Self {
        NamespaceFacts { unavailable: Some(reason), ..NamespaceFacts::unknown(name) }
    }
}

/// What the engine needs to know about the cluster, for one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterFacts {
    /// Whether init containers with `restartPolicy: Always` (native sidecars) start where the pod
    /// runs.
    pub native_sidecars: bool,
    /// What decided it (see `nodes`).
    pub rule: NativeRule,
    /// Whether the API server accepts a `resizePolicy` on a native sidecar (1.33 or newer): only
    /// then does one get the default policy (`native::make_native`).
    pub sidecar_resize_policy: bool,
    /// Whether image volumes (and a `subPath` into one) work where the pod runs, decided by the
    /// same nodes as `native_sidecars` (see `image_volumes`).
    pub image_volumes: ImageVolumeSupport,
    /// What the nodes the pod can run on offer of the features nodes declare, decided by the
    /// same nodes (see `node_features`).
    pub node_features: FeatureReach,
    /// The API server's minor version, when known: the newest Pod Security policy version it
    /// applies (`checks::pod_security::Policy::of`); unknown means the newest the checks know.
    pub api_server_minor: Option<u32>,
}

/// The rule that decided whether native sidecars start (`explain` says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeRule {
    /// The API server's version (no node's kubelet version is known).
    ApiServer,
    /// The kubelet of the node the pod names (`spec.nodeName`).
    NodeName {
        /// Its `(major, minor)`.
        kubelet: (u32, u32),
    },
    /// The oldest kubelet among the nodes the pod's nodeSelector and node affinity allow.
    NodesAllowed {
        /// Its `(major, minor)`.
        oldest: (u32, u32),
        /// How many nodes.
        nodes: u32,
    },
    /// The oldest kubelet of all nodes (the pod may run anywhere, or on no known node).
    OldestNode {
        /// Its `(major, minor)`.
        oldest: (u32, u32),
        /// How many nodes.
        nodes: u32,
    },
}

impl std::fmt::Display for NativeRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NativeRule::ApiServer => {
                f.write_str("by the Kubernetes version (the API server's, or --kube-version), as no node's kubelet version is known")
            }
            NativeRule::NodeName { kubelet: (major, minor) } => {
                write!(f, "by the kubelet of the pod's node (spec.nodeName): {major}.{minor}")
            }
            NativeRule::NodesAllowed { oldest: (major, minor), nodes } => write!(
                f,
                "by the oldest kubelet among the {nodes} node(s) its nodeSelector and node affinity allow: {major}.{minor}"
            ),
            NativeRule::OldestNode { oldest: (major, minor), nodes } => {
                write!(f, "by the oldest kubelet of the cluster's {nodes} node(s): {major}.{minor}")
            }
        }
    }
}

impl NativeRule {
    /// The nodes that decided, without the kubelet version (what decides image volumes, whose
    /// limit may be a container runtime: `image_volumes`).
    pub fn nodes(&self) -> String {
        match self {
            NativeRule::ApiServer => "by the Kubernetes version, as no node's kubelet version is known".to_owned(),
            NativeRule::NodeName { .. } => "by the pod's node (spec.nodeName)".to_owned(),
            NativeRule::NodesAllowed { nodes, .. } => {
                format!("by the {nodes} node(s) its nodeSelector and node affinity allow")
            }
            NativeRule::OldestNode { nodes, .. } => format!("by the cluster's {nodes} node(s)"),
        }
    }
}

impl Default for ClusterFacts {
    /// Unknown clusters are assumed to be recent (native sidecars are GA since 1.33, on by
    /// default since 1.29).
    fn default() -> Self {
        ClusterFacts::api_server(true)
    }
}

impl ClusterFacts {
    /// Facts decided by the API server's version.
    pub fn api_server(native_sidecars: bool) -> Self {
        ClusterFacts {
            native_sidecars,
            rule: NativeRule::ApiServer,
            sidecar_resize_policy: true,
            image_volumes: ImageVolumeSupport::of_api_server(None),
            node_features: FeatureReach::UNKNOWN,
            api_server_minor: None,
        }
    }

    /// Facts for a Kubernetes version, as reported by `/version` (`major` "1", `minor` "33" or
    /// "33+").
    pub fn from_version(major: &str, minor: &str) -> Option<Self> {
        let major: u32 = major.trim().parse().ok()?;
        let minor: u32 = minor.trim().trim_end_matches('+').parse().ok()?;
        Some(ClusterFacts {
            sidecar_resize_policy: (major, minor) >= crate::model::native::SIDECAR_RESIZE_POLICY_SINCE,
            image_volumes: ImageVolumeSupport::of_api_server(Some((major, minor))),
            api_server_minor: (major == 1).then_some(minor),
            ..ClusterFacts::api_server(crate::model::native::supported_by((major, minor)))
        })
    }

    /// Facts for a version written `1.33` or `v1.33.2`.
    pub fn from_version_string(version: &str) -> Option<Self> {
        let mut parts = version.trim().trim_start_matches('v').split('.');
        Self::from_version(parts.next()?, parts.next()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_sidecars_start_at_1_29() {
        let cases = [("1", "28", false), ("1", "29", true), ("1", "33+", true), ("2", "0", true), ("1", "x", false)];
        for (major, minor, native) in cases {
            let facts = ClusterFacts::from_version(major, minor);
            assert_eq!(facts.map(|f| f.native_sidecars).unwrap_or(false), native, "{major}.{minor}");
        }
        // A resizePolicy on a native sidecar: accepted since 1.33.
        for (minor, accepted) in [("32", false), ("33", true), ("37", true)] {
            assert_eq!(ClusterFacts::from_version("1", minor).unwrap().sidecar_resize_policy, accepted, "1.{minor}");
        }
        let old = ClusterFacts {
            sidecar_resize_policy: false,
            image_volumes: ImageVolumeSupport::of_api_server(Some((1, 28))),
            api_server_minor: Some(28),
            ..ClusterFacts::api_server(false)
        };
        assert_eq!(ClusterFacts::from_version_string("v1.28.3"), Some(old));
        let recent = ClusterFacts::from_version_string("1.36").unwrap();
        assert_eq!(recent, ClusterFacts { api_server_minor: Some(36), ..ClusterFacts::api_server(true) });
        // Image volumes from 1.35; a subPath into one is not known to be applied without a node.
        assert!(ClusterFacts::from_version_string("1.34").unwrap().image_volumes.volumes.is_err());
        assert!(recent.image_volumes.volumes.is_ok() && recent.image_volumes.sub_path.is_err());
        // Image volumes name the nodes that decided, not a kubelet version (a runtime may be the limit).
        let allowed = NativeRule::NodesAllowed { oldest: (1, 36), nodes: 2 };
        assert_eq!(allowed.nodes(), "by the 2 node(s) its nodeSelector and node affinity allow");
        assert!(allowed.to_string().ends_with(": 1.36"));
        assert_eq!(ClusterFacts::from_version_string("banana"), None);
    }
}
