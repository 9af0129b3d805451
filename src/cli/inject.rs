//! `sidecar-injector inject`: offline injection into the pods of YAML manifests.

use std::sync::Arc;

use serde_json::Value;

use super::{CliError, OfflineArgs, display_path, load_templates, read_input};
use crate::engine::{Decision, Denial, Engine, Outcome, PodRequest, manifest, names, workload};

/// One pod found in the input: where it is, and what the engine decided.
#[derive(Clone)]
pub(crate) struct PodDecision {
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
    pub cluster: crate::engine::ClusterFacts,
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
pub(crate) type PassedThrough = (String, String);

/// Parses the input and runs the engine on every pod in it; `visit` sees each document (and each
/// item of a list, however deeply nested) together with the decision for its pod, if it has one.
/// Returns the documents and, for each that was passed through unchanged although the user may
/// have expected it to be injected, its label and why.
pub(crate) fn decide_all(
    args: &OfflineArgs,
    mut visit: impl FnMut(&mut Value, Option<PodDecision>),
) -> Result<(Vec<Value>, Vec<PassedThrough>), CliError> {
    let file = args.file.as_deref().ok_or_else(|| CliError::one("-f FILE|- is required (the manifests to read)"))?;
    let text = read_input(file)?;
    // The webhook never touches the injector's own namespace: neither does the CLI.
    let engine = Engine::new(load_templates(args.templates.as_deref())?, vec![names::INJECTOR_NAMESPACE.to_owned()]);
    let file = display_path(file);
    let mut documents = manifest::read(&text).map_err(|e| CliError::one(format!("{file}: {e}")))?;
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
            let namespace = workload::namespace_of(doc).unwrap_or(&args.namespace).to_owned();
            let request = PodRequest {
                cluster: args.cluster_for(&pod),
                pod: Arc::new(pod),
                namespace: args.namespace_facts(&namespace),
                workload: workload::Workload::of_document(doc),
            };
            let decision = engine.evaluate(&request);
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default().to_owned();
            visit(
                doc,
                Some(PodDecision {
                    label,
                    namespace,
                    pod: request.pod,
                    cluster: request.cluster,
                    decision,
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
pub fn inject(args: &OfflineArgs) -> Result<(String, Vec<String>), CliError> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let (documents, notes) = decide_all(args, |doc, decision| {
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
    })?;
    warnings.extend(notes.into_iter().map(|(label, note)| format!("{label}: {note}")));
    if errors.is_empty() { Ok((manifest::write(&documents), warnings)) } else { Err(CliError(errors)) }
}
