//! A huge pod (1,000 env vars on each of 10 containers) gets a correct patch. Its cost relative to a
//! normal pod is measured by `make bench`, not here.

mod common;

use std::sync::Arc;

use common::fixtures::huge_pod;
use sidecar_injector::engine::templates::set::embedded_sources;
use sidecar_injector::engine::{ClusterFacts, Engine, NamespaceFacts, Outcome, PodRequest, TemplateSet};

#[test]
fn a_huge_pod_is_injected_correctly() {
    let (templates, errors) = TemplateSet::load(embedded_sources());
    assert!(errors.is_empty());
    let engine = Engine::new(templates, Vec::new());
    let pod = huge_pod(10, 1000);
    assert!(serde_json::to_vec(&pod).unwrap().len() > 64 * 1024);
    let request = |pod| PodRequest {
        pod: Arc::new(pod),
        namespace: NamespaceFacts::unknown("shop"),
        cluster: ClusterFacts::default(),
        workload: None,
    };

    let Outcome::Inject(injection) = engine.evaluate(&request(pod.clone())).outcome else { panic!("not injected") };
    // One add per injected env var and mount per container, plus a handful for the pod: linear in
    // what is added, independent of the 10,000 env vars already there.
    assert!(injection.patch.len() < 80, "{} operations", injection.patch.len());
    let mut out = pod.clone();
    json_patch::patch(&mut out, &injection.patch).unwrap();
    for (index, container) in out["spec"]["containers"].as_array().unwrap().iter().enumerate() {
        let env = container["env"].as_array().unwrap();
        assert_eq!(env.len(), 1004, "container {index}");
        assert_eq!(
            env[..1000],
            pod["spec"]["containers"][index]["env"].as_array().unwrap()[..],
            "existing env untouched"
        );
        assert_eq!(env[1000]["name"], "OTEL_EXPORTER_OTLP_ENDPOINT");
    }
    assert!(matches!(engine.evaluate(&request(out)).outcome, Outcome::UpToDate(_)));
}
