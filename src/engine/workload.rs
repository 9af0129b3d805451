//! Where the pod lives inside each workload kind, so `inject`, `explain` and `drift` can treat a
//! Deployment's pod template exactly like a pod.

use serde_json::{Map, Value};

/// The kinds that carry a pod (or a pod template), and the path to it.
const POD_TEMPLATE_PATHS: [(&str, &[&str]); 7] = [
    ("Pod", &[]),
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
}
