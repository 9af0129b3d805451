//! The offline commands over manifests (`inject` and `explain`): every pod of a file's documents
//! decided as the webhook would decide it, and what the commands print. The CLI reads the files
//! and flags and hands over their text and [`OfflineFacts`]; the golden tests call this directly,
//! so they run with the engine's tests.

pub mod explain;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::injection::nodes::{NodeFacts, NodePool};
use crate::{
    ClusterFacts, Decision, Denial, Engine, NamespaceFacts, Outcome, PodRequest, TemplateSet, manifest, names, workload,
};

/// What the offline commands take to be true of the cluster (the CLI's flags say it).
#[derive(Debug, Clone, Default)]
pub struct OfflineFacts {
    /// Namespace for objects that do not name one.
    pub namespace: String,
    /// The namespace's labels; without them the namespace counts as opted in.
    pub namespace_labels: Option<BTreeMap<String, String>>,
    /// The namespace's annotations.
    pub namespace_annotations: Option<BTreeMap<String, String>>,
    /// The API server's version (a recent cluster by default): decides native sidecars where no
    /// nodes are given.
    pub cluster: ClusterFacts,
    /// The cluster's nodes: native sidecars are then decided by the kubelets of the nodes each
    /// pod can run on, as the webhook does.
    pub nodes: Option<Arc<NodePool>>,
}

impl OfflineFacts {
    /// Namespace facts for a namespace named `name`.
    pub fn namespace_facts(&self, name: &str) -> NamespaceFacts {
        let annotations = self.namespace_annotations.clone().unwrap_or_default();
        match &self.namespace_labels {
            Some(labels) => NamespaceFacts::known(name, labels.clone(), annotations),
            None => NamespaceFacts { annotations, ..NamespaceFacts::unknown(name) },
        }
    }

    /// The cluster facts for `pod`: by the nodes where given, else by the API server's version.
    pub fn cluster_for(&self, pod: &Value) -> ClusterFacts {
        self.nodes.as_ref().map_or(self.cluster, |nodes| nodes.facts_for(pod, self.cluster))
    }
}

/// Parses `k=v,k2=v2` (the CLI's namespace labels and annotations). A value may contain commas
/// when the next item has no `=` (`sidecar-injector.io/templates=a,b`).
pub fn parse_key_values(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    if text.is_empty() {
        return Ok(map);
    }
    let mut last: Option<String> = None;
    for part in text.split(',') {
        if part.trim().is_empty() {
            return Err(format!("{text:?} has an empty item (two commas in a row, or a comma at an end)"));
        }
        match part.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                let key = key.trim().to_owned();
                map.insert(key.clone(), value.to_owned());
                last = Some(key);
            }
            _ => match last.as_ref().and_then(|k| map.get_mut(k)) {
                Some(value) => {
                    value.push(',');
                    value.push_str(part);
                }
                None => return Err(format!("{part:?} is not key=value")),
            },
        }
    }
    Ok(map)
}

/// The node pool of a file of Node objects (`kubectl get nodes -o yaml`: a `List`, or one
/// document per node) named `file` in messages.
pub fn node_pool(file: &str, text: &str) -> Result<NodePool, String> {
    let documents = manifest::read(text).map_err(|e| format!("{file}: {e}"))?;
    let nodes: Vec<&Value> = documents
        .iter()
        .flat_map(|d| match d.get("items").and_then(Value::as_array) {
            Some(items) => items.iter().collect(),
            None => vec![d],
        })
        .filter(|d| d.get("kind").and_then(Value::as_str).is_none_or(|k| k == "Node"))
        .collect();
    if nodes.is_empty() {
        return Err(format!("{file}: no Node objects"));
    }
    let nodes = nodes
        .into_iter()
        .map(|node| serde_json::from_value::<crate::injection::nodes::NodeObject>(node.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{file}: not a Node: {e}"))?;
    Ok(NodePool::new(nodes.iter().map(NodeFacts::of)))
}

/// One pod found in the input: where it is, and what the engine decided.
#[derive(Clone)]
pub struct PodDecision {
    /// `file: document N (Kind name)`.
    pub label: String,
    /// Namespace the pod was judged in.
    pub namespace: String,
    /// The pod as read.
    pub pod: Arc<Value>,
    /// The engine's decision.
    pub decision: Decision,
    /// Field prefix of the pod inside its document (`spec.template.`).
    pub field_prefix: String,
    /// Whether native sidecars start where the pod runs, and the rule that said so.
    pub cluster: ClusterFacts,
    /// For a pod injected with template versions no longer in service: the update that brings it
    /// to them in place (`drift::in_place`), or why there is none.
    pub in_place: Option<Result<crate::drift::in_place::InPlaceUpdate, String>>,
}

impl PodDecision {
    /// The denial as a message naming the file, document and field.
    pub fn denial_message(&self, denial: &Denial) -> String {
        match denial {
            Denial::Shape(e) => format!("{}: {}{}: {}", self.label, self.field_prefix, e.field, e.message),
            other => format!("{}: {other}", self.label),
        }
    }
}

/// A document passed through unchanged although it looks like a workload: its label and why.
pub type PassedThrough = (String, String);

/// The manifests of one file: its name (as messages name it) and its text.
#[derive(Debug, Clone, Copy)]
pub struct Manifests<'a> {
    /// The file as messages name it (`<stdin>` for standard input).
    pub file: &'a str,
    /// Its text: one or many YAML documents.
    pub text: &'a str,
}

/// Parses the manifests and runs the engine on every pod in them; `visit` sees each document (and
/// each item of a list, however deeply nested) together with the decision for its pod, if it has
/// one. Returns the documents and, for each that was passed through unchanged although the user
/// may have expected it to be injected, its label and why; or why the file cannot be read.
pub fn decide_all(
    templates: TemplateSet,
    input: Manifests<'_>,
    facts: &OfflineFacts,
    mut visit: impl FnMut(&mut Value, Option<PodDecision>),
) -> Result<(Vec<Value>, Vec<PassedThrough>), String> {
    // The webhook never touches the injector's own namespace: neither do the offline commands.
    let engine = Engine::new(templates, vec![names::INJECTOR_NAMESPACE.to_owned()]);
    let file = input.file;
    let mut documents = manifest::read(input.text).map_err(|e| format!("{file}: {e}"))?;
    let mut notes = Vec::new();
    for (index, document) in documents.iter_mut().enumerate() {
        let mut each = |doc: &mut Value, label: String| {
            let Some(pod) = workload::pod_of(doc) else {
                if workload::looks_like_unknown_workload(doc) {
                    let known = workload::supported_kinds().collect::<Vec<_>>().join(", ");
                    notes.push((
                        label.clone(),
                        format!(
                            "passed through unchanged: it has a pod template, but the kinds inject knows are {known}"
                        ),
                    ));
                }
                return visit(doc, None);
            };
            let namespace = workload::namespace_of(doc).unwrap_or(&facts.namespace).to_owned();
            let request = PodRequest {
                cluster: facts.cluster_for(&pod),
                pod: Arc::new(pod),
                namespace: facts.namespace_facts(&namespace),
                workload: workload::Workload::of_document(doc),
            };
            let decision = engine.evaluate(&request);
            let in_place = crate::drift::in_place::for_stale(&engine, &request);
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default().to_owned();
            visit(
                doc,
                Some(PodDecision {
                    label,
                    namespace,
                    pod: request.pod,
                    cluster: request.cluster,
                    decision,
                    in_place,
                    field_prefix: workload::field_prefix(&kind),
                }),
            );
        };
        let label = format!("{file}: document {}", index + 1);
        for_each_item(document, label, &mut each);
    }
    Ok((documents, notes))
}

/// Calls `each` on a document, or on every item of a list (kubectl flattens nested lists too).
fn for_each_item(document: &mut Value, label: String, each: &mut impl FnMut(&mut Value, String)) {
    if workload::is_list(document) {
        if let Some(Value::Array(items)) = document.get_mut("items") {
            for (i, item) in items.iter_mut().enumerate() {
                for_each_item(item, format!("{label} item {}", i + 1), each);
            }
        }
    } else {
        let label = format!("{label} ({})", workload::describe(document));
        each(document, label);
    }
}

/// Runs `inject`: returns the injected manifests as YAML and the warnings, or every error.
pub fn inject(
    templates: TemplateSet,
    input: Manifests<'_>,
    facts: &OfflineFacts,
) -> Result<(String, Vec<String>), Vec<String>> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let (documents, notes) = decide_all(templates, input, facts, |doc, decision| {
        let Some(found) = decision else { return };
        warnings.extend(found.decision.warnings.iter().map(|w| format!("{}: {w}", found.label)));
        match &found.decision.outcome {
            Outcome::Inject(injection) => {
                let mut pod = (*found.pod).clone();
                match json_patch::patch(&mut pod, &injection.patch) {
                    Ok(()) => workload::set_pod(doc, pod),
                    Err(e) => errors.push(format!("{}: internal error applying the patch: {e}", found.label)),
                }
            }
            Outcome::Denied(denial) => errors.push(found.denial_message(denial)),
            Outcome::OutOfScope(_) | Outcome::UpToDate(_) => {}
        }
    })
    .map_err(|e| vec![e])?;
    warnings.extend(notes.into_iter().map(|(label, note)| format!("{label}: {note}")));
    if errors.is_empty() { Ok((manifest::write(&documents), warnings)) } else { Err(errors) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_parse_with_commas_inside_values() {
        let parsed = parse_key_values("team=shop,sidecar-injector.io/templates=a,b,c,env=prod").unwrap();
        assert_eq!(parsed["team"], "shop");
        assert_eq!(parsed["sidecar-injector.io/templates"], "a,b,c");
        assert_eq!(parsed["env"], "prod");
        assert_eq!(parse_key_values("x").unwrap_err(), "\"x\" is not key=value");
        assert!(parse_key_values("").unwrap().is_empty());
        for empty in ["a=1,,b=2", "a=1,", ",a=1"] {
            assert!(parse_key_values(empty).unwrap_err().contains("empty item"), "{empty}");
        }
    }
}
