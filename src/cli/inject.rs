//! `sidecar-injector inject`: offline injection into the pods of YAML manifests.

use std::sync::Arc;

use serde_json::Value;

use super::{CliError, OfflineArgs, display_path, load_templates, read_input};
use crate::engine::{Decision, Denial, Engine, Outcome, PodRequest, manifest, workload};

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

/// Parses the input and runs the engine on every pod in it; `visit` sees each document (and each
/// item of a `List`) together with the decision for its pod, if it has one.
pub(crate) fn decide_all(
    args: &OfflineArgs,
    mut visit: impl FnMut(&mut Value, Option<PodDecision>),
) -> Result<Vec<Value>, CliError> {
    let file = args.file.as_deref().ok_or_else(|| CliError::one("-f FILE|- is required (the manifests to read)"))?;
    let text = read_input(file)?;
    let engine = Engine::new(load_templates(args.templates.as_deref())?, Vec::new());
    let file = display_path(file);
    let mut documents = manifest::read(&text).map_err(|e| CliError::one(format!("{file}: {e}")))?;
    for (index, document) in documents.iter_mut().enumerate() {
        let mut each = |doc: &mut Value, item: Option<usize>| {
            let Some(pod) = workload::pod_of(doc) else {
                return visit(doc, None);
            };
            let label = match item {
                Some(i) => format!("{file}: document {} item {i} ({})", index + 1, workload::describe(doc)),
                None => format!("{file}: document {} ({})", index + 1, workload::describe(doc)),
            };
            let namespace = workload::namespace_of(doc).unwrap_or(&args.namespace).to_owned();
            let request = PodRequest {
                pod: Arc::new(pod),
                namespace: args.namespace_facts(&namespace),
                cluster: args.cluster(),
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
                    decision,
                    field_prefix: workload::field_prefix(&kind),
                }),
            );
        };
        if document.get("kind").and_then(Value::as_str) == Some("List") {
            if let Some(Value::Array(items)) = document.get_mut("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    each(item, Some(i + 1));
                }
            }
        } else {
            each(document, None);
        }
    }
    Ok(documents)
}

/// Runs `inject`: returns the injected manifests as YAML and the warnings, or every error.
pub fn inject(args: &OfflineArgs) -> Result<(String, Vec<String>), CliError> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let documents = decide_all(args, |doc, decision| {
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
    if errors.is_empty() { Ok((manifest::write(&documents), warnings)) } else { Err(CliError(errors)) }
}
