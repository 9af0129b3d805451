//! The Kubernetes Events an admission decision calls for: what `kubectl describe` and `kubectl get
//! events` show the people who did not see the admission response (a Deployment's author never
//! sees the warnings the ReplicaSet controller got).
//!
//! Pure: each decision is turned into [`EventIntent`]s here; `cluster::events` publishes them
//! (rate-limited, aggregated into series, off the request path). Never for a dry-run request, so
//! the webhooks declare `sideEffects: NoneOnDryRun`.
//!
//! Where: a pod does not exist yet at admission, so pod events go on the pod's **owner** (its
//! controller reference: a ReplicaSet, Job, StatefulSet, DaemonSet). A pod without an owner was
//! created by a person, who got the same words as the admission response. Template edits go on the
//! template ConfigMap. The words are those of `explain` and the admission response.

use k8s_openapi::api::core::v1::ObjectReference;
use serde_json::Value;

use crate::engine::status::InjectionStatus;

/// One Event to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct EventIntent {
    /// The object the Event is about.
    pub regarding: ObjectReference,
    /// `Warning` (every Event here is about something a person should look at).
    pub warning: bool,
    /// `PascalCase` reason: `InjectedWithConflicts`, `InjectionRefused`, `OverridesIgnored`,
    /// `EnforcementAudit`, `TemplateEditRefused`, `TemplateEditNotApplied`.
    pub reason: &'static str,
    /// What the injector did: `Inject` or `LoadTemplates`.
    pub action: &'static str,
    /// The message (at most [`MAX_NOTE_BYTES`]).
    pub note: String,
}

/// The Events API's limit on a note.
pub const MAX_NOTE_BYTES: usize = 1024;

/// The controller reference of a pod, in the pod's namespace, as the Event's subject.
pub fn owner_of(pod: &Value, namespace: &str) -> Option<ObjectReference> {
    let owners = pod.get("metadata")?.get("ownerReferences")?.as_array()?;
    let owner = owners.iter().find(|o| o.get("controller") == Some(&Value::Bool(true)))?;
    let text = |key: &str| owner.get(key).and_then(Value::as_str).map(str::to_owned);
    Some(ObjectReference {
        api_version: text("apiVersion"),
        kind: text("kind"),
        name: text("name"),
        uid: text("uid"),
        namespace: Some(namespace.to_owned()),
        ..ObjectReference::default()
    })
}

/// A template ConfigMap as the Event's subject.
pub fn configmap(namespace: &str, name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        uid,
        ..ObjectReference::default()
    }
}

/// `pod <name>: ` for notes on a workload, which has many pods.
fn about(pod_name: &str) -> String {
    format!("pod {pod_name}: ")
}

/// A template applied with conflicts: which, and each item skipped, as `explain` says them.
pub fn conflicts(regarding: &ObjectReference, pod_name: &str, status: &InjectionStatus) -> Option<EventIntent> {
    let conflicted = status.conflicted_templates();
    if conflicted.is_empty() {
        return None;
    }
    let skipped: Vec<String> = status.skipped.iter().map(|s| s.describe()).collect();
    let note = format!(
        "{}{} applied with conflicts: the pod's own items stand where the template's would be: {}",
        about(pod_name),
        conflicted.join(", "),
        skipped.join("; ")
    );
    Some(intent(regarding, "InjectedWithConflicts", "Inject", note))
}

/// The pod was refused; `message` is the admission response's.
pub fn refused(regarding: &ObjectReference, pod_name: &str, message: &str) -> EventIntent {
    intent(regarding, "InjectionRefused", "Inject", format!("{}{message}", about(pod_name)))
}

/// Warnings of one kind (`OverridesIgnored`, `EnforcementAudit`), one Event for all of them.
pub fn warnings(
    regarding: &ObjectReference,
    pod_name: &str,
    reason: &'static str,
    texts: &[&str],
) -> Option<EventIntent> {
    (!texts.is_empty()).then(|| intent(regarding, reason, "Inject", format!("{}{}", about(pod_name), texts.join("; "))))
}

/// A template ConfigMap edit refused at admission, or not applied by hot reload (the last good
/// version stays in service).
pub fn template_edit(regarding: ObjectReference, refused: bool, message: &str) -> EventIntent {
    let reason = if refused { "TemplateEditRefused" } else { "TemplateEditNotApplied" };
    intent(&regarding, reason, "LoadTemplates", message.to_owned())
}

fn intent(regarding: &ObjectReference, reason: &'static str, action: &'static str, mut note: String) -> EventIntent {
    if note.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    EventIntent { regarding: regarding.clone(), warning: true, reason, action, note }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::engine::status::{ItemKind, Skipped, TemplateRef};

    #[test]
    fn pod_events_go_on_the_controller() {
        let pod = json!({"metadata": {"generateName": "web-", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Other", "name": "x", "uid": "1"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8", "uid": "u-1", "controller": true}]}});
        let owner = owner_of(&pod, "shop").unwrap();
        assert_eq!(
            (owner.kind.as_deref(), owner.name.as_deref(), owner.uid.as_deref(), owner.namespace.as_deref()),
            (Some("ReplicaSet"), Some("web-5d8"), Some("u-1"), Some("shop"))
        );
        assert_eq!(owner_of(&json!({"metadata": {"name": "bare"}}), "shop"), None);
    }

    #[test]
    fn notes_use_explains_words_and_fit_the_api() {
        let owner = configmap("shop", "x", None);
        let status = InjectionStatus {
            templates: vec![TemplateRef { name: "logs".into(), hash: "h".into() }],
            skipped: vec![Skipped {
                template: "logs".into(),
                kind: ItemKind::Sidecar,
                name: "logs".into(),
                container: None,
                owner: "pod".into(),
            }],
            ..Default::default()
        };
        let event = conflicts(&owner, "web-abc", &status).unwrap();
        assert_eq!(
            event.note,
            "pod web-abc: logs applied with conflicts: the pod's own items stand where the template's would be: skipped sidecar \"logs\" from template logs: the pod already has one"
        );
        assert_eq!(conflicts(&owner, "web", &InjectionStatus::default()), None);
        let long = refused(&owner, "web", &"x".repeat(5000));
        assert!(long.note.len() <= MAX_NOTE_BYTES && long.note.ends_with("..."));
        assert_eq!(warnings(&owner, "web", "OverridesIgnored", &[]), None);
    }
}
