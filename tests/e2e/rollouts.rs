//! Scenario 43: a template's new version rolls out to a share of workloads on the whole cluster —
//! the controllers create the pods, every replica of a Deployment agrees, a pin holds, the choice
//! survives an injector restart, and promotion is one edit.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};
use sidecar_injector::engine::templates::rollout::{self, BUCKETS};
use sidecar_injector::engine::workload::Workload;

use crate::scenarios::{Ctx, api_message, cli, dry_run_until, set_template};

const NAMESPACE: &str = "e2e-rollout";
const DEPLOYMENTS: usize = 40;
const SHARE: u8 = 25;

fn agent(image: &str, rollout: &str) -> String {
    format!(
        "description: A canary agent for tier=rollout pods\ndefault: true\n{rollout}podSelector:\n  matchLabels: {{tier: rollout}}\ninject:\n  sidecars:\n    - name: canary-agent\n      image: {image}\n      resources:\n        requests: {{cpu: 10m, memory: 16Mi}}\n        limits: {{cpu: 50m, memory: 32Mi}}\n"
    )
}

fn deployment(name: &str, replicas: u32, annotations: Value) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata:\n      labels: {{app: {name}, tier: rollout}}\n      annotations: {annotations}\n    spec:\n      containers: [{{name: app, image: registry.example/{name}:1}}]\n"
    )
}

/// The agent's image in a pod, as stored.
fn agent_image(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let containers = spec.init_containers.iter().flatten().chain(&spec.containers);
    containers.into_iter().find(|c| c.name == "canary-agent").and_then(|c| c.image.clone())
}

/// Each Deployment's agent images, once every one of them has `replicas` injected pods.
async fn images_by_deployment(ctx: &Ctx, replicas: usize, limit: Duration) -> Result<BTreeMap<String, Vec<String>>> {
    let start = Instant::now();
    loop {
        let pods = ctx.pods(NAMESPACE).list(&ListParams::default().labels("tier=rollout")).await?.items;
        let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let app = pod.metadata.labels.as_ref().and_then(|l| l.get("app")).cloned().unwrap_or_default();
            by.entry(app).or_default().push(agent_image(pod).unwrap_or_else(|| "none".into()));
        }
        if by.len() == DEPLOYMENTS + 1 && by.values().all(|images| images.len() == replicas) {
            return Ok(by);
        }
        ensure!(
            start.elapsed() < limit,
            "not every Deployment has {replicas} pods within {limit:?}: {:?}",
            by.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn apply(ctx: &Ctx, yaml: &str) -> Result<()> {
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-n", NAMESPACE, "-f", "-"], Some(yaml))?;
    Ok(())
}

pub async fn s43_progressive_rollout(ctx: &mut Ctx) -> Result<()> {
    let result = progressive_rollout(ctx).await;
    set_template(ctx, "canary-agent.yaml", None).await?;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone())
        .delete(NAMESPACE, &DeleteParams::default())
        .await;
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "sidecar-injector");
    let _ = configmaps.delete("sidecar-injector-versions", &DeleteParams::default()).await;
    result
}

async fn progressive_rollout(ctx: &mut Ctx) -> Result<()> {
    ctx.namespace(NAMESPACE, &[("sidecar-injector.io/inject", "enabled")]).await?;
    let probe = crate::scenarios::pod("probe", json!({"tier": "rollout"}), json!({}));
    let serves = |image: &'static str| move |pod: &Pod| agent_image(pod).as_deref() == Some(image);
    set_template(ctx, "canary-agent.yaml", Some(&agent("registry.example/canary-agent:1", ""))).await?;
    dry_run_until(ctx, &probe, "version 1", serves("registry.example/canary-agent:1")).await?;
    let hash = |text: &str| sidecar_injector::engine::Template::load("canary-agent", text).map(|t| t.hash);
    let old = hash(&agent("registry.example/canary-agent:1", "")).map_err(|e| anyhow::anyhow!("{e}"))?;
    let new = hash(&agent("registry.example/canary-agent:2", "")).map_err(|e| anyhow::anyhow!("{e}"))?;

    // The edit: version 2 to a quarter of the workloads.
    let rolled = agent("registry.example/canary-agent:2", &format!("rollout: {{share: {SHARE}}}\n"));
    set_template(ctx, "canary-agent.yaml", Some(&rolled)).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "sidecar-injector");
    let start = Instant::now();
    let kept = loop {
        if let Some(kept) = configmaps.get_opt("sidecar-injector-versions").await? {
            let data = kept.data.clone().unwrap_or_default();
            if data.contains_key(&format!("canary-agent.{old}.yaml")) {
                break data;
            }
        }
        ensure!(start.elapsed() < Duration::from_secs(15), "the injector did not keep version {old}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(kept["canary-agent.json"].contains(&format!("\"from\":\"{old}\"")), "{kept:?}");

    // 40 Deployments of 2 replicas, and one in the share pinned to the version before.
    let in_share = |name: &str| {
        let workload = Workload { kind: "Deployment".into(), name: name.into() };
        rollout::bucket("canary-agent", NAMESPACE, &workload) < u32::from(SHARE) * (BUCKETS / 100)
    };
    let pinned = (0..).map(|i| format!("pinned-{i}")).find(|n| in_share(n)).context("a name in the share")?;
    let mut yaml: Vec<String> = (0..DEPLOYMENTS).map(|i| deployment(&format!("app-{i:02}"), 2, json!({}))).collect();
    yaml.push(deployment(&pinned, 2, json!({"sidecar-injector.io/pins": format!("canary-agent={}", &old[..8])})));
    apply(ctx, &yaml.join("---\n"))?;
    let images = images_by_deployment(ctx, 2, Duration::from_secs(120)).await?;
    let (v1, v2) = ("registry.example/canary-agent:1", "registry.example/canary-agent:2");
    let mut got_new = Vec::new();
    for (name, pod_images) in &images {
        ensure!(pod_images.iter().all(|i| *i == pod_images[0]), "the replicas of {name} disagree: {pod_images:?}");
        let expected = if *name != pinned && in_share(name) { v2 } else { v1 };
        ensure!(pod_images[0] == expected, "{name}: got {}, its bucket says {expected}", pod_images[0]);
        if pod_images[0] == v2 {
            got_new.push(name.clone());
        }
    }
    ensure!((5..=16).contains(&got_new.len()), "{} of {DEPLOYMENTS} Deployments got the new version", got_new.len());
    println!(
        "      {} of {DEPLOYMENTS} Deployments ({SHARE}% asked) got version {new}, every replica alike; {pinned} held at {old} by its pin",
        got_new.len()
    );

    // A pin to a version nobody keeps is refused, naming the versions kept.
    let stale = crate::scenarios::pod(
        "stale-pin",
        json!({"tier": "rollout"}),
        json!({"sidecar-injector.io/pins": "canary-agent=0123456789abcdef"}),
    );
    let refused = ctx.create_pod(NAMESPACE, stale).await.err().context("a pin to an unknown version was admitted")?;
    ensure!(api_message(&refused).contains("which is not kept: the versions kept are"), "{}", api_message(&refused));

    // With both versions in service nothing is drifted; explain says why.
    let report: Value = serde_json::from_str(&cli(ctx, &["drift", "--namespace", NAMESPACE, "-o", "json"])?)?;
    ensure!(report.as_array().is_some_and(Vec::is_empty), "drifted during the rollout: {report}");
    let app = got_new.first().context("no Deployment got the new version")?;
    let text = cli(ctx, &["explain", "--cluster", "--namespace", NAMESPACE, &format!("deployment/{app}")])?;
    ensure!(text.contains(&format!("canary-agent version {new}: rollout: Deployment {app} falls at")), "{text}");

    // A restarted injector chooses alike: each Deployment's new replicas get its version.
    ctx.stop_injector();
    ctx.start_injector()?;
    crate::scenarios::wait_for_injection(ctx, NAMESPACE).await?;
    for name in images.keys() {
        ctx.plane.kubectl(&["-n", NAMESPACE, "scale", &format!("deployment/{name}"), "--replicas=3"])?;
    }
    let after = images_by_deployment(ctx, 3, Duration::from_secs(120)).await?;
    for (name, pod_images) in &after {
        ensure!(pod_images.iter().all(|i| *i == images[name][0]), "{name} after the restart: {pod_images:?}");
    }
    println!("      after an injector restart, the 41 new replicas got their Deployment's version");

    // Promotion: one edit (deleting rollout:) keeps version 2's hash; new pods get it, and the
    // pods of version 1 are drifted, but for the pinned Deployment's: version 1 stays kept, so
    // its pin holds.
    set_template(ctx, "canary-agent.yaml", Some(&agent("registry.example/canary-agent:2", ""))).await?;
    dry_run_until(ctx, &probe, "the promoted version", serves("registry.example/canary-agent:2")).await?;
    let report: Value = serde_json::from_str(&cli(ctx, &["drift", "--namespace", NAMESPACE, "-o", "json"])?)?;
    let drifted: Vec<String> = report
        .as_array()
        .context("a list")?
        .iter()
        .filter_map(|w| w["workload"]["name"].as_str().map(str::to_owned))
        .collect();
    let expected: Vec<String> =
        images.iter().filter(|(n, i)| i[0] == v1 && **n != pinned).map(|(n, _)| n.clone()).collect();
    for name in &expected {
        ensure!(drifted.contains(name), "{name} (version 1) is not listed as drifted after promotion: {drifted:?}");
    }
    for name in got_new.iter().chain([&pinned]) {
        ensure!(!drifted.contains(name), "{name} (version 2, or pinned) is listed as drifted after promotion");
    }
    println!("      promoted with one edit: {} Deployments of version 1 drifted, version 2's not", expected.len());
    Ok(())
}
