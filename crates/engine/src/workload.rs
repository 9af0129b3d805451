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

/// A kind of object that carries a pod or a pod template: where the pod is, how the API names the
/// kind, and what `drift --restart` does for it. The one table of workload kinds: manifests' pods
/// (`inject`, `explain`), `explain --cluster`'s targets, the owners Events go on, and drift's
/// restarts read it.
#[derive(Debug)]
pub struct WorkloadKind {
    /// The kind (`Deployment`).
    pub kind: &'static str,
    /// Its API group and version (`apps/v1`; `v1` for the core group).
    pub api_version: &'static str,
    /// Its resource (`deployments`).
    pub plural: &'static str,
    /// The names `explain --cluster KIND/NAME` takes for it, kubectl's short ones included (none:
    /// not a target).
    pub target_names: &'static [&'static str],
    /// The path of its pod (template) in the object.
    pub pod_path: &'static [&'static str],
    /// Whether Kubernetes' own controller of this kind makes pods (an Event about their injection
    /// goes on it; the RBAC in `deploy/` lets the injector `get` exactly these).
    pub makes_pods: bool,
    /// How `drift --restart` brings one up to date.
    pub restart: Restart,
}

/// How `drift --restart` brings a workload of a kind up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// A rollout, as `kubectl rollout restart` starts one.
    Rollout,
    /// Nothing: its next run gets the current templates.
    NextRun,
    /// By hand, as the advice says.
    Manual(&'static str),
    /// Not at all (no advice of its own).
    Never,
}

/// Every kind that carries a pod, in the order messages list them.
pub const WORKLOAD_KINDS: [WorkloadKind; 9] = [
    WorkloadKind {
        kind: "Pod",
        api_version: "v1",
        plural: "pods",
        target_names: &["pod", "pods", "po"],
        pod_path: &[],
        makes_pods: false,
        restart: Restart::Manual("a bare pod is never deleted by sidecar-injector; re-create it"),
    },
    WorkloadKind {
        kind: "PodTemplate",
        api_version: "v1",
        plural: "podtemplates",
        target_names: &[],
        pod_path: &["template"],
        makes_pods: false,
        restart: Restart::Never,
    },
    WorkloadKind {
        kind: "ReplicationController",
        api_version: "v1",
        plural: "replicationcontrollers",
        target_names: &[],
        pod_path: &["spec", "template"],
        makes_pods: true,
        restart: Restart::Never,
    },
    WorkloadKind {
        kind: "Deployment",
        api_version: "apps/v1",
        plural: "deployments",
        target_names: &["deployment", "deployments", "deploy"],
        pod_path: &["spec", "template"],
        makes_pods: false,
        restart: Restart::Rollout,
    },
    WorkloadKind {
        kind: "StatefulSet",
        api_version: "apps/v1",
        plural: "statefulsets",
        target_names: &["statefulset", "statefulsets", "sts"],
        pod_path: &["spec", "template"],
        makes_pods: true,
        restart: Restart::Rollout,
    },
    WorkloadKind {
        kind: "DaemonSet",
        api_version: "apps/v1",
        plural: "daemonsets",
        target_names: &["daemonset", "daemonsets", "ds"],
        pod_path: &["spec", "template"],
        makes_pods: true,
        restart: Restart::Rollout,
    },
    WorkloadKind {
        kind: "ReplicaSet",
        api_version: "apps/v1",
        plural: "replicasets",
        target_names: &["replicaset", "replicasets", "rs"],
        pod_path: &["spec", "template"],
        makes_pods: true,
        restart: Restart::Manual(
            "a ReplicaSet without a Deployment does not replace pods when its template changes; delete its pods to re-create them",
        ),
    },
    WorkloadKind {
        kind: "Job",
        api_version: "batch/v1",
        plural: "jobs",
        target_names: &["job", "jobs"],
        pod_path: &["spec", "template"],
        makes_pods: true,
        restart: Restart::Manual("a Job's pods are not restarted; re-run the Job to get the current templates"),
    },
    WorkloadKind {
        kind: "CronJob",
        api_version: "batch/v1",
        plural: "cronjobs",
        target_names: &["cronjob", "cronjobs", "cj"],
        pod_path: &["spec", "jobTemplate", "spec", "template"],
        makes_pods: false,
        restart: Restart::NextRun,
    },
];

/// The row of `kind`, if it carries a pod.
pub fn workload_kind(kind: &str) -> Option<&'static WorkloadKind> {
    WORKLOAD_KINDS.iter().find(|w| w.kind == kind)
}

/// The kinds whose pods can be injected.
pub fn supported_kinds() -> impl Iterator<Item = &'static str> {
    WORKLOAD_KINDS.iter().map(|w| w.kind)
}

/// The path of the pod (template) inside a document of this kind, `None` for other kinds.
pub fn pod_path(kind: &str) -> Option<&'static [&'static str]> {
    workload_kind(kind).map(|w| w.pod_path)
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
