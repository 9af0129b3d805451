//! `explain --cluster` and `drift`: the same engine, fed from a live cluster instead of files.
//!
//! Everything is read, never written, except by `drift --restart` (without `--dry-run`), which
//! patches a workload's pod template the way `kubectl rollout restart` does — one workload at a
//! time, waiting for each rollout — and never touches bare pods; and by `drift --in-place`, which
//! updates stale pods whose template change is images only (`engine::drift::in_place`): a few pods
//! at a time, one workload after the other, waiting for the new containers to run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use super::OutputFormat;
use crate::engine::drift::{self, DriftedWorkload, PodDrift, RestartAction, WorkloadRef};
use crate::engine::emit::webhook_rules::{self, Check, Reachability};
use crate::engine::model::status::InjectionStatus;
use crate::engine::{ClusterFacts, Engine, NamespaceFacts, Outcome, PodRequest, TemplateSet, names, workload};

/// Where the injector lives.
#[derive(Debug, Clone, clap::Args)]
pub struct InjectorRef {
    /// The injector's namespace (its template ConfigMaps).
    #[arg(long, default_value = "sidecar-injector")]
    pub injector_namespace: String,
    /// The injector's MutatingWebhookConfiguration.
    #[arg(long, default_value = "sidecar-injector")]
    pub webhook_configuration: String,
}

/// A client from the kubeconfig or the in-cluster service account.
pub async fn client() -> Result<Client> {
    let config = kube::Config::infer().await.context("no cluster: set KUBECONFIG or run in a pod")?;
    Ok(Client::try_from(config)?)
}

fn labels_of(object: &Value, field: &str) -> BTreeMap<String, String> {
    crate::engine::pod::string_map(object, field).unwrap_or_default()
}

/// The engine as the webhook has it now: templates from the ConfigMaps, the cluster's version.
async fn live_engine(client: &Client, injector: &InjectorRef) -> Result<(Engine, ClusterFacts, Vec<String>)> {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &injector.injector_namespace);
    // The kept ConfigMap too: the versions rollouts roll from, their halts.
    let list = configmaps
        .list(&ListParams::default().labels(&crate::cluster::rollouts::watch_selector()))
        .await
        .with_context(|| format!("reading template ConfigMaps in {}", injector.injector_namespace))?;
    let items: Vec<Arc<ConfigMap>> = list.items.into_iter().map(Arc::new).collect();
    let (kept, _) = crate::cluster::rollouts::kept_of(&items);
    let items: Vec<Arc<ConfigMap>> =
        items.into_iter().filter(|cm| crate::cluster::rollouts::is_templates(cm)).collect();
    let (templates, errors) = TemplateSet::default().update_with_kept(
        crate::cluster::sources_of(&items),
        &kept,
        &crate::engine::templates::set::InProcess,
    );
    let cluster = crate::cluster::cluster_facts(client).await;
    let errors = errors.iter().map(ToString::to_string).collect();
    Ok((Engine::new(templates, vec![injector.injector_namespace.clone()]), cluster, errors))
}

async fn namespace_facts(client: &Client, name: &str) -> Result<NamespaceFacts> {
    let namespace = Api::<Namespace>::all(client.clone())
        .get_opt(name)
        .await?
        .with_context(|| format!("namespace {name} not found"))?;
    Ok(NamespaceFacts::known(name, namespace.labels().clone(), namespace.annotations().clone()))
}

/// Whether the webhook's Service has ready endpoints (unknown for URL webhooks or when unreadable).
async fn reachability(client: &Client, configuration: Option<&MutatingWebhookConfiguration>) -> Reachability {
    let Some(service) = configuration.and_then(|c| c.webhooks.as_ref()?.first()?.client_config.service.clone()) else {
        return Reachability::Unknown;
    };
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &service.namespace);
    match slices.list(&ListParams::default().labels(&format!("kubernetes.io/service-name={}", service.name))).await {
        Ok(list) => {
            let ready = list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
                .count();
            if ready > 0 { Reachability::Ready(ready) } else { Reachability::NoReadyEndpoints }
        }
        Err(_) => Reachability::Unknown,
    }
}

/// A pod's (or pod template's) JSON for a target like `deployment/web`, `pod/web-1`, or none.
/// The target's label, its pod (template), the pod itself when the target is one, and the workload
/// a new pod of it belongs to (for a workload's pod template, which names none).
#[allow(clippy::type_complexity)]
async fn target_pod(
    client: &Client,
    namespace: &str,
    target: Option<&str>,
) -> Result<(String, Value, Option<Value>, Option<workload::Workload>)> {
    let Some(target) = target else {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a-new-pod", "namespace": namespace}, "spec": {"containers": [{"name": "app", "image": "app"}]}});
        return Ok((format!("namespace/{namespace} (a new pod without labels)"), pod, None, None));
    };
    let (kind, name) =
        target.split_once('/').with_context(|| format!("{target:?}: write KIND/NAME, e.g. deployment/web"))?;
    let asked = kind.to_lowercase();
    let Some(row) = workload::WORKLOAD_KINDS.iter().find(|w| w.target_names.contains(&asked.as_str())) else {
        let targets: Vec<&str> =
            workload::WORKLOAD_KINDS.iter().filter_map(|w| w.target_names.first().copied()).collect();
        let (last, rest) = targets.split_last().expect("targets");
        bail!("{asked:?} has no pods; use {} or {last}", rest.join(", "))
    };
    let (kind, resource) = (row.kind, api_resource(row));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let object = api.get_opt(name).await?.with_context(|| format!("{kind} {namespace}/{name} not found"))?;
    let mut json = serde_json::to_value(&object)?;
    json["kind"] = json!(kind);
    let pod = workload::pod_of(&json).context("no pod template in it")?;
    let existing = (kind == "Pod").then(|| json.clone());
    Ok((format!("{}/{name}", kind.to_lowercase()), pod, existing, workload::Workload::of_document(&json)))
}

/// What `explain --cluster` found.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterExplanation {
    target: String,
    namespace: String,
    would_inject: bool,
    /// The first rule that stops the injection, with what to change.
    #[serde(skip_serializing_if = "Option::is_none")]
    first_failing_rule: Option<Check>,
    checks: Vec<Check>,
    /// The engine's decision for a new pod like the target (what the webhook would do).
    decision: crate::engine::offline::explain::Explanation,
    /// For an existing pod: how it was injected and whether that is current.
    #[serde(skip_serializing_if = "Option::is_none")]
    existing_pod: Option<ExistingPod>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    template_errors: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ExistingPod {
    injected: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<InjectionStatus>,
    drift: PodDrift,
    /// For a stale pod: whether an update in place brings it up to date, and how or why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    in_place: Option<String>,
}

/// `explain --cluster [TARGET]`.
pub async fn explain(
    client: &Client,
    namespace: &str,
    target: Option<&str>,
    injector: &InjectorRef,
    output: OutputFormat,
) -> Result<String> {
    let facts = namespace_facts(client, namespace).await?;
    let (engine, cluster, template_errors) = live_engine(client, injector).await?;
    let configuration =
        Api::<MutatingWebhookConfiguration>::all(client.clone()).get_opt(&injector.webhook_configuration).await?;
    let reachable = reachability(client, configuration.as_ref()).await;
    let (label, pod, existing, owner) = target_pod(client, namespace, target).await?;

    // A new pod like this one: an existing pod is judged without what was injected into it.
    let fresh = match existing
        .as_ref()
        .and_then(|p| p["metadata"]["annotations"][names::STATUS_ANNOTATION].as_str())
        .and_then(|s| InjectionStatus::parse(s).ok())
    {
        Some(status) => crate::engine::claims::strip::strip_injection(&pod, &status),
        None => pod.clone(),
    };
    let (pod_labels, pod_annotations) = (labels_of(&fresh, "labels"), labels_of(&fresh, "annotations"));
    let checks = webhook_rules::checks(
        configuration.as_ref(),
        &injector.webhook_configuration,
        reachable,
        namespace,
        &facts.labels,
        &pod_labels,
        &pod_annotations,
    );
    // As the webhook decides native sidecars: by the kubelets of the nodes the pod can run on
    // (when the nodes can be listed).
    let cluster = match node_pool(client).await {
        Ok(pool) => pool.facts_for(&fresh, cluster),
        Err(_) => cluster,
    };
    let request = PodRequest { pod: Arc::new(fresh), namespace: facts.clone(), cluster, workload: owner };
    let found = crate::engine::offline::PodDecision {
        cluster,
        label: label.clone(),
        namespace: namespace.to_owned(),
        decision: engine.evaluate(&request),
        in_place: None,
        pod: request.pod,
        field_prefix: String::new(),
    };
    let engine_injects = matches!(&found.decision.outcome, Outcome::Inject(i) if !i.status.templates.is_empty());
    let first_failing_rule = checks.iter().find(|c| !c.passed).cloned().or_else(|| {
        (!engine_injects).then(|| Check {
            rule: "templates",
            passed: false,
            detail: crate::engine::offline::explain::one(found.clone(), true).message,
        })
    });
    let existing_pod = existing.map(|pod| {
        let annotations = labels_of(&pod, "annotations");
        let status = annotations.get(names::STATUS_ANNOTATION).and_then(|s| InjectionStatus::parse(s).ok());
        let drift = drift::classify(&engine, &labels_of(&pod, "labels"), &annotations, &facts);
        let as_it_is = PodRequest { pod: Arc::new(pod), namespace: facts.clone(), cluster, workload: None };
        let in_place = drift::in_place::for_stale(&engine, &as_it_is);
        ExistingPod {
            injected: status.as_ref().is_some_and(|s| !s.templates.is_empty()),
            status,
            drift,
            in_place: in_place.as_ref().map(crate::engine::offline::explain::in_place_sentence),
        }
    });
    let explanation = ClusterExplanation {
        target: label,
        namespace: namespace.to_owned(),
        would_inject: first_failing_rule.is_none(),
        first_failing_rule,
        checks,
        decision: crate::engine::offline::explain::one(found, true),
        existing_pod,
        template_errors,
    };
    Ok(match output {
        OutputFormat::Json => serde_json::to_string_pretty(&explanation)? + "\n",
        OutputFormat::Text => explanation.text(&injector.webhook_configuration),
    })
}

impl ClusterExplanation {
    fn text(&self, configuration: &str) -> String {
        let mut out = format!("{} in namespace {}\n", self.target, self.namespace);
        match &self.first_failing_rule {
            None => out.push_str(&format!("  a new pod would be injected: {}\n", self.decision.message)),
            Some(rule) => out.push_str(&format!("  a new pod would NOT be injected: {}\n", rule.detail)),
        }
        out.push_str(&format!("  webhook (MutatingWebhookConfiguration {configuration}):\n"));
        for check in &self.checks {
            out.push_str(&format!(
                "    {} {:<19} {}\n",
                if check.passed { "ok  " } else { "FAIL" },
                check.rule,
                check.detail
            ));
        }
        out.push_str(&format!("  injector: {}\n", self.decision.message));
        // The version a rollout or a pin decided, for each template (see `templates::rollout`).
        let verdicts = self.decision.templates.as_ref().and_then(|t| t["verdicts"].as_array());
        for verdict in verdicts.into_iter().flatten() {
            if let (Some(name), Some(hash), Some(why)) =
                (verdict["name"].as_str(), verdict["version"]["hash"].as_str(), verdict["version"]["why"].as_str())
            {
                out.push_str(&format!("    {name} version {hash}: {why}\n"));
            }
        }
        for note in &self.decision.sized {
            out.push_str(&format!("    sized {note}\n"));
        }
        if let Some(existing) = &self.existing_pod {
            let templates = existing
                .status
                .as_ref()
                .map(|s| s.templates.iter().map(|t| format!("{}@{}", t.name, t.hash)).collect::<Vec<_>>().join(", "));
            out.push_str(&match (&existing.drift, templates) {
                (_, None) => "  this pod: no sidecar-injector.io/status annotation (never seen by the injector)\n".to_owned(),
                (PodDrift::Current, Some(t)) => format!("  this pod: injected with [{t}], current\n"),
                (PodDrift::Stale { templates }, Some(t)) => format!(
                    "  this pod: injected with [{t}], stale ({}); {}\n",
                    templates.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "),
                    existing.in_place.as_deref().unwrap_or("restart its workload to update it (sidecar-injector drift --restart)")
                ),
                (PodDrift::Conflicts { templates }, Some(t)) => format!(
                    "  this pod: injected with [{t}], but {} applied with conflicts: the pod's own items stand where the template's would be (see \"skipped\" in its status)\n",
                    templates.join(", ")
                ),
                (PodDrift::NotInjected { templates }, Some(_)) => format!("  this pod: not injected, but {} apply now\n", templates.join(", ")),
                (PodDrift::OutOfScope, Some(t)) => format!("  this pod: injected with [{t}], now out of scope\n"),
                (PodDrift::EnforcementAudit { templates }, Some(t)) => format!(
                    "  this pod: injected with [{t}]; {} (enforced: audit) would refuse it, or be injected into it, with enforced: true\n",
                    templates.join(", ")
                ),
            });
        }
        for error in &self.template_errors {
            out.push_str(&format!("  warning: template not loaded: {error}\n"));
        }
        out
    }
}

/// Options of `drift`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("action").args(["restart", "in_place"])))]
pub struct DriftArgs {
    /// Only this namespace (default: all).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Restart drifted Deployments, StatefulSets and DaemonSets (pod-template annotation, as
    /// `kubectl rollout restart`), one at a time.
    #[arg(long)]
    pub restart: bool,
    /// Update stale pods in place where their templates changed only images: each injected
    /// container gets its new image (kubelet restarts only that container, not the app) and the
    /// status annotation its new versions; any other change is left to --restart, saying why.
    #[arg(long)]
    pub in_place: bool,
    /// With --restart or --in-place: print the plan, change nothing.
    #[arg(long, requires = "action")]
    pub dry_run: bool,
    /// With --restart or --in-place: pause between two workloads, in seconds.
    #[arg(long, default_value_t = 0, requires = "action")]
    pub interval: u64,
    /// With --in-place: how many pods of a workload are updated at once (the next ones wait until
    /// their new containers run).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), requires = "in_place")]
    pub max_updating: u32,
    /// With --restart: how long to wait for each rollout; with --in-place, for each group of pods
    /// to run their new containers; in seconds (0: do not wait).
    #[arg(long, default_value_t = 300, requires = "action")]
    pub rollout_timeout: u64,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Where the injector runs (its namespace and webhook).
    #[command(flatten)]
    pub injector: InjectorRef,
}

/// What `drift` found, and what it judged with.
struct Drifted {
    workloads: Vec<DriftedWorkload>,
    engine: Engine,
    cluster: ClusterFacts,
    namespaces: BTreeMap<String, NamespaceFacts>,
}

async fn drifted(client: &Client, args: &DriftArgs) -> Result<Drifted> {
    let (engine, cluster, errors) = live_engine(client, &args.injector).await?;
    for error in errors {
        eprintln!("warning: template not loaded: {error}");
    }
    let namespaces: BTreeMap<String, NamespaceFacts> = Api::<PartialObjectMeta<Namespace>>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|n| {
            let name = n.name_any();
            (name.clone(), NamespaceFacts::known(&name, n.labels().clone(), n.annotations().clone()))
        })
        .collect();
    let (pods, replica_sets, jobs) = match &args.namespace {
        Some(ns) => (
            Api::<PartialObjectMeta<Pod>>::namespaced(client.clone(), ns).list_metadata(&ListParams::default()).await?,
            Api::<PartialObjectMeta<ReplicaSet>>::namespaced(client.clone(), ns)
                .list_metadata(&ListParams::default())
                .await?,
            Api::<PartialObjectMeta<Job>>::namespaced(client.clone(), ns).list_metadata(&ListParams::default()).await?,
        ),
        None => (
            Api::<PartialObjectMeta<Pod>>::all(client.clone()).list_metadata(&ListParams::default()).await?,
            Api::<PartialObjectMeta<ReplicaSet>>::all(client.clone()).list_metadata(&ListParams::default()).await?,
            Api::<PartialObjectMeta<Job>>::all(client.clone()).list_metadata(&ListParams::default()).await?,
        ),
    };
    // ReplicaSet → its Deployment, Job → its CronJob, per namespace.
    let replica_set_rows =
        replica_sets.items.iter().map(|o| (o.namespace(), "ReplicaSet", o.name_any(), o.owner_references()));
    let job_rows = jobs.items.iter().map(|o| (o.namespace(), "Job", o.name_any(), o.owner_references()));
    let owner_rows: Vec<(String, &str, String, &[_])> = replica_set_rows
        .chain(job_rows)
        .map(|(ns, kind, name, refs)| (ns.unwrap_or_default(), kind, name, refs))
        .collect();
    let owners: Vec<drift::OwnerMetadata> = owner_rows
        .iter()
        .map(|(namespace, kind, name, references)| drift::OwnerMetadata {
            namespace,
            kind,
            name,
            owner_references: references,
        })
        .collect();
    let pod_rows: Vec<(String, String)> =
        pods.items.iter().map(|p| (p.namespace().unwrap_or_default(), p.name_any())).collect();
    let pod_metadata = pods.items.iter().zip(&pod_rows).map(|(pod, (namespace, name))| drift::PodMetadata {
        namespace,
        name,
        labels: pod.labels(),
        annotations: pod.annotations(),
        owner_references: pod.owner_references(),
    });
    let workloads = drift::drifted_workloads(&engine, pod_metadata, &owners, &namespaces);
    Ok(Drifted { workloads, engine, cluster, namespaces })
}

/// `drift [--restart | --in-place]`.
pub async fn drift(client: &Client, args: &DriftArgs) -> Result<String> {
    let drifted = drifted(client, args).await?;
    let workloads = &drifted.workloads;
    let mut out = String::new();
    if args.output == OutputFormat::Json && !args.restart && !args.in_place {
        return Ok(serde_json::to_string_pretty(&workloads)? + "\n");
    }
    if workloads.is_empty() {
        out.push_str("no drift: every injected pod has the current templates, applied without conflicts\n");
    } else {
        out.push_str(&format!(
            "{:<20} {:<32} {:>5} {:>12} {:>9} {:>5}  {:<28} ACTION\n",
            "NAMESPACE", "WORKLOAD", "STALE", "NOT INJECTED", "CONFLICTS", "AUDIT", "TEMPLATES"
        ));
        for w in workloads {
            let action = match &w.action {
                RestartAction::Restart => "restart".to_owned(),
                RestartAction::NextRun => "none: its next run gets them".to_owned(),
                RestartAction::Manual { advice } => advice.clone(),
            };
            out.push_str(&format!(
                "{:<20} {:<32} {:>5} {:>12} {:>9} {:>5}  {:<28} {action}\n",
                w.namespace,
                w.workload.to_string(),
                w.stale_pods.len(),
                w.not_injected_pods.len(),
                w.conflicted_pods.len(),
                w.enforcement_audit_pods.len(),
                w.templates.join(",")
            ));
        }
    }
    if args.restart {
        out.push_str(&restart(client, args, workloads).await?);
    }
    if args.in_place {
        out.push_str(&in_place(client, args, &drifted).await?);
    }
    Ok(out)
}

/// The API resource of a kind of workload.
fn api_resource(row: &workload::WorkloadKind) -> ApiResource {
    let (group, version) = row.api_version.split_once('/').unwrap_or(("", row.api_version));
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: row.api_version.into(),
        kind: row.kind.into(),
        plural: row.plural.into(),
    }
}

/// The resource of a kind of workload `drift --restart` rolls out.
fn resource_of(kind: &str) -> Option<ApiResource> {
    let row = workload::workload_kind(kind).filter(|w| w.restart == workload::Restart::Rollout)?;
    Some(api_resource(row))
}

async fn restart(client: &Client, args: &DriftArgs, workloads: &[DriftedWorkload]) -> Result<String> {
    let mut out = String::new();
    let plan: Vec<&DriftedWorkload> = workloads.iter().filter(|w| w.action == RestartAction::Restart).collect();
    if args.dry_run {
        out.push_str(&format!(
            "\nplan (dry run, nothing changed): {} workload(s) to restart, one at a time\n",
            plan.len()
        ));
        for w in &plan {
            out.push_str(&format!(
                "  would restart {} in {} ({} pod(s) drifted)\n",
                w.workload,
                w.namespace,
                w.stale_pods.len() + w.not_injected_pods.len()
            ));
        }
        return Ok(out);
    }
    for (index, w) in plan.iter().enumerate() {
        if index > 0 && args.interval > 0 {
            tokio::time::sleep(Duration::from_secs(args.interval)).await;
        }
        let resource = resource_of(&w.workload.kind).expect("only restartable kinds are planned");
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &w.namespace, &resource);
        let now = jiff::Timestamp::now().round(jiff::Unit::Second)?.to_string();
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {drift::RESTARTED_AT_ANNOTATION: now}}}}});
        api.patch(&w.workload.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("restarting {}", w.workload))?;
        out.push_str(&format!(
            "restarted {} in {} ({}={now})\n",
            w.workload,
            w.namespace,
            drift::RESTARTED_AT_ANNOTATION
        ));
        if args.rollout_timeout > 0 {
            let took = wait_for_rollout(&api, &w.workload, Duration::from_secs(args.rollout_timeout)).await?;
            out.push_str(&format!("  rolled out in {:.0} s\n", took.as_secs_f64()));
        }
    }
    Ok(out)
}

/// `drift --in-place`: each workload's stale pods, `--max-updating` at a time.
async fn in_place(client: &Client, args: &DriftArgs, drifted: &Drifted) -> Result<String> {
    let mut out = String::new();
    let plan: Vec<&DriftedWorkload> = drifted.workloads.iter().filter(|w| !w.stale_pods.is_empty()).collect();
    out.push_str(&match args.dry_run {
        true => format!(
            "\nplan (dry run, nothing changed): the stale pods of {} workload(s), in place where only images changed\n",
            plan.len()
        ),
        false => {
            format!("\nupdating the stale pods of {} workload(s) in place where only images changed\n", plan.len())
        }
    });
    let (mut updated, mut left) = (0, 0);
    for (index, w) in plan.iter().enumerate() {
        if index > 0 && args.interval > 0 && !args.dry_run {
            tokio::time::sleep(Duration::from_secs(args.interval)).await;
        }
        out.push_str(&format!("{} in {}:\n", w.workload, w.namespace));
        // Pods as JSON: the typed `Pod` would add its whole deserializer to the binary for two reads.
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &w.namespace, &ApiResource::erase::<Pod>(&()));
        let namespace =
            drifted.namespaces.get(&w.namespace).cloned().unwrap_or_else(|| NamespaceFacts::unknown(&w.namespace));
        for group in w.stale_pods.chunks(args.max_updating as usize) {
            let mut waiting = Vec::new();
            for name in group {
                let Some(pod) = api.get_opt(name).await? else {
                    out.push_str(&format!("  pod/{name}: gone\n"));
                    continue;
                };
                let pod = serde_json::to_value(&pod)?;
                let running_before = running_containers(&pod);
                let request = PodRequest {
                    pod: Arc::new(pod),
                    namespace: namespace.clone(),
                    cluster: drifted.cluster,
                    workload: None,
                };
                let update = match drift::in_place::in_place_update(&drifted.engine, &request) {
                    Ok(update) => update,
                    Err(why) => {
                        left += 1;
                        out.push_str(&format!("  pod/{name}: left for --restart: {why}\n"));
                        continue;
                    }
                };
                if args.dry_run {
                    out.push_str(&format!("  pod/{name}: would update in place: {}\n", update.describe()));
                    continue;
                }
                match api.patch(name, &PatchParams::default(), &Patch::Json::<()>(update.patch())).await {
                    Ok(_) => {
                        updated += 1;
                        out.push_str(&format!("  pod/{name}: updated in place: {}\n", update.describe()));
                        waiting.push((name.clone(), update, running_before));
                    }
                    Err(e) => {
                        left += 1;
                        out.push_str(&format!("  pod/{name}: not updated: {}\n", api_error_message(&e)));
                    }
                }
            }
            if args.rollout_timeout > 0 && !waiting.is_empty() {
                let took = wait_for_images(&api, &waiting, Duration::from_secs(args.rollout_timeout)).await?;
                out.push_str(&format!("  their new containers run after {:.0} s\n", took.as_secs_f64()));
            }
        }
    }
    out.push_str(&match args.dry_run {
        true => "no pod was changed (dry run)\n".to_owned(),
        false => format!("{updated} pod(s) updated in place, {left} left for --restart or not updated\n"),
    });
    Ok(out)
}

/// What the API server said, without the client's wrapping.
fn api_error_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(response) => response.message.clone(),
        other => other.to_string(),
    }
}

/// The running containers of a pod (init containers included), by name, with their container ID.
fn running_containers(pod: &Value) -> BTreeMap<String, String> {
    container_statuses(pod)
        .filter(|s| s["state"].get("running").is_some())
        .filter_map(|s| Some((s["name"].as_str()?.to_owned(), s["containerID"].as_str()?.to_owned())))
        .collect()
}

/// The container statuses of a pod (init containers included).
fn container_statuses(pod: &Value) -> impl Iterator<Item = &Value> {
    ["initContainerStatuses", "containerStatuses"]
        .into_iter()
        .flat_map(move |field| pod["status"][field].as_array().into_iter().flatten())
}

/// Waits until, in every updated pod, every container whose image changed and that was running
/// before the update runs again in a new container (the kubelet replaced it) or with the new image.
/// A container that was not running (a pod not started yet, a run-to-completion init container)
/// starts with its new image whenever it starts.
async fn wait_for_images(
    api: &Api<DynamicObject>,
    updated: &[(String, drift::in_place::InPlaceUpdate, BTreeMap<String, String>)],
    timeout: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let mut pending = Vec::new();
        for (name, update, running_before) in updated {
            let Some(pod) = api.get_opt(name).await? else { continue };
            let pod = serde_json::to_value(&pod)?;
            let running_now = running_containers(&pod);
            for change in update.images.iter().filter(|c| running_before.contains_key(&c.container)) {
                let status = container_statuses(&pod).find(|s| s["name"] == change.container.as_str());
                let image = status.and_then(|s| s["image"].as_str()).unwrap_or_default();
                let new_image = image == change.to || image.ends_with(&format!("/{}", change.to));
                let replaced = running_now
                    .get(&change.container)
                    .is_some_and(|id| Some(id) != running_before.get(&change.container));
                let serving = status.is_some_and(|s| s["started"] != false);
                if !(running_now.contains_key(&change.container) && serving && (replaced || new_image)) {
                    pending.push(format!("{name}/{}", change.container));
                }
            }
        }
        if pending.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!(
                "{} did not run its new image within {} s; stopping here (later pods were not updated)",
                pending.join(", "),
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until the workload's controller reports every replica updated and available.
async fn wait_for_rollout(api: &Api<DynamicObject>, workload: &WorkloadRef, timeout: Duration) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let object = serde_json::to_value(api.get(&workload.name).await?)?;
        let (spec, status) = (&object["spec"], &object["status"]);
        let number = |v: &Value| v.as_i64().unwrap_or(0);
        let observed = number(&status["observedGeneration"]) >= number(&object["metadata"]["generation"]);
        let done = observed
            && match workload.kind.as_str() {
                "Deployment" => {
                    let wanted = spec["replicas"].as_i64().unwrap_or(1);
                    number(&status["updatedReplicas"]) == wanted
                        && number(&status["availableReplicas"]) == wanted
                        && number(&status["replicas"]) == wanted
                }
                "StatefulSet" => {
                    number(&status["updatedReplicas"]) == spec["replicas"].as_i64().unwrap_or(1)
                        && status["currentRevision"] == status["updateRevision"]
                }
                _ => {
                    let desired = number(&status["desiredNumberScheduled"]);
                    number(&status["updatedNumberScheduled"]) == desired
                        && number(&status["numberAvailable"]) == desired
                }
            };
        if done {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!(
                "{} did not finish rolling out within {} s; stopping here (later workloads were not restarted)",
                workload,
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The cluster's nodes as the webhook's node watch keeps them, listed in pages of 500 (a real Node
/// is 10-20 KiB of JSON: a cluster of 5,000 in one response would be 75 MiB).
async fn node_pool(client: &Client) -> Result<crate::engine::injection::nodes::NodePool, kube::Error> {
    use crate::engine::injection::nodes::{KnownNodes, NodeFacts, NodeObject};
    let api = Api::<NodeObject>::all(client.clone());
    let mut known = KnownNodes::default();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        for node in &page.items {
            known.upsert(&NodeFacts::of(node));
        }
        match page.metadata.continue_.filter(|next| !next.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok(known.pool()),
        }
    }
}
