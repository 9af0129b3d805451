//! Native sidecars by what the nodes run, not what the API server runs.
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
//! Pure: the pool is what `cluster::watch_nodes` keeps (per node only its name, labels and
//! kubelet version). Nodes are read as [`NodeObject`], which deserializes only those fields: a
//! real Node is 10-20 KiB of image lists and conditions that kubelets rewrite all the time, and
//! the full typed `Node` cost a large deserializer in the binary and its work on every update.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use crate::facts::{ClusterFacts, NativeRule};

/// A Node as the injector reads it (from a watch, a list or a file): its metadata and kubelet
/// version; every other field is skipped while reading.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeObject {
    /// Name, labels, resource version (what the watch needs).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `status.nodeInfo.kubeletVersion`, when set.
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
}

impl NodeFacts {
    /// What the decision needs of a Node object.
    pub fn of(node: &NodeObject) -> Self {
        let version = node.status.node_info.as_ref().map(|i| i.kubelet_version.as_str());
        let labels = node.metadata.labels.clone().unwrap_or_default();
        NodeFacts::new(node.metadata.name.clone().unwrap_or_default(), labels, version.unwrap_or_default())
    }

    /// A node with its kubelet version as `status.nodeInfo.kubeletVersion` says it (`v1.37.1`).
    pub fn new(name: String, labels: BTreeMap<String, String>, kubelet_version: &str) -> Self {
        let mut parts = kubelet_version.trim().trim_start_matches('v').split('.');
        let number = |part: Option<&str>| -> Option<u32> {
            let digits: String = part?.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let kubelet = number(parts.next()).zip(number(parts.next()));
        NodeFacts { name, labels, kubelet }
    }
}

/// The cluster's nodes whose kubelet version can be read (the others say nothing), for the
/// decision; built once per change of the nodes, read on every pod admission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePool {
    nodes: Vec<NodeFacts>,
    /// The oldest kubelet of all: the answer for most pods, which say nothing about nodes.
    oldest: Option<(u32, u32)>,
}

impl NodePool {
    /// A pool of these nodes (those without a readable kubelet version are left out).
    pub fn new(nodes: impl IntoIterator<Item = NodeFacts>) -> Self {
        let nodes: Vec<NodeFacts> = nodes.into_iter().filter(|n| n.kubelet.is_some()).collect();
        let oldest = nodes.iter().filter_map(|n| n.kubelet).min();
        NodePool { nodes, oldest }
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

    /// The facts for `pod`: whether native sidecars start where it can run, and which rule said
    /// so. `api_server` holds for a pool without readable kubelet versions.
    pub fn facts_for(&self, pod: &Value, api_server: ClusterFacts) -> ClusterFacts {
        let Some(oldest_of_all) = self.oldest else {
            return api_server;
        };
        let known = &self.nodes;
        let spec = pod.get("spec");
        let facts = |version: (u32, u32), rule: fn((u32, u32), u32) -> NativeRule, nodes: usize| ClusterFacts {
            native_sidecars: crate::injection::native::supported_by(version),
            rule: rule(version, nodes as u32),
            sidecar_resize_policy: api_server.sidecar_resize_policy,
        };
        if let Some(name) = spec.and_then(|s| s.get("nodeName")).and_then(Value::as_str)
            && let Some(version) = known.iter().find(|n| n.name == name).and_then(|n| n.kubelet)
        {
            return facts(version, |v, _| NativeRule::NodeName { kubelet: v }, 1);
        }
        let constraints = Constraints::of(spec);
        if let Some(constraints) = constraints.filter(|c| c.limits()) {
            let fitting = known.iter().filter(|n| constraints.allow(n));
            let (count, version) = fitting.fold((0, None), |(count, oldest): (usize, Option<(u32, u32)>), n| {
                (count + 1, oldest.min(n.kubelet).or(n.kubelet))
            });
            if let Some(version) = version {
                return facts(version, |v, n| NativeRule::NodesAllowed { oldest: v, nodes: n }, count);
            }
        }
        facts(oldest_of_all, |v, n| NativeRule::OldestNode { oldest: v, nodes: n }, known.len())
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
        // Without a readable kubelet version, the API server's rule.
        let unreadable = NodePool::new([node("a", "x", "fake")]);
        assert_eq!(unreadable.facts_for(&json!({"spec": {}}), api), api);
        assert_eq!(NodePool::default().facts_for(&json!({"spec": {}}), api), api);
    }
}
