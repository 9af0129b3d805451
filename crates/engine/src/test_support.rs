//! Helpers shared by the engine's unit tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::{ClusterFacts, Engine, NamespaceFacts, PodRequest, Template, TemplateSet, TemplateSource};

/// Loads one template or panics with its error.
pub fn template(name: &str, yaml: &str) -> Template {
    Template::load(name, yaml).unwrap_or_else(|e| panic!("{e}"))
}

/// An engine with these templates, all of which must load.
pub fn engine(templates: &[(&str, &str)]) -> Engine {
    let (set, errors) = TemplateSet::load(
        templates.iter().map(|(name, text)| TemplateSource { name: (*name).to_owned(), text: (*text).to_owned() }),
    );
    assert!(errors.is_empty(), "{errors:?}");
    Engine::new(set, vec!["sidecar-injector".to_owned()])
}

/// An opted-in namespace with extra labels.
pub fn opted_in(name: &str, extra: &[(&str, &str)]) -> NamespaceFacts {
    let mut labels: BTreeMap<String, String> = extra.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    labels.insert("sidecar-injector.io/inject".into(), "enabled".into());
    NamespaceFacts::known(name, labels, BTreeMap::new())
}

/// A request for a pod in a namespace on a cluster with native sidecars.
pub fn request(pod: Value, namespace: NamespaceFacts) -> PodRequest {
    PodRequest { pod: Arc::new(pod), namespace, cluster: ClusterFacts::api_server(true), workload: None }
}

/// Applies a patch to a copy of the pod.
pub fn apply(pod: &Value, patch: &[json_patch::PatchOperation]) -> Value {
    let mut out = pod.clone();
    json_patch::patch(&mut out, patch).unwrap_or_else(|e| panic!("patch does not apply: {e}\n{patch:#?}"));
    out
}
