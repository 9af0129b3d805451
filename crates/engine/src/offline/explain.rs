//! `explain`: for each pod, whether it would be injected and why, in words or JSON. The offline
//! command's report, and the decision part of `explain --cluster`'s.

use serde::Serialize;
use serde_json::{Value, json};

use super::{Manifests, OfflineFacts, PodDecision, decide_all};
use crate::model::kinds::{APP_LISTS, CONTAINER_LISTS, MAPS, POD_LISTS, Placement};
use crate::model::status::InjectionStatus;
use crate::{Choice, Injection, Outcome, TemplateSet, emit::policy, names};

/// How `explain` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Human text.
    Text,
    /// JSON for machines.
    Json,
}

/// The explanation of one pod, as printed by `-o json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `file: document N (Kind name)`.
    pub object: String,
    /// Namespace the pod was judged in.
    pub namespace: String,
    /// `inject`, `upToDate`, `outOfScope`, `denied`, or `passedThrough` (a document with a pod
    /// template of a kind `inject` does not know).
    pub result: &'static str,
    /// One sentence on the result.
    pub message: String,
    /// Templates considered, with the verdict on each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub templates: Option<Value>,
    /// What the injection adds (or added, when up to date), as in the status annotation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<InjectionStatus>,
    /// What the injection removes: items an earlier injection provably added, replaced now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removes: Option<InjectionStatus>,
    /// Where each overridden value came from (the pod's annotation, or its namespace's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub value_sources: Vec<String>,
    /// How each value a template's `sizing:` computed from the app containers was reached.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sized: Vec<String>,
    /// How each env var a template merges into an app container's own is put together.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub merge_notes: Vec<String>,
    /// The form each image volume takes (an image volume, or its fallback and why).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume_forms: Vec<String>,
    /// Whether added sidecars run as native sidecars, and which rule decided (for pods that get
    /// sidecars).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sidecars: Option<String>,
    /// For a pod injected with template versions no longer in service: whether an update of the
    /// running pod brings it to them (`drift --in-place`), and how or why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_place: Option<String>,
    /// Warnings (ignored overrides and the like).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `explain`'s sentence on a stale pod's in-place update (see `drift::in_place`).
pub fn in_place_sentence(in_place: &Result<crate::drift::in_place::InPlaceUpdate, String>) -> String {
    match in_place {
        Ok(update) => format!(
            "an update of the running pod brings it to the template versions in service ({}; sidecar-injector drift --in-place)",
            update.describe()
        ),
        Err(why) => format!(
            "no update of the running pod brings it to the template versions in service: {why}; restart it (sidecar-injector drift --restart)"
        ),
    }
}

fn choice_json(choice: &Choice) -> Value {
    json!({
        "source": choice.source,
        "verdicts": choice.verdicts.iter().map(|(name, verdict)| {
            let mut v = serde_json::to_value(verdict).expect("verdicts serialize");
            v["name"] = json!(name);
            if let Some(chosen) = choice.versions.iter().find(|c| c.template == *name) {
                v["version"] = json!({"hash": chosen.hash, "why": chosen.why});
            }
            v
        }).collect::<Vec<_>>(),
    })
}

/// The explanation of one pod decision.
/// `labels_known`: whether the namespace's labels were given (else it counts as opted in, with a
/// warning).
pub fn one(found: PodDecision, labels_known: bool) -> Explanation {
    let decision = &found.decision;
    let (merge_notes, value_sources, sized, mut volume_forms) = match &decision.outcome {
        Outcome::Inject(injection) => {
            let notes = &injection.notes;
            (notes.merges.clone(), notes.value_sources.clone(), notes.sized.clone(), notes.volumes.clone())
        }
        _ => (Vec::new(), Vec::new(), Vec::new(), Vec::new()),
    };
    if !volume_forms.is_empty() {
        volume_forms.push(format!("decided {}", found.cluster.rule.nodes()));
    }
    let removes = match &decision.outcome {
        Outcome::Inject(injection) if !is_empty(&injection.removed) => Some((*injection.removed).clone()),
        _ => None,
    };
    let (result, message, status) = match &decision.outcome {
        Outcome::OutOfScope(reason) => ("outOfScope", format!("not injected: {reason}"), None),
        Outcome::UpToDate(status) => (
            "upToDate",
            format!("already injected with the current templates{}; nothing to change", conflicts_note(status)),
            Some(status.clone()),
        ),
        // Left as written but for the status annotation that says why.
        Outcome::Inject(Injection { skipped_as: Some(reason), status, .. }) => {
            ("outOfScope", format!("not injected: {reason}"), Some(status.clone()))
        }
        Outcome::Inject(injection) if injection.status.templates.is_empty() => (
            "inject",
            format!("no template would be injected: {}", injection.status.reason.clone().unwrap_or_default()),
            Some(injection.status.clone()),
        ),
        Outcome::Inject(injection) => (
            "inject",
            format!(
                "would inject {}{}{}",
                injection.status.templates.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", "),
                conflicts_note(&injection.status),
                // Templates left out (Pod Security).
                injection.status.reason.as_ref().map(|reason| format!("; {reason}")).unwrap_or_default()
            ),
            Some(injection.status.clone()),
        ),
        Outcome::Denied(denial) => ("denied", format!("would be refused: {}", found.denial_message(denial)), None),
    };
    let sidecars = status.as_ref().filter(|s| !s.containers.is_empty() || !s.native_sidecars.is_empty()).map(|_| {
        let how = match found.cluster.native_sidecars {
            true => "native sidecars start here (sidecarMode auto makes them native)",
            false => "native sidecars do not start here (sidecarMode auto and native make classic containers)",
        };
        format!("{how}; decided {}", found.cluster.rule)
    });
    let mut warnings: Vec<String> = decision.warnings.iter().map(|w| w.message.clone()).collect();
    if !labels_known && !matches!(decision.outcome, Outcome::OutOfScope(_)) {
        warnings.push("namespace labels not given (--namespace-labels): the namespace counts as opted in".to_owned());
    }
    let in_place = found.in_place.as_ref().map(in_place_sentence);
    Explanation {
        object: found.label,
        namespace: found.namespace,
        result,
        message,
        templates: decision.choice.as_ref().map(choice_json),
        status,
        removes,
        value_sources,
        sized,
        merge_notes,
        volume_forms,
        sidecars,
        in_place,
        warnings,
    }
}

/// Says which templates apply only in part, as the `injected` label will.
fn conflicts_note(status: &InjectionStatus) -> String {
    let conflicted = status.conflicted_templates();
    match conflicted.is_empty() {
        true => String::new(),
        false => format!(
            " ({} applied with conflicts: the pod's own items stand where the template's would be, see \"skipped\"; labelled {}={})",
            conflicted.join(", "),
            names::INJECTED_LABEL,
            names::INJECTED_PARTIAL
        ),
    }
}

fn is_empty(items: &InjectionStatus) -> bool {
    CONTAINER_LISTS.iter().all(|list| (list.claimed)(items).is_empty())
        && POD_LISTS.iter().all(|kind| (kind.claimed)(items).is_empty())
        && MAPS.iter().all(|kind| (kind.claimed)(items).is_empty())
        && items.app_containers.is_empty()
}

/// The item lists of a status, one line each, under `heading`.
fn item_lines<'a>(out: &mut String, heading: &str, status: &'a InjectionStatus) {
    let names = |list: &'a Vec<String>| list.iter().map(String::as_str).collect::<Vec<_>>();
    let containers =
        Placement::ALL.into_iter().map(|placement| (placement.plural(), placement.claimed(status).collect()));
    let pod_lists = POD_LISTS.iter().map(|kind| (kind.plural, names((kind.claimed)(status))));
    let metadata = MAPS.iter().map(|kind| (kind.field, names((kind.claimed)(status))));
    out.push_str(heading);
    for (what, names) in containers.chain(pod_lists).chain(metadata) {
        if !names.is_empty() {
            out.push_str(&format!("    {what}: {}\n", names.join(", ")));
        }
    }
    for (container, additions) in &status.app_containers {
        let mut parts: Vec<String> = APP_LISTS
            .iter()
            .map(|kind| (kind.plural, (kind.claimed)(additions)))
            .filter(|(_, items)| !items.is_empty())
            .map(|(plural, items)| format!("{plural} {}", items.join(", ")))
            .collect();
        if !additions.env_merges.is_empty() {
            parts.push(format!("merged env {}", additions.env_merges.join(", ")));
        }
        out.push_str(&format!(
            "    {} container {container}: {}\n",
            if heading.contains("removes") { "from" } else { "into" },
            parts.join("; ")
        ));
    }
}

/// Templates the policy mode leaves to the webhook, with why (`engine::emit::policy`).
type WebhookOnly = std::collections::BTreeMap<String, String>;

fn text(explanations: &[Explanation], decisions: &[Option<Choice>], webhook_only: &WebhookOnly) -> String {
    let mut out = String::new();
    for (e, choice) in explanations.iter().zip(decisions) {
        match e.namespace.is_empty() {
            true => out.push_str(&format!("{}\n  {}\n", e.object, e.message)),
            false => out.push_str(&format!("{} in namespace {}\n  {}\n", e.object, e.namespace, e.message)),
        }
        if let Some(choice) = choice {
            out.push_str(&format!("  templates ({}):\n", choice.source));
            let width = choice.verdicts.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
            for (name, verdict) in &choice.verdicts {
                out.push_str(&format!("    {name:width$}  {verdict}\n"));
                if let Some(reason) = webhook_only.get(&**name).filter(|_| verdict.is_chosen()) {
                    out.push_str(&format!("    {:width$}  (policy mode: webhook-only, {reason})\n", ""));
                }
                for chosen in choice.versions.iter().filter(|v| v.template == *name) {
                    out.push_str(&format!("    {:width$}  version {}: {}\n", "", chosen.hash, chosen.why));
                }
            }
        }
        if let Some(removes) = &e.removes {
            item_lines(&mut out, "  removes (an earlier injection's own items, replaced):\n", removes);
        }
        if let Some(status) = e.status.as_ref().filter(|s| !s.templates.is_empty()) {
            let heading = if e.result == "upToDate" { "  added earlier:\n" } else { "  adds:\n" };
            item_lines(&mut out, heading, status);
            for source in &e.value_sources {
                out.push_str(&format!("    value {source}\n"));
            }
            for note in &e.sized {
                out.push_str(&format!("    sized {note}\n"));
            }
            for note in &e.merge_notes {
                out.push_str(&format!("    merge into {note}\n"));
            }
            if let [notes @ .., rule] = e.volume_forms.as_slice() {
                for note in notes {
                    out.push_str(&format!("    {note}\n"));
                }
                out.push_str(&format!("    image volumes: {rule}\n"));
            }
            if let Some(sidecars) = &e.sidecars {
                out.push_str(&format!("    sidecars: {sidecars}\n"));
            }
            if let Some(padding) = &status.pod_resources {
                out.push_str(&format!(
                    "    pod-level resources (spec.resources) padded so the injected containers fit and the app keeps its budget: {}\n",
                    padding.describe()
                ));
            }
            for skip in &status.skipped {
                out.push_str(&format!("    {}\n", skip.describe()));
            }
        }
        if let Some(in_place) = &e.in_place {
            out.push_str(&format!("  in place: {in_place}\n"));
        }
        for warning in &e.warnings {
            out.push_str(&format!("  warning: {warning}\n"));
        }
        out.push('\n');
    }
    if explanations.is_empty() {
        let kinds = crate::workload::supported_kinds().collect::<Vec<_>>().join(", ");
        out.push_str(&format!("no pods found (kinds with pods: {kinds})\n"));
    }
    out
}

/// Runs `explain` and returns what to print, or why the file cannot be read.
pub fn explain(
    templates: TemplateSet,
    input: Manifests<'_>,
    facts: &OfflineFacts,
    format: Format,
) -> Result<String, String> {
    let native = facts.cluster.native_sidecars;
    let webhook_only: WebhookOnly = templates
        .iter()
        .filter_map(|t| policy::webhook_only_reason(t, native).map(|reason| (t.name.to_string(), reason)))
        .collect();
    let mut explanations = Vec::new();
    let mut choices = Vec::new();
    let (_, notes) = decide_all(templates, input, facts, |_, decision| {
        if let Some(found) = decision {
            choices.push(found.decision.choice.clone());
            explanations.push(one(found, facts.namespace_labels.is_some()));
        }
    })?;
    for (object, message) in notes {
        choices.push(None);
        explanations.push(Explanation {
            object,
            namespace: String::new(),
            result: "passedThrough",
            message,
            templates: None,
            status: None,
            removes: None,
            value_sources: Vec::new(),
            sized: Vec::new(),
            merge_notes: Vec::new(),
            volume_forms: Vec::new(),
            sidecars: None,
            in_place: None,
            warnings: Vec::new(),
        });
    }
    for verdict in explanations
        .iter_mut()
        .filter_map(|e| e.templates.as_mut())
        .flat_map(|t| t["verdicts"].as_array_mut().into_iter().flatten())
    {
        if let Some(reason) = verdict["name"].as_str().and_then(|name| webhook_only.get(name)) {
            verdict["webhookOnly"] = json!(reason);
        }
    }
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(&explanations).expect("explanations serialize") + "\n",
        Format::Text => text(&explanations, &choices, &webhook_only),
    })
}
