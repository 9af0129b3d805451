//! Where the pod lives inside each workload kind, so `inject`, `explain` and `drift` can treat a
//! Deployment's pod template exactly like a pod; and which workload a pod belongs to, for the
//! templates' `workload` context.

use serde::Serialize;
use serde_json::{Map, Value};

/// The workload a pod belongs to, as templates see it (`{{ workload.kind }}`, `{{ workload.name }}`).
///
/// At admission a controller-made pod has no name yet (only `generateName`), so templates that need
/// a stable name for the pod's owner use this instead of `pod.metadata.name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// `Deployment`, `StatefulSet`, `DaemonSet`, `Job`, `CronJob`, `ReplicaSet`, another owner's kind,
    /// or `Pod` for a pod without a controller.
    pub kind: String,
    /// The workload's name; for a bare pod its name, or its `generateName` without the trailing
    /// `-`; empty when the pod has neither.
    pub name: String,
}

impl Workload {
    /// The workload of a pod as submitted, from its controller's owner reference.
    ///
    /// Kubernetes' naming conventions name the top-level workload, as Istio does: a ReplicaSet
    /// owner whose name ends in `-<pod-template-hash>` belongs to the Deployment of the name before
    /// it; a Job whose name ends in `-<8 or more digits>` (the scheduled time) to that CronJob.
    pub fn of_pod(pod: &Value) -> Workload {
        let metadata = pod.get("metadata");
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
        let controller = metadata
            .and_then(|m| m.get("ownerReferences"))
            .and_then(Value::as_array)
            .and_then(|refs| refs.iter().find(|r| r.get("controller") == Some(&Value::Bool(true))));
        if let Some(owner) = controller {
            let (kind, name) = (text(owner.get("kind")), text(owner.get("name")));
            let hash = metadata.and_then(|m| m.get("labels")).and_then(|l| l.get("pod-template-hash"));
            if kind == "ReplicaSet"
                && let Some(base) = hash.and_then(Value::as_str).and_then(|h| name.strip_suffix(&format!("-{h}")))
            {
                return Workload { kind: "Deployment".into(), name: base.to_owned() };
            }
            if kind == "Job"
                && let Some((base, stamp)) = name.rsplit_once('-')
                && stamp.len() >= 8
                && stamp.bytes().all(|b| b.is_ascii_digit())
            {
                return Workload { kind: "CronJob".into(), name: base.to_owned() };
            }
            return Workload { kind, name };
        }
        let name = text(metadata.and_then(|m| m.get("name")));
        let name = match name.is_empty() {
            true => text(metadata.and_then(|m| m.get("generateName"))).trim_end_matches('-').to_owned(),
            false => name,
        };
        Workload { kind: "Pod".into(), name }
    }

    /// The workload a manifest document stands for, when it is not a bare Pod: a Deployment's pod
    /// template belongs to that Deployment (the CLI passes this, since a template has no owner).
    pub fn of_document(document: &Value) -> Option<Workload> {
        let kind = document.get("kind")?.as_str()?;
        if kind == "Pod" || pod_path(kind).is_none() {
            return None;
        }
        let name = document.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or_default();
        Some(Workload { kind: kind.to_owned(), name: name.to_owned() })
    }
}

/// The kinds that carry a pod (or a pod template), and the path to it.
const POD_TEMPLATE_PATHS: [(&str, &[&str]); 9] = [
    ("Pod", &[]),
    ("PodTemplate", &["template"]),
    ("ReplicationController", &["spec", "template"]),
    ("Deployment", &["spec", "template"]),
    ("StatefulSet", &["spec", "template"]),
    ("DaemonSet", &["spec", "template"]),
    ("ReplicaSet", &["spec", "template"]),
    ("Job", &["spec", "template"]),
    ("CronJob", &["spec", "jobTemplate", "spec", "template"]),
];

/// The kinds whose pods can be injected.
pub fn supported_kinds() -> impl Iterator<Item = &'static str> {
    POD_TEMPLATE_PATHS.iter().map(|(kind, _)| *kind)
}

/// The path of the pod (template) inside a document of this kind, `None` for other kinds.
pub fn pod_path(kind: &str) -> Option<&'static [&'static str]> {
    POD_TEMPLATE_PATHS.iter().find(|(k, _)| *k == kind).map(|(_, path)| *path)
}

/// The dotted field prefix of the pod inside the document, for error messages (`spec.template.`).
pub fn field_prefix(kind: &str) -> String {
    pod_path(kind).map(|p| p.iter().map(|s| format!("{s}.")).collect()).unwrap_or_default()
}

/// The document's pod as a Pod object (a template gets `apiVersion`/`kind` so expressions see a
/// pod), or `None` when the kind carries no pod or the path is missing.
pub fn pod_of(document: &Value) -> Option<Value> {
    let path = pod_path(document.get("kind")?.as_str()?)?;
    if path.is_empty() {
        return Some(document.clone());
    }
    let template = path.iter().try_fold(document, |v, key| v.get(key))?;
    let mut pod = Map::new();
    pod.insert("apiVersion".into(), Value::from("v1"));
    pod.insert("kind".into(), Value::from("Pod"));
    pod.insert("metadata".into(), template.get("metadata").cloned().unwrap_or_else(|| Value::Object(Map::new())));
    pod.insert("spec".into(), template.get("spec").cloned().unwrap_or(Value::Null));
    Some(Value::Object(pod))
}

/// Writes an (injected) pod back into the document it came from.
pub fn set_pod(document: &mut Value, pod: Value) {
    let Some(path) = document.get("kind").and_then(Value::as_str).and_then(pod_path) else {
        return;
    };
    if path.is_empty() {
        *document = pod;
        return;
    }
    let Some(template) = path.iter().try_fold(&mut *document, |v, key| v.get_mut(*key)) else {
        return;
    };
    if let (Value::Object(template), Value::Object(mut pod)) = (template, pod) {
        for key in ["metadata", "spec"] {
            if let Some(value) = pod.remove(key) {
                template.insert(key.to_owned(), value);
            }
        }
    }
}

/// Whether a document is a list kubectl flattens (`List` and every `<Kind>List`) and so holds
/// documents in `items`.
pub fn is_list(document: &Value) -> bool {
    document.get("kind").and_then(Value::as_str).is_some_and(|k| k.ends_with("List"))
        && document.get("items").is_some_and(Value::is_array)
}

/// Whether a document of a kind `inject` does not know carries what looks like a pod template
/// (`spec.template.spec.containers`, as custom workloads do): it is passed through unchanged, and
/// the user is told.
pub fn looks_like_unknown_workload(document: &Value) -> bool {
    let kind = document.get("kind").and_then(Value::as_str).unwrap_or_default();
    pod_path(kind).is_none()
        && ["spec", "template", "spec", "containers"].iter().try_fold(document, |v, k| v.get(k)).is_some()
}

/// The namespace a document names, if any.
pub fn namespace_of(document: &Value) -> Option<&str> {
    document.get("metadata")?.get("namespace")?.as_str().filter(|n| !n.is_empty())
}

/// `Kind name` for messages.
pub fn describe(document: &Value) -> String {
    let kind = document.get("kind").and_then(Value::as_str).unwrap_or("<no kind>");
    let name = document.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("<unnamed>");
    format!("{kind} {name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pod_templates_are_found_and_written_back_for_every_kind() {
        for kind in supported_kinds() {
            let pod_part = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}});
            let mut doc = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": "w"}});
            let path = pod_path(kind).unwrap();
            if path.is_empty() {
                doc["spec"] = pod_part["spec"].clone();
                doc["metadata"]["labels"] = pod_part["metadata"]["labels"].clone();
            } else {
                let mut slot = &mut doc;
                for key in path {
                    if slot.get(*key).is_none() {
                        slot[*key] = json!({});
                    }
                    slot = slot.get_mut(*key).unwrap();
                }
                *slot = pod_part.clone();
            }
            let mut pod = pod_of(&doc).unwrap();
            assert_eq!(pod["spec"]["containers"][0]["name"], "c", "{kind}");
            assert_eq!(pod["metadata"]["labels"]["app"], "x", "{kind}");
            pod["spec"]["containers"][0]["name"] = json!("changed");
            set_pod(&mut doc, pod);
            assert_eq!(pod_of(&doc).unwrap()["spec"]["containers"][0]["name"], "changed", "{kind}");
            assert_eq!(doc["kind"], kind);
        }
        assert_eq!(pod_of(&json!({"kind": "ConfigMap", "data": {}})), None);
        assert_eq!(field_prefix("CronJob"), "spec.jobTemplate.spec.template.");
    }

    #[test]
    fn the_workload_comes_from_the_controller_and_the_naming_conventions() {
        let owned = |kind: &str, name: &str, labels: Value| {
            json!({"metadata": {"generateName": format!("{name}-"), "labels": labels,
                "ownerReferences": [{"kind": "Other", "name": "x"}, {"kind": kind, "name": name, "controller": true}]}})
        };
        // (case, pod, kind, name)
        let cases = [
            (
                "deployment",
                owned("ReplicaSet", "web-7d9f8c6b5", json!({"pod-template-hash": "7d9f8c6b5"})),
                "Deployment",
                "web",
            ),
            ("bare replicaset", owned("ReplicaSet", "web-7d9f8c6b5", json!({})), "ReplicaSet", "web-7d9f8c6b5"),
            ("statefulset", owned("StatefulSet", "db", json!({})), "StatefulSet", "db"),
            ("daemonset", owned("DaemonSet", "agent", json!({})), "DaemonSet", "agent"),
            ("job", owned("Job", "migrate", json!({})), "Job", "migrate"),
            ("cronjob", owned("Job", "backup-29012345", json!({})), "CronJob", "backup"),
            ("named pod", json!({"metadata": {"name": "debug"}}), "Pod", "debug"),
            ("generateName pod", json!({"metadata": {"generateName": "runner-"}}), "Pod", "runner"),
            ("pod template", json!({"metadata": {"labels": {"app": "x"}}}), "Pod", ""),
        ];
        for (case, pod, kind, name) in cases {
            assert_eq!(Workload::of_pod(&pod), Workload { kind: kind.into(), name: name.into() }, "{case}");
        }
        let deployment = json!({"kind": "Deployment", "metadata": {"name": "web"}, "spec": {"template": {}}});
        assert_eq!(
            Workload::of_document(&deployment),
            Some(Workload { kind: "Deployment".into(), name: "web".into() })
        );
        assert_eq!(Workload::of_document(&json!({"kind": "Pod", "metadata": {"name": "p"}})), None);
    }
}
