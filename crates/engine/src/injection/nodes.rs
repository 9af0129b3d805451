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
//!    anywhere, and an empty affinity term allows no node (as for the scheduler);
//! 3. else (or when no known node fits) the oldest node;
//! 4. and without any node whose kubelet version can be read, the API server's version.
//!
//! The same nodes decide whether a template's image volumes mount there (`image_volumes`: every
//! one of them must have a kubelet and a container runtime that support them).
//!
//! Pure. The node watch keeps [`KnownNodes`] (per node only its name, labels, kubelet version and
//! container runtime, with label strings shared between nodes) and publishes a [`NodePool`] built
//! from it, which answers for a pod with index lookups (`node_index`) rather than a scan: at 5,000
//! nodes a scan per admission would cost more than the rest of the decision. Nodes are read as
//! [`NodeObject`], which deserializes only those fields: a real Node is 10-20 KiB of image lists,
//! conditions and managed fields that kubelets rewrite all the time, and the full typed `Node` cost
//! a large deserializer in the binary and its work on every update.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use crate::facts::{ClusterFacts, NativeRule};
use crate::injection::image_volumes::{self, ImageVolumeSupport, RuntimeVersion};
use crate::injection::node_features::{FeatureReach, NodeFeatures};
use crate::injection::node_index::{Interner, LabelIndex, Labels, NodeSet};
use crate::lean::{NoAnnotations, lean_metadata};

/// A Node as the injector reads it (from a watch, a list or a file): its name, labels, resource
/// version and kubelet and runtime versions; every other field is skipped while reading.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeObject {
    /// Name, labels, resource version (what the watch needs); its annotations and managed fields
    /// (kilobytes on a real node, rewritten by every status update) are skipped.
    #[serde(default, deserialize_with = "lean_metadata::<_, NoAnnotations>")]
    pub metadata: ObjectMeta,
    /// `status.nodeInfo.kubeletVersion` and `containerRuntimeVersion`, and
    /// `status.declaredFeatures`, when set.
    #[serde(default)]
    status: NodeObjectStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeObjectStatus {
    #[serde(default)]
    node_info: Option<NodeObjectInfo>,
    #[serde(default)]
    declared_features: Option<Vec<String>>,
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
    /// What it offers of the features nodes declare (`node_features`).
    pub features: NodeFeatures,
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
        facts.features = NodeFeatures::of(node.status.declared_features.as_deref(), facts.kubelet);
        facts
    }

    /// A node with its kubelet version as `status.nodeInfo.kubeletVersion` says it (`v1.37.1`),
    /// no container runtime reported and no features declared.
    pub fn new(name: String, labels: BTreeMap<String, String>, kubelet_version: &str) -> Self {
        let kubelet = image_volumes::major_minor(kubelet_version);
        let features = NodeFeatures::of(None, kubelet);
        NodeFacts { name, labels, kubelet, runtime: RuntimeVersion::parse(""), features }
    }

    /// The node declaring these features (`status.declaredFeatures`).
    pub fn declaring(self, features: &[String]) -> Self {
        NodeFacts { features: NodeFeatures::of(Some(features), self.kubelet), ..self }
    }

    /// The node with this container runtime (`containerd://2.2.0`).
    pub fn with_runtime(self, runtime: &str) -> Self {
        NodeFacts { runtime: RuntimeVersion::parse(runtime), ..self }
    }
}

/// One node as [`KnownNodes`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KnownNode {
    /// The keys of the labels whose value is the node's own name (`kubernetes.io/hostname`, as
    /// a rule), kept apart so that the others are one set shared by the nodes of a group.
    named: Box<[Arc<str>]>,
    /// The other labels.
    shared: Labels,
    kubelet: Option<(u32, u32)>,
    runtime: RuntimeVersion,
    features: NodeFeatures,
}

impl KnownNode {
    /// Whether `facts` say the same as what is kept of the node `name`.
    fn says(&self, name: &str, facts: &NodeFacts) -> bool {
        let named = facts.labels.iter().filter(|(_, value)| *value == name).map(|(key, _)| key.as_str());
        let shared = facts.labels.iter().filter(|(_, value)| *value != name);
        self.kubelet == facts.kubelet
            && self.runtime == facts.runtime
            && self.features == facts.features
            && named.eq(self.named.iter().map(|key| &**key))
            && shared.map(|(k, v)| (k.as_str(), v.as_str())).eq(self.shared.iter().map(|(k, v)| (&**k, &**v)))
    }

    /// All its labels.
    fn labels<'n>(&'n self, name: &'n Arc<str>) -> impl Iterator<Item = (&'n Arc<str>, &'n Arc<str>)> {
        self.named.iter().map(move |key| (key, name)).chain(self.shared.iter().map(|(key, value)| (key, value)))
    }
}

/// Every node the watch has seen, readable kubelet version or not, as compactly as the decision
/// allows (about 0.3 KiB a node with a cloud provider's 20 labels); the pools are built from it. A
/// node's status heartbeat changes nothing kept here.
#[derive(Debug, Default)]
pub struct KnownNodes {
    nodes: BTreeMap<Arc<str>, KnownNode>,
    strings: Interner,
}

impl KnownNodes {
    /// Records what `facts` say of their node; whether anything the decision reads changed.
    pub fn upsert(&mut self, facts: &NodeFacts) -> bool {
        let name = facts.name.as_str();
        if self.nodes.get(name).is_some_and(|known| known.says(name, facts)) {
            return false;
        }
        let strings = &mut self.strings;
        let named =
            facts.labels.iter().filter(|(_, value)| *value == name).map(|(key, _)| strings.intern(key)).collect();
        let shared = strings
            .labels(facts.labels.iter().filter(|(_, value)| *value != name).map(|(k, v)| (k.as_str(), v.as_str())));
        let known =
            KnownNode { named, shared, kubelet: facts.kubelet, runtime: facts.runtime, features: facts.features };
        self.nodes.insert(strings.intern(name), known);
        true
    }

    /// Forgets a node; whether it was known.
    pub fn remove(&mut self, name: &str) -> bool {
        self.nodes.remove(name).is_some()
    }

    /// How many nodes are known.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The pool of the known nodes whose kubelet version can be read.
    pub fn pool(&mut self) -> NodePool {
        self.strings.forget_unused();
        let mut pool = NodePool::default();
        for (name, node) in &self.nodes {
            let Some(kubelet) = node.kubelet else { continue };
            let slot = pool.nodes.len() as u32;
            pool.names.insert(name.clone(), slot);
            pool.labels.add(slot, node.labels(name));
            let image_volumes = ImageVolumeSupport::of_node(kubelet, node.runtime);
            pool.nodes.push(PooledNode { kubelet, image_volumes, features: node.features });
        }
        let count = pool.nodes.len();
        pool.labels.seal(count);
        for (slot, node) in pool.nodes.iter().enumerate() {
            let kind = match pool.kinds.iter_mut().find(|(kind, _)| kind == node) {
                Some((_, members)) => members,
                None => {
                    pool.kinds.push((*node, NodeSet::empty(count)));
                    &mut pool.kinds.last_mut().expect("just pushed").1
                }
            };
            kind.insert(slot as u32);
        }
        // Oldest kubelet first: of the limits on image volumes, the one reported is that of the
        // oldest nodes (`ImageVolumeSupport::and` keeps the first it finds).
        pool.kinds.sort_by_key(|(kind, _)| kind.kubelet);
        pool.oldest = pool.kinds.first().map(|(kind, _)| kind.kubelet);
        pool.image_volumes_everywhere =
            pool.kinds.iter().map(|(kind, _)| kind.image_volumes).reduce(ImageVolumeSupport::and);
        pool
    }
}

/// What the decision reads of a node in a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PooledNode {
    kubelet: (u32, u32),
    image_volumes: ImageVolumeSupport,
    features: NodeFeatures,
}

/// The cluster's nodes whose kubelet version can be read (the others say nothing), indexed for
/// the decision; built once per change of the nodes, read on every pod admission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePool {
    /// By slot, in name order.
    nodes: Vec<PooledNode>,
    names: HashMap<Arc<str>, u32>,
    labels: LabelIndex,
    /// The nodes grouped by what the decision reads of them: a cluster has a few kubelet and
    /// runtime versions, so a set of allowed nodes is summed up by these groups, not node by node.
    kinds: Vec<(PooledNode, NodeSet)>,
    /// The oldest kubelet of all: the answer for most pods, which say nothing about nodes.
    oldest: Option<(u32, u32)>,
    /// What every node supports of image volumes, likewise.
    image_volumes_everywhere: Option<ImageVolumeSupport>,
}

impl NodePool {
    /// A pool of these nodes (those without a readable kubelet version are left out).
    pub fn new(nodes: impl IntoIterator<Item = NodeFacts>) -> Self {
        let mut known = KnownNodes::default();
        for node in nodes {
            known.upsert(&node);
        }
        known.pool()
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
        let spec = pod.get("spec");
        let reads = FeatureReach::scheduler_reads(api_server.api_server_minor);
        let reach =
            |kinds: &mut dyn Iterator<Item = &PooledNode>| FeatureReach::of(kinds.map(|kind| kind.features), reads);
        let facts = |version: (u32, u32), image_volumes: ImageVolumeSupport, node_features, rule| ClusterFacts {
            native_sidecars: crate::model::native::supported_by(version),
            rule,
            sidecar_resize_policy: api_server.sidecar_resize_policy,
            image_volumes,
            node_features,
            api_server_minor: api_server.api_server_minor,
        };
        if let Some(name) = spec.and_then(|s| s.get("nodeName")).and_then(Value::as_str)
            && let Some(&slot) = self.names.get(name)
        {
            let node = self.nodes[slot as usize];
            let rule = NativeRule::NodeName { kubelet: node.kubelet };
            return facts(node.kubelet, node.image_volumes, reach(&mut std::iter::once(&node)), rule);
        }
        if let Some(constraints) = Constraints::of(spec).filter(Constraints::limits) {
            let allowed = constraints.allowed(self);
            let kinds = || self.kinds.iter().filter(|(_, members)| members.intersects(&allowed)).map(|(kind, _)| kind);
            let mut rest = kinds();
            if let Some(first) = rest.next() {
                let (oldest, image_volumes) = rest
                    .fold((first.kubelet, first.image_volumes), |(oldest, support), kind| {
                        (oldest.min(kind.kubelet), support.and(kind.image_volumes))
                    });
                let rule = NativeRule::NodesAllowed { oldest, nodes: allowed.count() };
                return facts(oldest, image_volumes, reach(&mut kinds()), rule);
            }
        }
        let rule = NativeRule::OldestNode { oldest: oldest_of_all, nodes: self.nodes.len() as u32 };
        facts(oldest_of_all, everywhere, reach(&mut self.kinds.iter().map(|(kind, _)| kind)), rule)
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

    /// The pool's nodes that the selector and any one of the terms allow.
    fn allowed(&self, pool: &NodePool) -> NodeSet {
        let count = pool.nodes.len();
        let mut allowed = NodeSet::full(count);
        for (key, value) in self.selector.into_iter().flatten() {
            match value.as_str().and_then(|value| pool.labels.with_value(key, value)) {
                Some(members) => allowed.keep(members),
                None => return NodeSet::empty(count),
            }
        }
        if let Some(terms) = self.terms.filter(|terms| !terms.is_empty()) {
            let mut any = NodeSet::empty(count);
            for term in terms {
                any.union_with(&term_allows(term, pool));
            }
            allowed.intersect_with(&any);
        }
        allowed
    }
}

/// The nodes one node selector term allows: all of its requirements hold (a term without any
/// allows none).
fn term_allows(term: &Value, pool: &NodePool) -> NodeSet {
    let count = pool.nodes.len();
    let requirements = |field: &str| term.get(field).and_then(Value::as_array).into_iter().flatten();
    let mut sets = requirements("matchExpressions")
        .map(|r| requirement_allows(r, pool, Subject::Label))
        .chain(requirements("matchFields").map(|r| requirement_allows(r, pool, Subject::Field)));
    let Some(mut allowed) = sets.next() else { return NodeSet::empty(count) };
    for set in sets {
        allowed.intersect_with(&set);
    }
    allowed
}

/// What a requirement's key names: a node label, or a field (`metadata.name` is the one there is).
#[derive(Clone, Copy)]
enum Subject {
    Label,
    Field,
}

fn requirement_allows(requirement: &Value, pool: &NodePool, subject: Subject) -> NodeSet {
    let count = pool.nodes.len();
    let key = requirement.get("key").and_then(Value::as_str).unwrap_or_default();
    let values = requirement.get("values").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
    let with_one_of = |values: &mut dyn Iterator<Item = &str>| {
        let mut set = NodeSet::empty(count);
        for value in values {
            match subject {
                Subject::Label => pool.labels.with_value(key, value).into_iter().for_each(|members| set.add(members)),
                Subject::Field if key == "metadata.name" => {
                    pool.names.get(value).into_iter().for_each(|&slot| set.insert(slot))
                }
                Subject::Field => {}
            }
        }
        set
    };
    let with_any_value = || match subject {
        Subject::Label => {
            let mut set = NodeSet::empty(count);
            pool.labels.with_key(key).for_each(|members| set.add(members));
            set
        }
        Subject::Field if key == "metadata.name" => NodeSet::full(count),
        Subject::Field => NodeSet::empty(count),
    };
    match requirement.get("operator").and_then(Value::as_str) {
        Some("In") => with_one_of(&mut values.into_iter()),
        Some("NotIn") => with_one_of(&mut values.into_iter()).complement(),
        Some("Exists") => with_any_value(),
        Some("DoesNotExist") => with_any_value().complement(),
        // Not reached: `Constraints::of` lets only these four through.
        _ => NodeSet::full(count),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::injection::image_volumes::Limit;
    use crate::injection::node_features::{DeclaredBy, NodeFeature};

    fn node(name: &str, pool: &str, version: &str) -> NodeFacts {
        NodeFacts::new(name.into(), [("pool".to_owned(), pool.to_owned())].into(), version)
    }

    #[test]
    fn a_node_is_read_for_its_name_labels_and_kubelet_only() {
        let real = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "worker-1", "resourceVersion": "42", "labels": {"pool": "a", "kubernetes.io/arch": "arm64"},
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                         "managedFields": [{"manager": "kubelet", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]},
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
        assert!(node.metadata.annotations.is_none() && node.metadata.managed_fields.is_none(), "skipped");
        let facts = NodeFacts::of(&node);
        assert_eq!((facts.name.as_str(), facts.kubelet, facts.labels.len()), ("worker-1", Some((1, 37)), 2));
        assert_eq!(facts.runtime, RuntimeVersion::parse("containerd://2.2.0"));
        assert!(facts.runtime.applies_sub_path());
        assert_eq!(facts.features, NodeFeatures::of(None, Some((1, 37))), "declares nothing: by version");
        let mut declaring = node.clone();
        declaring.status.declared_features = Some(vec!["ExtendWebSocketsToKubelet".into()]);
        let declared = NodeFacts::of(&declaring).features;
        assert!(!declared.offers(NodeFeature::RestartAllContainers), "a 1.37 kubelet that does not list it");
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
    #[test]
    fn the_features_the_nodes_a_pod_can_run_on_declare_decide() {
        let restart_all = NodeFeature::RestartAllContainers;
        let all = ["InPlacePodLevelResourcesVerticalScaling".to_owned(), restart_all.declared_as().to_owned()];
        let pool = NodePool::new([
            node("declaring", "new", "v1.37.1").declaring(&all),
            node("declaring-not", "new", "v1.37.1").declaring(&all[..1]),
            node("silent-new", "silent", "v1.36.2"),
            node("silent-old", "old", "v1.34.0"),
        ]);
        let api = ClusterFacts::api_server(true);
        let reach = |spec: Value| pool.facts_for(&json!({ "spec": spec }), api).node_features;
        let selector = |pool: &str| json!({"nodeSelector": {"pool": pool}});
        // (pod spec, offered, how)
        let cases = [
            (json!({"nodeName": "declaring"}), true, DeclaredBy::All),
            (json!({"nodeName": "declaring-not"}), false, DeclaredBy::All),
            (selector("new"), true, DeclaredBy::All),
            // A 1.36 kubelet that declares nothing: the scheduler does not place the pod there.
            (selector("silent"), false, DeclaredBy::None),
            (selector("old"), false, DeclaredBy::None),
            (json!({}), true, DeclaredBy::Some),
        ];
        for (spec, offered, by) in cases {
            let reach = reach(spec.clone());
            assert_eq!((reach.offers(restart_all), reach.by), (offered, by), "{spec}");
        }
        let older_scheduler = ClusterFacts { api_server_minor: Some(35), ..api };
        let silent = json!({"spec": selector("silent")});
        assert!(pool.facts_for(&silent, older_scheduler).node_features.offers(restart_all), "by version");
        let without = NodePool::new([node("declaring-not", "new", "v1.37.1").declaring(&all[..1])]);
        assert!(!without.facts_for(&json!({"spec": {}}), api).node_features.offers(restart_all));
        assert_eq!(NodePool::default().facts_for(&json!({"spec": {}}), api).node_features, FeatureReach::UNKNOWN);
    }

    #[test]
    fn the_watch_keeps_a_node_once_and_only_what_the_decision_reads_changes_it() {
        let mut known = KnownNodes::default();
        let labels = |host: &str, zone: &str| -> BTreeMap<String, String> {
            [("kubernetes.io/hostname", host), ("topology.kubernetes.io/zone", zone)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let node = NodeFacts::new("n-1".into(), labels("n-1", "a"), "v1.36.2").with_runtime("containerd://2.2.1");
        assert!(known.upsert(&node), "a new node");
        assert!(!known.upsert(&node.clone()), "a heartbeat: the same facts");
        assert!(known.upsert(&NodeFacts { labels: labels("n-1", "b"), ..node.clone() }), "a label changed");
        assert!(known.upsert(&node.clone().with_runtime("containerd://2.1.0")), "the runtime changed");
        assert!(known.upsert(&node.clone().declaring(&[])), "it declares its features (none)");
        assert!(known.upsert(&NodeFacts { labels: labels("other", "a"), ..node.clone() }), "the hostname changed");
        assert!(known.upsert(&node.clone()));
        assert!(known.upsert(&NodeFacts::new("n-2".into(), labels("n-2", "a"), "unknown")), "unreadable, still known");
        assert_eq!((known.len(), known.pool().len()), (2, 1), "the pool holds readable nodes only");
        // Each name is its node's hostname; both nodes share one set of the other labels.
        assert_eq!(known.strings.len(), 6, "n-1, n-2, two keys, zone a, the set {{zone: a}}");
        assert_eq!(known.nodes["n-1"].labels(&"n-1".into()).count(), 2);
        assert!(known.remove("n-2") && !known.remove("n-2"));
        let pool = known.pool();
        assert_eq!(known.strings.len(), 5, "n-2 is forgotten: {:?}", known.strings);
        drop(pool);
        assert!(known.remove("n-1"));
        assert!(known.pool().is_empty());
        assert!(known.strings.is_empty() && known.is_empty());
    }

    /// The pool's answer, by its indexes, against the obvious scan of every node: for every
    /// nodeSelector and affinity term over a small universe of labels, the same nodes.
    #[test]
    fn the_indexed_pool_allows_exactly_the_nodes_a_scan_allows() {
        let keys = ["pool", "zone", "gpu"];
        let values = ["a", "b", "c"];
        // Every node of 3 keys, each absent or one of 2 values: 27 nodes, various kubelets.
        let mut nodes = Vec::new();
        for i in 0..27u32 {
            let mut labels = BTreeMap::new();
            for (k, key) in keys.iter().enumerate() {
                match (i / 3u32.pow(k as u32)) % 3 {
                    0 => {}
                    v => drop(labels.insert((*key).to_owned(), values[v as usize - 1].to_owned())),
                }
            }
            nodes.push(NodeFacts::new(format!("node-{i}"), labels, &format!("v1.{}.0", 28 + i % 5)));
        }
        let pool = NodePool::new(nodes.clone());
        let scan = |constraints: &Constraints| -> Vec<String> {
            nodes.iter().filter(|n| scan_allows(constraints, n)).map(|n| n.name.clone()).collect()
        };
        let mut by_slot: Vec<(u32, String)> = pool.names.iter().map(|(name, slot)| (*slot, name.to_string())).collect();
        by_slot.sort();
        let indexed = |constraints: &Constraints| -> Vec<String> {
            let allowed = constraints.allowed(&pool);
            let mut names: Vec<String> =
                by_slot.iter().filter(|(slot, _)| allowed.contains(*slot)).map(|(_, name)| name.clone()).collect();
            names.sort_by_key(|name| name.trim_start_matches("node-").parse::<u32>().unwrap_or(u32::MAX));
            names
        };
        let mut requirements = Vec::new();
        for operator in ["In", "NotIn", "Exists", "DoesNotExist"] {
            for key in ["pool", "zone", "missing"] {
                for set in [&[][..], &["a"][..], &["a", "b"][..], &["c"][..]] {
                    requirements.push(json!({"key": key, "operator": operator, "values": set}));
                }
            }
        }
        let fields = [
            json!({"key": "metadata.name", "operator": "In", "values": ["node-4", "node-13", "gone"]}),
            json!({"key": "metadata.name", "operator": "NotIn", "values": ["node-4"]}),
            json!({"key": "spec.unschedulable", "operator": "In", "values": ["node-4"]}),
        ];
        let mut checked = 0;
        for (i, first) in requirements.iter().enumerate() {
            // One requirement, two in a term, two terms, a field beside it, a nodeSelector beside it.
            let second = &requirements[(i * 7 + 3) % requirements.len()];
            let field = &fields[i % fields.len()];
            let specs = [
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [first]}]}}}}),
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [first, second]}]}}}}),
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [first]}, {"matchExpressions": [second]}]}}}}),
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [first], "matchFields": [field]}, {}]}}}}),
                json!({"nodeSelector": {"zone": "b", "pool": values[i % 3]}, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [first]}]}}}}),
            ];
            for spec in specs {
                let constraints = Constraints::of(Some(&spec)).expect("cheap operators only");
                assert_eq!(indexed(&constraints), scan(&constraints), "{spec}");
                checked += 1;
            }
        }
        assert_eq!(checked, 48 * 5);
    }

    /// The scan the index must agree with, written from the Kubernetes rules.
    fn scan_allows(constraints: &Constraints, node: &NodeFacts) -> bool {
        let label = |key: &str| node.labels.get(key).map(String::as_str);
        let selected = constraints.selector.into_iter().flatten().all(|(k, v)| label(k) == v.as_str());
        let holds = |requirement: &Value, value: Option<&str>| {
            let values: Vec<&str> =
                requirement["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            match requirement["operator"].as_str() {
                Some("In") => value.is_some_and(|v| values.contains(&v)),
                Some("NotIn") => !value.is_some_and(|v| values.contains(&v)),
                Some("Exists") => value.is_some(),
                Some("DoesNotExist") => value.is_none(),
                _ => unreachable!(),
            }
        };
        let in_terms = match constraints.terms {
            None => true,
            Some(terms) if terms.is_empty() => true,
            Some(terms) => terms.iter().any(|term| {
                let expressions = term["matchExpressions"].as_array().cloned().unwrap_or_default();
                let fields = term["matchFields"].as_array().cloned().unwrap_or_default();
                !(expressions.is_empty() && fields.is_empty())
                    && expressions.iter().all(|r| holds(r, label(r["key"].as_str().unwrap_or_default())))
                    && fields.iter().all(|r| holds(r, (r["key"] == "metadata.name").then_some(node.name.as_str())))
            }),
        };
        selected && in_terms
    }
}
