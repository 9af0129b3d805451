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
//!
//! An owner reference is the pod's claim, and anyone who can create a pod can write any name and
//! uid into it. So an Event goes on an owner only once the publisher has seen that an object of
//! that kind, name and uid exists ([`VerifiedOwners`] remembers what it saw), and only for the
//! kinds whose controllers make pods in Kubernetes itself ([`owner_kinds`]), which the injector
//! may read. Any other claim gets no Event; its creator still got the admission warning.

use k8s_openapi::api::core::v1::ObjectReference;
use serde_json::Value;

use crate::engine::model::status::InjectionStatus;
use crate::engine::workload::{WORKLOAD_KINDS, WorkloadKind};

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

/// The owner kinds an Event may go on: the controllers of Kubernetes itself that make pods
/// (`WorkloadKind::makes_pods` in the engine's table of workload kinds). The RBAC in `deploy/` lets
/// the injector `get` exactly these.
pub fn owner_kinds() -> impl Iterator<Item = &'static WorkloadKind> {
    WORKLOAD_KINDS.iter().filter(|w| w.makes_pods)
}

/// The Events API's limit on a note.
pub const MAX_NOTE_BYTES: usize = 1024;

/// The controller reference of a pod, in the pod's namespace, as the Event's subject: only of an
/// [`owner_kinds`] kind with a name and a uid (still a claim, which the publisher checks).
pub fn owner_of(pod: &Value, namespace: &str) -> Option<ObjectReference> {
    let owners = pod.get("metadata")?.get("ownerReferences")?.as_array()?;
    let owner = owners.iter().find(|o| o.get("controller") == Some(&Value::Bool(true)))?;
    let text = |key: &str| owner.get(key).and_then(Value::as_str).filter(|t| !t.is_empty()).map(str::to_owned);
    resource_of(&text("apiVersion")?, &text("kind")?)?;
    text("name")?;
    text("uid")?;
    Some(ObjectReference {
        api_version: text("apiVersion"),
        kind: text("kind"),
        name: text("name"),
        uid: text("uid"),
        namespace: Some(namespace.to_owned()),
        ..ObjectReference::default()
    })
}

/// The resource of an [`owner_kinds`] kind.
pub fn resource_of(api_version: &str, kind: &str) -> Option<&'static str> {
    owner_kinds().find(|w| w.api_version == api_version && w.kind == kind).map(|w| w.plural)
}

/// What the publisher saw of claimed owners: whether an object with the claimed kind, namespace,
/// name and uid exists. Bounded: at most [`VerifiedOwners::CAPACITY`] answers, each for
/// [`VerifiedOwners::TTL`] (an owner deleted and made again under its name has a new uid, so an
/// answer for a uid only goes stale by the object's deletion).
#[derive(Debug, Default)]
pub struct VerifiedOwners {
    seen: std::collections::HashMap<OwnerKey, (bool, std::time::Instant)>,
}

/// An owner as claimed: namespace, kind, name, uid.
pub type OwnerKey = (String, String, String, String);

impl VerifiedOwners {
    /// The most answers kept.
    pub const CAPACITY: usize = 4096;
    /// How long an answer is kept.
    pub const TTL: std::time::Duration = std::time::Duration::from_secs(60);

    /// The key of a claimed owner, `None` for a subject that is not one ([`owner_of`]'s).
    pub fn key(regarding: &ObjectReference) -> Option<OwnerKey> {
        let text = |t: &Option<String>| t.clone().unwrap_or_default();
        Some((text(&regarding.namespace), regarding.kind.clone()?, regarding.name.clone()?, regarding.uid.clone()?))
    }

    /// The answer kept for `key`, if it is still fresh at `now`.
    pub fn get(&self, key: &OwnerKey, now: std::time::Instant) -> Option<bool> {
        self.seen.get(key).filter(|(_, at)| now.duration_since(*at) < Self::TTL).map(|(exists, _)| *exists)
    }

    /// Keeps an answer; when full, forgets the stale ones, and if none is stale, all of them (an
    /// owner is looked up again, never believed unchecked).
    pub fn insert(&mut self, key: OwnerKey, exists: bool, now: std::time::Instant) {
        if self.seen.len() >= Self::CAPACITY && !self.seen.contains_key(&key) {
            self.seen.retain(|_, (_, at)| now.duration_since(*at) < Self::TTL);
            if self.seen.len() >= Self::CAPACITY {
                self.seen.clear();
            }
        }
        self.seen.insert(key, (exists, now));
    }

    /// How many answers are kept.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether no answer is kept.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
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

/// A rollout halted because pods that got its new version failed (on the template's ConfigMap and
/// on the workloads of the failed pods).
pub fn rollout_halted(regarding: &ObjectReference, message: &str) -> EventIntent {
    intent(regarding, "RolloutHalted", "HaltRollout", message.to_owned())
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
    use crate::engine::model::status::{ItemKind, Skipped, TemplateRef};

    #[test]
    fn the_injector_may_get_exactly_the_owner_kinds() {
        // The rules of deploy/base/rbac.yaml with the verb `get` alone: (group, resources).
        let rbac = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base/rbac.yaml")).unwrap();
        let mut granted = Vec::new();
        let mut group = "";
        for line in rbac.lines().map(str::trim) {
            if let Some(g) = line.strip_prefix("- apiGroups: [").and_then(|g| g.strip_suffix(']')) {
                group = if g == "\"\"" { "" } else { g };
            } else if let Some(resources) = line.strip_prefix("resources: [").and_then(|r| r.strip_suffix(']')) {
                granted.push((group, resources.split(", ").map(str::to_owned).collect::<Vec<_>>()));
            } else if line == "verbs: [get]" {
                continue;
            } else if line.starts_with("verbs:") {
                granted.pop();
            }
        }
        let mut got: Vec<String> =
            granted.into_iter().flat_map(|(g, r)| r.into_iter().map(move |r| format!("{g}/{r}"))).collect();
        let mut owners: Vec<String> = owner_kinds()
            .map(|w| format!("{}/{}", w.api_version.rsplit_once('/').map_or("", |(g, _)| g), w.plural))
            .collect();
        got.sort();
        owners.sort();
        assert_eq!(got, owners);
    }

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
    fn only_an_owner_of_a_kind_that_can_be_checked_is_a_subject() {
        let with_owner = |owner: Value| json!({"metadata": {"generateName": "p-", "ownerReferences": [owner]}});
        // (controller reference, an Event subject)
        let cases = [
            (json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a", "uid": "u", "controller": true}), true),
            (json!({"apiVersion": "batch/v1", "kind": "Job", "name": "a", "uid": "u", "controller": true}), true),
            (
                json!({"apiVersion": "v1", "kind": "ReplicationController", "name": "a", "uid": "u", "controller": true}),
                true,
            ),
            (json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a", "uid": "u"}), false),
            (json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a", "controller": true}), false),
            (json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "", "uid": "u", "controller": true}), false),
            (
                json!({"apiVersion": "apps/v1beta2", "kind": "ReplicaSet", "name": "a", "uid": "u", "controller": true}),
                false,
            ),
            (json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "uid": "u", "controller": true}), false),
            (
                json!({"apiVersion": "example.com/v1", "kind": "Thing", "name": "a", "uid": "u", "controller": true}),
                false,
            ),
        ];
        for (owner, subject) in cases {
            assert_eq!(owner_of(&with_owner(owner.clone()), "shop").is_some(), subject, "{owner}");
        }
    }

    #[test]
    fn verified_owners_are_remembered_for_a_while_and_bounded() {
        let start = std::time::Instant::now();
        let key = |i: usize| ("shop".to_owned(), "ReplicaSet".to_owned(), format!("rs-{i}"), format!("uid-{i}"));
        let mut seen = VerifiedOwners::default();
        assert_eq!(seen.get(&key(0), start), None);
        seen.insert(key(0), true, start);
        seen.insert(key(1), false, start);
        assert_eq!(seen.get(&key(0), start), Some(true));
        assert_eq!(seen.get(&key(1), start + VerifiedOwners::TTL / 2), Some(false));
        assert_eq!(seen.get(&key(0), start + VerifiedOwners::TTL), None, "looked up again once stale");
        for i in 2..VerifiedOwners::CAPACITY * 3 {
            seen.insert(key(i), true, start);
            assert!(seen.len() <= VerifiedOwners::CAPACITY);
        }
        let later = start + VerifiedOwners::TTL;
        seen.insert(key(0), true, later);
        assert_eq!(seen.len(), 1, "stale answers go first when full");
        let subject = owner_of(
            &json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs-0", "uid": "uid-0", "controller": true}]}}),
            "shop",
        )
        .unwrap();
        assert_eq!(VerifiedOwners::key(&subject), Some(key(0)));
        assert_eq!(VerifiedOwners::key(&configmap("shop", "x", None)), None);
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
