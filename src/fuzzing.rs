//! The properties the fuzz targets in `fuzz/` check, as plain functions: each panics when its
//! property is violated. They live here, not in the fuzz crate, so that `cargo test`
//! (`tests/fuzz_corpus.rs`) replays the committed corpus — seeds and every regression found — on
//! stable Rust, and a fixed finding can never come back unnoticed.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use serde_json::{Value, json};

use crate::admission;
use crate::engine::templates::set::embedded_sources;
use crate::engine::{
    ClusterFacts, Engine, NamespaceFacts, Outcome, PodRequest, Template, TemplateSet, TemplateSource,
    injection::image_volumes::{ImageVolumeSupport, VolumeForms},
    injection::render,
};

/// A template using every feature, besides the embedded defaults.
const EVERYTHING: &str = r#"
default: true
sidecarMode: container
values: {image: "agent:1", port: 9000, debug: false}
overridable: [image, port, debug]
inject:
  labels: {fuzz.example/label: "{{ pod.metadata.name | default('x') }}"}
  annotations: {fuzz.example/annotation: "{{ values.port }}"}
  initContainers:
    - {name: fuzz-init, image: "{{ values.image }}"}
  sidecars:
    - name: fuzz-agent
      image: "{{ values.image }}"
      ports: [{containerPort: "{{ values.port }}"}]
      env:
        - {name: DEBUG, value: "1", when: "{{ values.debug }}"}
  volumes:
    - {name: fuzz-volume, emptyDir: {}}
  appContainers:
    env:
      - {name: FUZZ_NAMESPACE, value: "{{ namespace.name }}"}
    volumeMounts:
      - {name: fuzz-volume, mountPath: /fuzz}
"#;

static ENGINE: LazyLock<Engine> = LazyLock::new(|| {
    let mut sources = embedded_sources();
    sources.push(TemplateSource { name: "everything".into(), text: EVERYTHING.into() });
    let (templates, errors) = TemplateSet::load(sources);
    assert!(errors.is_empty(), "{errors:?}");
    Engine::new(templates, vec!["sidecar-injector".into()])
});

fn opted_in(name: &str) -> NamespaceFacts {
    NamespaceFacts::known(
        name,
        [("sidecar-injector.io/inject".to_owned(), "enabled".to_owned())].into(),
        BTreeMap::new(),
    )
}

/// Any bytes to `/mutate` and `/validate`: a 400 for an unreadable review, otherwise a 200 whose
/// body is a review echoing the uid; never a panic.
pub fn admission(data: &[u8]) {
    let request = match admission::parse(data) {
        Ok(request) => request,
        Err(error) => {
            assert_eq!(admission::invalid(&error).status, 400);
            return;
        }
    };
    let namespace = opted_in(admission::namespace_of(&request));
    for endpoint in [admission::Endpoint::Mutate, admission::Endpoint::Validate] {
        let reply = match endpoint {
            admission::Endpoint::Mutate => {
                admission::mutate(&ENGINE, request.clone(), &namespace, ClusterFacts::default())
            }
            admission::Endpoint::Validate => admission::validate(
                &ENGINE,
                request.clone(),
                &namespace,
                ClusterFacts::default(),
                "sidecar-injector",
                &crate::engine::templates::set::InProcess,
            ),
        };
        assert_eq!(reply.status, 200, "{:?}", reply.summary);
        let answer: Value = serde_json::from_slice(&reply.body).expect("the answer is JSON");
        assert_eq!(answer["response"]["uid"], json!(request.uid), "the uid is echoed");
    }
}

/// Any text as a template: loading either fails with an error or yields a template that renders
/// (within its bounds) for pods that override every overridable value.
pub fn template(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(template) = Template::load("fuzz", text) else { return };
    let annotations: BTreeMap<String, String> =
        template.overridable.iter().map(|v| (format!("sidecar-injector.io/fuzz.{}", v.name), "1".to_owned())).collect();
    let pods = [
        json!({"metadata": {"name": "a", "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}}),
        json!({"metadata": {}, "spec": {"containers": []}}),
    ];
    // Both forms of any image volume with a fallback.
    let forms = [VolumeForms::Nodes(ImageVolumeSupport::EVERYWHERE), VolumeForms::Recorded(&[])];
    for (pod, forms) in pods.iter().flat_map(|pod| forms.map(|f| (pod.clone(), f))) {
        let owner = crate::engine::workload::Workload::of_pod(&pod);
        let subject = render::Subject::new(Arc::new(pod), &owner);
        let _ = render::render(&template, &subject, &annotations, &opted_in("fuzz"), forms);
    }
}

/// Any JSON as a pod: when the engine injects, the patch applies to that pod, only adds (unless
/// the pod carries a previous status), and injecting the result again changes nothing.
pub fn patch(data: &[u8]) {
    let Ok(pod) = serde_json::from_slice::<Value>(data) else { return };
    let request = |pod: Value| PodRequest {
        pod: Arc::new(pod),
        namespace: opted_in("fuzz"),
        cluster: ClusterFacts::default(),
        workload: None,
    };
    let Outcome::Inject(injection) = ENGINE.evaluate(&request(pod.clone())).outcome else { return };
    let had_status = pod.pointer("/metadata/annotations/sidecar-injector.io~1status").is_some();
    if !had_status {
        for op in &injection.patch {
            let own = op.path().to_string().contains("/sidecar-injector.io~1");
            assert!(
                matches!(op, json_patch::PatchOperation::Add(_)) || own,
                "removes or replaces a field the pod had: {op:?}"
            );
        }
    }
    let mut injected = pod.clone();
    json_patch::patch(&mut injected, &injection.patch).expect("the patch applies to the pod it was made for");
    match ENGINE.evaluate(&request(injected)).outcome {
        Outcome::UpToDate(_) => {}
        other => panic!("injecting the injected pod again is not a no-op: {other:?}"),
    }
}
