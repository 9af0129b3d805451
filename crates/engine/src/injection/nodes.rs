//! Native sidecars and image volumes by what the nodes run, not what the API server runs.
//!
//! An init container with `restartPolicy: Always` needs the **kubelet** to be 1.29 or newer; the API
//! server's version says nothing about the nodes (a 1.29 control plane with 1.28 nodes is an
//! ordinary upgrade in progress, and there such a pod never starts). So `sidecarMode: auto` is
//! decided from the kubelet versions of the nodes the pod can run on:
//! 1. its `spec.nodeName`, when set and known;
//! 2. else the nodes its `nodeSelector` and required node affinity allow, where that is cheap to
//!    tell: `In`, `NotIn`, `Exists`, `DoesNotExist` on labels and `metadata.name` fields (what a
//!    DaemonSet's pods carry); a pod using anything else (`Gt`, `Lt`) counts as able to run
//!    anywhere;
//! 3. else (or when no known node fits) the oldest node;
//! 4. and without any node whose kubelet version can be read, the API server's version.
//!
//! The same nodes decide whether a template's image volumes mount there (`image_volumes`: every
//! one of them must have a kubelet and a container runtime that support them).
//!
//! Pure: the pool is what `cluster::watch_nodes` keeps (per node only its name, labels, kubelet
//! version and container runtime). Nodes are read as [`NodeObject`], which deserializes only those fields: a
//! real Node is 10-20 KiB of image lists and conditions that kubelets rewrite all the time, and
//! the full typed `Node` cost a large deserializer in the binary and its work on every update.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use crate::facts::{ClusterFacts, NativeRule};
use crate::injection::image_volumes::{self, ImageVolumeSupport, RuntimeVersion};

/// A Node as the injector reads it (from a watch, a list or a file): its metadata and kubelet
/// version; every other field is skipped while reading.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeObject {
    /// Name, labels, resource version (what the watch needs).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `status.nodeInfo.kubeletVersion` and `containerRuntimeVersion`, when set.
    #[serde(default)]
    status: NodeObjectStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeObjectStatus {
    #[serde(default)]
    node_info: Option<NodeObjectInfo>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeObjectInfo {
    #[serde(default)]
    kubelet_version: String,
    #[serde(default)]
    container_runtime_version: String,
}

impl kube_core::Resource for NodeObject {
    type DynamicType = ();
    type Scope = kube_core::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Node")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("nodes")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the decision needs of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// Node name.
    pub name: String,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Kubelet `(major, minor)`, when its version can be read.
    pub kubelet: Option<(u32, u32)>,
    /// Its container runtime (`status.nodeInfo.containerRuntimeVersion`).
    pub runtime: RuntimeVersion,
}

impl NodeFacts {
    /// What the decision needs of a Node object.
    pub fn of(node: &NodeObject) -> Self {
        let info = node.status.node_info.as_ref();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let mut facts = NodeFacts::new(
            node.metadata.name.clone().unwrap_or_default(),
            labels,
            info.map(|i| i.kubelet_version.as_str()).unwrap_or_default(),
        );
        facts.runtime = RuntimeVersion::parse(info.map(|i| i.container_runtime_version.as_str()).unwrap_or_default());
        facts
    }

    /// A node with its kubelet version as `status.nodeInfo.kubeletVersion` says it (`v1.37.1`),
    /// and no container runtime reported.
    pub fn new(name: String, labels: BTreeMap<String, String>, kubelet_version: &str) -> Self {
        let kubelet = image_volumes::major_minor(kubelet_version);
        NodeFacts { name, labels, kubelet, runtime: RuntimeVersion::parse("") }
    }

    /// The node with this container runtime (`containerd://2.2.0`).
    pub fn with_runtime(self, runtime: &str) -> Self {
        NodeFacts { runtime: RuntimeVersion::parse(runtime), ..self }
    }

    /// What the node supports of image volumes (a node without a readable kubelet is not in a
    /// pool).
    fn image_volumes(&self) -> ImageVolumeSupport {
        ImageVolumeSupport::of_node(self.kubelet.unwrap_or_default(), self.runtime)
    }
}

/// The cluster's nodes whose kubelet version can be read (the others say nothing), for the
/// decision; built once per change of the nodes, read on every pod admission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePool {
    nodes: Vec<NodeFacts>,
    /// The oldest kubelet of all: the answer for most pods, which say nothing about nodes.
    oldest: Option<(u32, u32)>,
    /// What every node supports of image volumes, likewise.
    image_volumes_everywhere: Option<ImageVolumeSupport>,
}

impl NodePool {
    /// A pool of these nodes (those without a readable kubelet version are left out).
    pub fn new(nodes: impl IntoIterator<Item = NodeFacts>) -> Self {
        let nodes: Vec<NodeFacts> = nodes.into_iter().filter(|n| n.kubelet.is_some()).collect();
        let oldest = nodes.iter().filter_map(|n| n.kubelet).min();
        let image_volumes_everywhere = nodes.iter().map(NodeFacts::image_volumes).reduce(ImageVolumeSupport::and);
        NodePool { nodes, oldest, image_volumes_everywhere }
    }

    /// The oldest kubelet version.
    pub fn oldest(&self) -> Option<(u32, u32)> {
        self.oldest
    }

    /// How many nodes report a readable kubelet version.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The facts for `pod`: whether native sidecars start and image volumes mount where it can
    /// run, and which rule said so. `api_server` holds for a pool without readable kubelet
    /// versions.
    pub fn facts_for(&self, pod: &Value, api_server: ClusterFacts) -> ClusterFacts {
        let (Some(oldest_of_all), Some(everywhere)) = (self.oldest, self.image_volumes_everywhere) else {
            return api_server;
        };
        let known = &self.nodes;
        let spec = pod.get("spec");
        let facts = |version: (u32, u32), image_volumes: ImageVolumeSupport, rule: NativeRule| ClusterFacts {
            native_sidecars: crate::injection::native::supported_by(version),
            rule,
            sidecar_resize_policy: api_server.sidecar_resize_policy,
            image_volumes,
        };
        if let Some(name) = spec.and_then(|s| s.get("nodeName")).and_then(Value::as_str)
            && let Some(node) = known.iter().find(|n| n.name == name)
            && let Some(version) = node.kubelet
        {
            return facts(version, node.image_volumes(), NativeRule::NodeName { kubelet: version });
        }
        let constraints = Constraints::of(spec);
        if let Some(constraints) = constraints.filter(|c| c.limits()) {
            let mut fitting = known.iter().filter(|n| constraints.allow(n));
            if let Some(first) = fitting.next() {
                let (mut count, mut oldest, mut image_volumes) = (1, first.kubelet, first.image_volumes());
                for node in fitting {
                    count += 1;
                    oldest = oldest.min(node.kubelet).or(node.kubelet);
                    image_volumes = image_volumes.and(node.image_volumes());
                }
                if let Some(version) = oldest {
                    let rule = NativeRule::NodesAllowed { oldest: version, nodes: count };
                    return facts(version, image_volumes, rule);
                }
            }
        }
        let rule = NativeRule::OldestNode { oldest: oldest_of_all, nodes: known.len() as u32 };
        facts(oldest_of_all, everywhere, rule)
    }
}

/// What a pod says about where it may run, as far as it is cheap to tell.
struct Constraints<'p> {
    selector: Option<&'p serde_json::Map<String, Value>>,
    /// Required node affinity terms (any one must hold); `None` when absent.
    terms: Option<&'p Vec<Value>>,
}

impl<'p> Constraints<'p> {
    /// `None` when the pod uses something not evaluated here (it may run anywhere).
    fn of(spec: Option<&'p Value>) -> Option<Self> {
        let spec = spec?;
        let selector = spec.get("nodeSelector").and_then(Value::as_object);
        let terms = spec
            .get("affinity")
            .and_then(|a| a.get("nodeAffinity"))
            .and_then(|a| a.get("requiredDuringSchedulingIgnoredDuringExecution"))
            .and_then(|r| r.get("nodeSelectorTerms"))
            .and_then(Value::as_array);
        let cheap = |requirement: &Value| {
            matches!(
                requirement.get("operator").and_then(Value::as_str),
                Some("In" | "NotIn" | "Exists" | "DoesNotExist")
            )
        };
        let all_cheap = terms.into_iter().flatten().all(|term| {
            let expressions = term.get("matchExpressions").and_then(Value::as_array).into_iter().flatten();
            let fields = term.get("matchFields").and_then(Value::as_array).into_iter().flatten();
            expressions.chain(fields).all(cheap)
        });
        all_cheap.then_some(Constraints { selector, terms })
    }

    fn limits(&self) -> bool {
        self.selector.is_some_and(|s| !s.is_empty()) || self.terms.is_some_and(|t| !t.is_empty())
    }

    fn allow(&self, node: &NodeFacts) -> bool {
        let selected =
            self.selector.into_iter().flatten().all(|(k, v)| node.labels.get(k).map(String::as_str) == v.as_str());
        let in_terms = match self.terms {
            None => true,
            Some(terms) if terms.is_empty() => true,
            Some(terms) => terms.iter().any(|term| {
                let requirements = |field: &str| term.get(field).and_then(Value::as_array).into_iter().flatten();
                requirements("matchExpressions").all(|r| requirement(r, |key| node.labels.get(key).map(String::as_str)))
                    && requirements("matchFields")
                        .all(|r| requirement(r, |key| (key == "metadata.name").then_some(node.name.as_str())))
            }),
        };
        selected && in_terms
    }
}

fn requirement<'n>(requirement: &Value, value_of: impl Fn(&str) -> Option<&'n str>) -> bool {
    let key = requirement.get("key").and_then(Value::as_str).unwrap_or_default();
    let values: Vec<&str> =
        requirement.get("values").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let value = value_of(key);
    match requirement.get("operator").and_then(Value::as_str) {
        Some("In") => value.is_some_and(|v| values.contains(&v)),
        Some("NotIn") => !value.is_some_and(|v| values.contains(&v)),
        Some("Exists") => value.is_some(),
        Some("DoesNotExist") => value.is_none(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::injection::image_volumes::Limit;

    fn node(name: &str, pool: &str, version: &str) -> NodeFacts {
        NodeFacts::new(name.into(), [("pool".to_owned(), pool.to_owned())].into(), version)
    }

    #[test]
    fn a_node_is_read_for_its_name_labels_and_kubelet_only() {
        let real = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "worker-1", "resourceVersion": "42", "labels": {"pool": "a", "kubernetes.io/arch": "arm64"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "10.0.1.0/24"},
            "status": {
                "nodeInfo": {"kubeletVersion": "v1.37.1", "containerRuntimeVersion": "containerd://2.2.0", "osImage": "Debian"},
                "images": [{"names": ["registry.example/app@sha256:0", "registry.example/app:1"], "sizeBytes": 123}],
                "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-25T00:00:00Z"}],
                "allocatable": {"cpu": "4", "memory": "16Gi"}
            }
        });
        let node: NodeObject = serde_json::from_value(real).unwrap();
        assert_eq!(kube_core::ResourceExt::resource_version(&node).as_deref(), Some("42"));
        let facts = NodeFacts::of(&node);
        assert_eq!((facts.name.as_str(), facts.kubelet, facts.labels.len()), ("worker-1", Some((1, 37)), 2));
        assert_eq!(facts.runtime, RuntimeVersion::parse("containerd://2.2.0"));
        assert!(facts.runtime.applies_sub_path());
        // A node that has not reported yet, and one whose status says nothing readable.
        for bare in
            [json!({"metadata": {"name": "new"}}), json!({"metadata": {"name": "odd"}, "status": {"nodeInfo": {}}})]
        {
            let node: NodeObject = serde_json::from_value(bare).unwrap();
            assert_eq!(NodeFacts::of(&node).kubelet, None);
        }
        assert!(serde_json::from_value::<NodeObject>(json!({"metadata": {"labels": "x"}})).is_err());
        assert_eq!(<NodeObject as kube_core::Resource>::url_path(&(), None), "/api/v1/nodes");
    }

    #[test]
    fn the_nodes_a_pod_can_run_on_decide() {
        let pool = NodePool::new([
            node("old-1", "old", "v1.28.15"),
            node("new-1", "new", "v1.37.1"),
            node("new-2", "new", "v1.31.0-eks-1"),
            node("odd", "new", "fake"),
        ]);
        let api = ClusterFacts::api_server(true);
        let affinity = |terms: Value| json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}});
        // (case, pod spec, native, rule)
        let cases = [
            ("no constraint: the oldest node", json!({}), false, NativeRule::OldestNode { oldest: (1, 28), nodes: 3 }),
            ("nodeName", json!({"nodeName": "new-1"}), true, NativeRule::NodeName { kubelet: (1, 37) }),
            (
                "unknown nodeName: the oldest",
                json!({"nodeName": "gone"}),
                false,
                NativeRule::OldestNode { oldest: (1, 28), nodes: 3 },
            ),
            (
                "nodeSelector on new nodes",
                json!({"nodeSelector": {"pool": "new"}}),
                true,
                NativeRule::NodesAllowed { oldest: (1, 31), nodes: 2 },
            ),
            (
                "nodeSelector on old nodes",
                json!({"nodeSelector": {"pool": "old"}}),
                false,
                NativeRule::NodesAllowed { oldest: (1, 28), nodes: 1 },
            ),
            (
                "nodeSelector nothing fits: the oldest",
                json!({"nodeSelector": {"pool": "gpu"}}),
                false,
                NativeRule::OldestNode { oldest: (1, 28), nodes: 3 },
            ),
            (
                "a DaemonSet pod's matchFields",
                affinity(json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["new-2"]}]}])),
                true,
                NativeRule::NodesAllowed { oldest: (1, 31), nodes: 1 },
            ),
            (
                "affinity NotIn old, or Exists",
                affinity(json!([{"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["old"]}]}])),
                true,
                NativeRule::NodesAllowed { oldest: (1, 31), nodes: 2 },
            ),
            (
                "two terms: either",
                affinity(json!([{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["old"]}]},
                                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["new-1"]}]}])),
                false,
                NativeRule::NodesAllowed { oldest: (1, 28), nodes: 2 },
            ),
            (
                "Gt is not evaluated: anywhere",
                affinity(json!([{"matchExpressions": [{"key": "pool", "operator": "Gt", "values": ["1"]}]}])),
                false,
                NativeRule::OldestNode { oldest: (1, 28), nodes: 3 },
            ),
        ];
        for (case, spec, native, rule) in cases {
            let facts = pool.facts_for(&json!({"spec": spec}), api);
            assert_eq!((facts.native_sidecars, facts.rule), (native, rule), "{case}");
        }
        // Image volumes: the same nodes decide, each by its kubelet and its runtime.
        let pool = NodePool::new([
            node("old-1", "old", "v1.34.2").with_runtime("containerd://2.2.0"),
            node("new-1", "new", "v1.37.1").with_runtime("containerd://2.2.9"),
            node("new-2", "new", "v1.36.0").with_runtime("containerd://2.1.5"),
            node("odd", "new", "fake").with_runtime("containerd://1.6.0"),
        ]);
        let limits = |spec: Value| {
            let facts = pool.facts_for(&json!({"spec": spec}), api).image_volumes;
            (facts.limit(false), facts.limit(true))
        };
        let old_kubelet = Some(Limit::Kubelet((1, 34)));
        let containerd_2_1 = Some(Limit::Runtime(RuntimeVersion::parse("containerd://2.1.5")));
        assert_eq!(limits(json!({})), (old_kubelet, old_kubelet), "anywhere: the old node");
        assert_eq!(limits(json!({"nodeName": "new-1"})), (None, None));
        assert_eq!(
            limits(json!({"nodeSelector": {"pool": "new"}})),
            (None, containerd_2_1),
            "the odd node does not count"
        );
        assert_eq!(limits(json!({"nodeName": "new-2"})), (None, containerd_2_1));
        // Without a readable kubelet version, the API server's rule.
        let unreadable = NodePool::new([node("a", "x", "fake")]);
        assert_eq!(unreadable.facts_for(&json!({"spec": {}}), api), api);
        assert_eq!(NodePool::default().facts_for(&json!({"spec": {}}), api), api);
    }
}
