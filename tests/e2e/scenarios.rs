//! The scenarios. Each one asserts on what the real API server stored or answered.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sidecar_injector::engine::InjectionStatus;

use crate::controlplane::{ControlPlane, Injector};

/// What the scenarios share.
pub struct Ctx {
    pub plane: ControlPlane,
    pub injector: Option<Injector>,
    pub binary: PathBuf,
    pub client: kube::Client,
    /// Output of `kubectl apply -k deploy/overlays/e2e`.
    pub applied: String,
    /// The CA bundle the injector wrote when it first started.
    pub first_ca_bundle: Vec<u8>,
}

impl Ctx {
    pub fn start_injector(&mut self) -> Result<()> {
        self.injector = Some(Injector::start(&self.plane, &self.binary, &[])?);
        Ok(())
    }

    pub fn stop_injector(&mut self) {
        if let Some(mut injector) = self.injector.take() {
            injector.process.stop(Duration::from_secs(10));
        }
    }

    pub fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// A namespace with labels; returns once the controller-manager has given it its `default`
    /// ServiceAccount (pods are refused until then).
    pub async fn namespace(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
        let namespace: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()}
        }))?;
        Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &namespace).await?;
        let accounts = Api::<ServiceAccount>::namespaced(self.client.clone(), name);
        let start = Instant::now();
        while accounts.get_opt("default").await?.is_none() {
            ensure!(start.elapsed() < Duration::from_secs(30), "no default ServiceAccount in {name} after 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    pub async fn create_pod(&self, namespace: &str, pod: Value) -> Result<Pod, kube::Error> {
        let pod: Pod = serde_json::from_value(pod).expect("a valid pod");
        self.pods(namespace).create(&PostParams::default(), &pod).await
    }

    pub async fn dry_run_pod(&self, namespace: &str, pod: Value) -> Result<Pod, kube::Error> {
        let pod: Pod = serde_json::from_value(pod).expect("a valid pod");
        self.pods(namespace).create(&PostParams { dry_run: true, ..Default::default() }, &pod).await
    }
}

/// A pod with one app container.
pub fn pod(name: &str, labels: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}
    })
}

pub(crate) fn status(pod: &Pod) -> Option<InjectionStatus> {
    pod.metadata.annotations.as_ref()?.get("sidecar-injector.io/status").and_then(|s| InjectionStatus::parse(s).ok())
}

pub(crate) fn init_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .map(|c| c.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

pub(crate) fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(e) => e.message.clone(),
        other => other.to_string(),
    }
}

pub(crate) fn log_shipper(pod: &Pod) -> Option<k8s_openapi::api::core::v1::Container> {
    pod.spec.as_ref()?.init_containers.as_ref()?.iter().find(|c| c.name == "log-shipper").cloned()
}

/// Polls a server-side dry-run until the webhook's mutation shows (webhook configurations take a
/// moment to take effect), as Kubernetes' own e2e does.
pub async fn wait_for_injection(ctx: &Ctx, namespace: &str) -> Result<Duration> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if let Ok(pod) = ctx.dry_run_pod(namespace, pod("probe", json!({}), json!({}))).await
            && status(&pod).is_some()
        {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("the webhook did not start mutating pods in {namespace} within 60 s")
}

/// Admission requests the injector has answered on /mutate.
fn mutate_calls(ctx: &Ctx) -> Result<f64> {
    let metrics = ctx.injector.as_ref().context("no injector")?.metrics();
    let series =
        metrics.lines().filter(|l| l.starts_with("sidecar_injector_admission_requests_total{endpoint=\"mutate\""));
    series.map(|l| Ok(l.rsplit_once(' ').context("no value")?.1.parse::<f64>()?)).sum()
}

/// Scenario 1: Every object of the e2e overlay is accepted; the default install and the cert-manager
/// overlay's standard objects pass a server-side dry run.
pub async fn s01_overlay_accepted(ctx: &mut Ctx) -> Result<()> {
    let rendered = ctx.plane.kubectl(&["kustomize", "deploy/overlays/e2e"])?;
    let objects = rendered.matches("\nkind: ").count() + usize::from(rendered.starts_with("kind: "));
    let created = ctx.applied.lines().filter(|l| l.ends_with(" created")).count();
    ensure!(created == objects && objects >= 15, "{created} of {objects} objects created:\n{}", ctx.applied);
    let listed =
        ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["get", "-f", "-", "-o", "name"], Some(&rendered))?;
    ensure!(listed.lines().count() == objects, "not every object reads back:\n{listed}");
    ctx.plane.kubectl(&["apply", "--dry-run=server", "-k", "deploy"])?;
    let lean = ctx.plane.kubectl(&["apply", "--dry-run=server", "-k", "deploy/overlays/lean"])?;
    ensure!(lean.contains("validatingwebhookconfiguration"), "{lean}");
    let lean_config = ctx.plane.kubectl(&["kustomize", "deploy/overlays/lean"])?;
    ensure!(
        !lean_config.contains("validate-pods.sidecar-injector.io")
            && lean_config.contains("validate-templates.sidecar-injector.io"),
        "the lean overlay drops the pod validating webhook only"
    );
    // cert-manager's own kinds need its CRDs; everything the overlay patches is standard.
    let cert_manager = ctx.plane.kubectl(&["kustomize", "deploy/overlays/cert-manager"])?;
    let standard: Vec<&str> =
        cert_manager.split("\n---\n").filter(|d| !d.contains("apiVersion: cert-manager.io/")).collect();
    ctx.plane.kubectl_as(
        &ctx.plane.admin_kubeconfig,
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&standard.join("\n---\n")),
    )?;
    Ok(())
}

/// What the scenarios share, made once before any of them runs so that any selection passes: the
/// opted-in namespace `e2e-shop`, with the webhook injecting there, and the plain `e2e-plain`.
pub async fn setup(ctx: &mut Ctx) -> Result<()> {
    ctx.namespace("e2e-shop", &[("sidecar-injector.io/inject", "enabled")]).await?;
    ctx.namespace("e2e-plain", &[]).await?;
    wait_for_injection(ctx, "e2e-shop").await?;
    Ok(())
}

/// Scenario 2: A pod in an opted-in namespace is stored injected.
pub async fn s02_pod_injected(ctx: &mut Ctx) -> Result<()> {
    let calls_before = mutate_calls(ctx)?;
    let stored = ctx.create_pod("e2e-shop", pod("web", json!({"app": "web"}), json!({}))).await?;
    // The sidecar gets the API-token mount the ServiceAccount plugin would add after the webhooks,
    // so the plugin changes nothing and the API server does not call the webhook a second time.
    let calls = mutate_calls(ctx)? - calls_before;
    ensure!(calls == 1.0, "the mutating webhook was called {calls} times for one pod");
    let status = status(&stored).context("no status annotation")?;
    ensure!(status.templates.iter().map(|t| t.name.as_str()).collect::<Vec<_>>() == ["log-shipper"], "{status:?}");
    let sidecar = log_shipper(&stored).context("no log-shipper init container")?;
    ensure!(sidecar.restart_policy.as_deref() == Some("Always"), "not a native sidecar: {sidecar:?}");
    let token = "/var/run/secrets/kubernetes.io/serviceaccount";
    let token_mounts = sidecar.volume_mounts.iter().flatten().filter(|m| m.mount_path == token).count();
    ensure!(token_mounts == 1, "{token_mounts} API-token mounts in the sidecar: {sidecar:?}");
    let labels = stored.metadata.labels.clone().unwrap_or_default();
    ensure!(labels.get("sidecar-injector.io/injected").map(String::as_str) == Some("true"), "{labels:?}");
    let spec = stored.spec.context("no spec")?;
    ensure!(spec.volumes.iter().flatten().any(|v| v.name == "app-logs"), "no app-logs volume");
    let app = &spec.containers[0];
    ensure!(app.volume_mounts.iter().flatten().any(|m| m.mount_path == "/var/log/app"), "app container not mounted");
    let metrics = ctx.injector.as_ref().context("no injector")?.metrics();
    ensure!(metrics.contains("sidecar_injector_injections_total{template=\"log-shipper\"}"), "injection not counted");

    // A pod named by the API server (generateName, as every Deployment's pods are) has no name at
    // the mutating call and a generated one at the validating call; it must pass both.
    let mut generated = pod("ignored", json!({"app": "web"}), json!({}));
    generated["metadata"].as_object_mut().unwrap().remove("name");
    generated["metadata"]["generateName"] = json!("web-7d9f-");
    let stored = ctx.create_pod("e2e-shop", generated).await.context("a pod with generateName")?;
    let name = stored.metadata.name.clone().unwrap_or_default();
    ensure!(name.starts_with("web-7d9f-") && name.len() > "web-7d9f-".len(), "{name}");
    let args = log_shipper(&stored).context("not injected")?.args.unwrap_or_default();
    ensure!(args.iter().any(|a| a == "--prop=tag=e2e-shop.web-7d9f-"), "rendered with the name at mutation: {args:?}");
    Ok(())
}

/// Scenario 3: Pods outside the injection's scope are stored untouched.
pub async fn s03_untouched(ctx: &mut Ctx) -> Result<()> {
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
    let _ = Api::<ServiceAccount>::namespaced(ctx.client.clone(), "kube-system")
        .create(&PostParams::default(), &account)
        .await;
    let cases = [
        ("e2e-plain", pod("plain", json!({"app": "web"}), json!({}))),
        ("e2e-shop", pod("opted-out", json!({"app": "web", "sidecar-injector.io/inject": "disabled"}), json!({}))),
        ("kube-system", pod("system", json!({"app": "web"}), json!({}))),
    ];
    for (namespace, pod) in cases {
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        let stored = ctx.create_pod(namespace, pod).await.with_context(|| format!("{namespace}/{name}"))?;
        ensure!(status(&stored).is_none() && init_names(&stored).is_empty(), "{namespace}/{name} was injected");
        let labels = stored.metadata.labels.unwrap_or_default();
        ensure!(!labels.contains_key("sidecar-injector.io/injected"), "{namespace}/{name} was labelled");
    }
    Ok(())
}

/// Scenario 4: `kubectl create --dry-run=server -o yaml` shows the injected pod, and stores nothing.
pub async fn s04_dry_run(ctx: &mut Ctx) -> Result<()> {
    let manifest = serde_json::to_string(&pod("preview", json!({"app": "web"}), json!({})))?;
    let yaml = ctx.plane.kubectl_as(
        &ctx.plane.admin_kubeconfig,
        &["-n", "e2e-shop", "create", "--dry-run=server", "-o", "yaml", "-f", "-"],
        Some(&manifest),
    )?;
    ensure!(yaml.contains("name: log-shipper") && yaml.contains("sidecar-injector.io/status"), "not injected:\n{yaml}");
    ensure!(ctx.pods("e2e-shop").get_opt("preview").await?.is_none(), "a dry run stored the pod");
    Ok(())
}

/// The log-shipper template with its image tag set to `tag`.
fn with_shipper_tag(text: &str, tag: &str) -> String {
    let start = text.find("fluent-bit:").map(|i| i + "fluent-bit:".len()).expect("the log-shipper image");
    let end = start + text[start..].find('\n').unwrap_or(text.len() - start);
    format!("{}{tag}{}", &text[..start], &text[end..])
}

async fn edit_templates(ctx: &Ctx, edit: impl Fn(&str) -> String) -> Result<(), kube::Error> {
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "sidecar-injector");
    let mut configmap = configmaps.get("sidecar-templates").await?;
    let data = configmap.data.get_or_insert_with(Default::default);
    let text = data.get("log-shipper.yaml").cloned().unwrap_or_default();
    data.insert("log-shipper.yaml".into(), edit(&text));
    configmaps.replace("sidecar-templates", &PostParams::default(), &configmap).await.map(drop)
}

/// Sets the log-shipper image tag in the templates ConfigMap and waits until a new pod in
/// `namespace` gets it; returns how long that took.
pub(crate) async fn edit_tag_and_wait(ctx: &Ctx, namespace: &str, tag: &str, limit: Duration) -> Result<Duration> {
    edit_templates(ctx, |t| with_shipper_tag(t, tag)).await?;
    let edited = Instant::now();
    let image = format!("cr.fluentbit.io/fluent/fluent-bit:{tag}");
    loop {
        let preview = ctx.dry_run_pod(namespace, pod("preview", json!({"app": "web"}), json!({}))).await?;
        if log_shipper(&preview).and_then(|c| c.image).as_deref() == Some(image.as_str()) {
            return Ok(edited.elapsed());
        }
        ensure!(edited.elapsed() < limit, "the template edit did not take effect within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Scenario 5: Editing the templates ConfigMap changes what the next pod gets within 5 s, without a restart.
pub async fn s05_hot_reload(ctx: &mut Ctx) -> Result<()> {
    let pid = ctx.injector.as_ref().and_then(|i| i.process.pid());
    let took = edit_tag_and_wait(ctx, "e2e-shop", "3.2.11", Duration::from_secs(5)).await?;
    println!("      the template edit took effect after {took:?}");
    ensure!(ctx.injector.as_mut().is_some_and(|i| i.process.running()), "the injector stopped");
    ensure!(pid.is_some() && pid == ctx.injector.as_ref().and_then(|i| i.process.pid()), "the injector was restarted");
    Ok(())
}

/// Scenario 6: A broken template edit is refused by the API server with the template's name in the message.
pub async fn s06_broken_edit_refused(ctx: &mut Ctx) -> Result<()> {
    let error = match edit_templates(ctx, |t| t.replace("{{ values.logDir }}/*.log", "{{ values.logDirectory }}/*.log"))
        .await
    {
        Ok(()) => bail!("the broken edit was accepted"),
        Err(e) => api_message(&e),
    };
    ensure!(
        error.contains("template \"log-shipper\" line") && error.contains("undefined value"),
        "unclear refusal: {error}"
    );
    println!("      refused: {}", error.chars().take(220).collect::<String>());
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "sidecar-injector");
    let stored = configmaps.get("sidecar-templates").await?;
    ensure!(
        !stored.data.unwrap_or_default()["log-shipper.yaml"].contains("logDirectory"),
        "the broken edit was stored"
    );
    Ok(())
}

fn apply_json(ctx: &Ctx, objects: &[Value]) -> Result<()> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(&list.to_string()))?;
    Ok(())
}

fn mutating_policy(name: &str, namespace_label: &str, expression: &str) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "matchConstraints": {
                    "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                    "namespaceSelector": {"matchLabels": {namespace_label: "on"}}
                },
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}]
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name}
        }),
    ]
}

/// Scenario 7: With another mutator (a MutatingAdmissionPolicy) changing pods around ours, reinvocation
/// leaves one copy of each injected item; one that breaks our sidecar is refused by /validate.
pub async fn s07_other_mutators(ctx: &mut Ctx) -> Result<()> {
    // Adds an env var to every container, ours included.
    let add_env = r#"Object{spec: Object.spec{
        initContainers: (has(object.spec.initContainers) ? object.spec.initContainers : []).map(c, Object.spec.initContainers{name: c.name, env: [Object.spec.initContainers.env{name: "OTHER_MUTATOR", value: "1"}]}),
        containers: object.spec.containers.map(c, Object.spec.containers{name: c.name, env: [Object.spec.containers.env{name: "OTHER_MUTATOR", value: "1"}]})
    }}"#;
    apply_json(ctx, &mutating_policy("e2e-add-env", "e2e-add-env", add_env))?;
    ctx.namespace("e2e-mutated", &[("sidecar-injector.io/inject", "enabled"), ("e2e-add-env", "on")]).await?;
    let start = Instant::now();
    let stored = loop {
        let preview = ctx.dry_run_pod("e2e-mutated", pod("probe", json!({}), json!({}))).await?;
        let mutated = preview
            .spec
            .as_ref()
            .is_some_and(|s| s.containers[0].env.iter().flatten().any(|e| e.name == "OTHER_MUTATOR"));
        if mutated && status(&preview).is_some() {
            break ctx.create_pod("e2e-mutated", pod("both", json!({"app": "web"}), json!({}))).await?;
        }
        ensure!(start.elapsed() < Duration::from_secs(60), "the MutatingAdmissionPolicy never took effect");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let spec = stored.spec.clone().context("no spec")?;
    let inits = init_names(&stored);
    ensure!(inits.iter().filter(|n| *n == "log-shipper").count() == 1, "init containers: {inits:?}");
    ensure!(spec.volumes.iter().flatten().filter(|v| v.name == "app-logs").count() == 1, "volumes duplicated");
    let app = &spec.containers[0];
    ensure!(
        app.volume_mounts.iter().flatten().filter(|m| m.mount_path == "/var/log/app").count() == 1,
        "mount duplicated"
    );
    let sidecar = log_shipper(&stored).context("no sidecar")?;
    ensure!(
        sidecar.env.iter().flatten().filter(|e| e.name == "OTHER_MUTATOR").count() == 1,
        "the other mutator did not run on our sidecar"
    );
    ensure!(app.env.iter().flatten().filter(|e| e.name == "OTHER_MUTATOR").count() == 1, "the other mutator ran twice");

    // Replaces our sidecar's image: /validate refuses the pod.
    let break_image = r#"Object{spec: Object.spec{
        initContainers: (has(object.spec.initContainers) ? object.spec.initContainers : []).filter(c, c.name == "log-shipper").map(c, Object.spec.initContainers{name: c.name, image: "evil.example/fluent-bit:1"})
    }}"#;
    apply_json(ctx, &mutating_policy("e2e-break", "e2e-break", break_image))?;
    ctx.namespace("e2e-broken", &[("sidecar-injector.io/inject", "enabled"), ("e2e-break", "on")]).await?;
    let start = Instant::now();
    loop {
        match ctx.dry_run_pod("e2e-broken", pod("victim", json!({"app": "web"}), json!({}))).await {
            Err(e) if api_message(&e).contains("was changed after injection") => {
                let message = api_message(&e);
                ensure!(message.contains("image is \"evil.example/fluent-bit:1\""), "{message}");
                println!("      refused: {}", message.chars().take(200).collect::<String>());
                break;
            }
            other => ensure!(start.elapsed() < Duration::from_secs(60), "never refused; last answer: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Scenario 8: With the injector stopped, a pod in an opted-in namespace is refused by the
/// ValidatingAdmissionPolicy with its message, a pod elsewhere is created; and the policy's CEL
/// rules, evaluated by the API server on pods that carry hand-written status annotations.
pub async fn s08_injector_down(ctx: &mut Ctx) -> Result<()> {
    ctx.stop_injector();
    let refused = ctx.create_pod("e2e-shop", pod("while-down", json!({"app": "web"}), json!({}))).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(
        message.contains("sidecar injection did not happen: is the sidecar-injector running?"),
        "not refused by the policy: {refused:?}"
    );
    ensure!(message.contains("ValidatingAdmissionPolicy 'sidecar-injector.io-injection'"), "{message}");
    ctx.create_pod("e2e-plain", pod("while-down", json!({"app": "web"}), json!({})))
        .await
        .context("a pod elsewhere")?;

    let with_status = |name: &str, status: Value, init: Value| {
        let mut p = pod(name, json!({"app": "web"}), json!({"sidecar-injector.io/status": status.to_string()}));
        p["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "sc", "image": "sc:1"}));
        p["spec"]["initContainers"] = init;
        p
    };
    let native =
        json!([{"name": "native", "image": "n:1", "restartPolicy": "Always"}, {"name": "plain-init", "image": "i:1"}]);
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "intact",
            with_status(
                "intact",
                json!({"templates": [], "containers": ["sc"], "initContainers": ["native", "plain-init"], "nativeSidecars": ["native"]}),
                native.clone(),
            ),
            None,
        ),
        (
            "nothing injected",
            with_status("nothing", json!({"templates": [], "reason": "no template matched"}), json!([])),
            None,
        ),
        (
            "container missing",
            with_status("missing-container", json!({"templates": [], "containers": ["sc", "ghost"]}), json!([])),
            Some("injected sidecar container(s) ghost named in sidecar-injector.io/status are missing"),
        ),
        (
            "init container missing",
            with_status("missing-init", json!({"templates": [], "initContainers": ["native", "gone"]}), native.clone()),
            Some("injected init container(s) gone named in"),
        ),
        (
            "native lost restartPolicy",
            with_status(
                "lost-policy",
                json!({"templates": [], "initContainers": ["plain-init"], "nativeSidecars": ["plain-init"]}),
                native.clone(),
            ),
            Some("native sidecar(s) plain-init lost restartPolicy: Always"),
        ),
        ("opted out", pod("opted-out-down", json!({"sidecar-injector.io/inject": "disabled"}), json!({})), None),
    ];
    for (case, pod, expected) in cases {
        let result = ctx.dry_run_pod("e2e-shop", pod).await;
        match (expected, result) {
            (None, Ok(_)) => {}
            (Some(fragment), Err(e)) if api_message(&e).contains(fragment) => {}
            (expected, result) => bail!(
                "{case}: expected {expected:?}, got {:?}",
                result.map(|p| p.metadata.name).map_err(|e| api_message(&e))
            ),
        }
    }
    ctx.start_injector()?;
    wait_for_injection(ctx, "e2e-shop").await?;
    Ok(())
}

/// Scenario 9: A Job's pod gets a native sidecar (an init container with `restartPolicy: Always`), so the Job
/// can complete.
pub async fn s09_job_pod_native_sidecar(ctx: &mut Ctx) -> Result<()> {
    let mut job_pod =
        pod("report-x7k2p", json!({"batch.kubernetes.io/job-name": "report", "job-name": "report"}), json!({}));
    job_pod["spec"]["restartPolicy"] = json!("Never");
    let stored = ctx.create_pod("e2e-shop", job_pod).await?;
    let sidecar = log_shipper(&stored).context("no sidecar")?;
    ensure!(sidecar.restart_policy.as_deref() == Some("Always"), "{sidecar:?}");
    ensure!(stored.spec.as_ref().unwrap().containers.len() == 1, "the sidecar must not be a regular container");
    ensure!(status(&stored).is_some_and(|s| s.native_sidecars == ["log-shipper"]));
    Ok(())
}

/// Scenario 10: Self-managed certificates: the injector's CA is in its webhook configurations (and the API
/// server's calls succeed with it, as every scenario above shows); a restart keeps the same CA.
pub async fn ca_bundle(client: &kube::Client) -> Result<Vec<u8>> {
    let secret = Api::<Secret>::namespaced(client.clone(), "sidecar-injector").get("sidecar-injector-tls").await?;
    Ok(secret.data.and_then(|d| d.get("ca-bundle.crt").map(|b| b.0.clone())).unwrap_or_default())
}

pub async fn s10_self_managed_certificates(ctx: &mut Ctx) -> Result<()> {
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), "sidecar-injector").get("sidecar-injector-tls").await?;
    let bundle =
        secret.data.as_ref().and_then(|d| d.get("ca-bundle.crt")).context("no ca-bundle.crt in the Secret")?.0.clone();
    ensure!(String::from_utf8_lossy(&bundle).starts_with("-----BEGIN CERTIFICATE-----"), "not a PEM bundle");
    let mutating = Api::<MutatingWebhookConfiguration>::all(ctx.client.clone()).get("sidecar-injector").await?;
    let validating = Api::<ValidatingWebhookConfiguration>::all(ctx.client.clone()).get("sidecar-injector").await?;
    let mut bundles: Vec<Option<Vec<u8>>> =
        mutating.webhooks.iter().flatten().map(|w| w.client_config.ca_bundle.clone().map(|b| b.0)).collect();
    bundles.extend(validating.webhooks.iter().flatten().map(|w| w.client_config.ca_bundle.clone().map(|b| b.0)));
    ensure!(
        bundles.len() == 4 && bundles.iter().all(|b| b.as_ref() == Some(&bundle)),
        "caBundle not written everywhere"
    );
    // Scenario 8 restarted the injector: it reused the Secret instead of making a new CA.
    ensure!(bundle == ctx.first_ca_bundle, "the restarted injector replaced the CA");
    Ok(())
}

/// Scenario 11: The injector's ServiceAccount cannot read Secrets or ConfigMaps outside its namespace.
pub async fn s11_least_privilege(ctx: &mut Ctx) -> Result<()> {
    let token = ctx.plane.kubectl(&["-n", "sidecar-injector", "create", "token", "sidecar-injector"])?;
    let kubeconfig = ctx.plane.kubeconfig_for("injector-rbac", token.trim(), "sidecar-injector")?;
    let can = |args: &[&str]| -> bool {
        let mut full = vec!["auth", "can-i"];
        full.extend_from_slice(args);
        ctx.plane.kubectl_as(&kubeconfig, &full, None).is_ok_and(|o| o.trim() == "yes")
    };
    let expectations: &[(&[&str], bool)] = &[
        (&["get", "secrets", "-n", "default"], false),
        (&["list", "secrets", "-n", "kube-system"], false),
        (&["get", "configmaps", "-n", "default"], false),
        (&["list", "configmaps", "--all-namespaces"], false),
        (&["list", "secrets", "-n", "sidecar-injector"], false),
        (&["get", "secrets/other", "-n", "sidecar-injector"], false),
        (&["get", "secrets/sidecar-injector-tls", "-n", "sidecar-injector"], true),
        (&["update", "secrets/sidecar-injector-tls", "-n", "sidecar-injector"], true),
        (&["watch", "configmaps", "-n", "sidecar-injector"], true),
        (&["watch", "namespaces"], true),
        (&["update", "namespaces/default"], false),
        (&["patch", "mutatingwebhookconfigurations/sidecar-injector"], true),
        (&["patch", "validatingwebhookconfigurations/sidecar-injector"], true),
        (&["update", "mutatingwebhookconfigurations/sidecar-injector"], false),
        (&["patch", "mutatingwebhookconfigurations/someone-else"], false),
        (&["create", "pods", "-n", "e2e-shop"], false),
        (&["list", "pods", "--all-namespaces"], true),
        (&["get", "pods/web", "-n", "e2e-shop"], false),
        (&["delete", "pods", "-n", "e2e-shop"], false),
        (&["create", "validatingadmissionpolicybindings"], true),
        (&["delete", "validatingadmissionpolicybindings/anything"], true),
        (&["update", "validatingadmissionpolicies/sidecar-injector.io-enforced"], false),
        (&["create", "configmaps", "-n", "sidecar-injector"], true),
        (&["create", "configmaps", "-n", "e2e-shop"], false),
        (&["create", "events.events.k8s.io", "-n", "e2e-shop"], true),
        (&["patch", "events.events.k8s.io", "-n", "e2e-shop"], true),
        (&["list", "events.events.k8s.io", "-n", "e2e-shop"], false),
        (&["delete", "events.events.k8s.io", "-n", "e2e-shop"], false),
        (&["create", "events", "-n", "e2e-shop"], false),
        (&["watch", "nodes"], true),
        (&["get", "replicasets/web", "-n", "e2e-shop"], true),
        (&["get", "jobs/x", "-n", "e2e-shop"], true),
        (&["list", "replicasets", "-n", "e2e-shop"], false),
        (&["watch", "jobs", "--all-namespaces"], false),
        (&["get", "deployments/web", "-n", "e2e-shop"], false),
        (&["get", "nodes/kwok-node-0"], false),
        (&["patch", "nodes/kwok-node-0"], false),
    ];
    for (args, expected) in expectations {
        ensure!(can(args) == *expected, "can-i {} should be {}", args.join(" "), if *expected { "yes" } else { "no" });
    }
    Ok(())
}

/// Runs the CLI as the admin; returns stdout, or an error with stderr.
pub(crate) fn cli(ctx: &Ctx, args: &[&str]) -> Result<String> {
    let output =
        std::process::Command::new(&ctx.binary).args(args).env("KUBECONFIG", &ctx.plane.admin_kubeconfig).output()?;
    ensure!(
        output.status.success(),
        "sidecar-injector {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn explain(ctx: &Ctx, args: &[&str]) -> Result<Value> {
    let mut full = vec!["explain", "--cluster", "-o", "json"];
    full.extend_from_slice(args);
    Ok(serde_json::from_str(&cli(ctx, &full)?)?)
}

/// Scenario 13: `explain --cluster` gives the right answer, naming the first rule that fails.
pub async fn s13_explain_cluster(ctx: &mut Ctx) -> Result<()> {
    let opted_in = explain(ctx, &["--namespace", "e2e-shop"])?;
    ensure!(opted_in["wouldInject"] == true && opted_in["firstFailingRule"].is_null(), "{opted_in:#}");
    ensure!(
        opted_in["decision"]["message"].as_str().unwrap_or_default().contains("would inject log-shipper"),
        "{opted_in:#}"
    );

    // Pods of its own: an injected one, and one that opts out.
    ctx.create_pod("e2e-shop", pod("explain-web", json!({"app": "web"}), json!({}))).await?;
    let opted_out_pod =
        pod("explain-opted-out", json!({"app": "web", "sidecar-injector.io/inject": "disabled"}), json!({}));
    ctx.create_pod("e2e-shop", opted_out_pod).await?;
    let existing = explain(ctx, &["--namespace", "e2e-shop", "pod/explain-web"])?;
    ensure!(existing["existingPod"]["injected"] == true, "{existing:#}");

    // An opted-out pod still reaches the injector (through the entry for opted-out pods, which
    // only enforced templates use); the injector's decision says why nothing is injected.
    let opted_out = explain(ctx, &["--namespace", "e2e-shop", "pod/explain-opted-out"])?;
    ensure!(
        opted_out["wouldInject"] == false
            && opted_out["firstFailingRule"]["rule"] == "templates"
            && opted_out["checks"][0]["detail"].as_str().unwrap_or_default().contains("enforce.sidecar-injector.io"),
        "{opted_out:#}"
    );
    ensure!(
        opted_out["decision"]["result"] == "outOfScope"
            && opted_out["decision"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("the pod opts out with label sidecar-injector.io/inject=disabled"),
        "{opted_out:#}"
    );

    let unlabelled = explain(ctx, &["--namespace", "e2e-plain"])?;
    ensure!(unlabelled["firstFailingRule"]["rule"] == "namespace-selected", "{unlabelled:#}");
    ensure!(
        unlabelled["firstFailingRule"]["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("kubectl label namespace e2e-plain sidecar-injector.io/inject=enabled"),
        "{unlabelled:#}"
    );

    // A webhook configuration whose selector no longer matches the opted-in namespace.
    let configurations = Api::<MutatingWebhookConfiguration>::all(ctx.client.clone());
    let original = configurations.get("sidecar-injector").await?;
    let mut narrowed = original.clone();
    narrowed.webhooks.as_mut().unwrap()[0].namespace_selector = Some(serde_json::from_value(
        json!({"matchLabels": {"sidecar-injector.io/inject": "enabled", "team": "payments"}}),
    )?);
    configurations.replace("sidecar-injector", &PostParams::default(), &narrowed).await?;
    let result = explain(ctx, &["--namespace", "e2e-shop"]);
    let mut restore = configurations.get("sidecar-injector").await?;
    restore.webhooks = original.webhooks;
    configurations.replace("sidecar-injector", &PostParams::default(), &restore).await?;
    let narrowed = result?;
    ensure!(narrowed["firstFailingRule"]["rule"] == "namespace-selected", "{narrowed:#}");
    ensure!(
        narrowed["firstFailingRule"]["detail"].as_str().unwrap_or_default().contains("team=payments"),
        "{narrowed:#}"
    );

    let text = cli(ctx, &["explain", "--cluster", "--namespace", "e2e-plain"])?;
    ensure!(text.contains("a new pod would NOT be injected: namespace e2e-plain is not opted in"), "{text}");
    println!("{}", text.lines().map(|l| format!("      | {l}")).collect::<Vec<_>>().join("\n"));
    Ok(())
}

/// An enforced template for pods labelled `tier=prod`, as an operator would add it.
const ENFORCED_AUDIT: &str = r#"description: An audit agent every tier=prod pod must run
enforced: true
ownProcessNamespace: true
sidecarMode: auto
podSelector:
  matchLabels: {tier: prod}
values:
  image: registry.example/audit-agent:2.1
inject:
  sidecars:
    - name: audit-agent
      image: "{{ values.image }}"
      command: [/audit-agent]
      args: [--spool=/spool, --upload=none]
      volumeMounts:
        - {name: audit-spool, mountPath: /spool}
  volumes:
    - name: audit-spool
      emptyDir: {}
  hostAliases:
    - {ip: 10.96.40.10, hostnames: [audit-collector.internal]}
  appContainers:
    envFrom:
      - {configMapRef: {name: audit-env, optional: true}, keys: [AUDIT_PRELOAD]}
    volumeMounts:
      - {name: audit-spool, mountPath: /var/audit, readOnly: true}
"#;

pub(crate) async fn set_template(ctx: &Ctx, key: &str, text: Option<&str>) -> Result<()> {
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "sidecar-injector");
    let mut configmap = configmaps.get("sidecar-templates").await?;
    let data = configmap.data.get_or_insert_with(Default::default);
    match text {
        Some(text) => data.insert(key.into(), text.into()),
        None => data.remove(key),
    };
    configmaps.replace("sidecar-templates", &PostParams::default(), &configmap).await?;
    Ok(())
}

/// Dry-runs `pod` in e2e-shop until the answer has what `served` looks for (a template edit
/// reaches the injector within seconds), and returns that answer; after 15 s, fails naming `what`
/// and the last answer.
pub(crate) async fn dry_run_until(ctx: &Ctx, pod: &Value, what: &str, served: impl Fn(&Pod) -> bool) -> Result<Pod> {
    let start = Instant::now();
    loop {
        let said = match ctx.dry_run_pod("e2e-shop", pod.clone()).await {
            Ok(answer) if served(&answer) => return Ok(answer),
            Ok(answer) => {
                let names: Vec<String> = all_containers(&answer).into_iter().map(|c| c.name).collect();
                format!("answered with containers {names:?}")
            }
            Err(e) => api_message(&e),
        };
        ensure!(start.elapsed() < Duration::from_secs(15), "{what} was never served: {said}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the enforcement binding of `template` exists (`true`) or is gone (`false`).
pub(crate) async fn wait_for_binding(ctx: &Ctx, template: &str, present: bool) -> Result<Duration> {
    let start = Instant::now();
    let name = format!("binding sidecar-injector-enforced-{template}");
    loop {
        let found = ctx
            .plane
            .kubectl(&[
                "get",
                "validatingadmissionpolicybindings",
                &format!("sidecar-injector-enforced-{template}"),
                "-o",
                "name",
            ])
            .is_ok_and(|o| o.contains(&format!("sidecar-injector-enforced-{template}")));
        if found == present {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "{name} still {}",
            if present { "missing" } else { "there" }
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) fn all_containers(pod: &Pod) -> Vec<k8s_openapi::api::core::v1::Container> {
    let spec = pod.spec.clone().unwrap_or_default();
    spec.init_containers.unwrap_or_default().into_iter().chain(spec.containers).collect()
}

/// A pod's exact copy of the enforced audit agent (`ENFORCED_AUDIT`) as a native sidecar.
fn audit_agent_copy() -> Value {
    json!({
        "name": "audit-agent", "image": "registry.example/audit-agent:2.1", "command": ["/audit-agent"],
        "args": ["--spool=/spool", "--upload=none"], "restartPolicy": "Always",
        "volumeMounts": [{"name": "audit-spool", "mountPath": "/spool"}]
    })
}

/// Adds the ephemeral container `name` targeting `target` to the stored pod `pod`, as `kubectl
/// debug --target` does; `Err` holds the API server's message.
async fn debug_target(pods: &Api<Pod>, pod: &str, name: &str, target: &str) -> Result<(), String> {
    let container = json!({"name": name, "image": "busybox", "targetContainerName": target, "command": ["sh"]});
    let patch = kube::api::Patch::Strategic(json!({"spec": {"ephemeralContainers": [container]}}));
    pods.patch_ephemeral_containers(pod, &kube::api::PatchParams::default(), &patch)
        .await
        .map(|_| ())
        .map_err(|e| api_message(&e))
}

/// Scenario 16: An enforced template cannot be skipped, swapped or faked: not with the opt-out label,
/// the templates annotation or a look-alike container while the injector is up, not by an UPDATE
/// afterwards, and not while the injector is down (the enforcement policy the injector binds); nor
/// by an exact copy the pod runs after an init container of its own, a host alias of its own for
/// the template's host name, a process namespace shared with the agent, an ephemeral container
/// that targets the agent (injector up and down), or a label update that leaves the template's
/// podSelector (the policy). The status tells the truth
/// about a template applied with conflicts.
pub async fn s16_enforced_templates(ctx: &mut Ctx) -> Result<()> {
    set_template(ctx, "audit.yaml", Some(ENFORCED_AUDIT)).await.context("adding the enforced template")?;
    let start = Instant::now();
    let took = wait_for_binding(ctx, "audit", true).await?;
    println!("      enforcement binding written {took:?} after the template edit");
    let prod_opted_out = json!({"app": "web", "tier": "prod", "sidecar-injector.io/inject": "disabled"});
    // The webhook serves the new template a moment after the edit: wait for it.
    let probe = pod("probe", prod_opted_out.clone(), json!({}));
    dry_run_until(ctx, &probe, "the enforced template", |p| all_containers(p).iter().any(|c| c.name == "audit-agent"))
        .await?;

    // Injector up: the pod cannot skip it.
    let opted_out = ctx.create_pod("e2e-shop", pod("enforced-opted-out", prod_opted_out.clone(), json!({}))).await?;
    let names: Vec<String> = all_containers(&opted_out).into_iter().map(|c| c.name).collect();
    ensure!(names.contains(&"audit-agent".to_owned()), "opted out, not enforced: {names:?}");
    ensure!(!names.contains(&"log-shipper".to_owned()), "the opt-out label still holds for the rest: {names:?}");
    let none_named = ctx
        .create_pod(
            "e2e-shop",
            pod("enforced-none-named", json!({"tier": "prod"}), json!({"sidecar-injector.io/templates": " , "})),
        )
        .await?;
    ensure!(all_containers(&none_named).iter().any(|c| c.name == "audit-agent"), "the annotation skipped it");
    let mut look_alike = pod("enforced-look-alike", json!({"tier": "prod"}), json!({}));
    look_alike["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "audit-agent", "image": "evil/not-audit"}));
    let refused = ctx.create_pod("e2e-shop", look_alike.clone()).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(
        message.contains("template audit is enforced for this pod") && message.contains("\"audit-agent\""),
        "look-alike not refused: {refused:?}"
    );

    // An exact copy of the enforced native sidecar that the pod runs after an init container of
    // its own (which would then run before the agent starts).
    let mut late_copy = pod("enforced-late-copy", json!({"tier": "prod"}), json!({}));
    late_copy["spec"]["initContainers"] = json!([{"name": "warm-cache", "image": "busybox"}, audit_agent_copy()]);
    late_copy["spec"]["volumes"] = json!([{"name": "audit-spool", "emptyDir": {}}]);
    let refused = ctx.dry_run_pod("e2e-shop", late_copy.clone()).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(
        message.contains("is the template's, but it runs after the pod's own init container \"warm-cache\""),
        "a copy run late not refused: {message:?}"
    );

    // A host alias of the pod's own for the agent's collector, to another IP.
    let mut shadowing = pod("enforced-shadowing", json!({"tier": "prod"}), json!({}));
    shadowing["spec"]["hostAliases"] = json!([{"ip": "127.0.0.1", "hostnames": ["audit-collector.internal"]}]);
    let refused = ctx.dry_run_pod("e2e-shop", shadowing.clone()).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(
        message.contains("the pod's host alias 127.0.0.1 maps host name \"audit-collector.internal\""),
        "a shadowing host alias not refused: {message:?}"
    );

    // A pod that shares its process namespace, which the agent must not.
    let mut sharing = pod("enforced-sharing", json!({"tier": "prod"}), json!({}));
    sharing["spec"]["shareProcessNamespace"] = json!(true);
    let refused = ctx.dry_run_pod("e2e-shop", sharing.clone()).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(message.contains("(shareProcessNamespace: true)"), "a shared process namespace not refused: {message:?}");

    // An env entry of the app's over a key the agent's envFrom source provides (env wins).
    let mut replacing = pod("enforced-replacing", json!({"tier": "prod"}), json!({}));
    replacing["spec"]["containers"][0]["env"] = json!([{"name": "AUDIT_PRELOAD", "value": ""}]);
    let refused = ctx.dry_run_pod("e2e-shop", replacing).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(
        message.contains("the env var \"AUDIT_PRELOAD\" of container \"app\" replaces the one the template's envFrom source configMap/audit-env provides"),
        "an env entry over an enforced envFrom key not refused: {message:?}"
    );
    // A mount of the app's below the template's, which would hide part of it.
    let mut hiding = pod("enforced-hiding", json!({"tier": "prod"}), json!({}));
    hiding["spec"]["volumes"] = json!([{"name": "mine", "emptyDir": {}}]);
    hiding["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "mine", "mountPath": "/var/audit/libaudit.so", "subPath": "fake.so"}]);
    let refused = ctx.dry_run_pod("e2e-shop", hiding).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(
        message.contains(
            "at \"/var/audit/libaudit.so\" in container \"app\" hides part of the template's mount at \"/var/audit\""
        ),
        "a mount below an enforced mount not refused: {message:?}"
    );

    // The honest status: a pod whose own container takes the log shipper's place.
    let before = ctx.injector.as_ref().context("no injector")?.metrics();
    let mut own_shipper = pod("own-shipper", json!({"app": "web"}), json!({}));
    own_shipper["spec"]["initContainers"] =
        json!([{"name": "log-shipper", "image": "evil/not-fluent-bit", "restartPolicy": "Always"}]);
    let stored = ctx.create_pod("e2e-shop", own_shipper).await?;
    let label = stored.metadata.labels.as_ref().and_then(|l| l.get("sidecar-injector.io/injected")).cloned();
    ensure!(label.as_deref() == Some("partial"), "injected label {label:?}");
    let status = status(&stored).context("no status")?;
    ensure!(
        !status.init_containers.contains(&"log-shipper".to_owned()),
        "the pod's own container reported as injected"
    );
    ensure!(status.conflicted_templates() == vec!["log-shipper"], "{status:?}");
    let after = ctx.injector.as_ref().context("no injector")?.metrics();
    let count = |text: &str, series: &str| -> f64 {
        text.lines().find_map(|l| l.strip_prefix(series)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    };
    let conflicts = "sidecar_injector_injection_conflicts_total{template=\"log-shipper\"}";
    ensure!(count(&after, conflicts) == count(&before, conflicts) + 1.0, "the conflict was not counted");
    let injections = "sidecar_injector_injections_total{template=\"log-shipper\"}";
    ensure!(count(&after, injections) == count(&before, injections), "counted as a clean injection");

    // UPDATE: an injected container's image cannot change; other updates pass.
    let pods = ctx.pods("e2e-shop");
    let patch = |p: Value| kube::api::Patch::Strategic(p);
    let params = kube::api::PatchParams::default();
    pods.patch("enforced-opted-out", &params, &patch(json!({"metadata": {"labels": {"team": "a"}}})))
        .await
        .context("an unrelated update")?;
    let swap = json!({"spec": {"initContainers": [{"name": "audit-agent", "image": "evil/not-audit"}]}});
    let refused = pods.patch("enforced-opted-out", &params, &patch(swap)).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    // Refused by the enforcement policy (which the API server runs before the webhooks) or by
    // `/validate`, whichever answers first.
    ensure!(
        message.contains("the image of injected container \"audit-agent\" cannot be changed by an update")
            || message.contains("an update may change the image of its audit-agent only to the template's"),
        "image swap not refused: {message:?}"
    );
    let forged = json!({"metadata": {"annotations": {"sidecar-injector.io/status": "{\"templates\":[]}"}}});
    let refused = pods.patch("enforced-none-named", &params, &patch(forged)).await;
    ensure!(
        refused.as_ref().err().map(api_message).unwrap_or_default().contains("cannot be changed by an update"),
        "status rewrite not refused: {refused:?}"
    );

    // An ephemeral container (`kubectl debug --target`) may not join the enforced agent's process
    // namespace; the app's, yes, and `/validate` saw it (the webhook matches the subresource).
    let validated =
        "sidecar_injector_admission_requests_total{endpoint=\"validate\",operation=\"UPDATE\",result=\"allowed\"}";
    let before = ctx.injector.as_ref().context("no injector")?.metrics();
    let message = debug_target(&pods, "enforced-opted-out", "peek", "audit-agent").await.err().unwrap_or_default();
    ensure!(
        message.contains("is enforced for this pod: ephemeral container")
            && message.contains("targets")
            && message.contains("audit-agent"),
        "an ephemeral container targeting the agent not refused: {message:?}"
    );
    debug_target(&pods, "enforced-opted-out", "peek-app", "app").await.map_err(anyhow::Error::msg)?;
    let after = ctx.injector.as_ref().context("no injector")?.metrics();
    ensure!(count(&after, validated) > count(&before, validated), "/validate never saw the ephemeral container");

    // Injector down: the enforcement policy holds on its own.
    ctx.stop_injector();
    let mut exact = pod("exact", prod_opted_out.clone(), json!({}));
    exact["spec"]["initContainers"] = json!([audit_agent_copy()]);
    exact["spec"]["volumes"] = json!([{"name": "audit-spool", "emptyDir": {}}]);
    let mut forged_status = exact.clone();
    forged_status["metadata"]["annotations"] = json!({"sidecar-injector.io/status": "{\"templates\":[{\"name\":\"audit\",\"hash\":\"x\"}],\"initContainers\":[\"audit-agent\"]}"});
    forged_status["spec"]["initContainers"][0]["image"] = json!("evil/not-audit");
    let mut swapped_args = exact.clone();
    // Encodes like the template's two args if the policy did not refuse the separator itself.
    swapped_args["spec"]["initContainers"][0]["args"] = json!(["--spool=/spool\u{1f}--upload=none"]);
    let mut not_native = exact.clone();
    not_native["spec"]["initContainers"][0].as_object_mut().unwrap().remove("restartPolicy");
    let mut shadowing = exact.clone();
    shadowing["spec"]["hostAliases"] = json!([{"ip": "127.0.0.1", "hostnames": ["audit-collector.internal"]}]);
    let mut sharing = exact.clone();
    sharing["spec"]["shareProcessNamespace"] = json!(true);
    let mut late = exact.clone();
    late["spec"]["initContainers"] = json!([{"name": "warm-cache", "image": "busybox"}, audit_agent_copy()]);
    let mut replacing = exact.clone();
    replacing["spec"]["containers"][0]["env"] = json!([{"name": "AUDIT_PRELOAD", "value": ""}]);
    let mut hiding = exact.clone();
    hiding["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "audit-spool", "mountPath": "/var/audit/lib"}]);
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "missing",
            pod("missing", prod_opted_out.clone(), json!({})),
            Some("which lacks its audit-agent, audit-spool"),
        ),
        ("forged status, other image", forged_status, Some("whose audit-agent differ from the template's")),
        ("separator smuggled into args", swapped_args, Some("whose audit-agent differ from the template's")),
        ("not native", not_native, Some("native sidecar(s) audit-agent lack restartPolicy: Always")),
        (
            "run after the pod's own init container",
            late,
            Some("whose audit-agent run after init containers of the pod's own"),
        ),
        (
            "a host alias to another IP",
            shadowing,
            Some("whose host aliases map audit-collector.internal to another IP"),
        ),
        ("a shared process namespace", sharing, Some("needs a process namespace of its own")),
        (
            "an env entry over an envFrom key",
            replacing,
            Some("whose container app sets AUDIT_PRELOAD, which the template's envFrom"),
        ),
        (
            "a mount below the template's",
            hiding,
            Some("whose container app at /var/audit/lib mounts something below the template's mount (/var/audit)"),
        ),
        ("exactly the template's", exact, None),
        (
            "not tier=prod",
            pod("dev", json!({"tier": "dev", "sidecar-injector.io/inject": "disabled"}), json!({})),
            None,
        ),
    ];
    // The API server picks up a new binding on its own cycle (about a second): wait for the first
    // refusal, and say how long the binding took to take effect since it was written.
    while ctx.dry_run_pod("e2e-shop", cases[0].1.clone()).await.is_ok() {
        ensure!(start.elapsed() < Duration::from_secs(20), "the enforcement binding never took effect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("      the API server enforced the binding within {:?} of the template edit", start.elapsed());
    for (case, pod, expected) in cases {
        let result = ctx.dry_run_pod("e2e-shop", pod).await;
        match (expected, result) {
            (None, Ok(_)) => {}
            (Some(fragment), Err(e))
                if api_message(&e).contains(fragment)
                    && api_message(&e).contains("ValidatingAdmissionPolicy 'sidecar-injector.io-enforced'") => {}
            (expected, result) => {
                let policy = ctx.plane.kubectl(&[
                    "get",
                    "validatingadmissionpolicies",
                    "sidecar-injector.io-enforced",
                    "-o",
                    "jsonpath={.status}",
                ]);
                let binding = ctx.plane.kubectl(&[
                    "get",
                    "validatingadmissionpolicybindings",
                    "sidecar-injector-enforced-audit",
                    "-o",
                    "json",
                ]);
                bail!(
                    "injector down, {case}: expected {expected:?}, got {:?}\npolicy status: {policy:?}\nbinding: {binding:?}",
                    result.map(|p| p.metadata.name).map_err(|e| api_message(&e))
                )
            }
        }
    }
    // The policy alone refuses an ephemeral container that targets the agent, not one that
    // targets the app.
    let message = debug_target(&pods, "enforced-opted-out", "peek-down", "audit-agent").await.err().unwrap_or_default();
    ensure!(
        message.contains("ephemeral container peek-down targets audit-agent")
            && message.contains("ValidatingAdmissionPolicy 'sidecar-injector.io-enforced'"),
        "injector down: an ephemeral container targeting the agent not refused: {message:?}"
    );
    debug_target(&pods, "enforced-opted-out", "peek-app-down", "app").await.map_err(anyhow::Error::msg)?;
    // Nor a label update that takes the pod out of the template's podSelector (after which an
    // image update would match the binding on neither the old pod nor the new one).
    let relabel = patch(json!({"metadata": {"labels": {"tier": "dev"}}}));
    let refused = pods.patch("enforced-opted-out", &params, &relabel).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(
        message.contains("and selects pods by tier: an update may not change these labels"),
        "injector down: a label update leaving the template's selector not refused: {refused:?}"
    );
    pods.patch("enforced-opted-out", &params, &patch(json!({"metadata": {"labels": {"team": "b"}}})))
        .await
        .context("injector down: an unrelated label update")?;
    ctx.start_injector()?;
    wait_for_injection(ctx, "e2e-shop").await?;

    // No longer enforced: the binding and its params go.
    set_template(ctx, "audit.yaml", None).await?;
    wait_for_binding(ctx, "audit", false).await?;
    let params = ctx.plane.kubectl(&[
        "-n",
        "sidecar-injector",
        "get",
        "configmaps",
        "-l",
        "sidecar-injector.io/enforced-template",
        "-o",
        "name",
    ])?;
    ensure!(params.trim().is_empty(), "params left behind: {params}");
    for name in ["enforced-opted-out", "enforced-none-named", "own-shipper"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// Scenario 12: kube-apiserver stops for over 60 s while admission requests go straight to the
/// webhook: they are answered from the caches (injected where the cached namespace labels say so).
/// After the restart, a template edit takes effect within 5 s.
/// A client of the webhook trusting the injector's CA, presenting `certificate` (or none).
pub(crate) fn webhook_client(ctx: &Ctx, certificate: Option<&sidecar_injector::certs::Pem>) -> Result<reqwest::Client> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ctx.first_ca_bundle) {
        roots.add(cert?)?;
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
    let tls = match certificate {
        None => builder.with_no_client_auth(),
        Some(pem) => builder.with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(pem.cert.as_bytes())?],
            PrivateKeyDer::from_pem_slice(pem.key.as_bytes())?,
        )?,
    };
    Ok(reqwest::Client::builder().tls_backend_preconfigured(tls).timeout(Duration::from_secs(5)).build()?)
}

/// Scenario 15: the API server authenticates itself to the webhook with its client certificate
/// (AdmissionConfiguration), and the injector (`tls.client_ca_file`) refuses everyone else during
/// the handshake: every other scenario's pods went through, a pod-network client does not.
pub async fn s15_only_the_api_server(ctx: &mut Ctx) -> Result<()> {
    let url = format!("https://127.0.0.1:{}/mutate", crate::controlplane::INJECTOR_HTTPS_PORT);
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    let stranger = webhook_client(ctx, None)?.post(&url).json(&body).send().await;
    ensure!(stranger.is_err(), "a client without a certificate was answered: {stranger:?}");
    let now = time::OffsetDateTime::now_utc();
    let other_ca = sidecar_injector::certs::generate_ca("not the API server's", now, 1)?;
    let forged = sidecar_injector::certs::issue_client(&other_ca, "kube-apiserver", now, 1)?;
    let impostor = webhook_client(ctx, Some(&forged))?.post(&url).json(&body).send().await;
    ensure!(impostor.is_err(), "a client with another CA's certificate was answered: {impostor:?}");
    let api_server = webhook_client(ctx, Some(&ctx.plane.webhook_client))?.post(&url).json(&body).send().await?;
    ensure!(api_server.status() == 400, "the API server's certificate: status {}", api_server.status());
    println!("      no certificate: refused; another CA's: refused; the API server's: answered");
    Ok(())
}

pub async fn s12_api_server_outage(ctx: &mut Ctx) -> Result<()> {
    // This test stands in for the API server, so it presents the API server's client certificate.
    let webhook = webhook_client(ctx, Some(&ctx.plane.webhook_client))?;
    let url = format!("https://127.0.0.1:{}/mutate", crate::controlplane::INJECTOR_HTTPS_PORT);
    let review = |namespace: &str, uid: &str| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace, "operation": "CREATE", "userInfo": {"username": "e2e"},
            "object": pod("outage", json!({"app": "web"}), json!({}))}})
    };

    ctx.plane.stop_apiserver();
    let down = Instant::now();
    let (mut answered, mut injected, mut left_alone) = (0, 0, 0);
    while down.elapsed() < Duration::from_secs(62) {
        for (namespace, expect_patch) in [("e2e-shop", true), ("e2e-plain", false)] {
            let response = webhook.post(&url).json(&review(namespace, &format!("outage-{answered}"))).send().await?;
            ensure!(response.status() == 200, "status {} while the API server is down", response.status());
            let answer: Value = response.json().await?;
            ensure!(answer["response"]["allowed"] == true, "{answer}");
            let patched = answer["response"].get("patch").is_some();
            ensure!(patched == expect_patch, "{namespace}: patched={patched} while the API server is down");
            answered += 1;
            if patched { injected += 1 } else { left_alone += 1 }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "      kube-apiserver down for {:.0} s: {answered} requests answered from the cache ({injected} injected, {left_alone} left alone)",
        down.elapsed().as_secs_f64()
    );

    let restarted = ctx.plane.start_apiserver()?;
    println!("      kube-apiserver ready again after {:.1} s", restarted.as_secs_f64());
    let took = edit_tag_and_wait(ctx, "e2e-shop", "3.2.12", Duration::from_secs(5)).await?;
    println!("      after the restart, the template edit took effect after {took:?}");
    Ok(())
}

/// Deletes the pods created along the way (namespaces cannot be deleted without a controller-manager).
pub async fn cleanup(ctx: &Ctx) {
    for namespace in ["e2e-shop", "e2e-plain", "e2e-mutated", "e2e-broken", "e2e-drift"] {
        let _ = ctx.pods(namespace).delete_collection(&DeleteParams::default(), &Default::default()).await;
    }
}

/// Scenario 25: Defaults per namespace. An override annotation on the namespace applies to its
/// pods, the pod's own annotation wins, and a namespace default that breaks the value's constraint
/// refuses the pods that use it, naming the namespace's annotation.
pub async fn s25_namespace_defaults(ctx: &mut Ctx) -> Result<()> {
    const NS: &str = "e2e-ns-defaults";
    const MEMORY: &str = "sidecar-injector.io/log-shipper.memoryLimit";
    ctx.namespace(NS, &[("sidecar-injector.io/inject", "enabled")]).await?;
    let namespaces = Api::<Namespace>::all(ctx.client.clone());
    let annotate = |value: &str| json!({"metadata": {"annotations": {MEMORY: value}}});
    namespaces.patch(NS, &PatchParams::default(), &Patch::Merge(annotate("96Mi"))).await?;
    let memory = |pod: &Pod| {
        log_shipper(pod)
            .and_then(|c| c.resources)
            .and_then(|r| r.limits)
            .and_then(|l| l.get("memory").map(|q| q.0.clone()))
    };
    // The namespace cache follows the annotation within a moment.
    let start = Instant::now();
    let inherited = loop {
        if let Ok(pod) = ctx.dry_run_pod(NS, pod("probe", json!({}), json!({}))).await
            && memory(&pod).as_deref() == Some("96Mi")
        {
            break pod;
        }
        ensure!(start.elapsed() < Duration::from_secs(30), "the namespace default was not applied within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(status(&inherited).is_some(), "no status");
    let own = ctx.create_pod(NS, pod("own", json!({}), json!({MEMORY: "128Mi"}))).await?;
    ensure!(memory(&own).as_deref() == Some("128Mi"), "the pod's own annotation did not win: {:?}", memory(&own));

    namespaces.patch(NS, &PatchParams::default(), &Patch::Merge(annotate("64Gi"))).await?;
    let start = Instant::now();
    let refused = loop {
        match ctx.dry_run_pod(NS, pod("probe", json!({}), json!({}))).await {
            Err(error) => break api_message(&error),
            Ok(_) if start.elapsed() < Duration::from_secs(30) => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(pod) => bail!("a namespace default breaking the pattern was applied: {:?}", memory(&pod)),
        }
    };
    ensure!(refused.contains(&format!("annotation {MEMORY} on namespace {NS}")), "{refused}");
    // A pod that sets the value itself does not depend on the namespace's.
    let own = ctx.dry_run_pod(NS, pod("own-2", json!({}), json!({MEMORY: "128Mi"}))).await?;
    ensure!(memory(&own).as_deref() == Some("128Mi"), "{:?}", memory(&own));
    namespaces.delete(NS, &Default::default()).await?;
    Ok(())
}

/// Scenario 26: `enforced: audit` on the real API server. A look-alike pod and an opted-out pod
/// that `enforced: true` would refuse or inject into are created, each with a warning to the client
/// in the words of the refusal, counted; the template's policy binding warns and audits instead of
/// denying; then `enforced: true` refuses the same look-alike.
pub async fn s26_enforcement_audit(ctx: &mut Ctx) -> Result<()> {
    let audited = ENFORCED_AUDIT
        .replace("enforced: true", "enforced: audit")
        .replace("{tier: prod}", "{tier: audit-dry-run}")
        .replace("audit-agent", "dry-agent")
        .replace("audit-spool", "dry-spool");
    set_template(ctx, "dry.yaml", Some(&audited)).await?;
    wait_for_binding(ctx, "dry", true).await?;
    let actions = ctx.plane.kubectl(&[
        "get",
        "validatingadmissionpolicybinding",
        "sidecar-injector-enforced-dry",
        "-o",
        "jsonpath={.spec.validationActions}",
    ])?;
    ensure!(actions.contains("Warn") && actions.contains("Audit") && !actions.contains("Deny"), "{actions}");
    let labels = json!({"tier": "audit-dry-run"});
    let named = json!({"sidecar-injector.io/templates": "dry"});
    let probe = pod("probe", labels.clone(), named.clone());
    dry_run_until(ctx, &probe, "the audited template", |p| all_containers(p).iter().any(|c| c.name == "dry-agent"))
        .await?;
    let counted = |text: &str| -> f64 {
        let series = "sidecar_injector_enforcement_audit_total{template=\"dry\"}";
        text.lines().find_map(|l| l.strip_prefix(series)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    };
    let before = counted(&ctx.injector.as_ref().context("no injector")?.metrics());
    // kubectl prints the admission warnings on stderr.
    let create = |manifest: &Value| -> Result<String> {
        let mut child = std::process::Command::new(ctx.plane.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&ctx.plane.admin_kubeconfig)
            .args(["-n", "e2e-shop", "create", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        use std::io::Write;
        child.stdin.take().context("stdin")?.write_all(manifest.to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        ensure!(out.status.success(), "refused: {text}");
        Ok(text)
    };
    let mut look_alike = pod("dry-look-alike", labels.clone(), named.clone());
    look_alike["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "dry-agent", "image": "evil/not-audit"}));
    let said = create(&look_alike)?;
    ensure!(
        said.contains("template dry is enforced: audit; with enforced: true it would refuse this pod")
            && said.contains("the pod's sidecar \"dry-agent\" is not the template's"),
        "no audit warning: {said}"
    );
    let opted_out = json!({"tier": "audit-dry-run", "sidecar-injector.io/inject": "disabled"});
    let said = create(&pod("dry-opted-out", opted_out, json!({})))?;
    ensure!(said.contains("with enforced: true it would be injected into this pod"), "no audit warning: {said}");
    let after = counted(&ctx.injector.as_ref().context("no injector")?.metrics());
    ensure!(after == before + 2.0, "enforcement_audit_total went from {before} to {after}");

    // Enforced for real: the same look-alike is refused.
    set_template(ctx, "dry.yaml", Some(&audited.replace("enforced: audit", "enforced: true"))).await?;
    let start = Instant::now();
    look_alike["metadata"]["name"] = json!("dry-look-alike-2");
    let message = loop {
        match ctx.dry_run_pod("e2e-shop", look_alike.clone()).await {
            Err(e) => break api_message(&e),
            Ok(_) if start.elapsed() < Duration::from_secs(15) => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(_) => bail!("enforced: true did not refuse the look-alike"),
        }
    };
    ensure!(message.contains("template dry is enforced for this pod"), "{message}");
    set_template(ctx, "dry.yaml", None).await?;
    wait_for_binding(ctx, "dry", false).await?;
    Ok(())
}

/// Scenario 27: Kubernetes Events on the owning workload. ReplicaSets whose pods get a template
/// with conflicts, an ignored override, or a refusal each get one Event in the words of `explain`
/// and the admission response, aggregated however many pods they try; a dry run makes none; a
/// refused edit of a template ConfigMap gets one on the ConfigMap.
pub async fn s27_events(ctx: &mut Ctx) -> Result<()> {
    let replica_set = |name: &str, annotations: Value, containers: Value| {
        json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": "e2e-shop"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"events": name}},
                "template": {
                    "metadata": {"labels": {"events": name}, "annotations": annotations},
                    "spec": {"containers": containers},
                },
            },
        })
    };
    let app = json!([{"name": "app", "image": "app:1"}]);
    let objects = [
        replica_set(
            "events-conflicts",
            json!({}),
            json!([{"name": "app", "image": "app:1"}, {"name": "log-shipper", "image": "own-shipper:1"}]),
        ),
        replica_set("events-ignored", json!({"sidecar-injector.io/log-shipper.image": "other:1"}), app.clone()),
        replica_set("events-refused", json!({"sidecar-injector.io/log-shipper.memoryLimit": "64Gi"}), app),
    ];
    let manifest: String = objects.iter().map(|o| format!("{o}\n")).collect();
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(&manifest))?;
    // The refusal's words, as the admission response gives them.
    let mut refused_pod =
        pod("refused-probe", json!({}), json!({"sidecar-injector.io/log-shipper.memoryLimit": "64Gi"}));
    let refusal = match ctx.dry_run_pod("e2e-shop", refused_pod.clone()).await {
        Err(e) => api_message(&e),
        Ok(_) => bail!("the bad override was not refused"),
    };
    let refusal = refusal.trim_start_matches(|c| c != ':').trim_start_matches(": ").to_owned();

    let events_in = |namespace: &str| -> Result<Vec<Value>> {
        let list: Value = serde_json::from_str(&ctx.plane.kubectl(&[
            "-n",
            namespace,
            "get",
            "events.events.k8s.io",
            "-o",
            "json",
        ])?)?;
        Ok(list["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["reportingController"] == "sidecar-injector")
            .collect())
    };
    let events = || events_in("e2e-shop");
    let about = |events: &[Value], name: &str, reason: &str| -> Vec<Value> {
        events.iter().filter(|e| e["regarding"]["name"] == name && e["reason"] == reason).cloned().collect()
    };
    let expected = [
        ("events-conflicts", "InjectedWithConflicts", "applied with conflicts: the pod's own items stand where the template's would be: skipped sidecar \"log-shipper\" from template log-shipper: the pod already has one".to_owned()),
        ("events-ignored", "OverridesIgnored", "annotation sidecar-injector.io/log-shipper.image ignored: value \"image\" of template \"log-shipper\" is not overridable".to_owned()),
        ("events-refused", "InjectionRefused", refusal),
    ];
    let start = Instant::now();
    loop {
        let all = events()?;
        let missing: Vec<&str> = expected
            .iter()
            .filter(|(name, reason, _)| about(&all, name, reason).is_empty())
            .map(|(n, _, _)| *n)
            .collect();
        if missing.is_empty() {
            for (name, reason, words) in &expected {
                let found = about(&all, name, reason);
                ensure!(found.len() == 1, "{name}: {} {reason} Events, not one aggregated: {found:?}", found.len());
                let event = &found[0];
                let note = event["note"].as_str().unwrap_or_default();
                ensure!(note.contains(words.as_str()), "{name}: {note:?} does not say {words:?}");
                ensure!(event["type"] == "Warning" && event["regarding"]["kind"] == "ReplicaSet", "{event}");
                ensure!(event["regarding"]["uid"].as_str().is_some_and(|u| !u.is_empty()), "no uid: {event}");
            }
            break;
        }
        ensure!(start.elapsed() < Duration::from_secs(30), "no Events for {missing:?} within 30 s: {all:#?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // A dry run with the same owner makes no Event (nor a count).
    let before = events()?;
    let rs: Value =
        serde_json::from_str(&ctx.plane.kubectl(&["-n", "e2e-shop", "get", "rs", "events-refused", "-o", "json"])?)?;
    refused_pod["metadata"]["name"] = json!("refused-dry-run");
    refused_pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": "events-refused", "uid": rs["metadata"]["uid"], "controller": true}]);
    let _ = ctx.dry_run_pod("e2e-shop", refused_pod).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let count =
        |events: &[Value]| about(events, "events-refused", "InjectionRefused").first().map(|e| e["series"].clone());
    ensure!(
        count(&events()?) == count(&before),
        "a dry run changed the Event: {:?} -> {:?}",
        count(&before),
        count(&events()?)
    );

    // A refused template edit: an Event on the ConfigMap.
    let broken = set_template(ctx, "events-broken.yaml", Some("inject:\n  sidecars: {not: a list}\n")).await;
    ensure!(broken.is_err(), "the broken edit was accepted");
    let start = Instant::now();
    loop {
        let all = events_in("sidecar-injector")?;
        // s06's refused edit has an Event of its own: this edit's is another one.
        let refused = about(&all, "sidecar-templates", "TemplateEditRefused");
        if let Some(event) = refused.iter().find(|e| e["note"].as_str().is_some_and(|n| n.contains("events-broken"))) {
            ensure!(event["regarding"]["kind"] == "ConfigMap", "{event}");
            break;
        }
        ensure!(start.elapsed() < Duration::from_secs(30), "no TemplateEditRefused Event: {all:#?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Owners are claims: bare pods that name a ReplicaSet which does not exist, and a real one
    // with a uid not its own, get no Event on either. A ReplicaSet made after them (whose pods the
    // one publishing task sees after theirs) gets its Event: the proof they were looked at.
    let rs: Value =
        serde_json::from_str(&ctx.plane.kubectl(&["-n", "e2e-shop", "get", "rs", "events-ignored", "-o", "json"])?)?;
    let ignored = json!({"sidecar-injector.io/log-shipper.image": "other:1"});
    let claims = [
        ("claims-missing", "payments-7f9", "8d5e2c43-5d5b-4a64-9b21-5f1f6b1f0a01".to_owned()),
        ("claims-wrong-uid", "events-ignored", format!("{}-not", rs["metadata"]["uid"].as_str().unwrap_or_default())),
    ];
    for (name, owner, uid) in &claims {
        let mut forged = pod(name, json!({}), ignored.clone());
        forged["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": uid, "controller": true}]);
        ctx.create_pod("e2e-shop", forged).await.with_context(|| format!("creating {name}"))?;
    }
    let verified = replica_set("events-verified", ignored, json!([{"name": "app", "image": "app:1"}]));
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(&verified.to_string()))?;
    let start = Instant::now();
    let all = loop {
        let all = events()?;
        if !about(&all, "events-verified", "OverridesIgnored").is_empty() {
            break all;
        }
        ensure!(start.elapsed() < Duration::from_secs(30), "no Event for events-verified within 30 s: {all:#?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let on_claims: Vec<&Value> = all
        .iter()
        .filter(|e| {
            e["regarding"]["name"] == "payments-7f9"
                || e["note"].as_str().is_some_and(|n| claims.iter().any(|(pod, _, _)| n.contains(pod)))
        })
        .collect();
    ensure!(on_claims.is_empty(), "Events on owners nobody verified: {on_claims:#?}");
    let metrics = ctx.injector.as_ref().context("no injector")?.metrics();
    ensure!(
        metrics.lines().any(|l| l.starts_with("sidecar_injector_events_total{result=\"owner_not_found\"}")),
        "owner_not_found is not counted"
    );

    for name in ["events-conflicts", "events-ignored", "events-refused", "events-verified"] {
        ctx.plane.kubectl(&["-n", "e2e-shop", "delete", "rs", name, "--wait=false"])?;
    }
    for (name, _, _) in &claims {
        ctx.plane.kubectl(&["-n", "e2e-shop", "delete", "pod", name, "--wait=false", "--ignore-not-found"])?;
    }
    Ok(())
}

/// Scenario 28: native sidecars by the nodes' kubelets. KWOK nodes report a 1.28 and a 1.37
/// kubelet beside a 1.37 API server: a pod that can run anywhere gets classic sidecars (the
/// oldest node decides), one whose nodeSelector or DaemonSet-style affinity keeps it on the 1.37
/// node gets native ones, the warning names the rule; without the old node, native again.
pub async fn s28_native_by_nodes(ctx: &mut Ctx) -> Result<()> {
    let node = |name: &str, pool: &str, version: &str| {
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/hostname": name, "type": "kwok", "pool": pool}},
            "spec": {"taints": [{"key": "e2e/mixed-pool", "effect": "NoSchedule"}]},
            "status": {"nodeInfo": {"kubeletVersion": version},
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}, "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"}}})
    };
    let manifest = format!("{}\n{}\n", node("mixed-old", "old", "v1.28.15"), node("mixed-new", "new", "v1.37.1"));
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["create", "-f", "-"], Some(&manifest))?;
    let native = |pod: &Pod| log_shipper(pod).is_some_and(|c| c.restart_policy.as_deref() == Some("Always"));
    let anywhere = pod("anywhere", json!({}), json!({}));
    let start = Instant::now();
    while ctx.dry_run_pod("e2e-shop", anywhere.clone()).await.is_ok_and(|p| native(&p)) {
        ensure!(start.elapsed() < Duration::from_secs(30), "the 1.28 node never made sidecars classic");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stored = ctx.dry_run_pod("e2e-shop", anywhere.clone()).await?;
    let classic = stored.spec.as_ref().is_some_and(|s| s.containers.iter().any(|c| c.name == "log-shipper"));
    ensure!(classic, "a pod that may land on the 1.28 node has no classic log-shipper");
    let mut on_new = pod("on-new", json!({}), json!({}));
    on_new["spec"]["nodeSelector"] = json!({"pool": "new"});
    ensure!(native(&ctx.dry_run_pod("e2e-shop", on_new).await?), "nodeSelector on the 1.37 node: not native");
    let mut daemon = pod("daemon", json!({}), json!({}));
    daemon["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["mixed-new"]}]}]}}});
    ensure!(native(&ctx.dry_run_pod("e2e-shop", daemon).await?), "a DaemonSet pod on the 1.37 node: not native");
    // A Job's pod that may land on the old node: classic sidecars, and the warning names the rule.
    let mut job_pod = pod("job-pod", json!({}), json!({}));
    job_pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "report", "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]);
    let said = admission_warnings(ctx, &job_pod)?;
    ensure!(
        said.contains("the Job does not complete while they run")
            && said.contains("decided by the oldest kubelet of the cluster's")
            && said.contains(": 1.28"),
        "no warning naming the rule: {said}"
    );

    ctx.plane.kubectl(&["delete", "node", "mixed-old", "mixed-new"])?;
    let start = Instant::now();
    while !ctx.dry_run_pod("e2e-shop", anywhere.clone()).await.is_ok_and(|p| native(&p)) {
        ensure!(start.elapsed() < Duration::from_secs(30), "native sidecars did not come back without the 1.28 node");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// What `kubectl create --dry-run=server` prints on stderr for a pod of e2e-shop: the admission
/// warnings, as its user sees them.
pub(crate) fn admission_warnings(ctx: &Ctx, pod: &Value) -> Result<String> {
    let out = std::process::Command::new(ctx.plane.bin.join("kubectl"))
        .arg("--kubeconfig")
        .arg(&ctx.plane.admin_kubeconfig)
        .args(["-n", "e2e-shop", "create", "--dry-run=server", "-o", "name", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().expect("stdin").write_all(pod.to_string().as_bytes())?;
            child.wait_with_output()
        })?;
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// An enforced sidecar with the resources it needs, for pods labelled `tier=floor`.
const ENFORCED_FLOOR: &str = r#"description: A metering agent every tier=floor pod must run with its resources
enforced: true
sidecarMode: container
podSelector:
  matchLabels: {tier: floor}
inject:
  sidecars:
    - name: meter
      image: registry.example/meter:1
      resources: {requests: {cpu: 50m, memory: 32Mi}, limits: {memory: 64Mi}}
"#;

/// Scenario 32: in-place resizes (`kubectl patch --subresource resize`) of an enforced sidecar on
/// the real API server: below what the template sets they are refused, by the validating webhook
/// while the injector is up and by the enforcement policy while it is down; above it, and the
/// app's own container, they pass and are stored.
///
/// The API server asks its admission policies before its webhooks, so once the injector has
/// written the template's enforcement binding the policy refuses first; the webhook's own check
/// is therefore seen with `cluster.enforcement_policy` off (a cluster that keeps no binding),
/// and the policy's with the injector stopped after it wrote the binding.
pub async fn s32_enforced_resize(ctx: &mut Ctx) -> Result<()> {
    ctx.stop_injector();
    ctx.injector =
        Some(Injector::start(&ctx.plane, &ctx.binary, &[("SIDECAR_INJECTOR__CLUSTER__ENFORCEMENT_POLICY", "false")])?);
    set_template(ctx, "floor.yaml", Some(ENFORCED_FLOOR)).await.context("adding the enforced template")?;
    let result = enforced_resize(ctx).await;
    ctx.stop_injector();
    ctx.start_injector()?;
    wait_for_injection(ctx, "e2e-shop").await?;
    set_template(ctx, "floor.yaml", None).await?;
    wait_for_binding(ctx, "floor", false).await?;
    let _ = ctx.pods("e2e-shop").delete("resized", &DeleteParams::default()).await;
    result
}

async fn enforced_resize(ctx: &mut Ctx) -> Result<()> {
    let mut pod = pod("resized", json!({"tier": "floor"}), json!({}));
    pod["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    // Unscheduled: the API server refuses any resize of a pod bound to a node that does not declare
    // in-place resize, as KWOK's nodes do not (the real-node suite resizes a running pod).
    pod["spec"]["nodeSelector"] = json!({"e2e.example/unschedulable": "true"});
    // The injector serves the new template within seconds.
    let has_meter = |pod: &Pod| all_containers(pod).iter().any(|c| c.name == "meter");
    dry_run_until(ctx, &pod, "the floor template", has_meter).await?;
    let created = ctx.create_pod("e2e-shop", pod).await.context("creating the tier=floor pod")?;
    ensure!(has_meter(&created), "meter not injected");

    fn resize_as(plane: &ControlPlane, container: &str, cpu: &str, dry_run: bool) -> Result<(), String> {
        let patch = json!({"spec": {"containers": [{"name": container, "resources": {"requests": {"cpu": cpu}}}]}});
        let mut args = vec!["-n", "e2e-shop", "patch", "pod", "resized", "--subresource", "resize"];
        if dry_run {
            args.push("--dry-run=server");
        }
        let patch = patch.to_string();
        args.extend(["-p", &patch]);
        plane.kubectl(&args).map(|_| ()).map_err(|e| e.to_string())
    }
    fn resize(plane: &ControlPlane, container: &str, cpu: &str) -> Result<(), String> {
        resize_as(plane, container, cpu, false)
    }
    fn stored_cpu(plane: &ControlPlane, container: &str) -> Result<String> {
        let path = format!("jsonpath={{.spec.containers[?(@.name==\"{container}\")].resources.requests.cpu}}");
        Ok(plane.kubectl(&["-n", "e2e-shop", "get", "pod", "resized", "-o", &path])?.trim().to_owned())
    }
    for phase in ["injector up", "injector down"] {
        if phase == "injector down" {
            // An injector with the enforcement policy on writes the binding; then it stops. The API
            // server enforces a new binding on its own cycle (a second or two after it was
            // written): wait for its first refusal, probing with dry runs.
            ctx.stop_injector();
            ctx.start_injector()?;
            wait_for_binding(ctx, "floor", true).await?;
            ctx.stop_injector();
            let start = Instant::now();
            while resize_as(&ctx.plane, "meter", "1m", true).is_ok() {
                ensure!(start.elapsed() < Duration::from_secs(20), "the enforcement binding never took effect");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } else {
            // The injector with the policy off wrote no binding, so only its webhook can refuse.
            wait_for_binding(ctx, "floor", false).await?;
        }
        let (below, above, app) = match phase {
            "injector up" => ("10m", "80m", "60m"),
            _ => ("20m", "90m", "70m"),
        };
        let refused =
            resize(&ctx.plane, "meter", below).err().with_context(|| format!("{phase}: meter resized to {below}"))?;
        let by = match phase {
            "injector up" => {
                "container \"meter\"'s resources.requests.cpu is 10m after the resize, below the 50m template floor sets"
            }
            _ => "ValidatingAdmissionPolicy 'sidecar-injector.io-enforced'",
        };
        ensure!(
            refused.contains(by) && refused.contains("template floor is enforced for this pod"),
            "{phase}: {refused}"
        );
        println!("      {phase}: meter to cpu {below} refused: {}", refused.lines().last().unwrap_or_default());
        for (container, cpu) in [("meter", above), ("app", app)] {
            resize(&ctx.plane, container, cpu)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("{phase}: {container} to {cpu}"))?;
            ensure!(stored_cpu(&ctx.plane, container)? == cpu, "{phase}: {container} not stored at {cpu}");
        }
        println!("      {phase}: meter to cpu {above} and the app to {app} stored");
    }
    Ok(())
}

const RESIZABLE: &str = r#"description: A native sidecar that vertical autoscalers resize in place
default: true
sidecarMode: native
podSelector:
  matchLabels: {tier: resizable}
inject:
  sidecars:
    - name: sizer
      image: registry.example/sizer:1
      resources: {requests: {cpu: 50m, memory: 32Mi}, limits: {memory: 64Mi}}
"#;

/// Scenario 33: an injected native sidecar carries `resizePolicy: NotRequired` for cpu and memory,
/// resizes in place (`kubectl patch --subresource resize`), and stays injected: a pod created from
/// the resized one's manifest (as `kubectl get -o yaml | kubectl create` does) is admitted as up
/// to date by the injector and the validating webhook, its resized sidecar kept as it is; after an
/// image edit of the template, a copy gets the new image with the resized resources carried over.
pub async fn s33_resized_sidecar_stays_injected(ctx: &mut Ctx) -> Result<()> {
    set_template(ctx, "resizable.yaml", Some(RESIZABLE)).await.context("adding the template")?;
    let result = resized_sidecar(ctx).await;
    set_template(ctx, "resizable.yaml", None).await?;
    for name in ["sized", "sized-copy"] {
        let _ = ctx.pods("e2e-shop").delete(name, &DeleteParams::default()).await;
    }
    result
}

async fn resized_sidecar(ctx: &mut Ctx) -> Result<()> {
    // Only this template (the shop's log-shipper renders the pod's name, which a copy changes).
    let mut pod = pod("sized", json!({"tier": "resizable"}), json!({"sidecar-injector.io/templates": "resizable"}));
    // Unscheduled: KWOK's nodes refuse resizes (see scenario 32).
    pod["spec"]["nodeSelector"] = json!({"e2e.example/unschedulable": "true"});
    let sizer = |pod: &Pod| -> Option<Value> {
        let init = pod.spec.as_ref()?.init_containers.as_ref()?;
        init.iter().find(|c| c.name == "sizer").map(|c| serde_json::to_value(c).unwrap_or_default())
    };
    // The injector serves the new template within seconds.
    dry_run_until(ctx, &pod, "the resizable template (a native sizer)", |p| sizer(p).is_some()).await?;
    let created = ctx.create_pod("e2e-shop", pod).await.context("creating the pod")?;
    let injected = sizer(&created).context("sizer not injected as a native sidecar")?;
    let in_place = json!([{"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "NotRequired"}]);
    ensure!(injected["restartPolicy"] == "Always" && injected["resizePolicy"] == in_place, "stored as {injected}");

    let patch = json!({"spec": {"initContainers": [{"name": "sizer", "resources": {"requests": {"cpu": "80m"}}}]}});
    let args = ["-n", "e2e-shop", "patch", "pod", "sized", "--subresource", "resize", "-p", &patch.to_string()];
    ctx.plane.kubectl(&args).context("resizing the sidecar in place")?;
    let resized = ctx.pods("e2e-shop").get("sized").await?;
    let cpu = |pod: &Pod| sizer(pod).map(|s| s["resources"]["requests"]["cpu"].clone());
    ensure!(cpu(&resized) == Some(json!("80m")), "not resized: {:?}", cpu(&resized));
    println!("      sizer resized in place to cpu 80m");

    let mut copy = serde_json::to_value(&resized)?;
    let metadata = &resized.metadata;
    copy["metadata"] = json!({"name": "sized-copy", "labels": metadata.labels, "annotations": metadata.annotations});
    copy.as_object_mut().context("a pod")?.remove("status");
    let copied = ctx.create_pod("e2e-shop", copy.clone()).await.map_err(|e| anyhow::anyhow!(api_message(&e)))?;
    ensure!(cpu(&copied) == Some(json!("80m")), "the copy's sidecar was rewritten: {:?}", cpu(&copied));
    ensure!(status(&copied) == status(&resized), "the copy was re-injected: {:?}", status(&copied));
    println!("      a copy of the resized pod admitted as up to date, its sidecar kept at cpu 80m");

    // A new image for the sidecar: a copy made now gets the new version, its resized cpu carried over.
    set_template(ctx, "resizable.yaml", Some(&RESIZABLE.replace("sizer:1", "sizer:2"))).await?;
    let image = |pod: &Pod| sizer(pod).map(|s| s["image"].clone());
    copy["metadata"]["name"] = json!("sized-copy-2");
    let upgraded =
        dry_run_until(ctx, &copy, "the new sizer image", |p| image(p) == Some(json!("registry.example/sizer:2")))
            .await?;
    ensure!(cpu(&upgraded) == Some(json!("80m")), "the resized cpu was not carried over: {:?}", cpu(&upgraded));
    println!("      after an image edit, a copy gets sizer:2 with the resized cpu 80m carried over");
    Ok(())
}

const POSITIONED: &str = r#"description: A secrets agent that starts before the app, and a setup step after the pod's own
default: true
sidecarMode: container
podSelector:
  matchLabels: {tier: positioned}
inject:
  initContainers:
    - {name: secrets-setup, image: registry.example/vault:1, position: last}
  sidecars:
    - {name: secrets-agent, image: registry.example/vault:1, position: first}
"#;

/// Scenario 34: `position:` on the real API server: the classic sidecar is stored before the
/// app's containers, the init container after the pod's own, and the pod names its app as
/// `kubectl logs`' default container (the author's own choice stands).
pub async fn s34_positions(ctx: &mut Ctx) -> Result<()> {
    set_template(ctx, "positioned.yaml", Some(POSITIONED)).await.context("adding the template")?;
    let result = positioned(ctx).await;
    set_template(ctx, "positioned.yaml", None).await?;
    for name in ["positioned", "positioned-chosen"] {
        let _ = ctx.pods("e2e-shop").delete(name, &DeleteParams::default()).await;
    }
    result
}

async fn positioned(ctx: &mut Ctx) -> Result<()> {
    let mut pod =
        pod("positioned", json!({"tier": "positioned"}), json!({"sidecar-injector.io/templates": "positioned"}));
    pod["spec"]["initContainers"] = json!([{"name": "migrate", "image": "registry.example/migrate:1"}]);
    pod["spec"]["containers"]
        .as_array_mut()
        .context("containers")?
        .push(json!({"name": "worker", "image": "registry.example/worker:1"}));
    pod["spec"]["nodeSelector"] = json!({"e2e.example/unschedulable": "true"});
    let names = |list: Option<&Vec<k8s_openapi::api::core::v1::Container>>| -> Vec<String> {
        list.into_iter().flatten().map(|c| c.name.clone()).collect()
    };
    dry_run_until(ctx, &pod, "the positioned template", |p| {
        all_containers(p).iter().any(|c| c.name == "secrets-agent")
    })
    .await?;
    let created = ctx.create_pod("e2e-shop", pod.clone()).await.map_err(|e| anyhow::anyhow!(api_message(&e)))?;
    let spec = created.spec.as_ref().context("no spec")?;
    let (containers, init) = (names(Some(&spec.containers)), names(spec.init_containers.as_ref()));
    ensure!(containers == ["secrets-agent", "app", "worker"], "containers stored as {containers:?}");
    ensure!(init == ["migrate", "secrets-setup"], "init containers stored as {init:?}");
    let default = |pod: &Pod| {
        pod.metadata.annotations.as_ref().and_then(|a| a.get("kubectl.kubernetes.io/default-container")).cloned()
    };
    ensure!(default(&created).as_deref() == Some("app"), "default container: {:?}", default(&created));
    println!("      stored: containers {containers:?}, init containers {init:?}, default container app");

    let mut chosen = pod;
    chosen["metadata"]["name"] = json!("positioned-chosen");
    chosen["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] = json!("worker");
    let created = ctx.create_pod("e2e-shop", chosen).await.map_err(|e| anyhow::anyhow!(api_message(&e)))?;
    ensure!(default(&created).as_deref() == Some("worker"), "the author's default container: {:?}", default(&created));
    println!("      the author's default container (worker) stands");
    Ok(())
}

/// The namespace of scenario 35's pods.
const UPGRADE_NS: &str = "e2e-upgrade";

/// A native agent whose image is a value, and an enforced classic shipper with a literal image,
/// for pods labelled `tier=upgradable`.
const UPGRADABLE_AGENT: &str = r#"description: An agent upgraded in place
default: true
sidecarMode: native
podSelector:
  matchLabels: {tier: upgradable}
values: {image: "registry.example/agent:1"}
inject:
  sidecars:
    - {name: agent, image: "{{ values.image }}", args: [--serve]}
"#;
const UPGRADABLE_SHIPPER: &str = r#"description: An enforced shipper upgraded in place
enforced: true
sidecarMode: container
podSelector:
  matchLabels: {tier: upgradable}
inject:
  sidecars:
    - {name: shipper, image: "registry.example/shipper:1", args: [--ship]}
"#;

/// Scenario 35: `drift --in-place` on the real API server. After an image edit of both templates,
/// the dry run names each pod's image changes and changes nothing; `/validate` refuses an update
/// that is not exactly the in-place one (saying what that is); the in-place run updates the pods
/// (same pods: the same UIDs), which are then current (drift lists none, their status names the
/// versions in service), and the enforcement policy, bound by the enforced shipper, accepts the
/// new image. With the injector down the policy still refuses another image for the enforced
/// shipper. An edit of more than images is left to `--restart`, and the run says why.
pub async fn s35_in_place_upgrade(ctx: &mut Ctx) -> Result<()> {
    // A namespace of its own: `drift --in-place` updates every stale pod of the namespace it is
    // given, and e2e-shop holds other scenarios' pods.
    ctx.namespace(UPGRADE_NS, &[("sidecar-injector.io/inject", "enabled")]).await?;
    set_template(ctx, "upgradable-agent.yaml", Some(UPGRADABLE_AGENT)).await.context("adding the templates")?;
    set_template(ctx, "upgradable-shipper.yaml", Some(UPGRADABLE_SHIPPER)).await?;
    let result = in_place_upgrade(ctx).await;
    if ctx.injector.is_none() {
        ctx.start_injector()?;
        wait_for_injection(ctx, "e2e-shop").await?;
    }
    set_template(ctx, "upgradable-agent.yaml", None).await?;
    set_template(ctx, "upgradable-shipper.yaml", None).await?;
    wait_for_binding(ctx, "upgradable-shipper", false).await?;
    for name in ["upgrade-a", "upgrade-b"] {
        let _ = ctx.pods(UPGRADE_NS).delete(name, &DeleteParams::default()).await;
    }
    result
}

async fn in_place_upgrade(ctx: &mut Ctx) -> Result<()> {
    let pods = ctx.pods(UPGRADE_NS);
    let template_pod = |name: &str| {
        let mut pod =
            pod(name, json!({"tier": "upgradable"}), json!({"sidecar-injector.io/templates": "upgradable-agent"}));
        pod["spec"]["nodeSelector"] = json!({"e2e.example/unschedulable": "true"});
        pod
    };
    let image = |pod: &Pod, name: &str| all_containers(pod).into_iter().find(|c| c.name == name).and_then(|c| c.image);
    dry_run_until(ctx, &template_pod("probe"), "the upgradable templates", |p| {
        image(p, "agent").is_some() && image(p, "shipper").is_some()
    })
    .await?;
    wait_for_binding(ctx, "upgradable-shipper", true).await?;
    let mut before = Vec::new();
    for name in ["upgrade-a", "upgrade-b"] {
        before
            .push(ctx.create_pod(UPGRADE_NS, template_pod(name)).await.map_err(|e| anyhow::anyhow!(api_message(&e)))?);
    }
    set_template(ctx, "upgradable-agent.yaml", Some(&UPGRADABLE_AGENT.replace("agent:1", "agent:2"))).await?;
    set_template(ctx, "upgradable-shipper.yaml", Some(&UPGRADABLE_SHIPPER.replace("shipper:1", "shipper:2"))).await?;
    dry_run_until(ctx, &template_pod("probe"), "the new images", |p| {
        image(p, "agent").as_deref() == Some("registry.example/agent:2")
            && image(p, "shipper").as_deref() == Some("registry.example/shipper:2")
    })
    .await?;

    let plan = cli(ctx, &["drift", "--namespace", UPGRADE_NS, "--in-place", "--dry-run"])?;
    for name in ["upgrade-a", "upgrade-b"] {
        let line = format!(
            "pod/{name}: would update in place: shipper: registry.example/shipper:1 → registry.example/shipper:2, agent: registry.example/agent:1 → registry.example/agent:2"
        );
        ensure!(plan.contains(&line), "no {line:?} in:\n{plan}");
    }
    ensure!(
        image(&pods.get("upgrade-a").await?, "agent").as_deref() == Some("registry.example/agent:1"),
        "a dry run changed a pod"
    );
    let explained = explain(ctx, &["--namespace", UPGRADE_NS, "pod/upgrade-a"])?;
    let said = explained["existingPod"]["inPlace"].as_str().unwrap_or_default();
    ensure!(said.contains("an update of the running pod brings it to the template versions in service"), "{explained}");
    println!("      drift --in-place --dry-run names both pods' image changes; explain --cluster says the same");

    // An update that is not exactly the in-place one: the new status with another agent image.
    // (Dry runs may be refused for a second or two, until the enforcement policy has the new
    // shipper image.)
    let new_images = |p: &Pod| image(p, "agent").as_deref() == Some("registry.example/agent:2");
    let current = status(&dry_run_until(ctx, &template_pod("probe"), "the new versions", new_images).await?)
        .context("no status")?;
    let mut forged = status(&before[1]).context("no status")?;
    forged.templates = current.templates.clone();
    let patch = json!({
        "metadata": {"annotations": {"sidecar-injector.io/status": forged.to_annotation()}},
        "spec": {"initContainers": [{"name": "agent", "image": "registry.example/evil:1"}]},
    });
    let refused =
        pods.patch("upgrade-b", &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(patch)).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(
        message.contains(
            "the one update to the versions in service is shipper: registry.example/shipper:1 → registry.example/shipper:2, agent: registry.example/agent:1 → registry.example/agent:2"
        ),
        "not refused as expected: {message:?}"
    );
    println!("      /validate refuses an update that is not the in-place one, naming it");

    // The enforcement policy's params follow the template edit within about a second: the run is
    // retried until the API server has them (the run reports a refusal and leaves the pod).
    // A run may update one pod and find the other refused; the next run takes what is left.
    let start = Instant::now();
    loop {
        let done = cli(ctx, &["drift", "--namespace", UPGRADE_NS, "--in-place", "--rollout-timeout", "0"])?;
        let mut current = 0;
        for name in ["upgrade-a", "upgrade-b"] {
            let pod = pods.get(name).await?;
            current += usize::from(image(&pod, "shipper").as_deref() == Some("registry.example/shipper:2"));
        }
        if current == 2 {
            break;
        }
        ensure!(start.elapsed() < Duration::from_secs(20), "drift --in-place did not update both pods:\n{done}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for old in &before {
        let name = old.metadata.name.as_deref().unwrap_or_default();
        let now = pods.get(name).await?;
        ensure!(now.metadata.uid == old.metadata.uid, "{name} was replaced, not updated");
        ensure!(
            image(&now, "agent").as_deref() == Some("registry.example/agent:2"),
            "{name}: agent {:?}",
            image(&now, "agent")
        );
        ensure!(
            image(&now, "shipper").as_deref() == Some("registry.example/shipper:2"),
            "{name}: shipper {:?}",
            image(&now, "shipper")
        );
        ensure!(
            status(&now).map(|s| s.templates) == Some(current.templates.clone()),
            "{name}: status {:?}",
            status(&now)
        );
    }
    let report: Value = serde_json::from_str(&cli(ctx, &["drift", "--namespace", UPGRADE_NS, "-o", "json"])?)?;
    let listed: Vec<&Value> = report
        .as_array()
        .context("a list")?
        .iter()
        .filter(|w| w["workload"]["name"].as_str().is_some_and(|n| n.starts_with("upgrade-")))
        .collect();
    ensure!(listed.is_empty(), "still drifted after the in-place update: {listed:?}");
    println!("      drift --in-place updated both pods (same UIDs); drift lists neither any more");

    // Injector down: the enforcement policy alone refuses another image for the enforced shipper.
    // Nothing before proves the API server enforces the binding yet (it picks one up on its own
    // cycle, and the in-place update above passes either way): a cold CI run once patched the
    // image before it did. Wait for the condition — a dry run of the same patch refused by the
    // policy (the webhook fails open while the injector is down) — not for time.
    ctx.stop_injector();
    let swap = json!({"spec": {"containers": [{"name": "shipper", "image": "registry.example/evil:1"}]}});
    let policy_refusal = "an update may change the image of its shipper only to the template's";
    let dry_run = kube::api::PatchParams { dry_run: true, ..Default::default() };
    let waited = Instant::now();
    loop {
        let tried = pods.patch("upgrade-a", &dry_run, &kube::api::Patch::Strategic(swap.clone())).await;
        if tried.as_ref().err().map(api_message).is_some_and(|m| m.contains(policy_refusal)) {
            break;
        }
        ensure!(waited.elapsed() < Duration::from_secs(20), "the enforcement binding never took effect: {tried:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("      the API server enforced the binding {:?} after the injector stopped", waited.elapsed());
    let refused = pods.patch("upgrade-a", &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(swap)).await;
    let message = refused.as_ref().err().map(api_message).unwrap_or_default();
    ensure!(message.contains(policy_refusal), "not refused by the policy: {message:?}");
    ctx.start_injector()?;
    wait_for_injection(ctx, "e2e-shop").await?;
    println!("      with the injector down, the enforcement policy refuses another shipper image");

    // More than an image: left to --restart, saying why.
    set_template(
        ctx,
        "upgradable-agent.yaml",
        Some(&UPGRADABLE_AGENT.replace("agent:1", "agent:3").replace("--serve", "--serve=all")),
    )
    .await?;
    dry_run_until(ctx, &template_pod("probe"), "the agent's new args", |p| {
        image(p, "agent").as_deref() == Some("registry.example/agent:3")
    })
    .await?;
    let plan = cli(ctx, &["drift", "--namespace", UPGRADE_NS, "--in-place", "--dry-run"])?;
    ensure!(
        plan.contains("pod/upgrade-a: left for --restart: template upgradable-agent changed more than images"),
        "{plan}"
    );
    println!(
        "      an args edit is left to --restart: {}",
        plan.lines().find(|l| l.contains("pod/upgrade-a: left")).unwrap_or_default().trim()
    );
    Ok(())
}

/// An agent as image volumes where the nodes mount them, as their declared fallback elsewhere;
/// the tools are mounted with subPath.
const AGENT_VOLUME: &str = r#"description: An agent delivered as an image volume, or copied where the nodes cannot mount one
inject:
  volumes:
    - name: agent
      image: {reference: "registry.example/agent:2", pullPolicy: IfNotPresent}
      fallback:
        initContainer:
          name: copy-agent
          image: registry.example/agent:2
          command: [cp, -a, /agent/., /copy/]
          volumeMounts: [{name: agent, mountPath: /copy}]
    - name: agent-tools
      image: {reference: "registry.example/agent-tools:2", pullPolicy: IfNotPresent}
      fallback:
        initContainer:
          name: copy-agent-tools
          image: registry.example/agent-tools:2
          command: [cp, -a, /tools/., /copy/]
          volumeMounts: [{name: agent-tools, mountPath: /copy}]
  appContainers:
    volumeMounts:
      - {name: agent, mountPath: /opt/agent, readOnly: true}
      - {name: agent-tools, mountPath: /opt/tools, subPath: bin, readOnly: true}
"#;

/// Scenario 36: image volumes decided by the nodes. KWOK nodes report kubelet 1.34 (no image
/// volumes), 1.36 with containerd 2.1 (image volumes, but a subPath into one is ignored) and 1.37
/// with containerd 2.2 beside the 1.37 API server: a pod that may run anywhere gets both fallbacks
/// (emptyDirs filled by the copy init containers) and a warning naming the kubelet; one kept on
/// the 1.36 node gets the agent as an image volume and the tools (mounted with subPath) as their
/// fallback; one on the 1.37 node gets both image volumes, which the real API server stores.
/// Without the old and middle nodes, the pod that may run anywhere gets image volumes too.
pub async fn s36_image_volumes_by_nodes(ctx: &mut Ctx) -> Result<()> {
    set_template(ctx, "agent-volume.yaml", Some(AGENT_VOLUME)).await.context("adding the template")?;
    let result = image_volumes_by_nodes(ctx).await;
    set_template(ctx, "agent-volume.yaml", None).await?;
    for name in ["iv-on-old", "iv-on-mid", "iv-on-new"] {
        let _ = ctx.pods("e2e-shop").delete(name, &DeleteParams::default()).await;
    }
    let _ = ctx.plane.kubectl(&["delete", "node", "iv-old", "iv-mid", "iv-new", "--ignore-not-found"]);
    result
}

async fn image_volumes_by_nodes(ctx: &mut Ctx) -> Result<()> {
    let node = |name: &str, version: &str, runtime: &str| {
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/hostname": name, "type": "kwok", "pool": name}},
            "spec": {"taints": [{"key": "e2e/image-volumes", "effect": "NoSchedule"}]},
            "status": {"nodeInfo": {"kubeletVersion": version, "containerRuntimeVersion": runtime},
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}, "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"}}})
    };
    let manifest = [
        node("iv-old", "v1.34.2", "containerd://2.2.1"),
        node("iv-mid", "v1.36.3", "containerd://2.1.5"),
        node("iv-new", "v1.37.1", "containerd://2.2.9"),
    ]
    .map(|n| n.to_string())
    .join("\n");
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["create", "-f", "-"], Some(&manifest))?;
    let agent_pod = |name: &str, pool: Option<&str>| {
        let mut pod = pod(name, json!({}), json!({"sidecar-injector.io/templates": "agent-volume"}));
        if let Some(pool) = pool {
            pod["spec"]["nodeSelector"] = json!({"pool": pool});
        }
        pod
    };
    // (name, volume) -> whether an image volume (else the fallback's emptyDir).
    let forms = |pod: &Pod| -> Vec<(String, bool)> {
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
        volumes.into_iter().filter(|v| v.name.starts_with("agent")).map(|v| (v.name, v.image.is_some())).collect()
    };
    let expect = |agent: bool, tools: bool| vec![("agent".to_owned(), agent), ("agent-tools".to_owned(), tools)];
    let anywhere = agent_pod("iv-anywhere", None);
    dry_run_until(ctx, &anywhere, "both fallbacks while the 1.34 node is there", |p| forms(p) == expect(false, false))
        .await?;
    let said = admission_warnings(ctx, &anywhere)?;
    ensure!(
        said.contains("volume agent is an emptyDir filled by init container copy-agent")
            && said.contains("a kubelet 1.34 (image volumes need 1.35+)"),
        "no warning naming the kubelet: {said}"
    );
    // (pod, its pool, agent as an image volume, tools as one, init containers)
    let cases = [
        ("iv-on-old", "iv-old", false, false, vec!["copy-agent", "copy-agent-tools"]),
        ("iv-on-mid", "iv-mid", true, false, vec!["copy-agent-tools"]),
        ("iv-on-new", "iv-new", true, true, vec![]),
    ];
    for (name, pool, agent, tools, init) in cases {
        let created = ctx
            .create_pod("e2e-shop", agent_pod(name, Some(pool)))
            .await
            .map_err(|e| anyhow::anyhow!("{name}: {}", api_message(&e)))?;
        ensure!(forms(&created) == expect(agent, tools), "{name} stored with volumes {:?}", forms(&created));
        let stored_init: Vec<String> = created
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.name)
            .collect();
        ensure!(stored_init == init, "{name} stored with init containers {stored_init:?}");
        let recorded = status(&created).context("no status")?.image_volumes;
        let image: Vec<&str> =
            [("agent", agent), ("agent-tools", tools)].iter().filter(|(_, i)| *i).map(|(n, _)| *n).collect();
        ensure!(recorded == image, "{name}: the status records image volumes {recorded:?}");
        println!(
            "      {name} (pool {pool}): agent {}, tools {}",
            if agent { "image volume" } else { "fallback" },
            if tools { "image volume" } else { "fallback" }
        );
    }
    ctx.plane.kubectl(&["delete", "node", "iv-old", "iv-mid"])?;
    dry_run_until(ctx, &anywhere, "image volumes once only the 1.37 node is left", |p| forms(p) == expect(true, true))
        .await?;
    Ok(())
}
