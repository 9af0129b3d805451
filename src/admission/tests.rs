//! Table tests of the admission layer: every bad input with its status and message, and the
//! decisions for pods and template ConfigMaps.

use serde_json::{Value, json};

use super::*;
use crate::engine::templates::set::InProcess;
use crate::engine::templates::set::embedded_sources;
use crate::engine::{InjectionStatus, TemplateSet};

fn engine() -> Engine {
    let (templates, errors) = TemplateSet::load(embedded_sources());
    assert!(errors.is_empty());
    Engine::new(templates, vec!["sidecar-injector".into()])
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-", "labels": {"app": "web"}},
           "spec": {"containers": [{"name": "web", "image": "nginx"}]}})
}

fn review(request: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": API_VERSION, "kind": KIND, "request": request})).unwrap()
}

fn request(kind: &str, operation: &str, namespace: &str, object: Value) -> Value {
    let (group, resource) = match kind {
        "Pod" => ("", "pods"),
        "ConfigMap" => ("", "configmaps"),
        _ => ("apps", "deployments"),
    };
    json!({
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "namespace": namespace,
        "name": "",
        "operation": operation,
        "userInfo": {"username": "admin"},
        "object": object,
        "oldObject": null,
        "dryRun": false,
    })
}

fn opted_in() -> NamespaceFacts {
    NamespaceFacts::known(
        "shop",
        [("sidecar-injector.io/inject".to_owned(), "enabled".to_owned())].into(),
        Default::default(),
    )
}

fn run_mutate(body: &[u8]) -> (u16, Value) {
    let reply = match parse(body) {
        Ok(request) => mutate(&engine(), request, &opted_in(), ClusterFacts::default()),
        Err(e) => invalid(&e),
    };
    (reply.status, serde_json::from_slice(&reply.body).unwrap())
}

#[test]
fn unreadable_reviews_get_400_with_a_specific_message() {
    let good = request("Pod", "CREATE", "shop", pod());
    let without = |field: &str| {
        let mut r = good.clone();
        r.as_object_mut().unwrap().remove(field);
        review(r)
    };
    let with = |field: &str, value: Value| {
        let mut r = good.clone();
        r[field] = value;
        review(r)
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty body", b"".to_vec(), "the body is not valid JSON: EOF while parsing a value at line 1 column 0"),
        ("truncated", review(good.clone())[..100].to_vec(), "the body is not valid JSON: EOF while parsing"),
        ("not JSON", b"<xml/>".to_vec(), "the body is not valid JSON: expected value at line 1 column 1"),
        ("invalid UTF-8", b"{\"a\": \"\xff\"}".to_vec(), "the body is not UTF-8: invalid byte at offset 7"),
        ("a JSON array", b"[1]".to_vec(), "the body is not an AdmissionReview: "),
        (
            "no apiVersion",
            br#"{"kind":"AdmissionReview","request":{}}"#.to_vec(),
            "apiVersion is missing: expected admission.k8s.io/v1",
        ),
        (
            "v1beta1",
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#.to_vec(),
            "unsupported apiVersion \"admission.k8s.io/v1beta1\": only admission.k8s.io/v1 is served",
        ),
        (
            "wrong kind",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#.to_vec(),
            "unsupported kind \"Pod\": expected AdmissionReview",
        ),
        ("no kind", br#"{"apiVersion":"admission.k8s.io/v1"}"#.to_vec(), "kind is missing: expected AdmissionReview"),
        (
            "no request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            "the AdmissionReview has no request",
        ),
        (
            "null request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}"#.to_vec(),
            "the AdmissionReview has no request",
        ),
        ("no uid", without("uid"), "request.uid is missing"),
        ("empty uid", with("uid", json!("")), "request.uid is missing"),
        ("no object on CREATE", without("object"), "request.object is missing"),
        ("null object on CREATE", with("object", Value::Null), "request.object is missing"),
        ("bad operation", with("operation", json!("EXPLODE")), "request.operation: unknown variant `EXPLODE`"),
        ("no kind in request", without("kind"), "request.kind is missing"),
        ("kind of the wrong type", with("kind", json!("Pod")), "request.kind: invalid type: string \"Pod\""),
    ];
    for (case, body, expected) in cases {
        let (status, answer) = run_mutate(&body);
        assert_eq!(status, 400, "{case}");
        let message = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(message.starts_with(expected), "{case}: {message}");
        assert_eq!(answer["response"]["allowed"], false, "{case}");
    }
}

#[test]
fn a_pod_in_an_opted_in_namespace_gets_a_patch_that_injects_it() {
    let (status, answer) = run_mutate(&review(request("Pod", "CREATE", "shop", pod())));
    assert_eq!(status, 200);
    let response = &answer["response"];
    assert_eq!(answer["apiVersion"], API_VERSION);
    assert_eq!(answer["kind"], KIND);
    assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    use base64::Engine as _;
    let patch: json_patch::Patch = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD.decode(response["patch"].as_str().unwrap()).unwrap(),
    )
    .unwrap();
    let mut out = pod();
    json_patch::patch(&mut out, &patch).unwrap();
    assert_eq!(out["spec"]["initContainers"][0]["name"], "log-shipper");
    let status =
        InjectionStatus::parse(out["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap()).unwrap();
    assert_eq!(status.templates[0].name, "log-shipper");
}

#[test]
fn everything_else_is_allowed_unchanged_with_a_reason() {
    let mut mirror = pod();
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
    let mut dry = request("Pod", "CREATE", "shop", pod());
    dry["dryRun"] = json!(true);
    let mut delete = request("Pod", "DELETE", "shop", Value::Null);
    delete["oldObject"] = pod();
    let cases: Vec<(&str, Value, Option<&str>, &str)> = vec![
        (
            "a deployment",
            request("Deployment", "CREATE", "shop", json!({"metadata": {}})),
            Some("not_a_pod"),
            "apps/Deployment is not a Pod",
        ),
        ("UPDATE", request("Pod", "UPDATE", "shop", pod()), Some("not_create"), "only CREATE is mutated, not UPDATE"),
        ("DELETE without object", delete, Some("not_create"), "only CREATE is mutated, not DELETE"),
        ("mirror pod", request("Pod", "CREATE", "shop", mirror), Some("mirror_pod"), "mirror pods"),
        (
            "kube-system",
            request("Pod", "CREATE", "kube-system", pod()),
            Some("excluded_namespace"),
            "namespace kube-system is excluded",
        ),
        (
            "own namespace",
            request("Pod", "CREATE", "sidecar-injector", pod()),
            Some("excluded_namespace"),
            "namespace sidecar-injector is excluded",
        ),
        ("dry run is mutated", dry, None, "injected log-shipper"),
    ];
    for (case, req, skip, reason) in cases {
        let namespace = NamespaceFacts { name: req["namespace"].as_str().unwrap().into(), ..opted_in() };
        let reply = mutate(&engine(), parse(&review(req)).unwrap(), &namespace, ClusterFacts::default());
        assert_eq!(reply.status, 200, "{case}");
        assert_eq!(reply.summary.skip, skip, "{case}");
        assert!(reply.summary.reason.contains(reason), "{case}: {}", reply.summary.reason);
        let answer: Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(answer["response"]["allowed"], true, "{case}");
        assert_eq!(answer["response"].get("patch").is_some(), skip.is_none(), "{case}");
    }
}

#[test]
fn refusals_carry_the_engines_message_and_warnings_reach_the_user() {
    let mut typo = pod();
    typo["metadata"]["annotations"] = json!({"sidecar-injector.io/templates": "log-shiper"});
    let (status, answer) = run_mutate(&review(request("Pod", "CREATE", "shop", typo)));
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], false);
    assert!(answer["response"]["status"]["message"].as_str().unwrap().contains("unknown template(s) log-shiper"));

    // A malformed object is read (it is raw JSON) and refused by the engine, naming the field.
    let mut malformed = pod();
    malformed["metadata"]["labels"]["a"] = json!(1);
    let (status, answer) = run_mutate(&review(request("Pod", "CREATE", "shop", malformed)));
    assert_eq!((status, answer["response"]["allowed"].as_bool()), (200, Some(false)));
    assert!(
        answer["response"]["status"]["message"].as_str().unwrap().ends_with("metadata.labels.a: must be a string"),
        "{answer}"
    );

    let mut ignored = pod();
    ignored["metadata"]["annotations"] = json!({"sidecar-injector.io/log-shipper.image": "evil"});
    let (_, answer) = run_mutate(&review(request("Pod", "CREATE", "shop", ignored)));
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"]["warnings"][0].as_str().unwrap().contains("is not overridable"), "{answer}");
}

#[test]
fn validate_checks_injected_pods_and_template_configmaps() {
    let engine = engine();
    let validate_body = |body: Vec<u8>, namespace: &NamespaceFacts| {
        let reply = validate(
            &engine,
            parse(&body).unwrap(),
            namespace,
            ClusterFacts::default(),
            "sidecar-injector",
            &InProcess,
        );
        let answer: Value = serde_json::from_slice(&reply.body).unwrap();
        (
            answer["response"]["allowed"].as_bool().unwrap(),
            answer["response"]["status"]["message"].as_str().unwrap_or("").to_owned(),
        )
    };
    // A pod that was not injected is refused; the same pod after injection passes.
    let (allowed, message) = validate_body(review(request("Pod", "CREATE", "shop", pod())), &opted_in());
    assert!(!allowed);
    assert!(message.contains("sidecar injection did not happen"), "{message}");
    let Outcome::Inject(injection) = engine
        .evaluate(&PodRequest {
            pod: Arc::new(pod()),
            namespace: opted_in(),
            cluster: ClusterFacts::default(),
            workload: None,
        })
        .outcome
    else {
        panic!()
    };
    let mut injected = pod();
    json_patch::patch(&mut injected, &injection.patch).unwrap();
    assert_eq!(
        validate_body(review(request("Pod", "CREATE", "shop", injected.clone())), &opted_in()),
        (true, String::new())
    );
    injected["spec"]["initContainers"][0]["image"] = json!("evil:1");
    let (allowed, message) = validate_body(review(request("Pod", "CREATE", "shop", injected)), &opted_in());
    assert!(!allowed && message.contains("image is \"evil:1\""), "{message}");

    // Template ConfigMaps in the injector's namespace.
    let own = NamespaceFacts::unknown("sidecar-injector");
    let configmap = |data: Value, labelled: bool| {
        let labels = if labelled { json!({"sidecar-injector.io/templates": "true"}) } else { json!({}) };
        let mut r = request(
            "ConfigMap",
            "UPDATE",
            "sidecar-injector",
            json!({"metadata": {"name": "sidecar-templates", "labels": labels}, "data": data}),
        );
        r["name"] = json!("sidecar-templates");
        review(r)
    };
    let broken = json!({"logs.yaml": "inject:\n  sidecars:\n    - name: s\n      image: \"{{ pod.metadata.nam }}\"\n"});
    let (allowed, message) = validate_body(configmap(broken.clone(), true), &own);
    assert!(!allowed);
    assert_eq!(
        message,
        "sidecar-injector: ConfigMap sidecar-templates has invalid templates: template \"logs\" line 4: undefined value in \"{{ pod.metadata.nam }}\" (while test-rendering for a named pod (metadata.name \"example\"))"
    );
    assert!(validate_body(configmap(broken.clone(), false), &own).0, "unlabelled ConfigMaps are not templates");
    assert!(validate_body(configmap(json!({"ok.yaml": "default: true\n"}), true), &own).0);
    let shop = review(request(
        "ConfigMap",
        "CREATE",
        "shop",
        json!({"metadata": {"labels": {"sidecar-injector.io/templates": "true"}}, "data": broken}),
    ));
    assert!(validate_body(shop, &opted_in()).0, "only the injector's namespace holds templates");
}

#[test]
fn the_patch_is_written_as_standard_padded_base64_of_its_json_at_every_length() {
    use base64::Engine as _;
    // Values of 0 to 5 bytes give patch texts of every length modulo 3 (no, one and two `=`),
    // and one needs JSON escaping inside the patch (which base64 then carries unchanged).
    for value in ["", "a", "ab", "abc", "a\"b\\", "héllo"] {
        let operations: Vec<json_patch::PatchOperation> =
            serde_json::from_value(json!([{"op": "add", "path": "/metadata/labels/x", "value": value}])).unwrap();
        let body = encode(AdmissionResponse::invalid("unused"), Some(&operations));
        let answer: Value = serde_json::from_slice(&body).unwrap();
        let text = answer["response"]["patch"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD.decode(text).unwrap();
        assert_eq!(decoded, serde_json::to_vec(&operations).unwrap(), "value {value:?}");
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
    }
}

#[test]
fn events_go_on_the_owner_and_never_for_a_dry_run() {
    let mut owned = pod();
    owned["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
        "uid": "u-1", "controller": true}]);
    // A container of the shipped log-shipper's name: applied with conflicts.
    owned["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "log-shipper", "image": "own"}));
    owned["metadata"]["annotations"] = json!({"sidecar-injector.io/log-shipper.image": "other"});
    let decide = |object: &Value, dry_run: bool| {
        let mut body = request("Pod", "CREATE", "shop", object.clone());
        body["dryRun"] = json!(dry_run);
        mutate(&engine(), parse(&review(body)).unwrap(), &opted_in(), ClusterFacts::default()).summary.events
    };
    let events = decide(&owned, false);
    let reasons: Vec<&str> = events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["OverridesIgnored", "InjectedWithConflicts"], "{events:#?}");
    assert!(events.iter().all(|e| e.regarding.name.as_deref() == Some("web-1") && e.note.starts_with("pod web-*: ")));
    assert!(decide(&owned, true).is_empty(), "a dry run has no side effects");
    assert!(decide(&pod(), false).is_empty(), "a pod without an owner: its creator saw the response");
    // A refusal.
    owned["metadata"]["annotations"] = json!({"sidecar-injector.io/log-shipper.memoryLimit": "64Gi"});
    let events = decide(&owned, false);
    assert_eq!(events.iter().map(|e| e.reason).collect::<Vec<_>>(), ["InjectionRefused"]);
    assert!(events[0].note.contains("sidecar-injector.io/log-shipper.memoryLimit"), "{}", events[0].note);
}

#[test]
fn warnings_reach_the_metric_by_code_and_the_response_by_message() {
    let mut object = pod();
    object["metadata"]["annotations"] = json!({"sidecar-injector.io/log-shipper.image": "other"});
    let reply = mutate(
        &engine(),
        parse(&review(request("Pod", "CREATE", "shop", object))).unwrap(),
        &opted_in(),
        ClusterFacts::default(),
    );
    assert_eq!(reply.summary.warnings, ["override_ignored"]);
    let answer: Value = serde_json::from_slice(&reply.body).unwrap();
    let warnings = answer["response"]["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with("sidecar-injector: annotation sidecar-injector.io/log-shipper.image ignored"),
        "{warnings:?}"
    );
}
