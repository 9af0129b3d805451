//! Tests of [`Engine::evaluate`] end to end: what the patch does to realistic pods.

use json_patch::PatchOperation;
use serde_json::{Value, json};

use crate::emit::policy;
use crate::model::status;
use crate::review::validate;
use crate::templates::template;
use crate::test_support::{self, apply, engine, opted_in, request};
use crate::*;

const LOGS: &str = r#"
default: true
values: {image: "fluent-bit:3", level: info}
overridable: [level]
inject:
  labels: {logging/shipper: fluent-bit}
  annotations: {logging/level: "{{ values.level }}"}
  sidecars:
    - name: logs
      image: "{{ values.image }}"
      args: ["--level={{ values.level }}"]
  volumes:
    - name: app-logs
      emptyDir: {}
  appContainers:
    env:
      - {name: LOG_DIR, value: /var/log/app}
    volumeMounts:
      - {name: app-logs, mountPath: /var/log/app}
"#;

const PROXY: &str = r#"
sidecarMode: native
inject:
  initContainers:
    - {name: proxy-init, image: init}
  sidecars:
    - {name: proxy, image: envoy}
"#;

const CLASSIC: &str = r#"
sidecarMode: container
inject:
  sidecars:
    - {name: agent, image: agent}
"#;

fn web_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}, "annotations": {"team": "a"}},
        "spec": {
            "initContainers": [{"name": "migrate", "image": "migrate"}],
            "containers": [
                {"name": "web", "image": "nginx", "env": [{"name": "MODE", "value": "prod"}], "futureField": {"x": 1}},
                {"name": "worker", "image": "worker"}
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "futureSpecField": true
        }
    })
}

fn inject(engine: &Engine, pod: &Value) -> Injection {
    match engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome {
        Outcome::Inject(injection) => injection,
        other => panic!("expected an injection, got {other:?}"),
    }
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array().map(|items| items.iter().map(|i| i["name"].as_str().unwrap()).collect()).unwrap_or_default()
}

/// Every operation is an `add`, or touches only the injector's own label and annotation.
fn only_adds(patch: &[PatchOperation]) -> bool {
    patch.iter().all(|op| match op {
        PatchOperation::Add(_) => true,
        other => {
            let path = other.path().to_string();
            path.ends_with("sidecar-injector.io~1status") || path.ends_with("sidecar-injector.io~1injected")
        }
    })
}

#[test]
fn a_typical_pod_gets_every_part_of_the_templates_and_keeps_everything_it_had() {
    let engine = engine(&[("logs", LOGS), ("proxy", PROXY)]);
    let mut pod = web_pod();
    pod["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("proxy,logs");
    let injection = inject(&engine, &pod);
    assert!(only_adds(&injection.patch), "{:#?}", injection.patch);
    let out = apply(&pod, &injection.patch);

    assert_eq!(
        names(&out["spec"]["initContainers"]),
        vec!["proxy-init", "proxy", "logs", "migrate"],
        "template init containers and native sidecars go first, in template order"
    );
    assert_eq!(out["spec"]["initContainers"][1]["restartPolicy"], "Always");
    assert!(out["spec"]["initContainers"][0].get("restartPolicy").is_none());
    assert_eq!(names(&out["spec"]["containers"]), vec!["web", "worker"], "logs is native on this cluster (auto)");
    assert_eq!(names(&out["spec"]["volumes"]), vec!["data", "app-logs"]);
    assert_eq!(names(&out["spec"]["containers"][0]["env"]), vec!["MODE", "LOG_DIR"]);
    assert_eq!(names(&out["spec"]["containers"][1]["env"]), vec!["LOG_DIR"]);
    assert_eq!(out["spec"]["containers"][1]["volumeMounts"][0]["mountPath"], "/var/log/app");
    assert_eq!(
        out["metadata"]["labels"],
        json!({"app": "web", "logging/shipper": "fluent-bit", "sidecar-injector.io/injected": "true"})
    );
    assert_eq!(out["metadata"]["annotations"]["logging/level"], "info");
    assert_eq!(out["metadata"]["annotations"]["team"], "a");
    assert_eq!(out["spec"]["containers"][0]["futureField"], json!({"x": 1}), "unknown fields survive");
    assert_eq!(out["spec"]["futureSpecField"], true);

    let status =
        InjectionStatus::parse(out["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap()).unwrap();
    assert_eq!(status, injection.status);
    assert_eq!(status.templates.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["proxy", "logs"]);
    assert_eq!(status.init_containers, vec!["proxy-init", "proxy", "logs"]);
    assert_eq!(status.native_sidecars, vec!["proxy", "logs"]);
    assert!(status.containers.is_empty());
    assert_eq!(status.volumes, vec!["app-logs"]);
    assert_eq!(status.labels, vec!["logging/shipper"]);
    assert_eq!(status.annotations, vec!["logging/level"]);
    assert_eq!(status.app_containers["web"].env, vec!["LOG_DIR"]);
    assert_eq!(status.app_containers["worker"].volume_mounts, vec!["/var/log/app"]);
    assert!(status.skipped.is_empty());
}

#[test]
fn sidecar_mode_decides_native_or_classic() {
    let engine = engine(&[("logs", LOGS), ("classic", CLASSIC), ("proxy", PROXY)]);
    let mut pod = web_pod();
    pod["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("logs,classic,proxy");
    // (cluster supports native sidecars, expected init containers, expected containers)
    let cases = [
        (true, vec!["logs", "proxy-init", "proxy", "migrate"], vec!["web", "worker", "agent"]),
        // Before 1.29 even `sidecarMode: native` falls back to classic containers, with a warning.
        (false, vec!["proxy-init", "migrate"], vec!["web", "worker", "logs", "agent", "proxy"]),
    ];
    for (native, init, containers) in cases {
        let mut req = request(pod.clone(), opted_in("shop", &[]));
        req.cluster = ClusterFacts::api_server(native);
        let decision = engine.evaluate(&req);
        let warned = decision.warnings.iter().any(|w| {
            w.code == WarningCode::NativeSidecarsUnavailable
                && w.message.contains("template proxy asks for native sidecars")
        });
        assert_eq!(warned, !native, "{:?}", decision.warnings);
        let Outcome::Inject(injection) = decision.outcome else { panic!() };
        let out = apply(&pod, &injection.patch);
        assert_eq!(names(&out["spec"]["initContainers"]), init, "native={native}");
        assert_eq!(names(&out["spec"]["containers"]), containers, "native={native}");
        let agent = out["spec"]["containers"].as_array().unwrap().iter().find(|c| c["name"] == "agent").unwrap();
        assert!(agent.get("restartPolicy").is_none(), "classic sidecars get no restartPolicy");
    }

    // A Job's pod with classic sidecars never completes: said so.
    let mut job_pod = pod.clone();
    job_pod["metadata"]["ownerReferences"] = json!([{"kind": "Job", "name": "migrate", "controller": true}]);
    let decision = engine.evaluate(&request(job_pod, opted_in("shop", &[])));
    let warnings = decision.warnings.iter().map(|w| w.message.as_str()).collect::<Vec<_>>().join("\n");
    assert!(
        warnings.contains("template classic adds classic sidecar containers to a pod of Job migrate"),
        "{warnings}"
    );
    assert!(!warnings.contains("template logs adds"), "native sidecars complete: {warnings}");
}

#[test]
fn the_pods_own_items_win_and_every_skip_is_recorded() {
    let engine = engine(&[("logs", LOGS)]);
    let mut pod = web_pod();
    pod["metadata"]["labels"]["logging/shipper"] = json!("vector");
    pod["metadata"]["annotations"]["logging/level"] = json!("debug");
    pod["spec"]["containers"][1]["name"] = json!("logs");
    pod["spec"]["volumes"][0]["name"] = json!("app-logs");
    pod["spec"]["containers"][0]["env"][0]["name"] = json!("LOG_DIR");
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/var/log/app"}]);
    let injection = inject(&engine, &pod);
    assert!(only_adds(&injection.patch));
    let out = apply(&pod, &injection.patch);

    assert_eq!(out["metadata"]["labels"]["logging/shipper"], "vector");
    assert_eq!(out["metadata"]["annotations"]["logging/level"], "debug");
    assert_eq!(names(&out["spec"]["containers"]), vec!["web", "logs"]);
    assert_eq!(out["spec"]["containers"][1]["image"], "worker", "the pod's container named logs is untouched");
    assert_eq!(out["spec"]["volumes"], pod["spec"]["volumes"]);
    assert_eq!(out["spec"]["containers"][0]["env"], json!([{"name": "LOG_DIR", "value": "prod"}]));
    assert_eq!(out["spec"]["containers"][0]["volumeMounts"], json!([{"name": "data", "mountPath": "/var/log/app"}]));

    let skipped: Vec<(status::ItemKind, &str, Option<&str>, &str)> = injection
        .status
        .skipped
        .iter()
        .map(|s| (s.kind, s.name.as_str(), s.container.as_deref(), s.owner.as_str()))
        .collect();
    use model::status::ItemKind::*;
    assert_eq!(
        skipped,
        vec![
            (Label, "logging/shipper", None, "pod"),
            (Annotation, "logging/level", None, "pod"),
            (InitContainer, "logs", None, "pod"),
            (Volume, "app-logs", None, "pod"),
            (Env, "LOG_DIR", Some("web"), "pod"),
            (VolumeMount, "/var/log/app", Some("web"), "pod"),
        ]
        .into_iter()
        .map(|(k, n, c, o)| (if k == InitContainer { Sidecar } else { k }, n, c, o))
        .collect::<Vec<_>>()
    );
    assert_eq!(injection.status.app_containers["logs"].env, vec!["LOG_DIR"], "the other app container still gets it");
}

#[test]
fn a_later_template_never_overwrites_an_earlier_one() {
    let second = LOGS.replace("default: true", "default: true\nsidecarMode: container");
    let engine = engine(&[("a-logs", LOGS), ("b-logs", &second)]);
    let injection = inject(&engine, &web_pod());
    let owners: Vec<&str> = injection.status.skipped.iter().map(|s| s.owner.as_str()).collect();
    assert!(owners.iter().all(|o| *o == "template:a-logs"), "{owners:?}");
    assert_eq!(injection.status.skipped.iter().filter(|s| s.kind == status::ItemKind::Sidecar).count(), 1);
    let out = apply(&web_pod(), &injection.patch);
    assert_eq!(names(&out["spec"]["containers"]), vec!["web", "worker"]);
}

#[test]
fn a_bare_pod_gets_whole_lists_and_maps() {
    let engine = engine(&[("logs", LOGS)]);
    let pod = json!({"spec": {"containers": [{"name": "app", "image": "app"}]}});
    let injection = inject(&engine, &pod);
    let paths: Vec<String> = injection.patch.iter().map(|op| op.path().to_string()).collect();
    assert_eq!(
        paths,
        vec![
            "/metadata",
            "/metadata/labels",
            "/metadata/annotations",
            "/spec/initContainers",
            "/spec/containers/0/env",
            "/spec/containers/0/volumeMounts",
            "/spec/volumes",
        ]
    );
    let out = apply(&pod, &injection.patch);
    assert_eq!(names(&out["spec"]["initContainers"]), vec!["logs"]);
    assert_eq!(out["metadata"]["labels"]["sidecar-injector.io/injected"], "true");
}

#[test]
fn injecting_an_injected_pod_changes_nothing() {
    let engine = engine(&[("logs", LOGS), ("proxy", PROXY), ("classic", CLASSIC)]);
    let mut pod = web_pod();
    pod["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("logs,proxy,classic");
    let out = apply(&pod, &inject(&engine, &pod).patch);
    match engine.evaluate(&request(out, opted_in("shop", &[]))).outcome {
        Outcome::UpToDate(status) => assert_eq!(status.templates.len(), 3),
        other => panic!("expected up to date, got {other:?}"),
    }
}

#[test]
fn other_mutators_changes_survive_re_admission() {
    let engine = engine(&[("logs", LOGS)]);
    let mut out = apply(&web_pod(), &inject(&engine, &web_pod()).patch);
    // Another webhook adds an env var to every container (ours included) and a container of its own.
    for list in ["initContainers", "containers"] {
        for c in out["spec"][list].as_array_mut().unwrap() {
            let env = c.as_object_mut().unwrap().entry("env").or_insert(json!([]));
            env.as_array_mut().unwrap().push(json!({"name": "OTHER", "value": "1"}));
        }
    }
    assert!(matches!(engine.evaluate(&request(out.clone(), opted_in("shop", &[]))).outcome, Outcome::UpToDate(_)));

    // A container another webhook adds is an app container like any other: on reinvocation it gets
    // the templates' env and mounts (only additions), whatever order the webhooks ran in.
    out["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "other-agent", "image": "x"}));
    let injection = inject(&engine, &out);
    assert!(only_adds(&injection.patch), "{:#?}", injection.patch);
    assert!(injection.status.app_containers.contains_key("other-agent"));
    out = apply(&out, &injection.patch);
    assert!(matches!(engine.evaluate(&request(out.clone(), opted_in("shop", &[]))).outcome, Outcome::UpToDate(_)));

    // But a pod whose injected env var was taken away is not up to date: it gets it back, and
    // nothing else changes.
    out["spec"]["containers"][0]["env"].as_array_mut().unwrap().retain(|e| e["name"] != "LOG_DIR");
    let injection = inject(&engine, &out);
    assert!(only_adds(&injection.patch), "{:#?}", injection.patch);
    let again = apply(&out, &injection.patch);
    assert!(again["spec"]["containers"][0]["env"].as_array().unwrap().iter().any(|e| e["name"] == "LOG_DIR"));
    assert!(matches!(engine.evaluate(&request(again, opted_in("shop", &[]))).outcome, Outcome::UpToDate(_)));
}

#[test]
fn re_injection_after_a_template_change_replaces_exactly_what_was_injected() {
    let v1 = engine(&[("logs", LOGS), ("classic", CLASSIC)]);
    let v2_logs = LOGS
        .replace("fluent-bit:3", "fluent-bit:4")
        .replace("- name: logs\n", "- name: logs-v2\n")
        .replace("{name: LOG_DIR, value: /var/log/app}", "{name: LOG_PATH, value: /logs}")
        .replace("logging/shipper: fluent-bit", "logging/agent: fluent-bit");
    // v2 replaces v1 in the running set, which remembers v1 (a pod injected with v1 can prove it).
    let (set, errors) = v1.templates.update(
        [("logs", v2_logs.as_str()), ("classic", CLASSIC)]
            .map(|(name, text)| TemplateSource { name: name.into(), text: text.into() }),
        &crate::templates::set::InProcess,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let v2 = Engine::new(set, v1.excluded_namespaces.clone());
    let mut pod = web_pod();
    pod["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("logs,classic");

    let injected_v1 = apply(&pod, &inject(&v1, &pod).patch);
    let reinjection = inject(&v2, &injected_v1);
    let reinjected = apply(&injected_v1, &reinjection.patch);
    let fresh_v2 = apply(&pod, &inject(&v2, &pod).patch);
    assert_eq!(reinjected, fresh_v2, "re-injecting an old injection equals injecting the original pod");

    // And only what v1 injected was removed.
    let removed: Vec<String> = reinjection
        .patch
        .iter()
        .filter(|op| matches!(op, PatchOperation::Remove(_)))
        .map(|op| op.path().to_string())
        .collect();
    assert_eq!(
        removed,
        vec![
            "/metadata/labels/logging~1shipper",
            "/metadata/annotations/logging~1level",
            "/spec/initContainers/0",
            "/spec/containers/2",
            "/spec/containers/0/env/1",
            "/spec/containers/0/volumeMounts/0",
            "/spec/containers/1/env/0",
            "/spec/containers/1/volumeMounts/0",
            "/spec/volumes/1",
        ]
    );
}

#[test]
fn an_edit_that_changes_nothing_the_pod_holds_keeps_its_claims_proven() {
    // An engine that never saw the version the pod names (a replica started since, the CLI).
    let v1 = engine(&[("logs", LOGS)]);
    let injected = apply(&web_pod(), &inject(&v1, &web_pod()).patch);
    let edits = [
        ("a description", LOGS.replace("default: true\n", "default: true\ndescription: Ships logs\n"), true),
        (
            "a selector",
            LOGS.replace(
                "default: true\n",
                "default: true\npodSelector: {matchExpressions: [{key: x, operator: DoesNotExist}]}\n",
            ),
            true,
        ),
        (
            "an item added",
            LOGS.replace(
                "  labels: {logging/shipper: fluent-bit}",
                "  labels: {logging/shipper: fluent-bit, logging/v: '2'}",
            ),
            true,
        ),
        // What the pod holds changed: nothing proves the old items (kept as the pod's own).
        ("an argument", LOGS.replace("--level=", "--log-level="), false),
        ("an env value", LOGS.replace("value: /var/log/app}", "value: /logs}"), false),
    ];
    for (edit, text, proven) in edits {
        let v2 = engine(&[("logs", &text)]);
        let decision = v2.evaluate(&request(injected.clone(), opted_in("shop", &[])));
        let doubted = decision.warnings.iter().any(|w| w.code == WarningCode::ClaimDoubted);
        assert_eq!(doubted, !proven, "{edit}: {:?}", decision.warnings);
        let Outcome::Inject(again) = decision.outcome else { panic!("{edit}: {:?}", decision.outcome) };
        let reinjected = apply(&injected, &again.patch);
        if proven {
            // Exactly a fresh injection of the author's pod with the version in service.
            assert_eq!(reinjected, apply(&web_pod(), &inject(&v2, &web_pod()).patch), "{edit}");
        } else {
            keeps_everything(&injected, &reinjected);
        }
    }
}

#[test]
fn a_pod_no_template_matches_gets_only_a_status_that_says_why() {
    let engine = engine(&[("proxy", PROXY)]);
    let injection = inject(&engine, &web_pod());
    assert!(injection.status.templates.is_empty());
    assert_eq!(injection.status.reason.as_deref(), Some("no template is marked default: true"));
    let out = apply(&web_pod(), &injection.patch);
    assert!(out["metadata"]["labels"].get("sidecar-injector.io/injected").is_none());
    assert_eq!(out["spec"], web_pod()["spec"]);
    assert!(matches!(engine.evaluate(&request(out, opted_in("shop", &[]))).outcome, Outcome::UpToDate(_)));
}

/// 36,000 instructions for the one-container sample pod, so it loads; 72,000 for a two-container pod,
/// over the 50,000 an expression may use.
const SLOW_PER_CONTAINER: &str = "inject:\n  labels:\n    v: \"{% for c in pod.spec.containers %}{% for i in range(12000) %}{% endfor %}{% endfor %}\"\n";

#[test]
fn denials_name_the_problem() {
    let engine = engine(&[("logs", LOGS), ("slow", SLOW_PER_CONTAINER)]);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut pod = web_pod();
        f(&mut pod);
        match engine.evaluate(&request(pod, opted_in("shop", &[]))).outcome {
            Outcome::Denied(denial) => denial.to_string(),
            other => panic!("expected a denial, got {other:?}"),
        }
    };
    type Mutation = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Mutation, &str)> = vec![
        (
            "unknown template",
            Box::new(|p| p["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("logs,nope")),
            "sidecar-injector: sidecar-injector.io/templates on the pod names unknown template(s) nope; known templates: logs, slow",
        ),
        (
            "invalid override",
            Box::new(|p| {
                p["metadata"]["annotations"]["sidecar-injector.io/logs.level"] = json!(7);
            }),
            "sidecar-injector: the pod is malformed: metadata.annotations.sidecar-injector.io/logs.level: must be a string",
        ),
        (
            "render error at admission",
            Box::new(|p| p["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("slow")),
            "sidecar-injector: cannot inject: template \"slow\" line 3: \"{% for c in pod.spec.containers %}",
        ),
        (
            "containers not a list",
            Box::new(|p| p["spec"]["containers"] = json!({"a": 1})),
            "the pod is malformed: spec.containers: must be a list",
        ),
        (
            "container without name",
            Box::new(|p| p["spec"]["containers"][1] = json!({"image": "x"})),
            "spec.containers[1].name: must be a string",
        ),
        (
            "env not a list",
            Box::new(|p| p["spec"]["containers"][0]["env"] = json!("x")),
            "spec.containers[0].env: must be a list",
        ),
        (
            "label not a string",
            Box::new(|p| p["metadata"]["labels"]["n"] = json!(1)),
            "metadata.labels.n: must be a string",
        ),
        (
            "no spec",
            Box::new(|p| p.as_object_mut().unwrap().remove("spec").map(drop).unwrap_or(())),
            "spec: must be an object",
        ),
    ];
    for (case, mutate, expected) in cases {
        let message = with(&*mutate);
        assert!(message.starts_with("sidecar-injector: ") && message.contains(expected), "{case}: {message}");
    }
}

#[test]
fn a_malformed_status_annotation_is_replaced_with_a_warning() {
    let engine = engine(&[("logs", LOGS)]);
    let mut pod = web_pod();
    pod["metadata"]["annotations"]["sidecar-injector.io/status"] = json!("{not json");
    let decision = engine.evaluate(&request(pod.clone(), opted_in("shop", &[])));
    assert!(
        decision.warnings[0].code == WarningCode::StatusUnreadable
            && decision.warnings[0].message.contains("is not valid"),
        "{:?}",
        decision.warnings
    );
    let Outcome::Inject(injection) = decision.outcome else { panic!() };
    let out = apply(&pod, &injection.patch);
    assert!(
        InjectionStatus::parse(out["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap()).is_ok()
    );
}

#[test]
fn out_of_scope_pods_get_no_patch() {
    let engine = engine(&[("logs", LOGS)]);
    let mut pod = web_pod();
    pod["metadata"]["labels"]["sidecar-injector.io/inject"] = json!("disabled");
    assert!(matches!(
        engine.evaluate(&request(pod, opted_in("shop", &[]))).outcome,
        Outcome::OutOfScope(OutOfScope::PodOptedOut)
    ));
}

const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// What Kubernetes' ServiceAccount admission plugin does to a pod whose token it mounts: the first
/// `kube-api-access-*` volume, read-only at the token path, into every container without a mount
/// there. (A model of plugin/pkg/admission/serviceaccount in kubernetes, for the tests below.)
fn service_account_plugin(pod: &mut Value) {
    let volume =
        names(&pod["spec"]["volumes"]).into_iter().find(|n| n.starts_with("kube-api-access-")).unwrap().to_owned();
    for list in ["initContainers", "containers"] {
        for container in pod["spec"][list].as_array_mut().into_iter().flatten() {
            let mounts = container.as_object_mut().unwrap().entry("volumeMounts").or_insert(json!([]));
            if !mounts.as_array().unwrap().iter().any(|m| m["mountPath"] == TOKEN_PATH) {
                mounts.as_array_mut().unwrap().push(json!({"name": volume, "readOnly": true, "mountPath": TOKEN_PATH}));
            }
        }
    }
}

/// A pod as the API server hands it to the webhook: the plugin has already mounted the token.
fn pod_with_token_mounted() -> Value {
    let mut pod = web_pod();
    pod["spec"]["volumes"].as_array_mut().unwrap().push(json!({"name": "kube-api-access-x7k2p", "projected": {}}));
    service_account_plugin(&mut pod);
    pod
}

#[test]
fn injected_containers_get_the_api_token_mount_kubernetes_would_add_so_the_webhook_is_not_called_twice() {
    const OWN_TOKEN: &str = r#"
sidecarMode: container
inject:
  sidecars:
    - name: api-client
      image: client
      volumeMounts: [{name: own-token, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}]
  volumes: [{name: own-token, emptyDir: {}}]
"#;
    let engine = engine(&[("logs", LOGS), ("proxy", PROXY), ("classic", CLASSIC), ("own-token", OWN_TOKEN)]);
    let injected = ["proxy-init", "proxy", "logs", "agent"];
    // (case, how the pod differs from one the plugin mounted the token into, token mount expected)
    type Change = fn(&mut Value);
    let cases: [(&str, Change, bool); 4] = [
        ("the plugin mounted the token", |_| {}, true),
        ("the pod opts out of the token", |pod| pod["spec"]["automountServiceAccountToken"] = json!(false), false),
        ("no token volume (a manifest rendered offline)", |pod| *pod = web_pod(), false),
        (
            "a container without the mount: not the plugin's work",
            |pod| pod["spec"]["containers"][1]["volumeMounts"] = json!([]),
            false,
        ),
    ];
    for (case, change, expected) in cases {
        let mut pod = pod_with_token_mounted();
        change(&mut pod);
        pod["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("proxy,logs,classic,own-token");
        let injection = inject(&engine, &pod);
        assert!(only_adds(&injection.patch), "{case}");
        let out = apply(&pod, &injection.patch);
        let containers: Vec<&Value> =
            ["initContainers", "containers"].iter().flat_map(|l| out["spec"][l].as_array().unwrap()).collect();
        for name in injected {
            let container = containers.iter().find(|c| c["name"] == name).unwrap();
            let token_mounts: Vec<Value> = container["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|m| m["mountPath"] == TOKEN_PATH)
                .cloned()
                .collect();
            let want = match expected {
                true => vec![json!({"name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": TOKEN_PATH})],
                false => vec![],
            };
            assert_eq!(token_mounts, want, "{case}: {name}");
        }
        let own = containers.iter().find(|c| c["name"] == "api-client").unwrap();
        assert_eq!(own["volumeMounts"], json!([{"name": "own-token", "mountPath": TOKEN_PATH}]), "{case}");
        if expected {
            // The plugin's run after the webhooks finds nothing to change, so no reinvocation.
            let mut rerun = out.clone();
            service_account_plugin(&mut rerun);
            assert_eq!(rerun, out, "{case}");
            assert!(matches!(
                engine.evaluate(&request(out.clone(), opted_in("shop", &[]))).outcome,
                Outcome::UpToDate(_)
            ));
            assert_eq!(
                validate::validate_pod(&engine, &request(out, opted_in("shop", &[]))),
                validate::Verdict::Allowed(vec![]),
                "{case}"
            );
        }
    }
}

// The status annotation is a claim (see `ownership`): these are the shapes that used to lose data.

/// Every item of `before` (containers, init containers, volumes, env, mounts, labels, annotations
/// other than the injector's two keys) is still in `after`, unchanged.
fn keeps_everything(before: &Value, after: &Value) {
    for list in ["containers", "initContainers", "volumes"] {
        for item in before["spec"][list].as_array().into_iter().flatten() {
            let name = &item["name"];
            let kept = after["spec"][list].as_array().and_then(|l| l.iter().find(|i| &i["name"] == name));
            let kept = kept.unwrap_or_else(|| panic!("{list} {name} was removed"));
            for field in ["env", "volumeMounts"] {
                for entry in item[field].as_array().into_iter().flatten() {
                    assert!(kept[field].as_array().unwrap().contains(entry), "{list} {name}: {field} {entry} lost");
                }
            }
            let others = |v: &Value| {
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    o.remove("env");
                    o.remove("volumeMounts");
                }
                v
            };
            assert_eq!(others(item), others(kept), "{list} {name} was rewritten");
        }
    }
    for section in ["labels", "annotations"] {
        for (key, value) in before["metadata"][section].as_object().into_iter().flatten() {
            if key.starts_with("sidecar-injector.io/status") || key == "sidecar-injector.io/injected" {
                continue;
            }
            assert_eq!(&after["metadata"][section][key], value, "{section} {key} was changed or removed");
        }
    }
}

#[test]
fn a_forged_or_copied_status_never_removes_what_the_author_wrote() {
    let engine = engine(&[("logs", LOGS)]);
    // The issue's pod: a status naming a template version nobody serves and the pod's own items.
    let pod = json!({
        "metadata": {"name": "stale", "annotations": {"sidecar-injector.io/status":
            r#"{"templates":[{"name":"logs","hash":"0000000000000000"}],"containers":["web"],"volumes":["data"],"appContainers":{"web":{"env":["DB"]}}}"#}},
        "spec": {"containers": [{"name": "web", "image": "nginx", "env": [{"name": "DB", "value": "prod"}]}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
    });
    let decision = engine.evaluate(&request(pod.clone(), opted_in("shop", &[])));
    let Outcome::Inject(injection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    assert!(only_adds(&injection.patch), "{:#?}", injection.patch);
    assert_eq!(
        *injection.removed,
        InjectionStatus { templates: injection.removed.templates.clone(), ..Default::default() }
    );
    let out = apply(&pod, &injection.patch);
    keeps_everything(&pod, &out);
    assert_eq!(names(&out["spec"]["initContainers"]), ["logs"], "and the pod gets a real injection");
    assert!(decision.warnings.iter().all(|w| w.code == WarningCode::ClaimDoubted), "{:?}", decision.warnings);
    let doubts = decision.warnings.iter().map(|w| w.message.as_str()).collect::<Vec<_>>().join("\n");
    for item in ["sidecar \"web\"", "volume \"data\"", "env var \"DB\" of container \"web\""] {
        assert!(doubts.contains(item) && doubts.contains("kept as the pod's own"), "{item}: {doubts}");
    }

    // The same claim with the *current* hash: web is still not what `logs` renders.
    let current = engine.templates.get("logs").unwrap().hash.clone();
    let mut pod = pod;
    let text = pod["metadata"]["annotations"]["sidecar-injector.io/status"]
        .as_str()
        .unwrap()
        .replace("0000000000000000", &current);
    pod["metadata"]["annotations"]["sidecar-injector.io/status"] = json!(text);
    let Outcome::Inject(injection) = engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome else {
        panic!("a current claim whose items are missing is not up to date")
    };
    assert!(only_adds(&injection.patch), "{:#?}", injection.patch);
    keeps_everything(&pod, &apply(&pod, &injection.patch));
}

#[test]
fn a_current_claim_whose_items_are_missing_gets_them_injected() {
    let engine = engine(&[("logs", LOGS)]);
    let injected = apply(&web_pod(), &inject(&engine, &web_pod()).patch);
    // Copy the status onto the original pod (a chart copying annotations).
    let mut copy = web_pod();
    copy["metadata"]["annotations"]["sidecar-injector.io/status"] =
        injected["metadata"]["annotations"]["sidecar-injector.io/status"].clone();
    let injection = inject(&engine, &copy);
    assert!(only_adds(&injection.patch), "{:#?}", injection.patch);
    let out = apply(&copy, &injection.patch);
    assert_eq!(out, injected, "the copy ends up exactly like a fresh injection");
}

#[test]
fn an_injected_item_changed_since_is_refused_clearly_not_laundered() {
    let engine = engine(&[("logs", LOGS), ("classic", CLASSIC)]);
    let injected = apply(&web_pod(), &inject(&engine, &web_pod()).patch);
    // `kubectl get -o yaml`, then the sidecar's image edited, then created again; or a later
    // mutating webhook replacing it before our reinvocation. Keeping it as injected would lie, and
    // calling it the pod's own would hide the change from /validate: refused, with the change.
    let mut edited = injected.clone();
    edited["spec"]["initContainers"][0]["image"] = json!("evil/not-fluent-bit");
    match engine.evaluate(&request(edited, opted_in("shop", &[]))).outcome {
        Outcome::Denied(denial) => {
            let message = denial.to_string();
            assert!(
                message.contains(r#"init container "logs" was changed after injection: image is "evil/not-fluent-bit", the template sets "fluent-bit:3""#)
                    && message.contains("remove the annotation"),
                "{message}"
            );
        }
        other => panic!("expected a denial, got {other:?}"),
    }

    // An author's addition to an injected sidecar is not lost when the pod moves to other templates.
    let mut added = injected.clone();
    added["spec"]["initContainers"][0]["env"] = json!([{"name": "MINE", "value": "1"}]);
    added["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("classic");
    let injection = inject(&engine, &added);
    let out = apply(&added, &injection.patch);
    assert_eq!(out["spec"]["initContainers"][0], added["spec"]["initContainers"][0]);
    assert_eq!(injection.removed.volumes, ["app-logs"], "the unedited items of logs do go");
    assert!(injection.removed.init_containers.is_empty());
}

#[test]
fn re_injection_with_another_template_set_equals_a_fresh_injection() {
    let engine = engine(&[("logs", LOGS), ("proxy", PROXY), ("classic", CLASSIC)]);
    let bare = json!({"metadata": {"name": "p", "annotations": {"sidecar-injector.io/templates": "logs,proxy"}},
                      "spec": {"containers": [{"name": "app", "image": "app"}]}});
    let first = apply(&bare, &inject(&engine, &bare).patch);
    let mut switched = first.clone();
    switched["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("classic");
    let injection = inject(&engine, &switched);
    let reinjected = apply(&switched, &injection.patch);
    let mut fresh_input = bare.clone();
    fresh_input["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!("classic");
    let fresh = apply(&fresh_input, &inject(&engine, &fresh_input).patch);
    assert_eq!(reinjected, fresh, "no empty env, initContainers, volumes or labels left behind");
    assert_eq!(injection.removed.init_containers, ["logs", "proxy-init", "proxy"]);

    // And to no template at all: every injected list and label goes, the injected label too.
    let mut none = first;
    none["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!(" , ");
    let out = apply(&none, &inject(&engine, &none).patch);
    let mut expected = bare.clone();
    expected["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!(" , ");
    expected["metadata"]["annotations"]["sidecar-injector.io/status"] =
        out["metadata"]["annotations"]["sidecar-injector.io/status"].clone();
    assert_eq!(out, expected);
}

#[test]
fn constrained_overrides_are_refused_with_the_annotation_that_breaks_them() {
    let engine = engine(&[
        ("otel-agent", include_str!("../../../templates/otel-agent.yaml")),
        (
            "limits",
            "default: true\nvalues: {memory: 64, level: info}\noverridable:\n  - {name: memory, minimum: 32, maximum: 512}\n  - {name: level, enum: [debug, info, warn]}\ninject:\n  sidecars:\n    - name: agent\n      image: agent\n      args: [\"--level={{ values.level }}\"]\n      resources: {limits: {memory: \"{{ values.memory }}Mi\"}}\n",
        ),
    ]);
    let with = |template: &str, annotations: &[(&str, &str)]| {
        let mut pod = web_pod();
        pod["metadata"]["annotations"]["sidecar-injector.io/templates"] = json!(template);
        for (key, value) in annotations {
            pod["metadata"]["annotations"][*key] = json!(value);
        }
        engine.evaluate(&request(pod, opted_in("shop", &[]))).outcome
    };
    // (case, template, annotation, value, refusal or None)
    let cases = [
        (
            "a host:port endpoint",
            "otel-agent",
            "sidecar-injector.io/otel-agent.gatewayEndpoint",
            "gw.example:4317",
            None,
        ),
        (
            "collector configuration smuggled in the endpoint",
            "otel-agent",
            "sidecar-injector.io/otel-agent.gatewayEndpoint",
            "gw:4317\nexporters:\n  debug: {}",
            Some("does not match the pattern"),
        ),
        ("a value in range", "limits", "sidecar-injector.io/limits.memory", "256", None),
        (
            "a value over the maximum",
            "limits",
            "sidecar-injector.io/limits.memory",
            "4096",
            Some("4096 is above the maximum 512 for memory"),
        ),
        (
            "a value under the minimum",
            "limits",
            "sidecar-injector.io/limits.memory",
            "8",
            Some("8 is below the minimum 32 for memory"),
        ),
        ("an allowed level", "limits", "sidecar-injector.io/limits.level", "warn", None),
        ("a level not listed", "limits", "sidecar-injector.io/limits.level", "trace", Some("\"trace\" is not one of")),
    ];
    for (case, template, annotation, value, refusal) in cases {
        match (with(template, &[(annotation, value)]), refusal) {
            (Outcome::Inject(_), None) => {}
            (Outcome::Denied(denial), Some(text)) => {
                let message = denial.to_string();
                assert!(message.contains(annotation) && message.contains(text), "{case}: {message}");
            }
            (other, want) => panic!("{case}: expected {want:?}, got {other:?}"),
        }
    }
}

/// A template using every `appContainers` and pod-level key added for users' requests.
const REGISTRY: &str = r#"
default: true
sidecarMode: container
podChoices: [appContainers, sidecarMode]
inject:
  imagePullSecrets:
    - name: private-registry
  sidecars:
    - {name: agent, image: registry.example/agent:1}
  appContainers:
    excludeContainers: [worker]
    env:
      - {name: AGENT_ADDR, value: "127.0.0.1:4317"}
    envFrom:
      - configMapRef: {name: agent-config}
      - secretRef: {name: agent-token}
        prefix: AGENT_
"#;

fn registry_engine() -> Engine {
    engine(&[("registry", REGISTRY)])
}

fn env_from_keys(container: &Value) -> Vec<String> {
    container["envFrom"].as_array().into_iter().flatten().filter_map(crate::model::compare::env_from_key).collect()
}

#[test]
fn image_pull_secrets_and_env_from_are_added_once_and_recorded() {
    let engine = registry_engine();
    let mut pod = web_pod();
    pod["spec"]["imagePullSecrets"] = json!([{"name": "team-registry"}]);
    let injection = inject(&engine, &pod);
    let injected = apply(&pod, &injection.patch);
    assert_eq!(names(&injected["spec"]["imagePullSecrets"]), vec!["team-registry", "private-registry"]);
    assert_eq!(injection.status.image_pull_secrets, vec!["private-registry"]);
    let web = &injected["spec"]["containers"][0];
    assert_eq!(env_from_keys(web), vec!["configMap/agent-config", "secret/agent-token+AGENT_"]);
    assert_eq!(injection.status.app_containers["web"].env_from, env_from_keys(web));
    // excludeContainers: the worker gets nothing.
    assert!(injected["spec"]["containers"][1].get("envFrom").is_none());
    assert!(!injection.status.app_containers.contains_key("worker"));
    assert!(only_adds(&injection.patch));
    // A pull secret the pod already names is neither duplicated nor reported as injected.
    pod["spec"]["imagePullSecrets"] = json!([{"name": "private-registry"}]);
    let injection = inject(&engine, &pod);
    let injected = apply(&pod, &injection.patch);
    assert_eq!(names(&injected["spec"]["imagePullSecrets"]), vec!["private-registry"]);
    assert!(injection.status.image_pull_secrets.is_empty());
    assert!(injection.status.skipped.is_empty(), "not a conflict: {:?}", injection.status.skipped);
    // Idempotent.
    assert!(matches!(engine.evaluate(&request(injected.clone(), opted_in("shop", &[]))).outcome, Outcome::UpToDate(_)));
}

#[test]
fn an_env_from_source_the_pod_has_wins_and_is_recorded() {
    let engine = registry_engine();
    let mut pod = web_pod();
    pod["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "agent-config", "optional": true}}]);
    let injection = inject(&engine, &pod);
    let injected = apply(&pod, &injection.patch);
    let web = &injected["spec"]["containers"][0];
    assert_eq!(env_from_keys(web), vec!["configMap/agent-config", "secret/agent-token+AGENT_"]);
    assert_eq!(web["envFrom"][0]["configMapRef"]["optional"], true, "the pod's own stands");
    let skip = &injection.status.skipped[0];
    assert_eq!(
        (skip.kind, skip.name.as_str(), skip.container.as_deref()),
        (status::ItemKind::EnvFrom, "configMap/agent-config", Some("web"))
    );
    assert_eq!(injected["metadata"]["labels"][names::INJECTED_LABEL], names::INJECTED_PARTIAL);
}

#[test]
fn re_injection_removes_exactly_the_pull_secrets_and_sources_it_added() {
    let engine = registry_engine();
    let pod = web_pod();
    let injected = apply(&pod, &inject(&engine, &pod).patch);
    // The template changes: everything it added goes, the new version comes.
    let edited = engine_with_edit(REGISTRY.replace("agent-token", "agent-token-v2"));
    let again = inject(&edited, &injected);
    let reinjected = apply(&injected, &again.patch);
    let fresh = apply(&pod, &inject(&edited, &pod).patch);
    assert_eq!(reinjected["spec"], fresh["spec"], "re-injection equals a fresh injection");
    assert_eq!(again.removed.image_pull_secrets, vec!["private-registry"]);
    assert_eq!(
        again.removed.app_containers["web"].env_from,
        vec!["configMap/agent-config", "secret/agent-token+AGENT_"]
    );
}

fn engine_with_edit(text: String) -> Engine {
    let mut engine = registry_engine();
    let (set, errors) = engine
        .templates
        .update(vec![TemplateSource { name: "registry".into(), text }], &crate::templates::set::InProcess);
    assert!(errors.is_empty(), "{errors:?}");
    engine.templates = set;
    engine
}

#[test]
fn a_pod_chooses_its_app_containers_and_sidecar_mode_only_where_the_template_lets_it() {
    let engine = registry_engine();
    let with = |annotations: Value| {
        let mut pod = web_pod();
        pod["metadata"]["annotations"] = annotations;
        pod
    };
    // Only "worker" is excluded by the template; the pod narrows to "web" and asks for native.
    let pod = with(
        json!({"sidecar-injector.io/registry.app-containers": "web", "sidecar-injector.io/registry.sidecar-mode": "native"}),
    );
    let injection = inject(&engine, &pod);
    assert_eq!(injection.status.app_containers.keys().collect::<Vec<_>>(), vec!["web"]);
    assert_eq!(injection.status.native_sidecars, vec!["agent"], "the pod chose native sidecars");
    // Refused, with the annotation's name: an excluded container, an unknown one, a bad mode.
    let refused = |annotations: Value, part: &str| match engine
        .evaluate(&request(with(annotations), opted_in("shop", &[])))
        .outcome
    {
        Outcome::Denied(denial) => {
            let message = denial.to_string();
            assert!(message.contains(part), "{part:?} not in {message}");
        }
        other => panic!("not refused: {other:?}"),
    };
    refused(
        json!({"sidecar-injector.io/registry.app-containers": "worker"}),
        "never adds to container \"worker\" (excludeContainers)",
    );
    refused(
        json!({"sidecar-injector.io/registry.app-containers": "wbe"}),
        "annotation sidecar-injector.io/registry.app-containers: the pod has no container \"wbe\"",
    );
    refused(json!({"sidecar-injector.io/registry.sidecar-mode": "sometimes"}), "\"sometimes\" is not a sidecar mode");
    // A template without podChoices ignores the annotations, with a warning.
    let strict = crate::test_support::engine(&[(
        "registry",
        &REGISTRY.replace("podChoices: [appContainers, sidecarMode]\n", ""),
    )]);
    let decision = strict.evaluate(&request(
        with(json!({"sidecar-injector.io/registry.sidecar-mode": "native"})),
        opted_in("shop", &[]),
    ));
    let Outcome::Inject(injection) = decision.outcome else { panic!("not injected") };
    assert!(injection.status.native_sidecars.is_empty());
    assert!(
        decision
            .warnings
            .iter()
            .any(|w| w.code == WarningCode::OverrideIgnored
                && w.message.contains("does not let pods choose sidecarMode")),
        "{:?}",
        decision.warnings
    );
}

#[test]
fn template_container_targets_select_the_app_containers() {
    let only_worker = engine(&[(
        "t",
        "default: true\ninject:\n  appContainers:\n    containers: [worker]\n    env:\n      - {name: X, value: \"1\"}\n",
    )]);
    let injection = inject(&only_worker, &web_pod());
    assert_eq!(injection.status.app_containers.keys().collect::<Vec<_>>(), vec!["worker"]);
}

/// A sidecar with requests and limits, for pods that set pod-level resources.
const BUDGETED: &str = r#"
default: true
sidecarMode: native
inject:
  sidecars:
    - name: agent
      image: agent:1
      resources: {requests: {cpu: 10m, memory: 32Mi}, limits: {memory: 64Mi}}
"#;

fn budgeted_pod(app_limit: &str) -> Value {
    json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": {
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "containers": [{"name": "app", "image": "app:1",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": app_limit}}}]}})
}

#[test]
fn pod_level_resources_are_padded_and_recorded_and_taken_back_exactly() {
    let engine = engine(&[("agent", BUDGETED)]);
    let pod = budgeted_pod("128Mi");
    let injection = inject(&engine, &pod);
    let out = apply(&pod, &injection.patch);
    assert_eq!(
        out["spec"]["resources"],
        json!({"requests": {"cpu": "110m", "memory": "160Mi"}, "limits": {"memory": "320Mi"}})
    );
    let padding = injection.status.pod_resources.clone().expect("recorded");
    assert_eq!(padding.describe(), "requests cpu +10m, memory +32Mi; limits memory +64Mi");
    assert!(matches!(engine.evaluate(&request(out.clone(), opted_in("shop", &[]))).outcome, Outcome::UpToDate(_)));
    assert_eq!(
        crate::claims::strip::strip_injection(&out, &injection.status)["spec"]["resources"],
        pod["spec"]["resources"]
    );
    // A template that no longer adds the sidecar takes the padding back with it.
    let (set, errors) = engine.templates.update(
        [TemplateSource { name: "agent".into(), text: "default: true\ninject:\n  labels: {a: b}\n".into() }],
        &crate::templates::set::InProcess,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let without = Engine::new(set, engine.excluded_namespaces.clone());
    let Outcome::Inject(taken_back) = without.evaluate(&request(out.clone(), opted_in("shop", &[]))).outcome else {
        panic!("expected a re-injection")
    };
    assert_eq!(apply(&out, &taken_back.patch)["spec"]["resources"], pod["spec"]["resources"]);
    // A pod without pod-level resources is untouched, and records nothing.
    let mut plain = pod.clone();
    plain["spec"].as_object_mut().unwrap().remove("resources");
    let injection = inject(&engine, &plain);
    assert_eq!(injection.status.pod_resources, None);
    assert!(injection.patch.iter().all(|op| !op.path().to_string().starts_with("/spec/resources")));
}

/// An agent sized from the app it serves (issue 60 part 3).
const SIZED: &str = r#"
default: true
sidecarMode: native
inject:
  sidecars:
    - name: agent
      image: agent:1
      resources: {requests: {cpu: 10m, memory: 32Mi}, limits: {memory: 64Mi}}
      sizing:
        requests:
          cpu: {from: sum, fraction: 0.1, min: 10m, max: "1"}
          memory: {from: max, fraction: 0.25, min: 32Mi, round: 16Mi}
        limits:
          memory: {from: sum, fraction: 0.5, max: 1Gi, round: 1Mi}
"#;

#[test]
fn an_agent_sized_from_the_app_pads_the_pod_with_its_computed_values_and_keeps_them_when_the_app_is_resized() {
    let engine = engine(&[("agent", SIZED)]);
    let pod = json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": {
    "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
    "containers": [
        {"name": "app", "image": "app:1", "resources": {"requests": {"cpu": 1, "memory": "600Mi"}, "limits": {"memory": "1Gi"}}},
        {"name": "helper", "image": "helper:1", "resources": {"requests": {"cpu": "200m", "memory": "100Mi"}, "limits": {"memory": "500Mi"}}}
    ]}});
    let injection = inject(&engine, &pod);
    let out = apply(&pod, &injection.patch);
    let agent = out["spec"]["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "agent").unwrap();
    // cpu: (1 + 200m) × 0.1 = 120m; memory request: 600Mi × 0.25 = 150Mi, up to 160Mi; limit:
    // 1524Mi × 0.5 = 762Mi.
    assert_eq!(
        agent["resources"],
        json!({"requests": {"cpu": "120m", "memory": "160Mi"}, "limits": {"memory": "762Mi"}})
    );
    // The pod-level padding is what the sized agent adds.
    assert_eq!(
        out["spec"]["resources"],
        json!({"requests": {"cpu": "1620m", "memory": "1184Mi"}, "limits": {"memory": "2810Mi"}})
    );
    assert_eq!(
        injection.notes.sized,
        [
            "agent: container agent: limits.memory = 762Mi (the sum of the app containers' limits.memory 1524Mi × 0.5, rounded up to 1Mi)",
            "agent: container agent: requests.cpu = 120m (the sum of the app containers' requests.cpu 1200m × 0.1, rounded up to 1m)",
            "agent: container agent: requests.memory = 160Mi (the largest of the app containers' requests.memory 600Mi × 0.25, rounded up to 16Mi)",
        ]
    );
    let up_to_date = |pod: &Value| {
        matches!(engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome, Outcome::UpToDate(_))
    };
    assert!(up_to_date(&out), "the sized pod is up to date");
    // The app resized in place: the agent keeps the size it was given. Without pod-level
    // resources the pod stays up to date (its next pod is sized from the new values); with
    // them, the claimed padding is no longer what the agent renders for this pod, so it is
    // doubted and left as the pod's values (never taken back), with a warning.
    let resize = |pod: &Value| {
        let mut resized = pod.clone();
        resized["spec"]["containers"][0]["resources"]["requests"] = json!({"cpu": "1200m", "memory": "700Mi"});
        resized
    };
    let mut unpadded = pod.clone();
    unpadded["spec"].as_object_mut().unwrap().remove("resources");
    let unpadded = apply(&unpadded, &inject(&engine, &unpadded).patch);
    assert!(up_to_date(&resize(&unpadded)), "a resized app does not make the agent stale");
    let decision = engine.evaluate(&request(resize(&out), opted_in("shop", &[])));
    let Outcome::Inject(rewritten) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    assert_eq!(apply(&resize(&out), &rewritten.patch)["spec"], resize(&out)["spec"], "nothing but the status changes");
    assert!(rewritten.status.pod_resources.is_none(), "the padding is no longer claimed");
    assert!(
        decision.warnings.iter().any(|w| w.code == WarningCode::ClaimDoubted && w.message.contains("claimed padding"))
    );
    // A pod whose app sets nothing: the floors, and for the limit (an app without one may use
    // the node) the ceiling.
    let bare = json!({"metadata": {"name": "b", "namespace": "shop"}, "spec": {"containers": [{"name": "app", "image": "app:1"}]}});
    let out = apply(&bare, &inject(&engine, &bare).patch);
    let agent = &out["spec"]["initContainers"][0];
    assert_eq!(agent["resources"], json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "1Gi"}}));
    // The policy mode leaves it to the webhook, and the enforcement policy compares no floor.
    let template = Template::load("agent", SIZED).unwrap();
    assert!(policy::webhook_only_reason(&template, true).is_some_and(|r| r.contains("sizing:")));
    // Rules are literal: one that reads the pod or values does not load.
    let reading = SIZED.replace("fraction: 0.1,", "fraction: \"{{ values.share }}\",");
    let error = Template::load("agent", &reading).unwrap_err().to_string();
    assert!(error.contains("sizing must be literal"), "{error}");
    let bad = SIZED.replace("from: max", "from: avg");
    let error = Template::load("agent", &bad).unwrap_err().to_string();
    assert!(error.contains("sizing.requests.memory: from must be sum or max, not \"avg\""), "{error}");
}

/// Issue 58 part 1: a quantity written as a number (`cpu: 1`, as people write YAML; the CLI's
/// manifests keep it a number) is read as Kubernetes reads it, in the template and in the pod.
#[test]
fn quantities_written_as_numbers_are_padded_like_strings() {
    let template = |cpu: &str| {
        format!(
            "default: true\ninject:\n  sidecars:\n    - name: agent\n      image: agent:1\n      resources: {{requests: {{cpu: {cpu}, memory: 64Mi}}, limits: {{cpu: {cpu}, memory: 64Mi}}}}\n"
        )
    };
    // (the template's cpu, the app's cpu as written, the padded pod-level cpu)
    let cases = [
        ("1", json!("500m"), "1500m"),
        ("\"1000m\"", json!("500m"), "1500m"),
        ("0.25", json!(0.5), "750m"),
        ("1", json!(0.5), "1500m"),
    ];
    for (cpu, app_cpu, padded) in cases {
        let engine = engine(&[("agent", &template(cpu))]);
        let pod = json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": {
            "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
            "containers": [{"name": "app", "image": "app:1", "resources": {"requests": {"cpu": app_cpu, "memory": "256Mi"}}}]}});
        let injection = inject(&engine, &pod);
        assert!(injection.invalid.is_empty(), "{cpu}: {:?}", injection.invalid);
        let out = apply(&pod, &injection.patch);
        assert_eq!(out["spec"]["resources"]["limits"]["cpu"], json!(padded), "{cpu}");
        assert_eq!(out["spec"]["resources"]["requests"]["cpu"], json!(padded), "{cpu}: Guaranteed stays Guaranteed");
        assert!(matches!(engine.evaluate(&request(out.clone(), opted_in("shop", &[]))).outcome, Outcome::UpToDate(_)));
        // As the API server stores it: every quantity a string.
        let mut stored = out.clone();
        stored["spec"]["initContainers"][0]["resources"] =
            json!({"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}});
        if cpu == "0.25" {
            stored["spec"]["initContainers"][0]["resources"] =
                json!({"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "250m", "memory": "64Mi"}});
        }
        let outcome = engine.evaluate(&request(stored, opted_in("shop", &[]))).outcome;
        assert!(matches!(outcome, Outcome::UpToDate(_)), "{cpu}: {outcome:?}");
    }
    // A pod value that is no quantity is never padded over: the pod is left as written, saying why.
    let engine = engine(&[("agent", &template("1"))]);
    let mut pod = budgeted_pod("128Mi");
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("1.5.0");
    let outcome = engine.evaluate(&request(pod, opted_in("shop", &[]))).outcome;
    let text = format!("{outcome:?}");
    assert!(text.starts_with("OutOfScope(WouldBeInvalid"), "{text}");
    assert!(text.contains(r#"spec.containers[0].resources.requests[cpu]: \"1.5.0\" is not a quantity"#), "{text}");
}

/// Strip and removal give back the author's own text of a padded value, not an equal value in
/// Kubernetes' form (`0.5` stays `0.5`, not `500m`).
#[test]
fn taking_a_padding_back_gives_the_authors_own_text() {
    let engine = engine(&[("agent", BUDGETED)]);
    // (the author's pod-level values, written as people write them)
    let cases = [
        json!({"requests": {"cpu": "0.1", "memory": "0.125Gi"}, "limits": {"memory": "0.25Gi"}}),
        json!({"requests": {"cpu": "100m", "memory": "134217728"}, "limits": {"memory": "1000M"}}),
        json!({"requests": {"cpu": 0.1, "memory": "128Mi"}, "limits": {"memory": "256Mi"}}),
    ];
    let (set, errors) = engine.templates.update(
        [TemplateSource { name: "agent".into(), text: "default: true\ninject:\n  labels: {a: b}\n".into() }],
        &crate::templates::set::InProcess,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let without = Engine::new(set, engine.excluded_namespaces.clone());
    for resources in cases {
        let mut pod = budgeted_pod("128Mi");
        pod["spec"]["resources"] = resources.clone();
        let injection = inject(&engine, &pod);
        let out = apply(&pod, &injection.patch);
        assert_ne!(out["spec"]["resources"], resources, "padded");
        let stripped = crate::claims::strip::strip_injection(&out, &injection.status);
        // A number (a manifest given to `inject`) comes back a number.
        assert_eq!(stripped["spec"]["resources"], resources, "strip");
        let Outcome::Inject(taken_back) = without.evaluate(&request(out.clone(), opted_in("shop", &[]))).outcome else {
            panic!("expected a re-injection")
        };
        assert_eq!(apply(&out, &taken_back.patch)["spec"]["resources"], resources, "removal");
    }
}

/// Issue 58 part 2: a copy of an injected pod whose status claims more padding than the injected
/// containers account for proves nothing; the pod's values are kept as they are, never padded a
/// second time for the same sidecar (and never taken below what the author had).
#[test]
fn a_forged_padding_claim_is_ignored_and_the_pods_values_kept() {
    let engine = engine(&[("agent", BUDGETED)]);
    let pod = budgeted_pod("128Mi");
    let injection = inject(&engine, &pod);
    let out = apply(&pod, &injection.patch);
    // (how the recorded padding is forged)
    type Forgery = (&'static str, fn(&mut Value));
    let forgeries: [Forgery; 3] = [
        ("doubled", |p| *p = json!({"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}})),
        ("halved", |p| *p = json!({"requests": {"cpu": "5m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}})),
        ("dropped", |p| *p = Value::Null),
    ];
    for (case, forge) in forgeries {
        let mut status: Value =
            serde_json::from_str(out["metadata"]["annotations"][names::STATUS_ANNOTATION].as_str().unwrap()).unwrap();
        forge(&mut status["podResources"]);
        let mut forged = out.clone();
        forged["metadata"]["annotations"][names::STATUS_ANNOTATION] = json!(status.to_string());
        let after = match engine.evaluate(&request(forged.clone(), opted_in("shop", &[]))).outcome {
            Outcome::Inject(injection) => apply(&forged, &injection.patch),
            Outcome::UpToDate(_) => forged.clone(),
            other => panic!("{case}: {other:?}"),
        };
        assert_eq!(after["spec"]["resources"], out["spec"]["resources"], "{case}: the pod's values are kept");
        let again = engine.evaluate(&request(after.clone(), opted_in("shop", &[]))).outcome;
        let again = match again {
            Outcome::Inject(injection) => apply(&after, &injection.patch),
            _ => after.clone(),
        };
        assert_eq!(again["spec"]["resources"], out["spec"]["resources"], "{case}: and stay so");
    }
}

#[test]
fn a_sidecar_resized_in_place_stays_injected_and_keeps_its_resources() {
    let engine = engine(&[("agent", BUDGETED)]);
    let pod = budgeted_pod("128Mi");
    let injection = inject(&engine, &pod);
    let injected = apply(&pod, &injection.patch);
    let sidecar = |pod: &Value| pod["spec"]["initContainers"][0].clone();
    assert_eq!(sidecar(&injected)["resizePolicy"], model::native::default_resize_policy());

    // An API server older than 1.33 refuses a resizePolicy on a native sidecar: none is written,
    // and the pod is up to date for a newer one (no policy is what the default says).
    let old_api_server = facts::ClusterFacts::from_version("1", "32").unwrap();
    let mut on_old = request(pod.clone(), opted_in("shop", &[]));
    on_old.cluster = old_api_server;
    let Outcome::Inject(old_injection) = engine.evaluate(&on_old).outcome else { panic!("expected an injection") };
    let injected_on_old = apply(&pod, &old_injection.patch);
    assert_eq!(sidecar(&injected_on_old)["restartPolicy"], "Always");
    assert_eq!(sidecar(&injected_on_old).get("resizePolicy"), None);
    let outcome = engine.evaluate(&request(injected_on_old, opted_in("shop", &[]))).outcome;
    assert!(matches!(outcome, Outcome::UpToDate(_)), "{outcome:?}");

    // A vertical autoscaler lowers the sidecar in place, then the pod-level values are resized.
    let mut resized = injected.clone();
    resized["spec"]["initContainers"][0]["resources"] =
        json!({"requests": {"cpu": "5m", "memory": "24Mi"}, "limits": {"memory": "48Mi"}});
    let mut pod_level_resized = resized.clone();
    pod_level_resized["spec"]["resources"]["requests"]["cpu"] = json!("210m");
    for (case, pod) in [("sidecar resized", &resized), ("pod-level values resized too", &pod_level_resized)] {
        let outcome = engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome;
        assert!(matches!(outcome, Outcome::UpToDate(_)), "{case}: {outcome:?}");
        let verdict = validate::validate_pod(&engine, &request(pod.clone(), opted_in("shop", &[])));
        assert!(matches!(verdict, validate::Verdict::Allowed(_)), "{case}: {verdict:?}");
    }
    // Strip takes back exactly the recorded padding (+10m cpu requests) from the resized values.
    let stripped = crate::claims::strip::strip_injection(&pod_level_resized, &injection.status);
    assert_eq!(stripped["spec"]["resources"]["requests"]["cpu"], json!("200m"));

    // A new template version with a new image: the resized sidecar is replaced, its resources
    // carried over (they may be the author's: the claim travels with copies), and the padding is
    // what the carried resources add.
    let edited = |text: String| {
        let (set, errors) =
            engine.templates.update([TemplateSource { name: "agent".into(), text }], &crate::templates::set::InProcess);
        assert!(errors.is_empty(), "{errors:?}");
        Engine::new(set, engine.excluded_namespaces.clone())
    };
    let v2 = edited(BUDGETED.replace("agent:1", "agent:2"));
    let Outcome::Inject(reinjection) = v2.evaluate(&request(resized.clone(), opted_in("shop", &[]))).outcome else {
        panic!("expected a re-injection")
    };
    let after = apply(&resized, &reinjection.patch);
    assert_eq!(sidecar(&after)["image"], "agent:2");
    assert_eq!(sidecar(&after)["resources"], sidecar(&resized)["resources"]);
    assert_eq!(after["spec"]["resources"]["requests"]["cpu"], "105m", "100m the author's, 5m the sidecar's");
    assert_eq!(
        crate::claims::strip::strip_injection(&after, &reinjection.status)["spec"]["resources"],
        pod["spec"]["resources"]
    );
    // The same sidecar as injected (not resized) is replaced with the template's resources.
    let Outcome::Inject(replaced) = v2.evaluate(&request(injected.clone(), opted_in("shop", &[]))).outcome else {
        panic!("expected a re-injection")
    };
    assert_eq!(sidecar(&apply(&injected, &replaced.patch))["resources"], sidecar(&injected)["resources"]);

    // A version that sets other resources does not undo the resize either: the new version, with
    // the pod's resources.
    let v3 = edited(BUDGETED.replace("cpu: 10m", "cpu: 20m").replace("agent:1", "agent:3"));
    let decision = v3.evaluate(&request(resized.clone(), opted_in("shop", &[])));
    assert!(decision.warnings.is_empty(), "{:?}", decision.warnings);
    let Outcome::Inject(reinjection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    let after = apply(&resized, &reinjection.patch);
    assert_eq!(
        (&sidecar(&after)["image"], &sidecar(&after)["resources"]),
        (&json!("agent:3"), &sidecar(&resized)["resources"])
    );
    // A version without the sidecar: the resized one may be the author's, so it is kept, with
    // its share of the padding, and the warning says why.
    let v4 = edited("default: true\ninject:\n  labels: {a: b}\n".to_owned());
    let decision = v4.evaluate(&request(resized.clone(), opted_in("shop", &[])));
    let Outcome::Inject(reinjection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    let after = apply(&resized, &reinjection.patch);
    assert_eq!(sidecar(&after), sidecar(&resized), "the resized sidecar is untouched");
    assert_eq!(after["spec"]["resources"], resized["spec"]["resources"]);
    assert!(decision.warnings.iter().any(|w| w.message.contains("was resized in place")), "{:?}", decision.warnings);
}

const POSITIONED: &str = r#"
default: true
sidecarMode: container
inject:
  initContainers:
    - {name: setup, image: "setup:1", position: last}
  sidecars:
    - {name: agent, image: "agent:1", position: first}
"#;

#[test]
fn positions_put_containers_where_the_template_says_and_re_injection_keeps_them_there() {
    let v1 = engine(&[("agent", POSITIONED)]);
    let pod = web_pod();
    let injected = apply(&pod, &inject(&v1, &pod).patch);
    assert_eq!(names(&injected["spec"]["containers"]), ["agent", "web", "worker"]);
    assert_eq!(names(&injected["spec"]["initContainers"]), ["migrate", "setup"]);
    // `kubectl logs pod/web` still shows the app.
    assert_eq!(injected["metadata"]["annotations"][names::DEFAULT_CONTAINER_ANNOTATION], "web");
    // The app container's own additions went to it, not to the sidecar now before it.
    assert_eq!(injected["spec"]["containers"][1], pod["spec"]["containers"][0]);

    let (set, errors) = v1.templates.update(
        [TemplateSource { name: "agent".into(), text: POSITIONED.replace("agent:1", "agent:2") }],
        &crate::templates::set::InProcess,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let v2 = Engine::new(set, v1.excluded_namespaces.clone());
    let reinjected = apply(&injected, &inject(&v2, &injected).patch);
    assert_eq!(reinjected, apply(&pod, &inject(&v2, &pod).patch), "re-injection equals a fresh injection");
    assert_eq!(reinjected["spec"]["containers"][0]["image"], "agent:2");
    assert_eq!(crate::claims::strip::strip_injection(&reinjected, &inject(&v2, &pod).status), pod);
}

/// The skip of a pod the injection would have made invalid: left as written, but for the status
/// annotation that says why (no template, the reason), so that the companion policy admits it;
/// or, when even that does not fit, without it.
fn left_as_written(pod: &Value, outcome: &Outcome) -> injection::select::OutOfScope {
    match outcome {
        Outcome::Inject(injection) => {
            let reason = injection.skipped_as.clone().expect("a skip");
            assert!(injection.status.templates.is_empty(), "{:?}", injection.status);
            assert_eq!(injection.status.reason, Some(format!("not injected: {reason}")));
            let mut out = apply(pod, &injection.patch);
            let annotations = out["metadata"]["annotations"].as_object_mut().unwrap();
            let status = annotations.remove("sidecar-injector.io/status").expect("the status annotation");
            assert_eq!(status::InjectionStatus::parse(status.as_str().unwrap()).unwrap(), injection.status);
            let mut original = pod.clone();
            original["metadata"].as_object_mut().unwrap().entry("annotations").or_insert(json!({}));
            assert_eq!(out, original, "only the status annotation is added");
            reason
        }
        Outcome::OutOfScope(reason) => reason.clone(),
        other => panic!("expected the pod left as written, got {other:?}"),
    }
}

#[test]
fn a_pod_the_api_server_would_refuse_after_the_injection_is_left_as_written_or_refused_when_enforced() {
    // The app's own limit is over the pod's: whatever is padded, the API server refuses the pod.
    let pod = budgeted_pod("512Mi");
    let engine_for = |text: &str| engine(&[("agent", text)]);
    let decision = engine_for(BUDGETED).evaluate(&request(pod.clone(), opted_in("shop", &[])));
    // Invalid on its own, it cannot carry even the status annotation that says why.
    assert!(matches!(decision.outcome, Outcome::OutOfScope(_)), "{:?}", decision.outcome);
    assert_eq!(left_as_written(&pod, &decision.outcome).code(), "would_be_invalid");
    assert!(
        decision.warnings.iter().any(|w| w.code == WarningCode::InjectionWouldBeInvalid
            && w.message
                .contains("container app's limits[memory] 512Mi must be less than or equal to the pod's limit 320Mi")),
        "{:?}",
        decision.warnings
    );
    let enforced = BUDGETED.replace("default: true", "default: true\nenforced: true");
    let decision = engine_for(&enforced).evaluate(&request(pod, opted_in("shop", &[])));
    let Outcome::Denied(denial) = decision.outcome else { panic!("expected a refusal") };
    assert!(
        denial.to_string().contains("template agent is enforced for this pod, but the API server would refuse"),
        "{denial}"
    );
}

/// A template whose additions carry the pod's `app` label: a label value, a sidecar's name, an
/// annotation.
const NAMED_AFTER_THE_APP: &str = r#"
default: true
sidecarMode: container
inject:
  labels:
    owner: "{{ (pod.metadata.labels | default({}))['app'] | default('none') }}-owner"
  annotations:
    example.com/owner: "{{ (pod.metadata.labels | default({}))['app'] | default('none') }}"
  sidecars:
    - name: "{{ (pod.metadata.labels | default({}))['app'] | default('none') }}-agent"
      image: registry.example/agent:1
      resources: {requests: {cpu: 1m, memory: 1Mi}, limits: {cpu: 1m, memory: 1Mi}}
"#;

#[test]
fn additions_the_api_server_would_refuse_leave_the_pod_as_written_or_refuse_it_when_enforced() {
    let engine = engine(&[("named", NAMED_AFTER_THE_APP)]);
    let pod_named = |app: &str, annotations: Value| {
        let mut pod = web_pod();
        pod["metadata"]["labels"]["app"] = json!(app);
        pod["metadata"]["annotations"] = annotations;
        pod
    };
    // (case, pod, what the warning says; None: injected). A label value may be 63 characters.
    let long_app = "a".repeat(60);
    let annotations_of = |bytes: usize| json!({"example.com/big": "x".repeat(bytes - "example.com/big".len())});
    let cases = [
        ("a short app label, few annotations", pod_named("web", json!({})), None),
        (
            "a label value and a container name over 63 characters",
            pod_named(&long_app, json!({})),
            Some(format!(
                "metadata.labels: Invalid value: \"{long_app}-owner\": must be no more than 63 characters; spec.containers: the injected sidecar container's name \"{long_app}-agent\": must be no more than 63 characters"
            )),
        ),
        (
            "the corpus issue's pod: 262,003 bytes of annotations, pushed over by the injection",
            pod_named("web", annotations_of(262_003)),
            Some("metadata.annotations: Too long: may not be more than 262144 bytes (the pod's own come to 262003 bytes, with the injection's".to_owned()),
        ),
        ("annotations well under the limit", pod_named("web", annotations_of(200_000)), None),
        // Over the limit on its own: the API server's to refuse, naming the pod's own field.
        ("annotations over the limit already", pod_named("web", annotations_of(270_000)), None),
    ];
    for (case, pod, expected) in cases {
        let decision = engine.evaluate(&request(pod.clone(), opted_in("shop", &[])));
        match (&decision.outcome, expected) {
            (Outcome::Inject(injection), None) => assert!(injection.skipped_as.is_none(), "{case}"),
            (outcome, Some(expected)) => {
                assert_eq!(left_as_written(&pod, outcome).code(), "would_be_invalid", "{case}");
                // The status annotation says why, unless the annotations are full.
                let recorded = matches!(outcome, Outcome::Inject(_));
                assert_eq!(recorded, !case.contains("262,003"), "{case}: {outcome:?}");
                let warning = decision.warnings.iter().find(|w| w.code == WarningCode::InjectionWouldBeInvalid);
                let message = warning.map(|w| w.message.as_str()).unwrap_or_default();
                assert!(message.contains(&expected), "{case}: {message}");
            }
            (outcome, expected) => panic!("{case}: {outcome:?}, expected {expected:?}"),
        }
    }
    // An enforced template refuses the pod instead, with the same reasons.
    let enforced = test_support::engine(&[(
        "named",
        &NAMED_AFTER_THE_APP.replace("default: true", "default: true\nenforced: true"),
    )]);
    let decision = enforced.evaluate(&request(pod_named(&long_app, json!({})), opted_in("shop", &[])));
    let Outcome::Denied(denial) = decision.outcome else { panic!("expected a refusal") };
    let text = denial.to_string();
    assert!(text.contains("template named is enforced for this pod, but the API server would refuse"), "{text}");
    assert!(text.contains("metadata.labels: Invalid value"), "{text}");
}

const HOSTS: &str = r#"
default: true
inject:
  hostAliases:
    - ip: 10.0.0.5
      hostnames: ["collector.{{ namespace.name }}.internal"]
    - ip: 10.0.0.6
      hostnames: [vault.internal]
"#;

#[test]
fn host_aliases_are_added_by_ip_and_the_pods_own_entry_for_an_ip_wins() {
    let engine = engine(&[("hosts", HOSTS)]);
    let mut pod = web_pod();
    pod["spec"]["hostAliases"] = json!([{"ip": "10.0.0.6", "hostnames": ["vault.corp"]}]);
    let injection = inject(&engine, &pod);
    let injected = apply(&pod, &injection.patch);
    assert_eq!(
        injected["spec"]["hostAliases"],
        json!([{"ip": "10.0.0.6", "hostnames": ["vault.corp"]}, {"ip": "10.0.0.5", "hostnames": ["collector.shop.internal"]}])
    );
    assert_eq!(injection.status.host_aliases, ["10.0.0.5"]);
    let skip = &injection.status.skipped[0];
    assert_eq!((skip.kind, skip.name.as_str(), skip.owner.as_str()), (status::ItemKind::HostAlias, "10.0.0.6", "pod"));
    assert_eq!(skip.describe(), "skipped host alias \"10.0.0.6\" from template hosts: the pod already has one");
    assert!(only_adds(&injection.patch));
    // Up to date once injected, allowed by /validate, and stripped back to the author's entries.
    let again = request(injected.clone(), opted_in("shop", &[]));
    assert!(matches!(engine.evaluate(&again).outcome, Outcome::UpToDate(_)));
    assert!(matches!(validate::validate_pod(&engine, &again), validate::Verdict::Allowed(_)));
    let stripped = crate::claims::strip::strip_injection(&injected, &injection.status);
    assert_eq!(stripped["spec"]["hostAliases"], pod["spec"]["hostAliases"]);
    // An injected entry changed after injection is caught.
    let mut edited = injected.clone();
    edited["spec"]["hostAliases"][1]["hostnames"] = json!(["elsewhere.internal"]);
    let validate::Verdict::Denied(message) = validate::validate_pod(&engine, &request(edited, opted_in("shop", &[])))
    else {
        panic!("an edited host alias passes /validate")
    };
    assert!(message.contains("host alias \"10.0.0.5\""), "{message}");
}

#[test]
fn host_aliases_a_pod_never_had_come_and_go_whole() {
    let engine = engine(&[("hosts", HOSTS)]);
    let pod = web_pod();
    let injection = inject(&engine, &pod);
    let injected = apply(&pod, &injection.patch);
    assert_eq!(injection.status.host_aliases, ["10.0.0.5", "10.0.0.6"]);
    assert_eq!(crate::claims::strip::strip_injection(&injected, &injection.status)["spec"].get("hostAliases"), None);
    // A template edit: re-injection removes exactly what it added and equals a fresh injection.
    let (set, errors) = engine.templates.update(
        vec![TemplateSource { name: "hosts".into(), text: HOSTS.replace("10.0.0.6", "10.0.0.7") }],
        &crate::templates::set::InProcess,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let edited = Engine::new(set, Vec::new());
    let again = inject(&edited, &injected);
    assert_eq!(again.removed.host_aliases, ["10.0.0.5", "10.0.0.6"]);
    assert_eq!(apply(&injected, &again.patch)["spec"], apply(&pod, &inject(&edited, &pod).patch)["spec"]);
    // A current claim on an entry that is not the template's is refused as altered, never
    // "repaired" over the author's entry.
    let mut forged = pod.clone();
    forged["spec"]["hostAliases"] = json!([{"ip": "10.0.0.5", "hostnames": ["mine.internal"]}]);
    forged["metadata"]["annotations"]["sidecar-injector.io/status"] =
        json!(serde_json::to_string(&injection.status).unwrap());
    match engine.evaluate(&request(forged, opted_in("shop", &[]))).outcome {
        Outcome::Denied(Denial::Altered(what)) => assert!(what[0].starts_with("host alias \"10.0.0.5\""), "{what:?}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn host_aliases_are_left_to_the_webhook_by_the_policy_mode_and_checked_strictly() {
    let set = engine(&[("hosts", HOSTS)]).templates;
    let reason = policy::webhook_only_reason(set.get("hosts").unwrap(), true);
    assert_eq!(reason.as_deref(), Some("it adds hostAliases (inject.hostAliases), which only the webhook adds"));
    let compiled = policy::compile(&set, true, &[]);
    assert!(compiled.compiled.is_empty() && compiled.webhook_only.len() == 1, "{:?}", compiled.webhook_only);
    let err = Template::load("hosts", &HOSTS.replace("hostnames: [vault", "hostname: [vault")).unwrap_err();
    assert!(err.message.contains("inject.hostAliases[1] is not valid: unknown field \"hostname\""), "{err}");
}

/// A sidecar may mount one volume at several paths (`subPath`), as real charts do: the pod is up
/// to date after its injection and `/validate` allows it, although the mounts share a name.
#[test]
fn a_sidecar_mounting_one_volume_twice_is_up_to_date_after_injection() {
    let engine = engine(&[(
        "agent",
        "default: true\ninject:\n  volumes:\n    - {name: agent-data, emptyDir: {}}\n  sidecars:\n    - name: agent\n      image: agent:1\n      volumeMounts:\n        - {name: agent-data, mountPath: /etc/agent, subPath: conf}\n        - {name: agent-data, mountPath: /var/agent}\n",
    )]);
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "image": "app:1"}]}});
    let Outcome::Inject(injection) = engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome else {
        panic!("the pod is injected")
    };
    let out = apply(&pod, &injection.patch);
    let again = engine.evaluate(&request(out.clone(), opted_in("shop", &[]))).outcome;
    assert!(matches!(again, Outcome::UpToDate(_)), "{again:?}");
    assert_eq!(
        validate::validate_pod(&engine, &request(out, opted_in("shop", &[]))),
        validate::Verdict::Allowed(vec![])
    );
}

#[test]
fn a_templates_own_sidecars_that_share_a_port_are_a_load_warning() {
    let text = "default: true\ninject:\n  sidecars:\n    - {name: a, image: a, ports: [{name: metrics, containerPort: 9090}]}\n    - {name: b, image: b, ports: [{name: admin, containerPort: 9090}]}\n";
    let template = template::Template::load("pair", text).unwrap();
    assert!(
        template.warnings.iter().any(|w| w
            == "its sidecars collide in every pod: injected container a and injected container b both declare port 9090/TCP: only the first to bind it runs, the other fails"),
        "{:?}",
        template.warnings
    );
    let apart = text.replace("containerPort: 9090}]}\n    - {name: b", "containerPort: 9091}]}\n    - {name: b");
    let template = template::Template::load("pair", &apart).unwrap();
    assert!(!template.warnings.iter().any(|w| w.contains("collide")), "{:?}", template.warnings);
}

#[test]
fn a_stored_sidecar_with_the_api_token_mount_is_replaced_and_a_resized_one_keeps_its_resources() {
    // A sidecar without mounts of its own: the ServiceAccount plugin's token mount is all it has
    // in the stored pod (found by e2e s33: such sidecars were kept, not replaced).
    let text = "default: true\nsidecarMode: native\ninject:\n  sidecars:\n    - name: sizer\n      image: sizer:1\n      resources: {requests: {cpu: 50m}}\n";
    let v1 = engine(&[("resizable", text)]);
    let pod = pod_with_token_mounted();
    let mut stored = apply(&pod, &inject(&v1, &pod).patch);
    service_account_plugin(&mut stored);
    let (set, errors) = v1.templates.update(
        [TemplateSource { name: "resizable".into(), text: text.replace("sizer:1", "sizer:2") }],
        &crate::templates::set::InProcess,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let v2 = Engine::new(set, v1.excluded_namespaces.clone());
    let mut resized = stored.clone();
    resized["spec"]["initContainers"][0]["resources"]["requests"]["cpu"] = json!("80m");
    for (case, pod, cpu) in [("as injected", &stored, "50m"), ("resized", &resized, "80m")] {
        let decision = v2.evaluate(&request(pod.clone(), opted_in("shop", &[])));
        assert!(decision.warnings.is_empty(), "{case}: {:?}", decision.warnings);
        let Outcome::Inject(injection) = decision.outcome else { panic!("{case}: expected a re-injection") };
        let sizer = &apply(pod, &injection.patch)["spec"]["initContainers"][0];
        assert_eq!(
            (sizer["image"].as_str(), sizer["resources"]["requests"]["cpu"].as_str()),
            (Some("sizer:2"), Some(cpu)),
            "{case}"
        );
    }
}

const AGENT: &str = r#"
default: true
inject:
  volumes:
    - name: agent
      image: {reference: "agent:2", pullPolicy: IfNotPresent}
      fallback:
        emptyDir: {sizeLimit: 64Mi}
        initContainer:
          name: copy-agent
          image: "agent:2"
          command: [cp, -a, /agent/., /copy/]
          volumeMounts: [{name: agent, mountPath: /copy}]
  appContainers:
    volumeMounts:
      - {name: agent, mountPath: /opt/agent, readOnly: true}
"#;

/// A config reloader that restarts the whole pod when it exits 42.
const RELOADER: &str = r#"
default: true
sidecarMode: native
inject:
  sidecars:
    - name: reloader
      image: reloader:1
      restartPolicyRules:
        - action: RestartAllContainers
          exitCodes: {operator: In, values: [42]}
"#;

#[test]
fn a_container_needing_a_feature_no_node_the_pod_can_run_on_offers_is_injected_with_a_warning() {
    use injection::node_features::{FeatureReach, NodeFeatures};
    let engine = engine(&[("reloader", RELOADER)]);
    let declaring = |features: &[&str]| {
        let declared: Vec<String> = features.iter().map(|f| f.to_string()).collect();
        FeatureReach::of([NodeFeatures::of(Some(&declared), Some((1, 37)))], true)
    };
    let by_version = |kubelet| FeatureReach::of([NodeFeatures::of(None, Some(kubelet))], false);
    // (nodes, warned, how the message says it was decided)
    let cases = [
        (declaring(&["RestartAllContainersOnContainerExits"]), false, ""),
        (declaring(&["ExtendWebSocketsToKubelet"]), true, "by their status.declaredFeatures"),
        (by_version((1, 35)), true, "none of them declares features: by kubelet version for the scheduler before 1.36"),
        (by_version((1, 36)), false, ""),
        (
            FeatureReach::of([NodeFeatures::of(None, Some((1, 37)))], true),
            true,
            "none of them declares features: a node that declares none offers none to the scheduler (1.36+)",
        ),
        (FeatureReach::UNKNOWN, false, ""),
    ];
    for (reach, warned, how) in cases {
        let request = PodRequest {
            cluster: ClusterFacts { node_features: reach, ..ClusterFacts::api_server(true) },
            ..request(web_pod(), opted_in("shop", &[]))
        };
        let decision = engine.evaluate(&request);
        let Outcome::Inject(injection) = decision.outcome else { panic!("expected an injection") };
        let injected = apply(&web_pod(), &injection.patch);
        let reloader = injected["spec"]["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "reloader");
        assert_eq!(
            reloader.unwrap_or_else(|| panic!("{injected:#}"))["restartPolicyRules"][0]["action"],
            "RestartAllContainers",
            "injected as written"
        );
        let warnings: Vec<&Warning> =
            decision.warnings.iter().filter(|w| w.code == WarningCode::NodeFeatureMissing).collect();
        assert_eq!(warnings.len(), warned as usize, "{reach:?}: {warnings:?}");
        if let Some(warning) = warnings.first() {
            let message = &warning.message;
            assert!(message.starts_with("template reloader: container reloader has restartPolicyRules with action RestartAllContainers, which needs nodes that offer RestartAllContainersOnContainerExits"), "{message}");
            assert!(message.contains(how) && message.contains("Pending"), "{message}");
        }
    }
    // The pod's own container of that name displaces the template's: nothing to warn about.
    let mut own = web_pod();
    own["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "reloader", "image": "own:1"}));
    let request = PodRequest {
        cluster: ClusterFacts {
            node_features: declaring(&["ExtendWebSocketsToKubelet"]),
            ..ClusterFacts::api_server(true)
        },
        ..request(own, opted_in("shop", &[]))
    };
    let decision = engine.evaluate(&request);
    let Outcome::Inject(injection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    assert!(injection.status.skipped.iter().any(|s| s.name == "reloader"), "{:?}", injection.status);
    assert!(decision.warnings.iter().all(|w| w.code != WarningCode::NodeFeatureMissing), "{:?}", decision.warnings);
}

/// A request on a cluster whose nodes mount image volumes or not.
fn on_nodes(pod: &Value, image_volumes: bool) -> PodRequest {
    let support = match image_volumes {
        true => injection::image_volumes::ImageVolumeSupport::EVERYWHERE,
        false => injection::image_volumes::ImageVolumeSupport::of_api_server(Some((1, 34))),
    };
    PodRequest {
        cluster: ClusterFacts { image_volumes: support, ..ClusterFacts::api_server(true) },
        ..request(pod.clone(), opted_in("shop", &[]))
    }
}

#[test]
fn an_image_volume_or_its_fallback_is_injected_as_the_nodes_allow_and_stays_as_injected() {
    let engine = engine(&[("agent", AGENT)]);
    for image_volumes in [true, false] {
        let Outcome::Inject(injection) = engine.evaluate(&on_nodes(&web_pod(), image_volumes)).outcome else {
            panic!("expected an injection")
        };
        let injected = apply(&web_pod(), &injection.patch);
        let volume = injected["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "agent").unwrap();
        let init = names(&injected["spec"]["initContainers"]);
        match image_volumes {
            true => {
                assert_eq!(volume["image"]["reference"], "agent:2");
                assert_eq!(init, ["migrate"]);
                assert_eq!(injection.status.image_volumes, ["agent"]);
            }
            false => {
                assert_eq!(volume, &json!({"name": "agent", "emptyDir": {"sizeLimit": "64Mi"}}));
                assert_eq!(init, ["copy-agent", "migrate"], "the copy runs before the pod's own init containers");
                assert!(injection.status.image_volumes.is_empty());
                assert_eq!(injection.warnings.iter().filter(|w| w.code == WarningCode::ImageVolumeFallback).count(), 0);
            }
        }
        // Whatever the nodes say later, the pod keeps the form it was given: up to date, and the
        // validating check finds it as injected.
        for later in [true, false] {
            let decision = engine.evaluate(&on_nodes(&injected, later));
            assert!(
                matches!(decision.outcome, Outcome::UpToDate(_)),
                "{image_volumes} then {later}: {:?}",
                decision.outcome
            );
            assert_eq!(
                validate::validate_pod(&engine, &on_nodes(&injected, later)),
                validate::Verdict::Allowed(Vec::new())
            );
        }
        // Strip gives back the author's volumes and containers exactly (an emptied mount list
        // apart).
        let stripped = claims::strip::strip_injection(&injected, &injection.status);
        for list in ["volumes", "initContainers"] {
            assert_eq!(stripped["spec"][list], web_pod()["spec"][list], "{image_volumes}: {list}");
        }
        assert!(stripped["spec"]["containers"][0]["volumeMounts"].as_array().is_some_and(Vec::is_empty));
    }
    // A controller-made pod with no annotation but the status: the check still recomputes the form
    // the pod was given, whatever the nodes say now.
    let made = json!({"metadata": {"generateName": "web-7d9f8c6b5-", "namespace": "shop",
        "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d9f8c6b5", "controller": true}]},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}});
    for (injected_on, validated_on) in [(false, true), (true, false)] {
        let Outcome::Inject(injection) = engine.evaluate(&on_nodes(&made, injected_on)).outcome else { panic!() };
        let stored = apply(&made, &injection.patch);
        let verdict = validate::validate_pod(&engine, &on_nodes(&stored, validated_on));
        assert_eq!(verdict, validate::Verdict::Allowed(Vec::new()), "injected {injected_on}, validated {validated_on}");
    }
    // The fallback comes with a warning naming the reason.
    let decision = engine.evaluate(&on_nodes(&web_pod(), false));
    let warning = decision.warnings.iter().find(|w| w.code == WarningCode::ImageVolumeFallback).expect("a warning");
    assert!(warning.message.contains("the Kubernetes version is 1.34 (image volumes need 1.35+)"), "{warning}");
}

#[test]
fn a_copy_after_an_image_only_edit_gets_the_new_agent_in_either_form() {
    // The agent's image in `values:`, as a release bump edits it; the engine after the edit never
    // saw the old text (a replica started since, or the offline CLI).
    let agent = |tag: &str| {
        AGENT
            .replace("default: true\n", &format!("default: true\nvalues: {{tag: \"{tag}\"}}\n"))
            .replace("agent:2", "agent:{{ values.tag }}")
    };
    let (v2, v3) = (engine(&[("agent", &agent("2"))]), engine(&[("agent", &agent("3"))]));
    for image_volumes in [true, false] {
        let Outcome::Inject(injection) = v2.evaluate(&on_nodes(&web_pod(), image_volumes)).outcome else { panic!() };
        let copy = apply(&web_pod(), &injection.patch);
        let decision = v3.evaluate(&on_nodes(&copy, image_volumes));
        let doubts = decision.warnings.iter().filter(|w| w.code != WarningCode::ImageVolumeFallback);
        assert_eq!(doubts.count(), 0, "{image_volumes}: {:?}", decision.warnings);
        let Outcome::Inject(again) = decision.outcome else { panic!("{image_volumes}: {:?}", decision.outcome) };
        assert!(again.status.skipped.is_empty(), "{image_volumes}: nothing is kept as the pod's own");
        let upgraded = apply(&copy, &again.patch);
        // Exactly a fresh injection of the author's pod with the new version.
        let Outcome::Inject(fresh) = v3.evaluate(&on_nodes(&web_pod(), image_volumes)).outcome else { panic!() };
        assert_eq!(upgraded, apply(&web_pod(), &fresh.patch), "{image_volumes}");
        let volume = upgraded["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "agent").unwrap();
        match image_volumes {
            true => assert_eq!(volume["image"]["reference"], "agent:3"),
            false => assert_eq!(upgraded["spec"]["initContainers"][0]["image"], "agent:3"),
        }
        assert_eq!(
            validate::validate_pod(&v3, &on_nodes(&upgraded, image_volumes)),
            validate::Verdict::Allowed(Vec::new())
        );
    }
}

#[test]
fn a_status_that_lies_about_the_form_proves_nothing_and_costs_nothing() {
    let engine = engine(&[("agent", AGENT)]);
    let Outcome::Inject(injection) = engine.evaluate(&on_nodes(&web_pod(), false)).outcome else { panic!() };
    let injected = apply(&web_pod(), &injection.patch);
    // The status now claims the image volume the pod does not have.
    let mut forged = injected.clone();
    let mut status = injection.status.clone();
    status.image_volumes = vec!["agent".into()];
    forged["metadata"]["annotations"][names::STATUS_ANNOTATION] = json!(status.to_annotation());
    // The pod's emptyDir is not what the claimed form renders: refused as changed since (as any
    // claimed item that is not its template's), never removed or rewritten.
    let outcome = engine.evaluate(&on_nodes(&forged, true)).outcome;
    let Outcome::Denied(Denial::Altered(changes)) = outcome else { panic!("{outcome:?}") };
    assert_eq!(changes, ["volume \"agent\" was changed after injection: image was removed"]);
    // A claim of the image volume on a pod never injected adds it as claimed, and removes nothing.
    let mut claimed = web_pod();
    claimed["metadata"]["annotations"][names::STATUS_ANNOTATION] = json!(status.to_annotation());
    let Outcome::Inject(fresh) = engine.evaluate(&on_nodes(&claimed, false)).outcome else { panic!() };
    assert!(claims::ownership::owns_all(&InjectionStatus::default(), &fresh.removed), "{:?}", fresh.removed);
}

#[test]
fn a_fallback_is_checked_when_the_template_loads() {
    let with = |fallback: &str| {
        format!(
            "inject:\n  volumes:\n    - name: agent\n      image: {{reference: \"agent:2\"}}\n      fallback: {fallback}\n"
        )
    };
    // (fallback, error)
    let cases = [
        ("{emptyDir: {}}", "fallback needs an initContainer"),
        ("{initContainer: {image: x}}", "fallback.initContainer has no name"),
        ("{initContainer: {name: c, image: x}, hostPath: {}}", "unknown key \"hostPath\" in fallback"),
        ("[]", "fallback must be {initContainer"),
        ("{initContainer: {name: c, image: x}}", "its initContainer \"c\" does not mount \"agent\""),
        (
            "{initContainer: {name: c, image: x, volumeMounts: [{name: agent, mountPath: /c}]}, emptyDir: 3}",
            "fallback.emptyDir must be a mapping",
        ),
    ];
    for (fallback, error) in cases {
        let e = Template::load("t", &with(fallback)).unwrap_err().to_string();
        assert!(e.contains(error), "{fallback}: {e}");
    }
    let e = Template::load(
        "t",
        "inject:\n  volumes:\n    - name: a\n      emptyDir: {}\n      fallback: {initContainer: {name: c}}\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("fallback is for image volumes"), "{e}");
    // Without a fallback: a warning for check-templates.
    let t =
        Template::load("t", "inject:\n  volumes:\n    - name: agent\n      image: {reference: \"agent:2\"}\n").unwrap();
    assert!(
        t.warnings.iter().any(|w| w.contains("volume \"agent\" is an image volume without a fallback")),
        "{:?}",
        t.warnings
    );
    // The policy mode leaves fallbacks to the webhook.
    let t = Template::load("t", AGENT).unwrap();
    assert!(policy::webhook_only_reason(&t, true).is_some_and(|r| r.to_string().contains("fallback")));
}

#[test]
fn templates_sharing_an_image_volume_give_it_one_form() {
    // The second template mounts the shared volume with subPath, which the nodes do not apply.
    let tools = AGENT.replace(
        "{name: agent, mountPath: /opt/agent, readOnly: true}",
        "{name: agent, mountPath: /opt/tools, subPath: bin}",
    );
    let engine = engine(&[("agent", AGENT), ("tools", &tools)]);
    let support = injection::image_volumes::ImageVolumeSupport::of_node(
        (1, 36),
        injection::image_volumes::RuntimeVersion::parse("containerd://2.1.0"),
    );
    let request = PodRequest {
        cluster: ClusterFacts { image_volumes: support, ..ClusterFacts::api_server(true) },
        ..request(web_pod(), opted_in("shop", &[]))
    };
    let Outcome::Inject(injection) = engine.evaluate(&request).outcome else { panic!() };
    let injected = apply(&web_pod(), &injection.patch);
    let volume = injected["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "agent").unwrap();
    assert!(volume.get("emptyDir").is_some(), "{volume}");
    // One volume, one copy (the second template's are the first's), both templates' mounts on it.
    assert_eq!(names(&injected["spec"]["initContainers"]), ["copy-agent", "migrate"]);
    let skipped: Vec<(&str, &str)> =
        injection.status.skipped.iter().map(|s| (s.name.as_str(), s.owner.as_str())).collect();
    assert_eq!(skipped, [("copy-agent", "template:agent"), ("agent", "template:agent")]);
    assert_eq!(injection.status.app_containers["web"].volume_mounts, ["/opt/agent", "/opt/tools"]);
    let reason = injection.notes.volumes.iter().find(|n| n.starts_with("agent:")).unwrap();
    assert!(reason.contains("containerd 2.1"), "{reason}");
    assert!(matches!(
        engine.evaluate(&PodRequest { pod: std::sync::Arc::new(injected), ..request }).outcome,
        Outcome::UpToDate(_)
    ));
}

/// Issue 58 part 6: a namespace neither the cache nor a direct read could answer for. A template
/// that chooses by namespace labels is never judged on labels nobody could read (the class of
/// Kyverno's CVE-2025-46342, a failed lookup that skipped namespace-selected rules): the pod is
/// refused, for its controller to retry. Templates that do not choose by them are unaffected.
#[test]
fn a_namespace_that_could_not_be_read_never_decides_a_namespace_selector() {
    const BY_TEAM: &str =
        "default: true\nnamespaceSelector: {matchLabels: {team: payments}}\ninject:\n  labels: {audited: \"yes\"}\n";
    const ANYWHERE: &str = "default: true\ninject:\n  labels: {shipped: \"yes\"}\n";
    let pod = json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": {"containers": [{"name": "app", "image": "app:1"}]}});
    let unavailable = || NamespaceFacts::unavailable("shop", "reading it took over 2s".to_owned());
    // (templates, the outcome)
    let audited = BY_TEAM.replace("default: true", "default: false\nenforced: audit");
    let cases: [(&[(&str, &str)], &str); 4] = [
        (&[("by-team", BY_TEAM), ("anywhere", ANYWHERE)], "refused"),
        (&[("by-team", &BY_TEAM.replace("default: true", "default: true\nenforced: true"))], "refused"),
        // Its annotations are unknown too (a templates annotation, per-namespace values).
        (&[("anywhere", ANYWHERE)], "refused"),
        // Nothing would be injected, and an audited template only reports.
        (&[("by-team", &audited)], "nothing"),
    ];
    for (templates, expected) in cases {
        let engine = engine(templates);
        match (engine.evaluate(&request(pod.clone(), unavailable())).outcome, expected) {
            (Outcome::Denied(denial), "refused") => {
                let text = denial.to_string();
                assert!(
                    text.contains("the labels of namespace shop could not be read (reading it took over 2s)"),
                    "{text}"
                );
                assert!(text.contains(&format!("decide template(s) {}", templates[0].0)), "{text}");
            }
            (Outcome::OutOfScope(_), "nothing") => {}
            (Outcome::Inject(injection), "nothing") => assert!(injection.status.templates.is_empty(), "{injection:?}"),
            (other, _) => panic!("{templates:?}: expected {expected}, got {other:?}"),
        }
    }
    // The same namespace read: decided on its labels as ever.
    let engine = engine(&[("by-team", BY_TEAM)]);
    let known = opted_in("shop", &[("team", "payments")]);
    assert!(matches!(engine.evaluate(&request(pod, known)).outcome, Outcome::Inject(_)));
}

/// A template with a scheduling gate: the gate is lifted by its controller after admission.
const GATED: &str = r#"
default: true
sidecarMode: container
inject:
  schedulingGates:
    - name: devices.example.com/prepared
  sidecars:
    - {name: agent, image: "agent:1"}
"#;

fn app_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app"},
           "spec": {"containers": [{"name": "app", "image": "app:1"}]}})
}

#[test]
fn a_lifted_scheduling_gate_is_neither_doubted_nor_put_back_on_a_running_pod() {
    let engine = engine(&[("gated", GATED)]);
    let Outcome::Inject(injection) = engine.evaluate(&request(app_pod(), opted_in("shop", &[]))).outcome else {
        panic!("not injected")
    };
    let injected = apply(&app_pod(), &injection.patch);
    assert_eq!(injection.status.scheduling_gates, ["devices.example.com/prepared"]);
    assert_eq!(injected["spec"]["schedulingGates"], json!([{"name": "devices.example.com/prepared"}]));
    // Its controller lifts the gate: the running pod is still the injection's.
    let mut lifted = injected.clone();
    lifted["spec"].as_object_mut().unwrap().remove("schedulingGates");
    // At creation a gate cannot have been lifted yet: a later mutator that dropped it is refused by
    // `/validate` like any injected item that did not survive.
    let verdict = validate::validate_pod(&engine, &request(lifted.clone(), opted_in("shop", &[])));
    assert!(
        matches!(verdict, validate::Verdict::Denied(ref why) if why.contains("devices.example.com/prepared")),
        "{verdict:?}"
    );

    // An edit of the agent's image: `drift --in-place` updates the image and never adds the gate
    // back (the API server refuses a gate added by an update), and no claim is doubted.
    let edited = test_support::engine(&[("gated", &GATED.replace("agent:1", "agent:2"))]);
    let update = drift::in_place::in_place_update(&edited, &request(lifted.clone(), opted_in("shop", &[])))
        .expect("a lifted gate is no doubt");
    assert_eq!(update.images.iter().map(|c| c.to.as_str()).collect::<Vec<_>>(), ["agent:2"]);
    // The update of the image passes `/validate`, and so does the lifting itself.
    let mut updated = lifted.clone();
    updated["spec"]["containers"][1]["image"] = json!("agent:2");
    updated["metadata"]["annotations"][names::STATUS_ANNOTATION] = json!(update.status);
    let verdict = validate::validate_pod_update(&edited, &lifted, &request(updated, opted_in("shop", &[])));
    assert!(matches!(verdict.verdict, validate::Verdict::Allowed(_)), "{verdict:?}");
    let verdict = validate::validate_pod_update(&engine, &injected, &request(lifted.clone(), opted_in("shop", &[])));
    assert!(matches!(verdict.verdict, validate::Verdict::Allowed(_)), "{verdict:?}");

    // At admission nothing can have been lifted yet: a pod created with a copied (or forged)
    // status that claims the gate, without it, gets the gate.
    let Outcome::Inject(again) = engine.evaluate(&request(lifted, opted_in("shop", &[]))).outcome else {
        panic!("a claimed gate the new pod lacks is added")
    };
    assert!(
        again.patch.iter().any(
            |op| matches!(op, PatchOperation::Add(add) if add.path.to_string().starts_with("/spec/schedulingGates"))
        ),
        "{:?}",
        again.patch
    );
}

#[test]
fn a_sidecar_that_uses_a_claim_the_pod_holds_otherwise_is_skipped_with_it() {
    let template = r#"
default: true
sidecarMode: container
inject:
  resourceClaims:
    - {name: gpu, resourceClaimTemplateName: profiling-gpu}
  sidecars:
    - name: profiler
      image: "profiler:1"
      resources: {claims: [{name: gpu}]}
"#;
    let engine = engine(&[("gpu", template)]);
    let mut pod = app_pod();
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": "shared-a100"}]);
    let Outcome::Inject(injection) = engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome else {
        panic!("not injected")
    };
    let skipped: Vec<(status::ItemKind, &str, &str)> =
        injection.status.skipped.iter().map(|s| (s.kind, s.name.as_str(), s.owner.as_str())).collect();
    assert_eq!(
        skipped,
        [(status::ItemKind::Sidecar, "profiler", "resourceClaim:gpu"), (status::ItemKind::ResourceClaim, "gpu", "pod")]
    );
    assert_eq!(apply(&pod, &injection.patch)["spec"]["containers"].as_array().unwrap().len(), 1);
    // The same claim the pod already has is the template's: the sidecar uses it.
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "profiling-gpu"}]);
    let Outcome::Inject(injection) = engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome else {
        panic!("not injected")
    };
    assert_eq!(injection.status.containers, ["profiler"]);
}

/// What a decision for `pod` made, and how many renderings it took.
fn counted_renders(engine: &Engine, pod: &Value) -> (Outcome, usize) {
    let request = request(pod.clone(), opted_in("shop", &[]));
    let mut renderings = crate::Renderings::new(&request, false);
    let decision = engine.evaluate_in(&mut renderings);
    (decision.outcome, renderings.renders)
}

#[test]
fn a_decision_renders_each_template_version_once_for_each_pod_it_reads() {
    // An enforced template whose app mounts the enforcement checks read again after the decision
    // (a pod can shadow a mount without any skip), and an agent whose container can be resized.
    let mounts = "default: true\nenforced: true\ninject:\n  volumes: [{name: certs, emptyDir: {}}]\n  appContainers:\n    volumeMounts: [{name: certs, mountPath: /certs}]\n";
    let engine = engine(&[("agent", BUDGETED), ("mounts", mounts)]);
    let pod = budgeted_pod("128Mi");
    let (outcome, renders) = counted_renders(&engine, &pod);
    let Outcome::Inject(injection) = outcome else { panic!("{outcome:?}") };
    assert_eq!(renders, 2, "a fresh pod: each template once, the enforcement checks reusing the enforced one's");

    let injected = apply(&pod, &injection.patch);
    let (outcome, renders) = counted_renders(&engine, &injected);
    assert!(matches!(outcome, Outcome::UpToDate(_)), "{outcome:?}");
    // The claimed versions for the pod without its claimed items, then the enforced one for the
    // pod as it is (what the enforcement checks judge).
    assert_eq!(renders, 3, "an injected copy");

    // The agent edited, its sidecar resized in place: the claimed versions and the current ones,
    // each once for the pod without the claimed items (the resize carried over reads the current
    // version the injection then takes).
    let (set, errors) = engine.templates.update(
        [
            TemplateSource { name: "agent".into(), text: BUDGETED.replace("agent:1", "agent:2") },
            TemplateSource { name: "mounts".into(), text: mounts.to_owned() },
        ],
        &crate::templates::set::InProcess,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let edited = Engine::new(set, engine.excluded_namespaces.clone());
    let mut resized = injected.clone();
    resized["spec"]["initContainers"][0]["resources"] = json!({"requests": {"cpu": "5m", "memory": "24Mi"}});
    let (outcome, renders) = counted_renders(&edited, &resized);
    let Outcome::Inject(reinjection) = outcome else { panic!("{outcome:?}") };
    assert_eq!(apply(&resized, &reinjection.patch)["spec"]["initContainers"][0]["image"], "agent:2");
    assert_eq!(reinjection.status.templates.len(), 2);
    assert_eq!(renders, 4, "two claimed versions, one current version of the agent, the enforced one for the pod");
}

#[test]
fn a_current_claim_the_plan_disproves_is_replaced_rendering_each_version_at_most_twice() {
    // A forged copy: the agent claimed as injected by the version in service, exactly as it
    // renders, but the volume it mounts is the pod's own, which displaces it.
    let template = "default: true\ninject:\n  volumes: [{name: shared, emptyDir: {}}]\n  sidecars:\n    - name: agent\n      image: agent:1\n      volumeMounts: [{name: shared, mountPath: /shared}]\n";
    let engine = engine(&[("agent", template)]);
    let pod = app_pod();
    let Outcome::Inject(injection) = engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome else {
        panic!("not injected")
    };
    let mut forged = apply(&pod, &injection.patch);
    forged["spec"]["volumes"] = json!([{"name": "shared", "configMap": {"name": "the-authors"}}]);
    let mut claim = injection.status.clone();
    claim.volumes.clear();
    forged["metadata"]["annotations"][names::STATUS_ANNOTATION] = json!(claim.to_annotation());

    let (outcome, renders) = counted_renders(&engine, &forged);
    let Outcome::Inject(replaced) = outcome else { panic!("{outcome:?}") };
    // Kept in place, the agent would be displaced by the pod's volume while the claim says it was
    // injected: the claim is not kept, and the replacement is what a fresh injection of the pod
    // without the agent makes.
    let skipped: Vec<(&str, &str)> =
        replaced.status.skipped.iter().map(|s| (s.name.as_str(), s.owner.as_str())).collect();
    assert!(skipped.contains(&("agent", "volume:shared")), "{skipped:?}");
    let after = apply(&forged, &replaced.patch);
    assert_eq!(after["spec"]["volumes"], forged["spec"]["volumes"], "the pod's own volume stays");
    let mut without_agent = forged.clone();
    without_agent["metadata"]["annotations"].as_object_mut().unwrap().remove(names::STATUS_ANNOTATION);
    for list in ["containers", "initContainers"] {
        if let Some(containers) = without_agent["spec"][list].as_array_mut() {
            containers.retain(|c| c["name"] != "agent");
        }
    }
    // A list that held only injected items goes whole, as if never added.
    without_agent["spec"].as_object_mut().unwrap().remove("initContainers");
    let Outcome::Inject(fresh) = engine.evaluate(&request(without_agent.clone(), opted_in("shop", &[]))).outcome else {
        panic!("not injected")
    };
    assert_eq!(
        (after["spec"].clone(), replaced.status),
        (apply(&without_agent, &fresh.patch)["spec"].clone(), fresh.status)
    );
    // The kept plan takes the rendering it was given; the replacement renders the version again.
    assert_eq!(renders, 2);
}

/// A sidecar every Pod Security level admits.
const HARDENED: &str = r#"
default: true
inject:
  sidecars:
    - name: agent
      image: agent:1
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
        runAsNonRoot: true
        seccompProfile: {type: RuntimeDefault}
"#;

/// An init container only `privileged` admits (it programs iptables).
const NET_ADMIN: &str = r#"
default: true
inject:
  initContainers:
    - name: net-init
      image: init:1
      securityContext:
        capabilities: {add: [NET_ADMIN, NET_RAW], drop: [ALL]}
"#;

/// A pod the `restricted` level admits.
fn restricted_pod() -> Value {
    json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": {
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "app", "image": "app:1", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}})
}

fn in_level(engine: &Engine, pod: &Value, labels: &[(&str, &str)]) -> Decision {
    engine.evaluate(&request(pod.clone(), opted_in("shop", labels)))
}

const ENFORCE_RESTRICTED: (&str, &str) = ("pod-security.kubernetes.io/enforce", "restricted");

#[test]
fn a_template_that_breaks_the_namespaces_pod_security_level_is_left_out_with_the_reason() {
    let engine = engine(&[("hardened", HARDENED), ("net", NET_ADMIN)]);
    let pod = restricted_pod();
    let decision = in_level(&engine, &pod, &[ENFORCE_RESTRICTED]);
    let Outcome::Inject(injection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    // The hardened sidecar is injected; the privileged init container is not.
    let names: Vec<&str> = injection.status.templates.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["hardened"]);
    let after = apply(&pod, &injection.patch);
    assert_eq!(after["spec"].get("initContainers").map(|c| c.as_array().unwrap().len()), Some(1), "{after:#}");
    let reason = injection.status.reason.as_deref().unwrap_or_default();
    for expected in ["not injected: template net: ", "violates PodSecurity \"restricted:latest\"", "\"NET_ADMIN\""] {
        assert!(reason.contains(expected), "{expected:?} in {reason}");
    }
    assert!(decision.warnings.iter().any(|w| w.code == WarningCode::PodSecurityLeftOut), "{:?}", decision.warnings);
    // What the API server judges: the injected pod passes the level.
    let policy = checks::pod_security::Policy::enforce_of(&opted_in("shop", &[ENFORCE_RESTRICTED]).labels, 37);
    assert!(policy.violations(&after).is_empty(), "{:?}", policy.violations(&after));

    // At baseline the init container still breaks the level (capabilities); at privileged it does not.
    let decision = in_level(&engine, &pod, &[("pod-security.kubernetes.io/enforce", "baseline")]);
    let Outcome::Inject(injection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    assert_eq!(injection.status.templates.len(), 1);
    let decision = in_level(&engine, &pod, &[("pod-security.kubernetes.io/enforce", "privileged")]);
    let Outcome::Inject(injection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    assert_eq!((injection.status.templates.len(), injection.status.reason.as_deref()), (2, None));

    // Left out alone: the pod as written, with a status that says why.
    let only_net = crate::test_support::engine(&[("net", NET_ADMIN)]);
    let decision = in_level(&only_net, &pod, &[ENFORCE_RESTRICTED]);
    let Outcome::Inject(injection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    assert!(matches!(injection.skipped_as, Some(OutOfScope::PodSecurity { .. })), "{:?}", injection.skipped_as);
    let after = apply(&pod, &injection.patch);
    assert_eq!(after["spec"], pod["spec"]);
    assert!(after["metadata"]["annotations"][names::STATUS_ANNOTATION].as_str().unwrap().contains("PodSecurity"));
    // Admitted again (a copy), it is up to date: leaving the template out is not a change.
    let again = in_level(&only_net, &after, &[ENFORCE_RESTRICTED]).outcome;
    assert!(matches!(again, Outcome::UpToDate(_)), "{again:?}");
}

#[test]
fn pod_security_judges_only_what_the_injection_adds() {
    let engine = engine(&[("net", NET_ADMIN)]);
    // A pod that fails the level on its own is not the injection's doing: injected as usual.
    let mut root = restricted_pod();
    root["spec"]["securityContext"]["runAsNonRoot"] = json!(false);
    let decision = in_level(&engine, &root, &[ENFORCE_RESTRICTED]);
    let Outcome::Inject(injection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    assert_eq!(injection.status.templates.len(), 1);
    // A namespace whose labels are unknown: nothing to judge by.
    let unknown = NamespaceFacts::unknown("shop");
    let Outcome::Inject(injection) = engine.evaluate(&request(restricted_pod(), unknown)).outcome else {
        panic!("expected an injection")
    };
    assert_eq!(injection.status.templates.len(), 1);
    // The warn and audit levels only warn, in the API server's words.
    let decision = in_level(
        &engine,
        &restricted_pod(),
        &[("pod-security.kubernetes.io/warn", "baseline"), ("pod-security.kubernetes.io/audit", "restricted")],
    );
    let Outcome::Inject(injection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    assert_eq!(injection.status.templates.len(), 1);
    let warned: Vec<&str> = decision
        .warnings
        .iter()
        .filter(|w| w.code == WarningCode::PodSecurityWarn)
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(
        warned[0].contains("Pod Security warn level: would violate PodSecurity \"baseline:latest\""),
        "{}",
        warned[0]
    );
    assert!(warned[1].contains("audit level: would violate PodSecurity \"restricted:latest\""), "{}", warned[1]);
}

#[test]
fn an_enforced_template_that_breaks_the_pod_security_level_refuses_the_pod() {
    let enforced = NET_ADMIN.replace("default: true", "default: true\nenforced: true");
    let engine = engine(&[("hardened", HARDENED), ("net", &enforced)]);
    let decision = in_level(&engine, &restricted_pod(), &[ENFORCE_RESTRICTED]);
    let Outcome::Denied(denial) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    let message = denial.to_string();
    assert!(message.contains("template net is enforced for this pod, but the API server would refuse"), "{message}");
    assert!(message.contains("violates PodSecurity \"restricted:latest\""), "{message}");
}

#[test]
fn a_copied_pod_whose_injected_items_break_the_level_is_injected_afresh_without_them() {
    let engine = engine(&[("hardened", HARDENED), ("net", NET_ADMIN)]);
    let pod = restricted_pod();
    // Injected where the level allows everything, then copied (status and all) into a namespace
    // that enforces restricted.
    let Outcome::Inject(injection) = in_level(&engine, &pod, &[]).outcome else { panic!("expected an injection") };
    let copied = apply(&pod, &injection.patch);
    assert_eq!(injection.status.templates.len(), 2);
    let decision = in_level(&engine, &copied, &[ENFORCE_RESTRICTED]);
    let Outcome::Inject(reinjection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
    let after = apply(&copied, &reinjection.patch);
    let policy = checks::pod_security::Policy::enforce_of(&opted_in("shop", &[ENFORCE_RESTRICTED]).labels, 37);
    assert!(policy.violations(&after).is_empty(), "{:?}", policy.violations(&after));
    let names: Vec<&str> = reinjection.status.templates.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["hardened"]);
    assert_eq!(after["spec"]["initContainers"].as_array().map(Vec::len), Some(1), "net-init, provably ours, is gone");
    // And that is up to date there.
    let again = in_level(&engine, &after, &[ENFORCE_RESTRICTED]).outcome;
    assert!(matches!(again, Outcome::UpToDate(_)), "{again:?}");
}
