//! Scenarios of the flows users live in, on the whole cluster: controllers create the pods (with
//! `generateName` and no name at admission), the scheduler places them on KWOK's simulated nodes,
//! Jobs complete, namespaces really delete, and rollouts really roll. Every assertion is on what
//! the cluster stored or reports, never on the objects the test itself wrote.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

use crate::controlplane::{INJECTOR_HTTPS_PORT, Injector, NODES};
use crate::scenarios::{Ctx, cli, edit_tag_and_wait, log_shipper, status};

/// `kubectl apply -f -` of YAML text, as a user applies manifests.
fn kubectl_apply(ctx: &Ctx, namespace: &str, yaml: &str) -> Result<()> {
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-n", namespace, "-f", "-"], Some(yaml))?;
    Ok(())
}

/// Polls `check` every 200 ms until it yields a value, for at most `limit`.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<(T, Duration)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok((value, start.elapsed())),
            Ok(None) => {}
            Err(error) => last_error = Some(error),
        }
        if start.elapsed() > limit {
            bail!(
                "{what}: not within {limit:?}{}",
                last_error.map(|e| format!(" (last error: {e:#})")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The pods of a namespace that are not being deleted.
async fn live_pods(ctx: &Ctx, namespace: &str, selector: &str) -> Result<Vec<Pod>> {
    let pods = ctx.pods(namespace).list(&ListParams::default().labels(selector)).await?;
    Ok(pods.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect())
}

fn injected_label(pod: &Pod) -> Option<String> {
    pod.metadata.labels.as_ref()?.get("sidecar-injector.io/injected").cloned()
}

/// The log shipper's hash recorded in a pod's status, when it was injected cleanly as a native
/// sidecar (what every pod in an opted-in namespace gets from the default templates).
fn shipper_hash(pod: &Pod) -> Option<String> {
    let status = status(pod)?;
    let sidecar = log_shipper(pod)?;
    (injected_label(pod).as_deref() == Some("true") && sidecar.restart_policy.as_deref() == Some("Always"))
        .then(|| status.templates.iter().find(|t| t.name == "log-shipper").map(|t| t.hash.clone()))
        .flatten()
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

const WORKLOADS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: app, image: registry.example/web:1}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  replicas: 2
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: app, image: registry.example/db:1}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: node-agent}
spec:
  selector: {matchLabels: {app: node-agent}}
  template:
    metadata: {labels: {app: node-agent}}
    spec:
      containers: [{name: app, image: registry.example/agent:1}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: report}
spec:
  template:
    metadata: {labels: {app: report}}
    spec:
      restartPolicy: Never
      containers: [{name: app, image: registry.example/report:1}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        metadata: {labels: {app: nightly}}
        spec:
          restartPolicy: Never
          containers: [{name: app, image: registry.example/nightly:1}]
"#;

/// Scenario 17: `kubectl apply` of a Deployment, StatefulSet, DaemonSet, Job and CronJob (run once
/// by hand, `kubectl create job --from=cronjob/...`) in an opted-in namespace: every pod the
/// controllers create is injected, and the Jobs, whose pods have a native sidecar, complete.
pub async fn s17_workloads(ctx: &mut Ctx) -> Result<()> {
    let namespace = "e2e-workloads";
    ctx.namespace(namespace, &[("sidecar-injector.io/inject", "enabled")]).await?;
    kubectl_apply(ctx, namespace, WORKLOADS)?;
    ctx.plane.kubectl(&["-n", namespace, "create", "job", "nightly-manual", "--from=cronjob/nightly"])?;
    let expected = [("web", 2), ("db", 2), ("node-agent", NODES), ("report", 1), ("nightly", 1)];
    let (pods, took) = eventually("every workload's pods", Duration::from_secs(90), || async {
        let pods = live_pods(ctx, namespace, "app").await?;
        let count = |app: &str| {
            pods.iter()
                .filter(|p| p.metadata.labels.as_ref().and_then(|l| l.get("app")).map(String::as_str) == Some(app))
                .count()
        };
        Ok(expected.iter().all(|(app, n)| count(app) == *n).then_some(pods))
    })
    .await?;
    println!("      {} pods created by 5 controllers within {took:?}", pods.len());
    for pod in &pods {
        ensure!(shipper_hash(pod).is_some(), "pod {} escaped injection: {:?}", name(pod), pod.metadata.annotations);
    }
    let controller_made = pods.iter().filter(|p| p.metadata.generate_name.is_some()).count();
    ensure!(controller_made >= pods.len() - 2, "only the StatefulSet's pods are named: {controller_made}");
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), namespace);
    let (_, took) = eventually("the Jobs to complete", Duration::from_secs(60), || async {
        let mut done = true;
        for job in ["report", "nightly-manual"] {
            let job = jobs.get(job).await?;
            done &= job.status.and_then(|s| s.succeeded).unwrap_or(0) == 1;
        }
        Ok(done.then_some(()))
    })
    .await?;
    println!("      both Jobs (native log-shipper sidecar) completed within {took:?}");
    let scheduled = |pods: &[Pod]| pods.iter().all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
    eventually("every pod scheduled onto a simulated node", Duration::from_secs(30), || async {
        Ok(scheduled(&live_pods(ctx, namespace, "app").await?).then_some(()))
    })
    .await?;
    Ok(())
}

/// Scenario 14: a template edit → `drift` lists exactly the pods created before it →
/// `drift --restart` rolls the Deployment: the new pods carry the new template hash, the old
/// ReplicaSet is scaled to zero (one rollout), and the server's drift metric agrees throughout.
pub async fn s14_drift(ctx: &mut Ctx) -> Result<()> {
    let namespace = "e2e-drift";
    ctx.namespace(namespace, &[("sidecar-injector.io/inject", "enabled")]).await?;
    kubectl_apply(ctx, namespace, WORKLOADS.split("---").next().unwrap_or_default())?;
    let (old, _) = eventually("the Deployment's 2 pods", Duration::from_secs(60), || async {
        let pods = live_pods(ctx, namespace, "app=web").await?;
        Ok((pods.len() == 2 && pods.iter().all(|p| shipper_hash(p).is_some())).then_some(pods))
    })
    .await?;
    let old_hash = shipper_hash(&old[0]).context("injected")?;
    ctx.create_pod(namespace, crate::scenarios::pod("debug", json!({"run": "debug"}), json!({}))).await?;

    edit_tag_and_wait(ctx, namespace, "3.2.13", Duration::from_secs(10)).await?;
    let report: Value = serde_json::from_str(&cli(ctx, &["drift", "--namespace", namespace, "-o", "json"])?)?;
    let workloads = report.as_array().context("a list")?;
    let web = workloads.iter().find(|w| w["workload"]["kind"] == "Deployment").context("deployment/web not listed")?;
    let mut old_names: Vec<String> = old.iter().map(name).collect();
    old_names.sort();
    let mut listed: Vec<String> = serde_json::from_value(web["stalePods"].clone())?;
    listed.sort();
    ensure!(web["workload"]["name"] == "web" && listed == old_names, "exactly the pods from before the edit: {web}");
    ensure!(web["templates"] == json!(["log-shipper"]) && web["action"]["action"] == "restart", "{web}");
    let debug = workloads.iter().find(|w| w["workload"]["kind"] == "Pod").context("the bare pod is not listed")?;
    ensure!(debug["action"]["advice"].as_str().unwrap_or_default().contains("never deleted"), "{debug}");

    // The server exports the same count from its pod metadata watch.
    let line = format!(
        "sidecar_injector_drifted_pods{{namespace=\"{namespace}\",template=\"log-shipper\",state=\"stale\"}} 3"
    );
    eventually("the drift metric", Duration::from_secs(15), || async {
        Ok(ctx.injector.as_ref().context("no injector")?.metrics().contains(&line).then_some(()))
    })
    .await?;

    let plan = cli(ctx, &["drift", "--namespace", namespace, "--restart", "--dry-run"])?;
    ensure!(plan.contains(&format!("would restart deployment/web in {namespace} (2 pod(s) drifted)")), "{plan}");
    let started = Instant::now();
    let done = cli(ctx, &["drift", "--namespace", namespace, "--restart", "--rollout-timeout", "120"])?;
    ensure!(done.contains(&format!("restarted deployment/web in {namespace}")), "{done}");
    println!("      drift --restart rolled deployment/web in {:?}", started.elapsed());
    let (new, _) = eventually("the rolled pods", Duration::from_secs(60), || async {
        let pods = live_pods(ctx, namespace, "app=web").await?;
        Ok((pods.len() == 2 && pods.iter().all(|p| !old_names.contains(&name(p)))).then_some(pods))
    })
    .await?;
    for pod in &new {
        let hash = shipper_hash(pod).context("a rolled pod was not injected")?;
        ensure!(hash != old_hash, "pod {} still has the old template {hash}", name(pod));
    }
    let replica_sets: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), namespace);
    let sets = replica_sets.list(&ListParams::default().labels("app=web")).await?.items;
    let sizes: Vec<i32> = sets.iter().map(|rs| rs.spec.replicas.unwrap_or(0)).collect();
    ensure!(sets.len() == 2 && sizes.contains(&0) && sizes.contains(&2), "one rollout: ReplicaSet sizes {sizes:?}");
    ensure!(ctx.pods(namespace).get_opt("debug").await?.is_some(), "a bare pod was deleted");
    let line = format!(
        "sidecar_injector_drifted_pods{{namespace=\"{namespace}\",template=\"log-shipper\",state=\"stale\"}} 1"
    );
    eventually("the drift metric after the rollout (the bare pod only)", Duration::from_secs(15), || async {
        Ok(ctx.injector.as_ref().context("no injector")?.metrics().contains(&line).then_some(()))
    })
    .await?;
    Ok(())
}

/// Scenario 18: a namespace opts in after its pods exist: `drift` reports them as not injected,
/// and `drift --restart` replaces them with injected ones.
pub async fn s18_opt_in_later(ctx: &mut Ctx) -> Result<()> {
    let namespace = "e2e-late";
    ctx.namespace(namespace, &[]).await?;
    kubectl_apply(ctx, namespace, WORKLOADS.split("---").next().unwrap_or_default())?;
    let (before, _) = eventually("the Deployment's 2 pods", Duration::from_secs(60), || async {
        let pods = live_pods(ctx, namespace, "app=web").await?;
        Ok((pods.len() == 2).then_some(pods))
    })
    .await?;
    ensure!(before.iter().all(|p| status(p).is_none()), "injected before the namespace opted in");
    ctx.plane.kubectl(&["label", "namespace", namespace, "sidecar-injector.io/inject=enabled"])?;
    let report: Value = serde_json::from_str(&cli(ctx, &["drift", "--namespace", namespace, "-o", "json"])?)?;
    let web = report.as_array().and_then(|w| w.first()).context("nothing listed")?;
    ensure!(web["notInjectedPods"].as_array().map(Vec::len) == Some(2), "{web}");
    cli(ctx, &["drift", "--namespace", namespace, "--restart", "--rollout-timeout", "120"])?;
    let before: Vec<String> = before.iter().map(name).collect();
    eventually("injected replacements", Duration::from_secs(60), || async {
        let pods = live_pods(ctx, namespace, "app=web").await?;
        Ok((pods.len() == 2 && pods.iter().all(|p| !before.contains(&name(p)) && shipper_hash(p).is_some()))
            .then_some(()))
    })
    .await?;
    Ok(())
}

/// Scenario 19: a namespace deleted (the namespace controller really removes it) and created again
/// with the same name and other annotations: the injector decides from the new namespace, not a
/// cached copy of the old one.
pub async fn s19_namespace_reborn(ctx: &mut Ctx) -> Result<()> {
    let namespace = "e2e-reborn";
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    ctx.namespace(namespace, &[("sidecar-injector.io/inject", "enabled")]).await?;
    ctx.plane.kubectl(&["annotate", "namespace", namespace, "sidecar-injector.io/templates=proxy"])?;
    let templates = |pod: &Pod| status(pod).map(|s| s.templates.into_iter().map(|t| t.name).collect::<Vec<_>>());
    let (first, _) =
        eventually("the namespace annotation in the injector's cache", Duration::from_secs(10), || async {
            let pod = ctx.dry_run_pod(namespace, crate::scenarios::pod("probe", json!({}), json!({}))).await?;
            Ok((templates(&pod) == Some(vec!["proxy".to_owned()])).then_some(pod))
        })
        .await?;
    ensure!(templates(&first) == Some(vec!["proxy".to_owned()]));
    ctx.create_pod(namespace, crate::scenarios::pod("first-life", json!({}), json!({}))).await?;
    namespaces.delete(namespace, &DeleteParams::default()).await?;
    let (_, took) = eventually("the namespace to be deleted", Duration::from_secs(90), || async {
        Ok(namespaces.get_opt(namespace).await?.is_none().then_some(()))
    })
    .await?;
    println!("      namespace {namespace} deleted by the namespace controller in {took:?}");
    ctx.namespace(namespace, &[("sidecar-injector.io/inject", "enabled")]).await?;
    let stored = ctx.create_pod(namespace, crate::scenarios::pod("second-life", json!({}), json!({}))).await?;
    ensure!(
        templates(&stored) == Some(vec!["log-shipper".to_owned()]),
        "the re-created namespace was decided from the old one's annotation: {:?}",
        templates(&stored)
    );
    Ok(())
}

/// Scenario 20: two injector processes start at the same moment against an API server with no
/// certificate Secret: exactly one CA Secret results, and both serve certificates of that CA.
pub async fn s20_two_injectors_race(ctx: &mut Ctx) -> Result<()> {
    ctx.stop_injector();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), "sidecar-injector");
    secrets.delete("sidecar-injector-tls", &DeleteParams::default()).await?;
    let second_port = INJECTOR_HTTPS_PORT + 1;
    let port = second_port.to_string();
    let mut first = Injector::spawn(&ctx.plane, &ctx.binary, &[])?;
    let mut second =
        Injector::spawn(&ctx.plane, &ctx.binary, &[("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", port.as_str())])?;
    first.wait_ready()?;
    second.wait_ready()?;
    let names: Vec<String> = secrets
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .filter(|n| n.starts_with("sidecar-injector-tls"))
        .collect();
    ensure!(names == ["sidecar-injector-tls"], "CA Secrets: {names:?}");
    ctx.first_ca_bundle = crate::scenarios::ca_bundle(&ctx.client).await?;
    // Each serves a certificate the Secret's CA verifies (the client trusts nothing else).
    let client = crate::scenarios::webhook_client(ctx, Some(&ctx.plane.webhook_client))?;
    for port in [INJECTOR_HTTPS_PORT, second_port] {
        let response = client.post(format!("https://127.0.0.1:{port}/mutate")).body("{}").send().await;
        let status =
            response.with_context(|| format!("the injector on :{port} does not serve the Secret's CA"))?.status();
        ensure!(status == 400, "an empty review on :{port} answered {status}");
    }
    drop(second);
    ctx.injector = Some(first);
    crate::scenarios::wait_for_injection(ctx, "e2e-shop").await?;
    Ok(())
}

/// Scenario 21: the API server restarts in the middle of a rollout: no pod of the rollout escapes
/// injection. The rollout surges all 12 new pods at once (`maxSurge: 100%`), so the pods are created
/// around the restart whatever the simulated nodes do; the controllers retry while the API server is
/// away, and the webhook, failing open, is unreachable only while the API server itself is down.
pub async fn s21_restart_during_rollout(ctx: &mut Ctx) -> Result<()> {
    let namespace = "e2e-restart";
    ctx.namespace(namespace, &[("sidecar-injector.io/inject", "enabled")]).await?;
    let deployment = WORKLOADS.split("---").next().unwrap_or_default().replace(
        "  replicas: 2\n",
        "  replicas: 12\n  strategy: {rollingUpdate: {maxSurge: 100%, maxUnavailable: 0}}\n",
    );
    kubectl_apply(ctx, namespace, &deployment)?;
    let before: Vec<String> = eventually("12 pods", Duration::from_secs(60), || async {
        let pods = live_pods(ctx, namespace, "app=web").await?;
        Ok((pods.len() == 12).then(|| pods.iter().map(name).collect()))
    })
    .await?
    .0;
    ctx.plane.kubectl(&["-n", namespace, "rollout", "restart", "deployment/web"])?;
    ctx.plane.stop_apiserver();
    tokio::time::sleep(Duration::from_secs(3)).await;
    ctx.plane.start_apiserver()?;
    let (rolled, took) = eventually("the rollout's 12 new pods", Duration::from_secs(120), || async {
        let pods = live_pods(ctx, namespace, "app=web").await?;
        let new: Vec<Pod> = pods.into_iter().filter(|p| !before.contains(&name(p))).collect();
        Ok((new.len() == 12).then_some(new))
    })
    .await?;
    println!("      the rollout created its 12 pods {took:?} after the API server came back");
    for pod in &rolled {
        ensure!(shipper_hash(pod).is_some(), "pod {} of the rollout escaped injection", name(pod));
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
    let generation = deployments.get("web").await?.metadata.generation;
    ensure!(generation == Some(2), "one rollout: generation {generation:?}");
    Ok(())
}

/// Scenario 22: a namespace whose LimitRange sets default requests and limits and whose
/// ResourceQuota counts cpu and memory: the pods are admitted with the injected sidecar, and the
/// injected containers carry requests and limits for everything the quota counts (Kubernetes
/// applies the LimitRange's defaults to injected containers too). Then a namespace with the quota
/// and no LimitRange: a pod whose own container sets its resources is admitted, because the
/// shipped templates set all four on every injected container.
pub async fn s22_limit_range_and_quota(ctx: &mut Ctx) -> Result<()> {
    let namespace = "e2e-quota";
    ctx.namespace(namespace, &[("sidecar-injector.io/inject", "enabled")]).await?;
    kubectl_apply(
        ctx,
        namespace,
        r#"
apiVersion: v1
kind: LimitRange
metadata: {name: defaults}
spec:
  limits:
    - type: Container
      default: {cpu: 500m, memory: 256Mi}
      defaultRequest: {cpu: 50m, memory: 64Mi}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: quota}
spec:
  hard: {requests.cpu: "8", requests.memory: 8Gi, limits.cpu: "16", limits.memory: 16Gi}
"#,
    )?;
    // The quota admission plugin needs its informer to have seen the quota.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stored = ctx.create_pod(namespace, crate::scenarios::pod("app", json!({"app": "web"}), json!({}))).await;
    let stored = stored.map_err(|e| anyhow::anyhow!("refused: {}", crate::scenarios::api_message(&e)))?;
    every_container_has_requests_and_limits(&stored)?;

    let namespace = "e2e-quota-only";
    opted_in_with_quota(ctx, namespace).await?;
    let mut app = crate::scenarios::pod("app", json!({"app": "web"}), json!({}));
    app["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}});
    let stored = ctx.create_pod(namespace, app).await;
    let stored = stored.map_err(|e| anyhow::anyhow!("refused: {}", crate::scenarios::api_message(&e)))?;
    every_container_has_requests_and_limits(&stored)
}

fn every_container_has_requests_and_limits(pod: &Pod) -> Result<()> {
    ensure!(shipper_hash(pod).is_some(), "not injected");
    let spec = pod.spec.clone().context("no spec")?;
    for container in spec.init_containers.iter().flatten().chain(&spec.containers) {
        let resources = container.resources.clone().unwrap_or_default();
        let (requests, limits) = (resources.requests.unwrap_or_default(), resources.limits.unwrap_or_default());
        for resource in ["cpu", "memory"] {
            ensure!(
                requests.contains_key(resource) && limits.contains_key(resource),
                "container {} lacks {resource} requests or limits: {requests:?} {limits:?}",
                container.name
            );
        }
    }
    Ok(())
}

/// Scenario 24: every API server metric the alerts and the dashboard of
/// `deploy/components/monitoring` use is one this API server exports once it has called, been
/// refused by and failed open on the webhooks, which this scenario makes it do (an earlier API
/// server restart sets its counters back to zero). The injector's own metrics are checked by
/// `tests/monitoring.rs`.
pub async fn s24_monitoring_uses_real_api_server_metrics(ctx: &mut Ctx) -> Result<()> {
    // A refusal: a broken template, in a server-side dry run.
    let broken: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "broken-templates", "labels": {"sidecar-injector.io/templates": "true"}},
        "data": {"broken.yaml": "inject:\n  labels: {a: \"{{ oops }}\"}\n"}}))?;
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(ctx.client.clone(), "sidecar-injector");
    let dry_run = kube::api::PostParams { dry_run: true, ..Default::default() };
    ensure!(configmaps.create(&dry_run, &broken).await.is_err(), "the broken template was accepted");
    // A fail-open: a pod while the injector is away (the policy refuses it).
    // The policy takes a moment to be in effect after the install (this may be the first scenario).
    ctx.stop_injector();
    let start = std::time::Instant::now();
    let refused = loop {
        let attempt =
            ctx.dry_run_pod("e2e-shop", crate::scenarios::pod("fail-open", json!({"app": "web"}), json!({}))).await;
        if attempt.is_err() || start.elapsed() > Duration::from_secs(15) {
            break attempt;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    ctx.start_injector()?;
    ensure!(refused.is_err(), "a pod was admitted without the injector");

    let used: std::collections::BTreeSet<String> = crate::metrics::monitoring_expressions()
        .iter()
        .flat_map(|(_, expression)| crate::metrics::used_in(expression, "apiserver_"))
        .collect();
    ensure!(used.len() >= 3, "the monitoring uses only {used:?} of the API server's metrics");
    let text = crate::controlplane::curl(
        &format!("{}/metrics", ctx.plane.url),
        Some(&ctx.plane.dir.join("ca.crt")),
        Some("e2e-admin-token"),
    )
    .context("scraping the API server")?;
    let exported: std::collections::BTreeSet<&str> =
        text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
    let missing: Vec<&String> = used.iter().filter(|name| !exported.contains(name.as_str())).collect();
    println!("      API server metrics the monitoring uses, all exported: {used:?}");
    ensure!(missing.is_empty(), "the API server exports no {missing:?}");
    Ok(())
}

/// An opted-in namespace with a ResourceQuota on cpu and memory, once the quota plugin has seen it.
async fn opted_in_with_quota(ctx: &Ctx, namespace: &str) -> Result<()> {
    ctx.namespace(namespace, &[("sidecar-injector.io/inject", "enabled")]).await?;
    kubectl_apply(
        ctx,
        namespace,
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: quota}\nspec:\n  hard: {requests.cpu: \"8\", requests.memory: 8Gi, limits.cpu: \"16\", limits.memory: 16Gi}\n",
    )?;
    // The quota admission plugin needs its informer to have seen the quota.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

/// Scenario 29: pod-level resources (KEP-2837). A Deployment whose pods set `spec.resources` equal
/// to what its app requests (Guaranteed) gets its pods, in a namespace with a ResourceQuota: the
/// log-shipper's requests and limits are added to the pod-level values (the API server refused
/// every pod before), the pod stays Guaranteed, and the status records the padding.
pub async fn s29_pod_level_resources(ctx: &mut Ctx) -> Result<()> {
    let namespace = "e2e-pod-resources";
    opted_in_with_quota(ctx, namespace).await?;
    kubectl_apply(
        ctx,
        namespace,
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: payments}
spec:
  replicas: 1
  selector: {matchLabels: {app: payments}}
  template:
    metadata: {labels: {app: payments}}
    spec:
      resources:
        requests: {cpu: 200m, memory: 128Mi}
        limits: {cpu: 200m, memory: 128Mi}
      containers:
        - name: app
          image: registry.example/payments:1
          resources: {requests: {cpu: 200m, memory: 128Mi}}
"#,
    )?;
    let start = Instant::now();
    let pod = loop {
        let pods = ctx.pods(namespace).list(&ListParams::default().labels("app=payments")).await?;
        if let Some(pod) = pods.items.into_iter().next() {
            break pod;
        }
        let events =
            ctx.plane.kubectl(&["-n", namespace, "get", "events", "--field-selector", "reason=FailedCreate"])?;
        ensure!(start.elapsed() < Duration::from_secs(30), "the ReplicaSet made no pod within 30 s: {events}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let status = crate::scenarios::status(&pod).context("not injected")?;
    let padding = status.pod_resources.clone().context("no padding recorded")?;
    let resources = serde_json::to_value(pod.spec.as_ref().and_then(|s| s.resources.clone()))?;
    // The shipped log-shipper: requests cpu 10m, memory 32Mi; limits cpu 200m, memory 64Mi.
    // Guaranteed pads requests as limits.
    ensure!(
        resources
            == json!({"requests": {"cpu": "400m", "memory": "192Mi"}, "limits": {"cpu": "400m", "memory": "192Mi"}}),
        "pod-level resources {resources}, padding {padding:?}"
    );
    ensure!(
        pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) == Some("Guaranteed"),
        "QoS class {:?}",
        pod.status.as_ref().and_then(|s| s.qos_class.clone())
    );
    ctx.plane.kubectl(&["-n", namespace, "delete", "deployment", "payments", "--wait=false"])?;
    Ok(())
}

/// A template that adds `hostAliases` (selected by annotation, so other scenarios never get it).
const HOST_ALIASES_TEMPLATE: &str = r#"
description: Fixed addresses for pods that cannot use cluster DNS
inject:
  hostAliases:
    - ip: 10.96.40.10
      hostnames: ["otel-collector.{{ namespace.name }}.internal"]
    - ip: 10.96.40.20
      hostnames: [vault.internal]
"#;

/// 30. `hostAliases` on the real API server: a template's entries are added by IP, the pod's own
///     entry for an IP stands (recorded as skipped), the API server stores the pod as patched, and
///     the policy mode leaves the template to the webhook.
pub async fn s30_host_aliases(ctx: &mut Ctx) -> Result<()> {
    crate::scenarios::set_template(ctx, "hosts.yaml", Some(HOST_ALIASES_TEMPLATE)).await?;
    let result = host_aliases(ctx).await;
    crate::scenarios::set_template(ctx, "hosts.yaml", None).await?;
    result
}

async fn host_aliases(ctx: &mut Ctx) -> Result<()> {
    let namespace = "e2e-shop";
    let annotations = json!({"sidecar-injector.io/templates": "hosts"});
    let mut authored = crate::scenarios::pod("legacy", json!({}), annotations.clone());
    authored["spec"]["hostAliases"] = json!([{"ip": "10.96.40.20", "hostnames": ["vault.corp.example"]}]);
    // The injector serves the new template within seconds; until then it refuses the pod that names it.
    let start = Instant::now();
    let pod = loop {
        match ctx.create_pod(namespace, authored.clone()).await {
            Ok(pod) => break pod,
            Err(e) if start.elapsed() < Duration::from_secs(15) => {
                ensure!(e.to_string().contains("hosts"), "refused for another reason: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => bail!("the template was not served within 15 s: {e}"),
        }
    };
    let aliases = serde_json::to_value(pod.spec.as_ref().and_then(|s| s.host_aliases.clone()))?;
    ensure!(
        aliases
            == json!([
                {"ip": "10.96.40.20", "hostnames": ["vault.corp.example"]},
                {"ip": "10.96.40.10", "hostnames": ["otel-collector.e2e-shop.internal"]}
            ]),
        "stored hostAliases {aliases}"
    );
    let status = status(&pod).context("not injected")?;
    ensure!(status.host_aliases == ["10.96.40.10"], "status {status:?}");
    ensure!(
        status.skipped.iter().any(|s| s.name == "10.96.40.20" && s.owner == "pod"),
        "the pod's own entry is not recorded as skipped: {status:?}"
    );
    // `explain --cluster` reads the stored pod's status: injected, with the pod's entry standing.
    let text = cli(ctx, &["explain", "--cluster", "--namespace", namespace, "pod/legacy"])?;
    ensure!(
        text.contains("this pod: injected with [hosts@") && text.contains("hosts applied with conflicts"),
        "explain --cluster says:\n{text}"
    );
    ctx.pods(namespace).delete("legacy", &DeleteParams::default()).await?;
    Ok(())
}

/// The namespace of scenario 39's pods (`drift --in-place` updates every stale pod of the one it
/// is given).
const GATED_NS: &str = "e2e-gates";

/// A profiler on the pod's accelerator: a DRA claim its sidecar uses, and a scheduling gate a
/// device operator lifts once the node is prepared.
const GPU_AGENT: &str = r#"description: A profiler on the pod's accelerator, held until the device operator prepared the node
default: true
sidecarMode: container
podSelector:
  matchLabels: {tier: gated}
values: {image: "registry.example/profiler:1"}
inject:
  schedulingGates:
    - name: e2e.example/prepared
  resourceClaims:
    - {name: gpu, resourceClaimName: e2e-gpu}
  sidecars:
    - name: profiler
      image: "{{ values.image }}"
      resources: {claims: [{name: gpu}]}
"#;

/// Two ResourceClaims (resource.k8s.io/v1, stable since Kubernetes 1.34): the template's and a
/// pod's own.
const RESOURCE_CLAIMS: &str = r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: e2e-gpu}
spec:
  devices:
    requests:
      - {name: gpu, exactly: {deviceClassName: gpu.example.com}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: e2e-other}
spec:
  devices:
    requests:
      - {name: gpu, exactly: {deviceClassName: gpu.example.com}}
"#;

/// 39. `schedulingGates` and `resourceClaims` on the real API server. The pod is stored with the
///     template's gate, claim and the sidecar that uses the claim, and the scheduler holds it
///     `SchedulingGated`; the device operator (here, the test) lifts the gate with an update that
///     `/validate` allows, and the scheduler takes the pod up; after an image edit `drift
///     --in-place` updates the pod (same UID), the lifted gate neither a doubt nor put back. A pod
///     with its own claim of that name keeps it, and the sidecar that would have used the pod's
///     device instead is skipped with the template's claim (the API server accepts the result).
pub async fn s39_claims_and_gates(ctx: &mut Ctx) -> Result<()> {
    ctx.namespace(GATED_NS, &[("sidecar-injector.io/inject", "enabled")]).await?;
    crate::scenarios::set_template(ctx, "gpu-agent.yaml", Some(GPU_AGENT)).await?;
    let result = claims_and_gates(ctx).await;
    crate::scenarios::set_template(ctx, "gpu-agent.yaml", None).await?;
    for name in ["gated", "own-claim"] {
        let _ = ctx.pods(GATED_NS).delete(name, &DeleteParams::default()).await;
    }
    result
}

async fn claims_and_gates(ctx: &mut Ctx) -> Result<()> {
    use crate::scenarios::{all_containers, api_message, dry_run_until};
    kubectl_apply(ctx, GATED_NS, RESOURCE_CLAIMS)?;
    let gated_pod = |name: &str| crate::scenarios::pod(name, json!({"tier": "gated"}), json!({}));
    let image = |pod: &Pod, name: &str| all_containers(pod).into_iter().find(|c| c.name == name).and_then(|c| c.image);
    dry_run_until(ctx, &gated_pod("probe"), "the gpu-agent template", |p| image(p, "profiler").is_some()).await?;
    let pods = ctx.pods(GATED_NS);
    let created = ctx.create_pod(GATED_NS, gated_pod("gated")).await.map_err(|e| anyhow::anyhow!(api_message(&e)))?;
    let spec = serde_json::to_value(created.spec.as_ref().context("no spec")?)?;
    ensure!(
        spec["schedulingGates"] == json!([{"name": "e2e.example/prepared"}]),
        "stored gates {}",
        spec["schedulingGates"]
    );
    ensure!(
        spec["resourceClaims"] == json!([{"name": "gpu", "resourceClaimName": "e2e-gpu"}]),
        "stored claims {}",
        spec["resourceClaims"]
    );
    ensure!(
        spec["containers"][1]["resources"]["claims"] == json!([{"name": "gpu"}]),
        "stored sidecar {}",
        spec["containers"][1]
    );
    let injected = status(&created).context("not injected")?;
    ensure!(
        injected.scheduling_gates == ["e2e.example/prepared"] && injected.resource_claims == ["gpu"],
        "status {injected:?}"
    );
    let scheduled_reason = |pod: &Pod| {
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
        conditions.into_iter().find(|c| c.type_ == "PodScheduled").and_then(|c| c.reason)
    };
    let (_, took) = eventually("the pod SchedulingGated", Duration::from_secs(20), || async {
        Ok((scheduled_reason(&pods.get("gated").await?).as_deref() == Some("SchedulingGated")).then_some(()))
    })
    .await?;
    println!("      stored with the gate, the claim and the sidecar using it; SchedulingGated after {took:?}");

    // The device operator lifts the gate: an update /validate allows.
    let lift = kube::api::Patch::Json::<()>(serde_json::from_value(
        json!([{"op": "remove", "path": "/spec/schedulingGates"}]),
    )?);
    pods.patch("gated", &kube::api::PatchParams::default(), &lift)
        .await
        .map_err(|e| anyhow::anyhow!(api_message(&e)))?;
    let (reason, took) = eventually("the scheduler taking the pod up", Duration::from_secs(20), || async {
        let reason = scheduled_reason(&pods.get("gated").await?);
        Ok(reason.filter(|r| r != "SchedulingGated"))
    })
    .await?;
    println!("      the gate lifted by an update (allowed); the scheduler took the pod up after {took:?} ({reason})");

    // An image edit: the pod is updated in place, its lifted gate no doubt and not put back.
    let edited = GPU_AGENT.replace("profiler:1", "profiler:2");
    crate::scenarios::set_template(ctx, "gpu-agent.yaml", Some(&edited)).await?;
    dry_run_until(ctx, &gated_pod("probe"), "the new image", |p| {
        image(p, "profiler").as_deref() == Some("registry.example/profiler:2")
    })
    .await?;
    let (done, _) = eventually("drift --in-place updating the pod", Duration::from_secs(20), || async {
        let done = cli(ctx, &["drift", "--namespace", GATED_NS, "--in-place", "--rollout-timeout", "0"])?;
        ensure!(!done.contains("pod/gated: left for --restart"), "drift --in-place left the pod:\n{done}");
        let now = pods.get("gated").await?;
        Ok((image(&now, "profiler").as_deref() == Some("registry.example/profiler:2")).then_some(now))
    })
    .await?;
    ensure!(done.metadata.uid == created.metadata.uid, "the pod was replaced, not updated");
    let gates = done.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default();
    ensure!(gates.is_empty(), "the gate was put back: {gates:?}");
    ensure!(
        status(&done).is_some_and(|s| s.scheduling_gates == ["e2e.example/prepared"]),
        "status {:?}",
        status(&done)
    );
    println!("      after an image edit drift --in-place updated the pod (same UID); the lifted gate stays lifted");

    // A pod with its own claim named gpu keeps it; the sidecar is skipped with the template's claim.
    let mut own = gated_pod("own-claim");
    own["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": "e2e-other"}]);
    own["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    let created = ctx.create_pod(GATED_NS, own).await.map_err(|e| anyhow::anyhow!(api_message(&e)))?;
    let names: Vec<String> = all_containers(&created).into_iter().map(|c| c.name).collect();
    ensure!(!names.iter().any(|n| n == "profiler"), "containers stored as {names:?}");
    let claims = serde_json::to_value(created.spec.as_ref().and_then(|s| s.resource_claims.clone()))?;
    ensure!(claims == json!([{"name": "gpu", "resourceClaimName": "e2e-other"}]), "stored claims {claims}");
    let skipped: Vec<(String, String)> =
        status(&created).context("no status")?.skipped.iter().map(|s| (s.name.clone(), s.owner.clone())).collect();
    ensure!(
        skipped.contains(&("profiler".into(), "resourceClaim:gpu".into()))
            && skipped.contains(&("gpu".into(), "pod".into())),
        "skipped {skipped:?}"
    );
    println!(
        "      a pod with its own claim gpu keeps it; the sidecar that would use it is skipped (resourceClaim:gpu)"
    );
    Ok(())
}

const PORTS_TEMPLATE: &str = r#"
description: A mesh proxy whose ports an app may declare too
sidecarMode: container
inject:
  sidecars:
    - name: mesh
      image: registry.example/mesh:1
      ports: [{name: proxy-admin, containerPort: 9901}]
      resources: {requests: {cpu: 1m, memory: 1Mi}, limits: {cpu: 1m, memory: 1Mi}}
"#;

/// 31. Ports that collide inside a pod, on the real API server: which collisions the API server
///     refuses itself (containers of one pod sharing a port number, a port name, and the same
///     under `hostNetwork`, where each port is a host port), and that an injection whose sidecar
///     collides with the app is admitted with a warning naming both containers and the port, and
///     never costs the create (under `hostNetwork` the pod is left as written instead).
pub async fn s31_port_collisions(ctx: &mut Ctx) -> Result<()> {
    crate::scenarios::set_template(ctx, "ports.yaml", Some(PORTS_TEMPLATE)).await?;
    let result = port_collisions(ctx).await;
    crate::scenarios::set_template(ctx, "ports.yaml", None).await?;
    result
}

/// A pod with two containers declaring these ports.
fn two_containers(name: &str, annotations: Value, first: Value, second: Value, host_network: bool) -> Value {
    let mut pod = crate::scenarios::pod(name, json!({}), annotations);
    pod["spec"]["containers"] = json!([
        {"name": "app", "image": "registry.example/app:1", "ports": first},
        {"name": "helper", "image": "registry.example/helper:1", "ports": second},
    ]);
    if host_network {
        pod["spec"]["hostNetwork"] = json!(true);
    }
    pod
}

async fn port_collisions(ctx: &mut Ctx) -> Result<()> {
    // What the API server refuses itself, in a namespace the injector leaves alone.
    let number = json!([{"name": "http", "containerPort": 8080}]);
    let same_number = json!([{"name": "admin", "containerPort": 8080}]);
    let same_name = json!([{"name": "http", "containerPort": 9090}]);
    let facts = [
        ("same number", two_containers("same-number", json!({}), number.clone(), same_number.clone(), false)),
        ("same name", two_containers("same-name", json!({}), number.clone(), same_name, false)),
        ("same number, hostNetwork", two_containers("host-number", json!({}), number.clone(), same_number, true)),
    ];
    let mut refused = Vec::new();
    for (case, pod) in facts {
        match ctx.dry_run_pod("e2e-plain", pod).await {
            Ok(_) => eprintln!("      the API server admits two containers with the {case}"),
            Err(e) => {
                eprintln!("      the API server refuses two containers with the {case}: {e}");
                refused.push(case);
            }
        }
    }
    ensure!(refused == ["same number, hostNetwork"], "the API server refused {refused:?}");

    // An injected sidecar that collides with the app: admitted, with the warning (kubectl prints
    // admission warnings on stderr). Under hostNetwork the API server would refuse the injected
    // pod: admitted as written, with the warning saying why.
    let annotations = json!({"sidecar-injector.io/templates": "ports"});
    let app_ports = json!([{"name": "proxy-admin", "containerPort": 9901}]);
    let create = |pod: &Value| {
        let args = ["-n", "e2e-shop", "create", "--dry-run=server", "-o", "json", "-f", "-"];
        ctx.plane.kubectl_with_stderr(&ctx.plane.admin_kubeconfig, &args, Some(&pod.to_string()))
    };
    for host_network in [false, true] {
        let mut pod = crate::scenarios::pod("meshed", json!({}), annotations.clone());
        pod["spec"]["containers"][0]["ports"] = app_ports.clone();
        if host_network {
            pod["spec"]["hostNetwork"] = json!(true);
        }
        // The injector serves the new template within seconds; until then it refuses the pod.
        let served = Instant::now();
        let (stored, warnings) = loop {
            match create(&pod) {
                Ok(created) => break created,
                Err(e) if served.elapsed() < Duration::from_secs(15) && e.to_string().contains("ports") => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => bail!("the pod (hostNetwork {host_network}) was refused: {e}"),
            }
        };
        let stored: Value = serde_json::from_str(&stored)?;
        let containers = stored["spec"]["containers"].as_array().into_iter().flatten();
        let names: Vec<&str> = containers.filter_map(|c| c["name"].as_str()).collect();
        let (expected, said): (&[&str], &str) = match host_network {
            false => (&["app", "mesh"], "container app and injected container mesh both declare port 9901/TCP"),
            true => (
                &["app"],
                "not injected: the API server would refuse the injected pod (spec.hostNetwork: container app and injected container mesh both declare port 9901/TCP",
            ),
        };
        ensure!(names == expected, "hostNetwork {host_network}: containers {names:?}");
        ensure!(warnings.contains(said), "hostNetwork {host_network}: warnings {warnings}");
    }
    Ok(())
}

/// A sidecar every Pod Security level admits, and an init container only `privileged` admits.
const PSA_AGENT: &str = r#"description: A hardened agent (restricted)
default: true
sidecarMode: container
podSelector:
  matchLabels: {tier: psa}
inject:
  sidecars:
    - name: psa-agent
      image: registry.example/agent:1
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
        runAsNonRoot: true
        seccompProfile: {type: RuntimeDefault}
"#;
const PSA_NET: &str = r#"description: Traffic capture (privileged only)
default: true
podSelector:
  matchLabels: {tier: psa}
inject:
  initContainers:
    - name: psa-net-init
      image: registry.example/net-init:1
      securityContext:
        capabilities: {add: [NET_ADMIN, NET_RAW], drop: [ALL]}
"#;

/// Namespaces at each Pod Security level (enforced by the API server's own PodSecurity plugin):
/// a pod that meets `restricted` gets both templates at `privileged`, and only the hardened one at
/// `baseline` and `restricted`, the other left out with the reason in the status, an Event and
/// the warning; the API server admits every one of them. Made enforced, the privileged template
/// refuses the pod with the API server's words instead.
pub async fn s40_pod_security_levels(ctx: &mut Ctx) -> Result<()> {
    let levels = ["privileged", "baseline", "restricted"];
    for level in levels {
        let labels = [("sidecar-injector.io/inject", "enabled"), ("pod-security.kubernetes.io/enforce", level)];
        ctx.namespace(&format!("e2e-psa-{level}"), &labels).await?;
    }
    crate::scenarios::set_template(ctx, "psa-agent.yaml", Some(PSA_AGENT)).await?;
    crate::scenarios::set_template(ctx, "psa-net.yaml", Some(PSA_NET)).await?;
    let result = pod_security_levels(ctx).await;
    crate::scenarios::set_template(ctx, "psa-net.yaml", None).await?;
    crate::scenarios::set_template(ctx, "psa-agent.yaml", None).await?;
    for level in levels {
        let _ = Api::<Namespace>::all(ctx.client.clone())
            .delete(&format!("e2e-psa-{level}"), &DeleteParams::default())
            .await;
    }
    result
}

/// A pod that meets the `restricted` level.
fn restricted_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"tier": "psa"}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "app", "image": "registry.example/app:1", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
        }
    })
}

async fn pod_security_levels(ctx: &mut Ctx) -> Result<()> {
    use crate::scenarios::{all_containers, api_message, dry_run_until};
    let names = |pod: &Pod| all_containers(pod).into_iter().map(|c| c.name).collect::<Vec<_>>();
    dry_run_until(ctx, &restricted_pod("probe"), "the psa templates", |p| {
        let names = names(p);
        names.contains(&"psa-agent".to_owned()) && names.contains(&"psa-net-init".to_owned())
    })
    .await?;
    for (level, both) in [("privileged", true), ("baseline", false), ("restricted", false)] {
        let namespace = format!("e2e-psa-{level}");
        let created = ctx
            .create_pod(&namespace, restricted_pod("web"))
            .await
            .map_err(|e| anyhow::anyhow!("{level}: the API server refused the pod: {}", api_message(&e)))?;
        let containers = names(&created);
        let injected = status(&created).context("no status annotation")?;
        ensure!(containers.contains(&"psa-agent".to_owned()), "{level}: no agent: {containers:?}");
        ensure!(containers.contains(&"psa-net-init".to_owned()) == both, "{level}: {containers:?}");
        match both {
            true => ensure!(injected.reason.is_none(), "{level}: {injected:?}"),
            false => {
                let reason = injected.reason.clone().unwrap_or_default();
                let expected = format!(
                    "not injected: template psa-net: the namespace enforces Pod Security, and the API server would refuse the pod with what it adds (violates PodSecurity \"{level}:latest\""
                );
                ensure!(reason.starts_with(&expected), "{level}: the status says {reason}");
            }
        }
        println!(
            "      {level}: stored with {containers:?}{}",
            if both { "" } else { ", psa-net left out with the reason" }
        );
    }

    // Enforced, the privileged template refuses the pod in the API server's words.
    let enforced = PSA_NET.replace("default: true", "default: true\nenforced: true");
    crate::scenarios::set_template(ctx, "psa-net.yaml", Some(&enforced)).await?;
    let (refusal, took) = eventually("the enforced template refusing the pod", Duration::from_secs(20), || async {
        match ctx.create_pod("e2e-psa-restricted", restricted_pod("refused")).await {
            Err(e) => Ok(Some(api_message(&e))),
            Ok(_) => {
                let _ = ctx.pods("e2e-psa-restricted").delete("refused", &DeleteParams::default()).await;
                Ok(None)
            }
        }
    })
    .await?;
    ensure!(
        refusal.contains("template psa-net is enforced for this pod, but the API server would refuse the pod with it: violates PodSecurity \"restricted:latest\""),
        "refused with: {refusal}"
    );
    println!("      enforced: refused in the API server's words after {took:?}");
    Ok(())
}

/// A config reloader that restarts the whole pod when it exits 42: it needs nodes that declare
/// `RestartAllContainersOnContainerExits`.
const RESTART_ALL: &str = r#"description: A reloader that restarts every container of the pod
default: true
sidecarMode: native
podSelector:
  matchLabels: {tier: restart-all}
inject:
  sidecars:
    - name: reloader
      image: registry.example/reloader:1
      restartPolicyRules:
        - action: RestartAllContainers
          exitCodes: {operator: In, values: [42]}
"#;

/// The KWOK nodes of scenario 41: (name, status.declaredFeatures).
const DECLARING_NODES: [(&str, Option<&[&str]>); 3] = [
    ("ndf-declaring", Some(&["InPlacePodLevelResourcesVerticalScaling", "RestartAllContainersOnContainerExits"])),
    ("ndf-declaring-not", Some(&["ExtendWebSocketsToKubelet"])),
    ("ndf-silent", None),
];

/// Scenario 41: features nodes declare. KWOK nodes (1.37 kubelets) that declare
/// `RestartAllContainersOnContainerExits`, declare other features only, or declare nothing; a
/// template whose native sidecar restarts the whole pod on exit code 42. The injector warns for
/// exactly the pods whose nodes do not offer the feature, and the real scheduler agrees: it binds
/// the pod kept on the declaring node and leaves the others Pending for that reason.
pub async fn s41_node_declared_features(ctx: &mut Ctx) -> Result<()> {
    let manifest = DECLARING_NODES
        .map(|(name, declared)| {
            let mut node = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {"kubernetes.io/hostname": name, "type": "kwok", "pool": name}},
                "spec": {"taints": [{"key": "e2e/declared-features", "effect": "NoSchedule"}]},
                "status": {"nodeInfo": {"kubeletVersion": "v1.37.1"},
                    "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                    "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"}}});
            if let Some(declared) = declared {
                node["status"]["declaredFeatures"] = json!(declared);
            }
            node.to_string()
        })
        .join("\n");
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["create", "-f", "-"], Some(&manifest))?;
    crate::scenarios::set_template(ctx, "restart-all.yaml", Some(RESTART_ALL)).await?;
    let result = node_declared_features(ctx).await;
    crate::scenarios::set_template(ctx, "restart-all.yaml", None).await?;
    for (name, _) in DECLARING_NODES {
        let _ = ctx.pods("e2e-shop").delete(&format!("on-{name}"), &DeleteParams::default()).await;
    }
    let names: Vec<&str> = DECLARING_NODES.iter().map(|(name, _)| *name).collect();
    let _ = ctx.plane.kubectl(&[&["delete", "node", "--ignore-not-found"][..], &names].concat());
    result
}

async fn node_declared_features(ctx: &mut Ctx) -> Result<()> {
    use crate::scenarios::{admission_warnings, api_message, dry_run_until, pod};
    // The API server keeps what the nodes declare (the field is GA in 1.37).
    let stored = ctx.plane.kubectl(&["get", "node", "ndf-declaring", "-o", "jsonpath={.status.declaredFeatures}"])?;
    ensure!(stored.contains("RestartAllContainersOnContainerExits"), "ndf-declaring stored with {stored:?}");
    let on = |node: &str| {
        let mut pod = pod(&format!("on-{node}"), json!({"tier": "restart-all"}), json!({}));
        pod["spec"]["nodeSelector"] = json!({"pool": node});
        pod["spec"]["tolerations"] = json!([{"key": "e2e/declared-features", "operator": "Exists"}]);
        pod
    };
    let reloader = |pod: &Pod| crate::scenarios::init_names(pod).contains(&"reloader".to_owned());
    dry_run_until(ctx, &on("ndf-declaring"), "the reloader template", reloader).await?;
    let warned = |said: &str| said.contains("which needs nodes that offer RestartAllContainersOnContainerExits");
    // The injector learns of the nodes through its watch: wait until it warns for the silent one.
    let start = Instant::now();
    while !warned(&admission_warnings(ctx, &on("ndf-silent"))?) {
        ensure!(start.elapsed() < Duration::from_secs(30), "no warning for the node that declares nothing");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // (node, warned, how the warning says it was decided)
    let cases = [
        ("ndf-declaring", false, ""),
        ("ndf-declaring-not", true, "by their status.declaredFeatures"),
        ("ndf-silent", true, "a node that declares none offers none to the scheduler (1.36+)"),
    ];
    for (node, expect_warning, how) in cases {
        let said = admission_warnings(ctx, &on(node))?;
        ensure!(warned(&said) == expect_warning && said.contains(how), "{node}: warnings {said:?}");
        let created =
            ctx.create_pod("e2e-shop", on(node)).await.map_err(|e| anyhow::anyhow!("{node}: {}", api_message(&e)))?;
        ensure!(reloader(&created), "{node}: the reloader was not injected");
    }
    // The scheduler's verdict on each: bound to the declaring node, the others left Pending
    // because the nodes do not declare what the pod needs.
    let start = Instant::now();
    loop {
        let mut verdicts = Vec::new();
        for (node, expect_warning, _) in cases {
            let pod = ctx.pods("e2e-shop").get(&format!("on-{node}")).await?;
            let bound = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let unschedulable = pod.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|conditions| {
                conditions.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.message.as_deref().is_some_and(|m| m.contains("didn't match Pod's required features"))
                })
            });
            let agrees = match expect_warning {
                false => bound.as_deref() == Some(node),
                true => bound.is_none() && unschedulable,
            };
            verdicts.push((node, agrees, bound, unschedulable));
        }
        if verdicts.iter().all(|(_, agrees, _, _)| *agrees) {
            println!(
                "      the scheduler agrees: bound where no warning, Pending for the required features where warned"
            );
            return Ok(());
        }
        ensure!(start.elapsed() < Duration::from_secs(60), "the scheduler's verdicts: {verdicts:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An agent sized from the app it serves.
const SIZED_AGENT: &str = r#"description: An agent sized from the app it serves
default: true
sidecarMode: native
podSelector:
  matchLabels: {tier: sized}
inject:
  sidecars:
    - name: sized-agent
      image: registry.example/agent:1
      resources: {requests: {cpu: 10m, memory: 32Mi}, limits: {memory: 64Mi}}
      sizing:
        requests:
          cpu: {from: sum, fraction: 0.1, min: 10m, max: "1"}
          memory: {from: max, fraction: 0.25, min: 32Mi, round: 16Mi}
        limits:
          memory: {from: sum, fraction: 0.5, max: 1Gi, round: 1Mi}
"#;

/// Scenario 42: sidecars sized from the app. Through the webhook, pods whose app containers
/// write their quantities as kubectl's YAML gives them (numbers, decimal and binary units) are
/// stored with the agent's computed requests and limits **text for text** (the API server
/// canonicalizes quantities: a value we wrote in another form would be stored differently), the
/// pod-level values padded by exactly them and accepted; `explain --cluster` shows each
/// computation.
pub async fn s42_sized_from_the_app(ctx: &mut Ctx) -> Result<()> {
    crate::scenarios::set_template(ctx, "sized-agent.yaml", Some(SIZED_AGENT)).await?;
    let result = sized_from_the_app(ctx).await;
    crate::scenarios::set_template(ctx, "sized-agent.yaml", None).await?;
    for name in ["sized-two", "sized-large", "sized-bare"] {
        let _ = ctx.pods("e2e-shop").delete(name, &DeleteParams::default()).await;
    }
    result
}

async fn sized_from_the_app(ctx: &mut Ctx) -> Result<()> {
    use crate::scenarios::{api_message, cli, dry_run_until, pod};
    let agent_resources = |pod: &Pod| -> Value {
        let init = pod.spec.as_ref().and_then(|s| s.init_containers.clone()).unwrap_or_default();
        let agent = init.into_iter().find(|c| c.name == "sized-agent");
        serde_json::to_value(agent.and_then(|c| c.resources)).unwrap_or_default()
    };
    let with = |name: &str, spec: Value| {
        let mut pod = pod(name, json!({"tier": "sized"}), json!({}));
        pod["spec"] = spec;
        pod
    };
    // (pod, the agent's resources as stored, the pod-level resources as stored)
    let cases = [
        (
            with(
                "sized-two",
                json!({
                "resources": {"requests": {"cpu": 1.5, "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                "containers": [
                    {"name": "app", "image": "registry.example/app:1", "resources": {"requests": {"cpu": 1, "memory": "600Mi"}, "limits": {"memory": "1Gi"}}},
                    {"name": "helper", "image": "registry.example/helper:1", "resources": {"requests": {"cpu": "200m", "memory": 104857600}, "limits": {"memory": "500Mi"}}}
                ]}),
            ),
            json!({"requests": {"cpu": "120m", "memory": "160Mi"}, "limits": {"memory": "762Mi"}}),
            // Padded by the agent and by the namespace's log-shipper (10m, 32Mi, a 64Mi limit).
            json!({"requests": {"cpu": "1630m", "memory": "1216Mi"}, "limits": {"memory": "2874Mi"}}),
        ),
        (
            with(
                "sized-large",
                json!({"containers": [{"name": "app", "image": "registry.example/app:1",
                "resources": {"requests": {"cpu": 64, "memory": "6Gi"}, "limits": {"memory": "8G"}}}]}),
            ),
            // 8G × 0.5 = 4G, past the 1Gi ceiling; 6Gi × 0.25 held at that limit.
            json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}),
            Value::Null,
        ),
        (
            with("sized-bare", json!({"containers": [{"name": "app", "image": "registry.example/app:1"}]})),
            json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "1Gi"}}),
            Value::Null,
        ),
    ];
    dry_run_until(ctx, &cases[2].0, "the sized agent", |p| agent_resources(p) != Value::Null).await?;
    for (pod, agent, pod_level) in cases {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let stored =
            ctx.create_pod("e2e-shop", pod).await.map_err(|e| anyhow::anyhow!("{name}: {}", api_message(&e)))?;
        ensure!(agent_resources(&stored) == agent, "{name}: the agent is stored with {}", agent_resources(&stored));
        let stored_level =
            serde_json::to_value(stored.spec.as_ref().and_then(|s| s.resources.clone())).unwrap_or_default();
        ensure!(stored_level == pod_level, "{name}: pod-level resources stored as {stored_level}");
    }
    let text = cli(ctx, &["explain", "--cluster", "--namespace", "e2e-shop", "pod/sized-two"])?;
    ensure!(
        text.contains("sized sized-agent: container sized-agent: requests.cpu = 120m (the sum of the app containers' requests.cpu 1200m × 0.1, rounded up to 1m)"),
        "explain does not show the computation:\n{text}"
    );
    println!("      three pods stored with the agent's computed values text for text, padded by them");
    Ok(())
}
