//! A namespace the injector cannot read (issue 58 part 6): the namespace watch held back by RBAC on
//! the real API server, so every namespace is missing from the cache.
//!
//! With `get` still allowed, a miss is read directly and the pod is decided on the namespace's
//! real labels. With `get` taken away too, a template that chooses by namespace labels is never
//! judged on labels nobody could read: the pod is refused with a message its controller retries,
//! and the lookup failure is counted.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::controlplane::Injector;
use crate::scenarios::{Ctx, api_message, pod, set_template, wait_for_injection};

/// A default template that only namespaces of team payments get.
const BY_TEAM: &str =
    "default: true\nnamespaceSelector: {matchLabels: {team: payments}}\ninject:\n  labels: {audited: \"yes\"}\n";

/// Sets the verbs the injector's ClusterRole grants on namespaces.
async fn namespace_verbs(ctx: &Ctx, verbs: &[&str]) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(ctx.client.clone());
    let mut role = roles.get("sidecar-injector").await?;
    let rules = role.rules.as_mut().context("the ClusterRole has rules")?;
    let rule = rules
        .iter_mut()
        .find(|r| r.resources.iter().flatten().any(|x| x == "namespaces"))
        .context("a rule for namespaces")?;
    rule.verbs = verbs.iter().map(|v| (*v).to_owned()).collect();
    roles.replace("sidecar-injector", &PostParams::default(), &role).await?;
    Ok(())
}

pub async fn s38_namespace_unreadable(ctx: &mut Ctx) -> Result<()> {
    set_template(ctx, "by-team.yaml", Some(BY_TEAM)).await?;
    // Hold the watch back: no list or watch of namespaces, so the cache never learns one.
    namespace_verbs(ctx, &["get"]).await?;
    ctx.stop_injector();
    let wait = [("SIDECAR_INJECTOR__CLUSTER__NAMESPACE_WAIT_MS", "200")];
    let mut injector = Injector::spawn(&ctx.plane, &ctx.binary, &wait)?;
    let result = held_back(ctx, &mut injector).await;
    // Put everything back whatever happened.
    injector.process.stop(Duration::from_secs(10));
    namespace_verbs(ctx, &["get", "list", "watch"]).await?;
    ctx.start_injector()?;
    wait_for_injection(ctx, "e2e-shop").await?;
    // (The ConfigMap guard needs the injector up.)
    set_template(ctx, "by-team.yaml", None).await?;
    result
}

async fn held_back(ctx: &mut Ctx, injector: &mut Injector) -> Result<()> {
    let labels = [("sidecar-injector.io/inject", "enabled"), ("team", "payments")];
    ctx.namespace("e2e-payments", &labels).await?;
    // The cache cannot have it: read directly, decided on its real labels.
    let probe = pod("probe", json!({"app": "probe"}), json!({}));
    let started = Instant::now();
    let injected = loop {
        match ctx.dry_run_pod("e2e-payments", probe.clone()).await {
            Ok(answer) if answer.metadata.labels.as_ref().is_some_and(|l| l.contains_key("audited")) => break answer,
            answer => {
                let said = answer.map(|_| "no audited label".to_owned()).unwrap_or_else(|e| api_message(&e));
                ensure!(started.elapsed() < Duration::from_secs(30), "never injected by a direct read: {said}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    ensure!(injected.metadata.labels.unwrap_or_default()["audited"] == "yes");
    // And it was read directly, not from a watch that still worked.
    let metrics = injector.metrics();
    let metric = |name: &str| {
        let line = metrics.lines().find(|l| l.starts_with(name));
        line.and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse::<f64>().ok()).unwrap_or_default()
    };
    ensure!(metric("sidecar_injector_namespaces_watched") == 0.0, "the watch still filled the cache:\n{metrics}");
    ensure!(metric("sidecar_injector_namespace_cache_misses_total") >= 1.0, "no cache miss counted:\n{metrics}");
    println!("      namespace missing from the cache: read directly, the payments template injected");

    // Nor can it be read: refused, never decided on unknown labels.
    namespace_verbs(ctx, &["watch"]).await?;
    ctx.namespace("e2e-payments-2", &labels).await?;
    let wanted = "the labels of namespace e2e-payments-2 could not be read";
    let started = Instant::now();
    let message = loop {
        let said = match ctx.dry_run_pod("e2e-payments-2", probe.clone()).await {
            Ok(_) => "admitted".to_owned(),
            Err(e) => api_message(&e),
        };
        if said.contains(wanted) {
            break said;
        }
        ensure!(started.elapsed() < Duration::from_secs(30), "not refused for an unreadable namespace: {said}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(message.contains("decide template(s)") && message.contains("by-team"), "{message}");
    let metrics = injector.metrics();
    let failures = metrics
        .lines()
        .find(|l| l.starts_with("sidecar_injector_namespace_lookup_failures_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_default();
    ensure!(failures >= 1.0, "the lookup failure was not counted:\n{metrics}");
    println!("      namespace unreadable: refused ({message:?}), counted");
    Ok(())
}
