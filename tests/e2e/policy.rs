//! The policy mode on the real API server: the MutatingAdmissionPolicy that `compile-policies`
//! prints, applied as a user would, injects pods that are stored exactly as the webhook's.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use crate::scenarios::{Ctx, api_message, pod, status};

/// A second default template, for these namespaces only: a classic sidecar next to log-shipper's
/// native one, a volume log-shipper already adds (skipped, owned by log-shipper), overridable
/// values of each type, env vars from the namespace and from a pod label under `when`.
const TRACING: &str = r#"
description: policy-mode comparison
default: true
namespaceSelector: {matchLabels: {pm: "on"}}
sidecarMode: container
values: {level: info, port: 9000, verbose: false}
overridable: [{name: level, pattern: "debug|info|warn"}, port, verbose]
inject:
  annotations:
    tracing.example/port: "{{ values.port }}"
  sidecars:
    - name: tracer
      image: registry.example/tracer:1
      args: ["--level={{ values.level }}", "--verbose={{ values.verbose }}", "--pod={{ pod.metadata.name | default(pod.metadata.generateName | default('pod')) }}"]
      ports: [{containerPort: "{{ values.port }}"}]
      resources: {requests: {cpu: 1m, memory: 1Mi}, limits: {cpu: 1m, memory: 1Mi}}
  volumes:
    - name: app-logs
      emptyDir: {}
  appContainers:
    env:
      - name: SERVICE
        value: "{{ (pod.metadata.labels | default({}))['app'] }}"
        when: "{{ (pod.metadata.labels | default({}))['app'] is defined }}"
      - name: NS
        value: "{{ namespace.name }}"
"#;

const THROUGH_WEBHOOK: &str = "e2e-pm-webhook";
const THROUGH_POLICY: &str = "e2e-pm-policy";

/// The pods of the comparison: (case, pod). The same bodies go to both namespaces.
fn cases() -> Vec<(&'static str, Value)> {
    // The pod's own label and mount path stand (a same-named volume of its own is the webhook's
    // alone: see `displaced_volume`).
    let mut conflicts =
        pod("conflicts", json!({"app": "web", "logging.sidecar-injector.io/shipper": "mine"}), json!({}));
    conflicts["spec"]["volumes"] = json!([{"name": "own-logs", "emptyDir": {}}]);
    conflicts["spec"]["containers"] = json!([
        {"name": "app", "image": "registry.example/app:1", "volumeMounts": [{"name": "own-logs", "mountPath": "/var/log/app"}]},
        {"name": "aux", "image": "registry.example/aux:1"},
    ]);
    let mut generated = pod("unused", json!({"app": "web"}), json!({}));
    generated["metadata"] = json!({"generateName": "gen-", "labels": {"app": "web"}});
    let mut with_init = pod("with-init", json!({"app": "web"}), json!({}));
    with_init["spec"]["initContainers"] = json!([{"name": "setup", "image": "registry.example/setup:1"}]);
    with_init["spec"]["containers"] = json!([
        {"name": "zeta", "image": "registry.example/z:1", "env": [{"name": "A", "value": "1"}]},
        {"name": "alpha", "image": "registry.example/a:1"},
    ]);
    let mut no_token = pod("no-token", json!({"app": "web"}), json!({}));
    no_token["spec"]["automountServiceAccountToken"] = json!(false);
    let overrides = pod(
        "overrides",
        json!({}),
        json!({"sidecar-injector.io/tracing.level": "debug", "sidecar-injector.io/tracing.verbose": "true",
               "sidecar-injector.io/log-shipper.logLevel": "warn"}),
    );
    vec![
        ("named", pod("named", json!({"app": "web"}), json!({}))),
        ("valid overrides, no labels", overrides),
        ("generateName only", generated),
        ("conflicts with the pod's own items", conflicts),
        ("own init container, containers out of order", with_init),
        ("no service-account token", no_token),
    ]
}

/// A stored pod without what differs between two creations of the same body: identity, times,
/// scheduling, the token volume's random suffix, and the namespace's name wherever it is printed.
fn comparable(pod: &Pod, namespace: &str) -> Value {
    let mut value = serde_json::to_value(pod).expect("pods serialize");
    for field in [
        "name",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "ownerReferences",
        "namespace",
        "generation",
    ] {
        value["metadata"].as_object_mut().map(|m| m.remove(field));
    }
    if let Some(labels) = value["metadata"]["labels"].as_object_mut() {
        labels.retain(|k, _| !k.contains("controller-uid"));
    }
    value["spec"].as_object_mut().map(|s| s.remove("nodeName"));
    value.as_object_mut().map(|v| v.remove("status"));
    let text = value.to_string().replace(namespace, "NAMESPACE");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("kube-api-access-") {
        let (head, tail) = rest.split_at(at + "kube-api-access-".len());
        out.push_str(head);
        out.push('*');
        rest = tail.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    }
    out.push_str(rest);
    serde_json::from_str(&out).expect("still JSON")
}

fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).find_map(|k| {
            first_difference(x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), &format!("{path}.{k}"))
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(p, q, &format!("{path}[{i}]")))
        }
        _ if a == b => None,
        _ => Some(format!("{path}: webhook {a} / policy {b}")),
    }
}

async fn job_pod(ctx: &Ctx, namespace: &str) -> Result<Pod> {
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "report"},
        "spec": {"template": {"metadata": {"labels": {"app": "report"}}, "spec": {
            "restartPolicy": "Never", "containers": [{"name": "app", "image": "registry.example/report:1"}]}}}
    }))?;
    Api::<Job>::namespaced(ctx.client.clone(), namespace).create(&PostParams::default(), &job).await?;
    let start = Instant::now();
    loop {
        let pods = ctx.pods(namespace).list(&ListParams::default().labels("job-name=report")).await?;
        if let Some(pod) = pods.items.into_iter().next() {
            return Ok(pod);
        }
        ensure!(start.elapsed() < Duration::from_secs(30), "the Job made no pod in {namespace} within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Scenario 23: The policy mode. `sidecar-injector compile-policies` prints the
/// MutatingAdmissionPolicy and binding; applied (bound to one namespace), they inject with the
/// injector stopped, and every pod they store — named, generateName-only, with conflicts, a Job's —
/// equals the pod the webhook stores for the same body in another namespace.
pub async fn s23_policy_mode(ctx: &mut Ctx) -> Result<()> {
    let opted_in = [("sidecar-injector.io/inject", "enabled"), ("pm", "on")];
    ctx.namespace(THROUGH_WEBHOOK, &opted_in).await?;
    ctx.namespace(THROUGH_POLICY, &opted_in).await?;
    let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "e2e-policy-mode", "namespace": "sidecar-injector", "labels": {"sidecar-injector.io/templates": "true"}},
        "data": {"tracing.yaml": TRACING}});
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(&configmap.to_string()))?;
    let start = Instant::now();
    while !ctx
        .dry_run_pod(THROUGH_WEBHOOK, pod("probe", json!({}), json!({})))
        .await
        .is_ok_and(|p| p.spec.is_some_and(|s| s.containers.iter().any(|c| c.name == "tracer")))
    {
        ensure!(start.elapsed() < Duration::from_secs(30), "the injector did not load the tracing template");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The templates in service, as a user would export them (earlier scenarios edited some).
    let templates = tempfile::tempdir()?;
    let live: Value = serde_json::from_str(&ctx.plane.kubectl(&[
        "get",
        "configmaps",
        "-n",
        "sidecar-injector",
        "-l",
        "sidecar-injector.io/templates",
        "-o",
        "json",
    ])?)?;
    for configmap in live["items"].as_array().into_iter().flatten() {
        for (key, text) in configmap["data"].as_object().into_iter().flatten() {
            std::fs::write(templates.path().join(key), text.as_str().unwrap_or_default())?;
        }
    }

    // Through the webhook.
    let mut webhook_pods = Vec::new();
    for (case, body) in cases() {
        webhook_pods
            .push((case, ctx.create_pod(THROUGH_WEBHOOK, body).await.with_context(|| format!("{case}: webhook"))?));
    }
    webhook_pods.push(("a Job's pod", job_pod(ctx, THROUGH_WEBHOOK).await?));

    // The policy, as a user applies it, bound to one namespace only for the comparison.
    let compiled = std::process::Command::new(&ctx.binary)
        .args(["compile-policies", "--kube-version", "1.37", "--templates"])
        .arg(templates.path())
        .output()?;
    ensure!(compiled.status.success(), "compile-policies failed: {}", String::from_utf8_lossy(&compiled.stderr));
    let yaml = String::from_utf8(compiled.stdout)?;
    ensure!(
        yaml.contains("injects log-shipper"),
        "the shipped default template compiles:\n{}",
        &yaml[..yaml.len().min(400)]
    );
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(&yaml))?;
    let only_here = json!([{"op": "add", "path": "/spec/matchResources/namespaceSelector/matchExpressions/-",
        "value": {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [THROUGH_POLICY]}}]);
    ctx.plane.kubectl(&[
        "patch",
        "mutatingadmissionpolicybinding",
        "sidecar-injector.io-inject",
        "--type=json",
        "-p",
        &only_here.to_string(),
    ])?;

    // With the injector stopped, only the policy can inject.
    ctx.stop_injector();
    let result = async {
        let start = Instant::now();
        loop {
            if let Ok(pod) = ctx.dry_run_pod(THROUGH_POLICY, pod("probe", json!({}), json!({}))).await
                && status(&pod).is_some()
            {
                break;
            }
            ensure!(start.elapsed() < Duration::from_secs(60), "the policy did not start injecting within 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut policy_pods = Vec::new();
        for (case, body) in cases() {
            policy_pods
                .push((case, ctx.create_pod(THROUGH_POLICY, body).await.with_context(|| format!("{case}: policy"))?));
        }
        policy_pods.push(("a Job's pod", job_pod(ctx, THROUGH_POLICY).await?));
        // A pod whose own volume has the name of one a template mounts: what that template would
        // mount is displaced (`inject`), which only the webhook decides; with it down, the
        // injection policy refuses the pod.
        let mut displaced_volume = pod("displaced-volume", json!({"app": "web"}), json!({}));
        displaced_volume["spec"]["volumes"] = json!([{"name": "app-logs", "hostPath": {"path": "/"}}]);
        match ctx.create_pod(THROUGH_POLICY, displaced_volume).await {
            Err(error) if api_message(&error).contains("sidecar injection did not happen") => {}
            other => bail!("a pod with its own app-logs volume was not left to the webhook: {other:?}"),
        }
        anyhow::Ok(policy_pods)
    }
    .await;
    ctx.start_injector()?;
    let mut policy_pods = result?;
    // Both paths on: the policy injects, the webhook finds the pod current and leaves it alone.
    let mut both = cases().remove(0);
    both.1["metadata"]["name"] = json!("named-both");
    let stored = ctx.create_pod(THROUGH_POLICY, both.1).await.context("both paths")?;
    // The name is printed into the sidecars' arguments; compared as if it were "named".
    let stored: Pod = serde_json::from_str(&serde_json::to_string(&stored)?.replace("named-both", "named"))?;
    policy_pods.push(("named, the policy and the webhook both on", stored));
    webhook_pods.push(("named, the policy and the webhook both on", webhook_pods[0].1.clone()));

    for ((case, through_webhook), (_, through_policy)) in webhook_pods.iter().zip(&policy_pods) {
        ensure!(status(through_policy).is_some_and(|s| !s.templates.is_empty()), "{case}: the policy did not inject");
        let owners: Vec<String> =
            status(through_policy).map(|s| s.skipped.into_iter().map(|k| k.owner).collect()).unwrap_or_default();
        // The volume both templates add is log-shipper's; only the conflicts case has items of its own.
        let own = case.starts_with("conflicts");
        ensure!(owners.contains(&"template:log-shipper".to_owned()), "{case}: skips {owners:?}");
        ensure!(owners.contains(&"pod".to_owned()) == own, "{case}: skips {owners:?}");
        let (a, b) = (comparable(through_webhook, THROUGH_WEBHOOK), comparable(through_policy, THROUGH_POLICY));
        if let Some(difference) = first_difference(&a, &b, "pod") {
            bail!("{case}: the stored pods differ at {difference}");
        }
    }
    ctx.plane.kubectl(&[
        "delete",
        "mutatingadmissionpolicybinding,mutatingadmissionpolicy",
        "sidecar-injector.io-inject",
    ])?;
    for namespace in [THROUGH_WEBHOOK, THROUGH_POLICY] {
        ctx.plane.kubectl(&["delete", "namespace", namespace, "--wait=false"])?;
    }
    Ok(())
}
