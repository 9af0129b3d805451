//! The drift watch's pod index: for every pod in the cluster, exactly what [`drift::classify`]
//! reads (its namespace, its labels and the annotations in [`drift::ANNOTATIONS_READ`]) and
//! nothing else, in a form whose cost per pod does not grow with what the pods carry.
//!
//! Pods made by one controller are nearly alike: the pods of a ReplicaSet have the same labels,
//! and pods injected with the same template versions the same status annotation. So a pod keeps
//! only its name and two shared pointers: one to its namespace's name and one to its *shape* (the
//! labels and read annotations, interned by content, their strings interned too). What a pod costs
//! is then its map slot (namespace pointer, name, shape pointer, list epoch: 48 bytes, at the
//! hash map's load factor) and its name's allocation; a pod with labels of its own (a
//! StatefulSet's `pod-name`, an indexed Job's completion index) adds one shape and its unique
//! strings. Drift is counted per (namespace, shape) group, not per pod.
//!
//! Fed from watch events: [`PodIndex::begin_list`], [`PodIndex::apply`] for every listed pod and
//! [`PodIndex::end_list`] for a (re-)list, which forgets the pods the list did not name by their
//! epoch instead of building a second index beside the first; then [`PodIndex::apply`] and
//! [`PodIndex::remove`] for the watch's changes.
//!
//! The watch reads pods as [`WatchedPod`]: metadata only (the API server sends
//! `PartialObjectMetadata`), and of it only the name, namespace, labels, resource version and the
//! read annotations; managed fields and every other annotation are skipped while decoding.
//!
//! [`drift::classify`]: crate::drift::classify
//! [`drift::ANNOTATIONS_READ`]: crate::drift::ANNOTATIONS_READ

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::drift::{ANNOTATIONS_READ, PodDrift, classify};
use crate::lean::{KeptAnnotations, lean_metadata};
use crate::{Engine, NamespaceFacts};

/// Drifted pods by (namespace, template, state): the `sidecar_injector_drifted_pods` gauge.
pub type DriftCounts = BTreeMap<(String, String, &'static str), i64>;

/// A pod as the drift watch reads it (from a metadata-only watch or list): its name, namespace,
/// labels, resource version and the annotations in [`ANNOTATIONS_READ`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatchedPod {
    /// What the index keeps of the pod's metadata, and its resource version for the watch.
    #[serde(default, deserialize_with = "lean_metadata::<_, ReadAnnotations>")]
    pub metadata: ObjectMeta,
}

/// The annotations drift reads.
struct ReadAnnotations;

impl KeptAnnotations for ReadAnnotations {
    const KEYS: &'static [&'static str] = &ANNOTATIONS_READ;
}

impl kube_core::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = kube_core::NamespaceResourceScope;

    /// Metadata-only requests: the API server sends `PartialObjectMetadata`, not the pod's spec.
    fn metadata_api() -> bool {
        true
    }
    fn kind(_: &()) -> Cow<'_, str> {
        Pod::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        Pod::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        Pod::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Pod::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Counts the drifted pods of `groups`, classifying each group once. `namespace` gives a
/// namespace's facts (`None`: not known yet, its pods are not counted); it is asked once per run
/// of consecutive groups in one namespace ([`PodIndex::groups`] orders them so), and only that
/// namespace's facts are held at a time: holding every namespace's labels and annotations at once
/// was a transient of ~1.2 KiB per namespace with pods (12 MiB at 10,000 namespaces, every count)
/// that the allocator kept as resident memory.
pub fn drift_counts(
    engine: &Engine,
    groups: &[PodGroup],
    mut namespace: impl FnMut(&str) -> Option<NamespaceFacts>,
) -> DriftCounts {
    let mut counts = DriftCounts::new();
    for same_namespace in groups.chunk_by(|a, b| a.namespace == b.namespace) {
        let name = &same_namespace[0].namespace;
        let Some(facts) = namespace(name) else { continue };
        for group in same_namespace {
            let (labels, annotations) = (group.shape.labels(), group.shape.annotations());
            let (templates, state): (Vec<String>, &'static str) = match classify(engine, &labels, &annotations, &facts)
            {
                PodDrift::Stale { templates } => (templates.into_iter().map(|t| t.name).collect(), "stale"),
                PodDrift::NotInjected { templates } => (templates, "not_injected"),
                PodDrift::Conflicts { templates } => (templates, "conflicts"),
                PodDrift::EnforcementAudit { templates } => (templates, "enforcement_audit"),
                PodDrift::Current | PodDrift::OutOfScope => continue,
            };
            for template in templates {
                *counts.entry((name.to_string(), template, state)).or_default() += group.pods as i64;
            }
        }
    }
    counts
}

/// A pod's labels and the annotations drift reads, sorted by key, strings shared.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    labels: Box<[(Arc<str>, Arc<str>)]>,
    annotations: Box<[(Arc<str>, Arc<str>)]>,
}

impl Shape {
    /// The labels, as the engine takes them.
    pub fn labels(&self) -> BTreeMap<String, String> {
        Self::map(&self.labels)
    }

    /// The annotations drift reads, as the engine takes them.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        Self::map(&self.annotations)
    }

    fn map(pairs: &[(Arc<str>, Arc<str>)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct PodKey {
    namespace: Arc<str>,
    name: Box<str>,
}

#[derive(Debug)]
struct PodEntry {
    shape: Arc<Shape>,
    /// The list that last named the pod (or the list in force when the watch reported it).
    epoch: u32,
}

/// Pods grouped for counting: the pods of one namespace with one shape.
#[derive(Debug, Clone)]
pub struct PodGroup {
    /// The namespace.
    pub namespace: Arc<str>,
    /// What every pod of the group has.
    pub shape: Arc<Shape>,
    /// How many pods.
    pub pods: usize,
}

/// Every pod's drift-relevant metadata (see the module doc).
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<PodKey, PodEntry>,
    strings: HashSet<Arc<str>>,
    shapes: HashSet<Arc<Shape>>,
    epoch: u32,
    synced: bool,
}

impl PodIndex {
    /// An empty index.
    pub fn new() -> PodIndex {
        PodIndex::default()
    }

    /// How many pods it holds.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether it holds no pod.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Whether a complete list has been applied (counts before that would be partial).
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// How many distinct shapes and strings it keeps (for the figures of the scale run).
    pub fn interned(&self) -> (usize, usize) {
        (self.shapes.len(), self.strings.len())
    }

    /// A (re-)list starts: pods it does not name are forgotten at [`PodIndex::end_list`].
    pub fn begin_list(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// A list is complete: forgets the pods it did not name.
    pub fn end_list(&mut self) {
        let epoch = self.epoch;
        self.pods.retain(|_, entry| entry.epoch == epoch);
        self.pods.shrink_to(self.pods.len() * 8 / 7);
        self.synced = true;
        self.prune();
    }

    /// A pod was listed, created or changed.
    pub fn apply(
        &mut self,
        namespace: &str,
        name: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) {
        // The watch reads no other annotation (`WatchedPod`); other callers may pass them all.
        let read = annotations.iter().filter(|(k, _)| ANNOTATIONS_READ.contains(&k.as_str()));
        let shape = Shape { labels: self.pairs(labels.iter()), annotations: self.pairs(read) };
        let shape = match self.shapes.get(&shape) {
            Some(known) => known.clone(),
            None => {
                let shape = Arc::new(shape);
                self.shapes.insert(shape.clone());
                shape
            }
        };
        let key = PodKey { namespace: self.intern(namespace), name: name.into() };
        self.pods.insert(key, PodEntry { shape, epoch: self.epoch });
    }

    /// A pod was deleted.
    pub fn remove(&mut self, namespace: &str, name: &str) {
        let Some(namespace) = self.strings.get(namespace).cloned() else { return };
        self.pods.remove(&PodKey { namespace, name: name.into() });
    }

    /// The pods grouped by namespace and shape, the groups of a namespace next to each other.
    pub fn groups(&self) -> Vec<PodGroup> {
        let mut groups: HashMap<(*const u8, *const Shape), PodGroup> = HashMap::new();
        for (key, entry) in &self.pods {
            let id = (key.namespace.as_ptr(), Arc::as_ptr(&entry.shape));
            groups
                .entry(id)
                .or_insert_with(|| PodGroup { namespace: key.namespace.clone(), shape: entry.shape.clone(), pods: 0 })
                .pods += 1;
        }
        let mut groups: Vec<PodGroup> = groups.into_values().collect();
        groups.sort_unstable_by(|a, b| a.namespace.cmp(&b.namespace));
        groups
    }

    /// Forgets shapes and strings no pod uses any more.
    pub fn prune(&mut self) {
        // Shapes first: dropping one releases its strings.
        self.shapes.retain(|shape| Arc::strong_count(shape) > 1);
        self.strings.retain(|string| Arc::strong_count(string) > 1);
    }

    fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(known) = self.strings.get(text) {
            return known.clone();
        }
        let text: Arc<str> = text.into();
        self.strings.insert(text.clone());
        text
    }

    fn pairs<'a>(&mut self, pairs: impl Iterator<Item = (&'a String, &'a String)>) -> Box<[(Arc<str>, Arc<str>)]> {
        // BTreeMap iteration is sorted by key, so equal maps give equal shapes.
        pairs.map(|(k, v)| (self.intern(k), self.intern(v))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Labels and annotations as the engine takes them.
    type Metadata = (BTreeMap<String, String>, BTreeMap<String, String>);

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn counts(index: &PodIndex) -> Vec<(String, Metadata, usize)> {
        let mut groups: Vec<_> = index
            .groups()
            .into_iter()
            .map(|g| (g.namespace.to_string(), (g.shape.labels(), g.shape.annotations()), g.pods))
            .collect();
        groups.sort();
        groups
    }

    const STATUS: &str = "sidecar-injector.io/status";

    #[test]
    fn alike_pods_share_one_shape_and_strings_and_group_together() {
        let mut index = PodIndex::new();
        index.begin_list();
        let labels = map(&[("app", "web"), ("pod-template-hash", "7d9f")]);
        for i in 0..100 {
            let annotations =
                map(&[(STATUS, "{\"templates\":[]}"), ("kubectl.kubernetes.io/restartedAt", &i.to_string())]);
            index.apply("shop", &format!("web-7d9f-{i}"), &labels, &annotations);
        }
        index.apply("other", "web-1", &labels, &map(&[]));
        index.end_list();
        assert_eq!(index.len(), 101);
        // Annotations drift does not read are not kept: the restartedAt values do not split shapes.
        assert_eq!(index.interned().0, 2);
        assert_eq!(
            counts(&index),
            vec![
                ("other".into(), (labels.clone(), map(&[])), 1),
                ("shop".into(), (labels.clone(), map(&[(STATUS, "{\"templates\":[]}")])), 100),
            ]
        );
    }

    #[test]
    fn a_watched_pod_is_read_from_partial_object_metadata_keeping_what_drift_reads() {
        // An item of a metadata-only list, as the API server sends it.
        let item = serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "web-7d9f-x2", "generateName": "web-7d9f-", "namespace": "shop", "uid": "u1",
                "resourceVersion": "4711", "labels": {"app": "web"},
                "annotations": {STATUS: "{}", "kubectl.kubernetes.io/restartedAt": "now"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f", "uid": "r"}],
                "managedFields": [{"manager": "kube-controller-manager", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}]
            }
        });
        // Read from text, as the watch reads it (keys borrowed from the input).
        let pod: WatchedPod = serde_json::from_str(&item.to_string()).unwrap();
        let expected = ObjectMeta {
            name: Some("web-7d9f-x2".into()),
            namespace: Some("shop".into()),
            resource_version: Some("4711".into()),
            labels: Some(map(&[("app", "web")])),
            annotations: Some(map(&[(STATUS, "{}")])),
            ..ObjectMeta::default()
        };
        assert_eq!(pod.metadata, expected);
        assert!(ANNOTATIONS_READ.contains(&STATUS));
        use kube_core::Resource;
        assert!(WatchedPod::metadata_api(), "the watch must ask for metadata only");
        assert_eq!((WatchedPod::kind(&()), WatchedPod::api_version(&())), ("Pod".into(), "v1".into()));
        assert_eq!(WatchedPod::url_path(&(), None), "/api/v1/pods");
        assert_eq!(WatchedPod::url_path(&(), Some("shop")), "/api/v1/namespaces/shop/pods");
    }

    #[test]
    fn a_relist_forgets_what_it_did_not_name_and_keeps_the_rest() {
        let mut index = PodIndex::new();
        assert!(!index.synced());
        index.begin_list();
        index.apply("a", "one", &map(&[("x", "1")]), &map(&[]));
        index.apply("a", "two", &map(&[("x", "2")]), &map(&[]));
        index.end_list();
        assert!(index.synced());
        index.apply("a", "three", &map(&[("x", "3")]), &map(&[]));
        // The watch broke; the re-list names "two" (changed) and "three" only.
        index.begin_list();
        index.apply("a", "two", &map(&[("x", "22")]), &map(&[]));
        index.apply("a", "three", &map(&[("x", "3")]), &map(&[]));
        index.end_list();
        let labels: Vec<_> = counts(&index).into_iter().map(|g| g.1.0["x"].clone()).collect();
        assert_eq!(labels, vec!["22", "3"]);
        // Nothing the forgotten pods used is kept.
        assert_eq!(index.interned(), (2, 4), "shapes x=22, x=3; strings a, x, 22, 3");
    }

    #[test]
    fn deletes_changes_and_pruning() {
        let mut index = PodIndex::new();
        index.begin_list();
        index.end_list();
        index.apply("a", "one", &map(&[("x", "1")]), &map(&[]));
        index.apply("a", "one", &map(&[("x", "2")]), &map(&[]));
        assert_eq!(index.len(), 1);
        index.remove("a", "one");
        index.remove("a", "never-seen");
        index.remove("no-such-namespace", "one");
        assert!(index.is_empty());
        index.prune();
        assert_eq!(index.interned(), (0, 0));
    }

    #[test]
    fn drift_is_counted_per_group_as_per_pod() {
        use crate::names;
        use crate::test_support::{engine, opted_in};
        let engine = engine(&[("a", "default: true\ninject:\n  labels: {a: \"1\"}\n")]);
        let hash = engine.templates.get("a").unwrap().hash.clone();
        let status = |hash: &str| format!("{{\"templates\":[{{\"name\":\"a\",\"hash\":\"{hash}\"}}]}}");
        let mut index = PodIndex::new();
        let web = map(&[("app", "web")]);
        for i in 0..3 {
            index.apply("shop", &format!("stale-{i}"), &web, &map(&[(names::STATUS_ANNOTATION, &status("0000"))]));
            index.apply("shop", &format!("current-{i}"), &web, &map(&[(names::STATUS_ANNOTATION, &status(&hash))]));
            index.apply("shop", &format!("bare-{i}"), &map(&[("n", &i.to_string())]), &map(&[]));
            index.apply("dev", &format!("bare-{i}"), &web, &map(&[]));
            index.apply("unknown", &format!("bare-{i}"), &web, &map(&[]));
        }
        let facts = |ns: &str| match ns {
            "shop" => Some(opted_in("shop", &[])),
            "dev" => Some(NamespaceFacts::known("dev", map(&[]), map(&[]))),
            _ => None,
        };
        let mut asked = Vec::new();
        let groups = index.groups();
        let counts = drift_counts(&engine, &groups, |ns| {
            asked.push(ns.to_owned());
            facts(ns)
        });
        let expected: DriftCounts =
            [(("shop".into(), "a".into(), "not_injected"), 3), (("shop".into(), "a".into(), "stale"), 3)].into();
        assert_eq!(counts, expected);
        // Each namespace's facts are fetched once (the groups come namespace by namespace)...
        assert_eq!(asked, ["dev", "shop", "unknown"]);
        // ...and groups in any order count the same, a namespace's groups split apart included.
        let mut shuffled = groups.clone();
        let last = shuffled.len() - 1;
        shuffled.swap(2, last);
        let order: Vec<&str> = shuffled.iter().map(|g| &*g.namespace).collect();
        assert_eq!(order[..4], ["dev", "shop", "unknown", "shop"], "shop's groups are split");
        assert_eq!(drift_counts(&engine, &shuffled, facts), expected);
    }

    #[test]
    fn same_name_in_two_namespaces_is_two_pods() {
        let mut index = PodIndex::new();
        index.apply("a", "web", &map(&[]), &map(&[]));
        index.apply("b", "web", &map(&[]), &map(&[]));
        assert_eq!(index.len(), 2);
        index.remove("a", "web");
        assert_eq!(counts(&index), vec![("b".into(), (map(&[]), map(&[])), 1)]);
    }
}
