//! The rollouts' shell (see `templates::rollout` for the decisions): keeps the kept ConfigMap
//! (`sidecar-injector-versions`, in the injector's namespace) holding what the templates in service
//! want, and, while a rollout reaches pods, watches the pods that got its new version and halts
//! it when their injected containers fail (the threshold is the template's `rollout.halt`).
//!
//! Every replica does both: the writes are idempotent merge patches of the same data (a halt
//! written twice says the same), so no leader is needed, and a replica started later reads what
//! the others wrote. The pod watch runs only while some rollout reaches pods (so a cluster without
//! rollouts pays nothing), selects injected pods by label, and keeps of the pods of a new version
//! only their injected containers' statuses (readiness fails by lasting, so each check judges
//! them again at its own time).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::engine::injection::select;
use crate::engine::model::kinds::CONTAINER_LISTS;
use crate::engine::model::status::InjectionStatus;
use crate::engine::templates::rollout::{self, Halt, Kept};
use crate::engine::{Engine, NamespaceFacts, TemplateSet, names};
use crate::state::{AppState, Namespaces};

/// How often the failures of a rollout's pods are weighed against its threshold.
const HALT_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// How often a replica with no rollout reaching pods looks again.
const IDLE_INTERVAL: Duration = Duration::from_secs(5);

/// The label selector of the template watch: the template ConfigMaps and the kept one come in
/// one watch.
pub fn watch_selector() -> String {
    format!("{} in (true,{})", names::TEMPLATES_CONFIGMAP_LABEL, names::KEPT_LABEL_VALUE)
}

fn label(configmap: &ConfigMap) -> Option<&str> {
    configmap.labels().get(names::TEMPLATES_CONFIGMAP_LABEL).map(String::as_str)
}

/// Whether a ConfigMap of the template watch is the kept one.
pub fn is_kept(configmap: &ConfigMap) -> bool {
    configmap.name_any() == names::KEPT_CONFIGMAP && label(configmap) == Some(names::KEPT_LABEL_VALUE)
}

/// Whether a ConfigMap of the template watch holds templates: labelled `true`. One labelled
/// `kept` under another name is neither templates nor the kept state, and is ignored.
pub fn is_templates(configmap: &ConfigMap) -> bool {
    label(configmap) == Some("true")
}

/// What the kept ConfigMap among `configmaps` holds, and whether there is one.
pub fn kept_of(configmaps: &[Arc<ConfigMap>]) -> (Kept, bool) {
    let Some(configmap) = configmaps.iter().find(|cm| is_kept(cm)) else { return (Kept::default(), false) };
    let (kept, errors) = Kept::from_data(&configmap.data.clone().unwrap_or_default());
    for error in errors {
        tracing::warn!("{error}");
    }
    (kept, true)
}

/// A write the kept ConfigMap needs: a merge patch of its data, or its creation.
#[derive(Debug, Clone, PartialEq)]
pub struct KeptWrite {
    /// Whether the ConfigMap exists (else it is created with the patch's data).
    pub exists: bool,
    /// The merge patch (`{"data": {...}}`; `null` removes a key).
    pub patch: Value,
}

/// The write that makes the kept ConfigMap (`now`) hold what `templates` want, if any.
pub fn kept_write(templates: &TemplateSet, now: &Kept, exists: bool) -> Option<KeptWrite> {
    now.merge_patch_to(templates.kept_wanted()).map(|patch| KeptWrite { exists, patch })
}

/// Applies a [`KeptWrite`] (a ConfigMap another replica created meanwhile is patched instead).
pub async fn write_kept(api: &Api<ConfigMap>, write: &KeptWrite) -> kube::Result<()> {
    if !write.exists {
        let data: BTreeMap<String, String> = write.patch["data"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
            .collect();
        let configmap = ConfigMap {
            metadata: ObjectMeta {
                name: Some(names::KEPT_CONFIGMAP.to_owned()),
                labels: Some(BTreeMap::from([(
                    names::TEMPLATES_CONFIGMAP_LABEL.to_owned(),
                    names::KEPT_LABEL_VALUE.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        };
        match api.create(&PostParams::default(), &configmap).await {
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            other => return other.map(drop),
        }
    }
    api.patch(names::KEPT_CONFIGMAP, &PatchParams::default(), &Patch::Merge(&write.patch)).await.map(drop)
}

/// A pod of a live rollout's new version, as the halt watch keeps it: what it needs to judge the
/// pod's injected containers at every check (readiness fails by lasting, without a new event).
#[derive(Debug, Clone)]
struct Tracked {
    /// `(template, version)` of every live rollout whose new version the pod has.
    versions: Vec<(String, String)>,
    /// The strictest thresholds among them.
    thresholds: rollout::HaltThresholds,
    /// The injected containers' names.
    containers: Vec<String>,
    /// The statuses of those containers only (`initContainerStatuses`, `containerStatuses`).
    statuses: Value,
    /// The pod's controller, for the Event.
    owner: Option<ObjectReference>,
}

impl Tracked {
    /// What failed in the pod at `now`, if anything.
    fn failure(&self, now: jiff::Timestamp) -> Option<String> {
        let containers: Vec<&str> = self.containers.iter().map(String::as_str).collect();
        rollout::container_failure(&self.statuses, &containers, self.thresholds, now)
    }
}

/// A rollout under way whose new version reaches pods.
struct Live {
    template: String,
    /// The new version.
    version: String,
    halt: rollout::HaltThresholds,
    /// The containers the new version injects (`None`: a name is computed).
    containers: Option<Vec<String>>,
}

/// The rollouts under way whose new version reaches pods.
fn live_rollouts(templates: &TemplateSet) -> Vec<Live> {
    templates
        .rollouts()
        .filter(|(_, active)| active.reaches_anyone())
        .filter_map(|(name, active)| {
            let current = templates.get(name)?;
            Some(Live {
                template: name.to_owned(),
                version: current.hash.clone(),
                halt: active.spec.halt,
                containers: rollout::container_names(current),
            })
        })
        .collect()
}

/// A pod to keep watching: one whose status names the new version of a live rollout, of a
/// template the injector gives it now (`engine`'s choice for its labels, annotations and
/// namespace, `namespace`: `None` where the cache does not know it). The label and the status are
/// the pod's claims, which any pod may make: a pod the injector does not serve with that template
/// (a namespace not opted in, a pod opted out) cannot halt its rollout. Of the pod's injected
/// containers, only those the new versions inject are judged (another template's failing sidecar
/// halts nothing).
fn tracked(
    pod: &Pod,
    live: &[Live],
    engine: &Engine,
    namespace: impl FnOnce(&str) -> Option<NamespaceFacts>,
) -> Option<Tracked> {
    let status = InjectionStatus::parse(pod.annotations().get(names::STATUS_ANNOTATION)?).ok()?;
    let claimed = |l: &&Live| status.templates.iter().any(|t| t.name == l.template && t.hash == l.version);
    let mut versions: Vec<&Live> = live.iter().filter(claimed).collect();
    if versions.is_empty() {
        return None;
    }
    let namespace = namespace(pod.metadata.namespace.as_deref().unwrap_or_default())?;
    let choice =
        select::select(&engine.templates, pod.labels(), pod.annotations(), &namespace, &engine.excluded_namespaces);
    let choice = choice.ok()?;
    versions.retain(|l| choice.selected().any(|name| name == l.template));
    let thresholds = rollout::HaltThresholds {
        failed_pods: versions.iter().map(|v| v.halt.failed_pods).min()?,
        restarts: versions.iter().map(|v| v.halt.restarts).min()?,
        unready_seconds: versions.iter().map(|v| v.halt.unready_seconds).min()?,
    };
    let injected = CONTAINER_LISTS.iter().flat_map(|list| (list.claimed)(&status));
    let theirs = |name: &&String| {
        versions.iter().any(|v| v.containers.as_ref().is_none_or(|names| names.iter().any(|n| n == *name)))
    };
    let containers: Vec<String> = injected.filter(theirs).cloned().collect();
    let pod_status = serde_json::to_value(pod.status.as_ref()?).ok()?;
    let ours = |field: &str| -> Value {
        let list = pod_status.get(field).and_then(Value::as_array).into_iter().flatten();
        Value::Array(
            list.filter(|s| s.get("name").and_then(Value::as_str).is_some_and(|n| containers.iter().any(|c| c == n)))
                .cloned()
                .collect(),
        )
    };
    let statuses = serde_json::json!({
        "initContainerStatuses": ours("initContainerStatuses"),
        "containerStatuses": ours("containerStatuses"),
    });
    let owner_json = serde_json::json!({"metadata": {"ownerReferences": pod.metadata.owner_references}});
    Some(Tracked {
        versions: versions.into_iter().map(|l| (l.template.clone(), l.version.clone())).collect(),
        thresholds,
        containers,
        statuses,
        owner: crate::admission::events::owner_of(&owner_json, &pod.namespace().unwrap_or_default()),
    })
}

/// The facts of a namespace as the namespace cache has them now (`None`: not there, or no cache).
fn cached_namespace(state: &AppState, name: &str) -> Option<NamespaceFacts> {
    let Namespaces::Cache { store, .. } = &state.namespaces else { return None };
    let namespace = store.get(&ObjectRef::new(name))?;
    Some(NamespaceFacts::known(name, namespace.labels().clone(), namespace.annotations().clone()))
}

/// Starts the halt watch (see the module's doc). Without the pod watch (`cluster.watch_pods:
/// false`, the `no-drift-metrics` component, which also takes the permission away) no rollout
/// halts by itself: each one that reaches pods is logged as such, once.
pub fn watch_rollouts(client: Client, namespace: String, state: Arc<AppState>, watch_pods: bool) {
    tokio::spawn(async move {
        let mut told: BTreeSet<(String, String)> = BTreeSet::new();
        loop {
            let live = live_rollouts(&state.engine.load().templates);
            // A pod counts only where its namespace is known (`tracked`): not before the
            // namespace cache has its first list.
            if !state.readiness.namespaces_synced.load(Ordering::Relaxed) {
                tokio::time::sleep(IDLE_INTERVAL).await;
                continue;
            }
            if live.is_empty() || !watch_pods {
                for Live { template: name, version, .. } in live {
                    if told.contains(&(name.clone(), version.clone())) {
                        continue;
                    }
                    tracing::warn!(
                        template = name,
                        version,
                        "a rollout reaches pods, but the pod watch is off (cluster.watch_pods: false): it will not halt by itself; watch the new version's pods yourself"
                    );
                    told.insert((name, version));
                }
                tokio::time::sleep(IDLE_INTERVAL).await;
                continue;
            }
            tracing::info!("a rollout reaches pods: watching the pods of its new version");
            watch_while_live(&client, &namespace, &state).await;
        }
    });
}

/// What woke the halt watch: a pod event (`None`: the watch ended) or the periodic check.
enum Wake<E> {
    Pod(Option<E>),
    Check,
}

/// Watches injected pods and halts rollouts whose new version fails, until no rollout reaches pods.
async fn watch_while_live(client: &Client, namespace: &str, state: &Arc<AppState>) {
    let config = watcher::Config::default().labels(names::INJECTED_LABEL);
    let stream = watcher(Api::<Pod>::all(client.clone()), config).backoff(super::backoff());
    futures::pin_mut!(stream);
    let mut watched: BTreeMap<(String, String), Tracked> = BTreeMap::new();
    let mut halted_here: BTreeSet<(String, String)> = BTreeSet::new();
    let mut tick = tokio::time::interval(HALT_CHECK_INTERVAL);
    // The live rollouts of the engine in service, computed again only when it changes (not at
    // every pod event or check).
    let mut engine = state.engine.load_full();
    let mut live = live_rollouts(&engine.templates);
    loop {
        let wake = tokio::select! {
            event = stream.next() => Wake::Pod(event),
            _ = tick.tick() => Wake::Check,
        };
        let now = state.engine.load_full();
        if !Arc::ptr_eq(&now, &engine) {
            engine = now;
            live = live_rollouts(&engine.templates);
        }
        match wake {
            Wake::Pod(Some(Ok(watcher::Event::Init))) => watched.clear(),
            Wake::Pod(Some(Ok(watcher::Event::InitApply(pod) | watcher::Event::Apply(pod)))) => {
                let key = (pod.namespace().unwrap_or_default(), pod.name_any());
                match tracked(&pod, &live, &engine, |name| cached_namespace(state, name)) {
                    Some(pod) => drop(watched.insert(key, pod)),
                    None => drop(watched.remove(&key)),
                }
            }
            Wake::Pod(Some(Ok(watcher::Event::Delete(pod)))) => {
                drop(watched.remove(&(pod.namespace().unwrap_or_default(), pod.name_any())))
            }
            Wake::Pod(Some(Ok(watcher::Event::InitDone))) => {}
            Wake::Pod(Some(Err(error))) => tracing::warn!(%error, "rollout pod watch failed; retrying with backoff"),
            Wake::Pod(None) => return,
            // The check: every live rollout's pods weighed against its threshold.
            Wake::Check if live.is_empty() => return,
            Wake::Check => {
                for Live { template: name, version, halt: thresholds, .. } in &live {
                    if halted_here.contains(&(name.clone(), version.clone())) {
                        continue;
                    }
                    let now = jiff::Timestamp::now();
                    let of_version =
                        watched.iter().filter(|(_, t)| t.versions.iter().any(|v| v.0 == *name && v.1 == *version));
                    let failed: Vec<(String, String, Option<ObjectReference>)> = of_version
                        .filter_map(|((ns, pod), t)| {
                            t.failure(now).map(|what| (format!("{ns}/{pod}"), what, t.owner.clone()))
                        })
                        .collect();
                    let failures: Vec<(String, String)> =
                        failed.iter().map(|(pod, what, _)| (pod.clone(), what.clone())).collect();
                    let Some(reason) = rollout::halt_reason(version, &failures, *thresholds) else { continue };
                    let owners: Vec<ObjectReference> = failed.into_iter().filter_map(|(_, _, owner)| owner).collect();
                    match halt(client, namespace, state, &engine.templates, name, version, &reason, owners).await {
                        Ok(()) => drop(halted_here.insert((name.clone(), version.clone()))),
                        Err(error) => {
                            tracing::error!(template = name, %error, "halting the rollout failed; trying again")
                        }
                    }
                }
            }
        }
    }
}

/// Halts a rollout: the kept record says so (every replica then serves the earlier version), an
/// Event on the template's ConfigMap and on the failed pods' workloads, a metric, a log line.
#[allow(clippy::too_many_arguments)]
async fn halt(
    client: &Client,
    namespace: &str,
    state: &AppState,
    templates: &TemplateSet,
    name: &str,
    version: &str,
    reason: &str,
    owners: Vec<ObjectReference>,
) -> kube::Result<()> {
    let at = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map_or_else(|_| jiff::Timestamp::now().to_string(), |t| t.to_string());
    let mut wanted = templates.kept_wanted().clone();
    let record = wanted.records.entry(name.to_owned()).or_default();
    record.halted = Some(Halt { version: version.to_owned(), reason: reason.to_owned(), at: at.clone() });
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    if let Some(patch) = templates.kept_wanted().merge_patch_to(&wanted) {
        write_kept(&api, &KeptWrite { exists: true, patch }).await?;
    }
    state.metrics.rollout_halts.get_or_create(&crate::telemetry::TemplateLabel { template: name.to_owned() }).inc();
    let from = templates.rollout(name).map(|a| a.from.hash.clone()).unwrap_or_default();
    let message = format!(
        "rollout of template {name} version {version} halted: {reason}. New pods get version {from} again; `sidecar-injector drift` lists the pods that got {version}, and `drift --in-place` or `--restart` brings them back"
    );
    tracing::error!(template = name, version, "{message}");
    let mut regarding: Vec<ObjectReference> = owners;
    regarding.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    regarding.dedup_by(|a, b| a.uid == b.uid);
    let listed = api.list(&ListParams::default().labels(&format!("{}=true", names::TEMPLATES_CONFIGMAP_LABEL))).await;
    let holder = listed.ok().and_then(|list| {
        list.items.into_iter().find(|cm| cm.data.as_ref().is_some_and(|d| d.contains_key(&format!("{name}.yaml"))))
    });
    if let Some(configmap) = holder {
        regarding.insert(0, crate::admission::events::configmap(namespace, &configmap.name_any(), configmap.uid()));
    }
    let intents = regarding.iter().map(|r| crate::admission::events::rollout_halted(r, &message)).collect();
    let dropped = state.events.send(intents);
    state.metrics.event("dropped", dropped as u64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::TemplateSource;
    use crate::engine::templates::set::InProcess;

    const AGENT_1: &str = "default: true\ninject:\n  sidecars:\n    - {name: agent, image: agent:1}\n";
    const AGENT_2: &str =
        "default: true\nrollout: {share: 100}\ninject:\n  sidecars:\n    - {name: agent, image: agent:2}\n";
    const OTHER: &str = "default: true\ninject:\n  sidecars:\n    - {name: other, image: other:1}\n";

    fn sources(agent: &str) -> Vec<TemplateSource> {
        [("agent", agent), ("other", OTHER)]
            .into_iter()
            .map(|(name, text)| TemplateSource { name: name.into(), text: text.into() })
            .collect()
    }

    fn namespace(opted_in: bool) -> NamespaceFacts {
        let value = if opted_in { "enabled" } else { "disabled" };
        NamespaceFacts::known("shop", [(names::INJECT_LABEL.to_owned(), value.to_owned())].into(), BTreeMap::new())
    }

    /// A pod whose status names `agent` at `version` and `other`, with both sidecars crash-looping
    /// or only `failing`.
    fn pod(version: &str, failing: &[&str]) -> Pod {
        let status = format!(
            r#"{{"templates":[{{"name":"agent","hash":"{version}"}},{{"name":"other","hash":"x"}}],"initContainers":["agent","other"]}}"#
        );
        let statuses: Vec<Value> = ["agent", "other"]
            .iter()
            .map(|name| match failing.contains(name) {
                true => {
                    serde_json::json!({"name": name, "ready": false, "restartCount": 9, "image": "i", "imageID": "",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}}})
                }
                false => {
                    serde_json::json!({"name": name, "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                    "state": {"running": {}}})
                }
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop",
                "labels": {names::INJECTED_LABEL: "true"},
                "annotations": {names::STATUS_ANNOTATION: status}},
            "spec": {"containers": [{"name": "app", "image": "app:1"}]},
            "status": {"initContainerStatuses": statuses}
        }))
        .unwrap()
    }

    #[test]
    fn only_pods_the_injector_serves_and_only_the_new_versions_containers_can_halt_a_rollout() {
        let (first, _) = TemplateSet::default().update_with_kept(sources(AGENT_1), &Kept::default(), &InProcess);
        let (rolling, errors) = first.update_with_kept(sources(AGENT_2), &Kept::default(), &InProcess);
        assert!(errors.is_empty(), "{errors:?}");
        let version = rolling.get("agent").unwrap().hash.clone();
        let engine = Engine::new(rolling, Vec::new());
        let live = live_rollouts(&engine.templates);
        assert_eq!(live[0].containers.as_deref(), Some(&["agent".to_owned()][..]));
        let now = jiff::Timestamp::now();
        let failure = |pod: &Pod, namespace: Option<&NamespaceFacts>| {
            tracked(pod, &live, &engine, |_| namespace.cloned()).and_then(|t| t.failure(now))
        };
        let opted_in = namespace(true);
        assert!(failure(&pod(&version, &["agent"]), Some(&opted_in)).is_some_and(|f| f.contains("CrashLoopBackOff")));
        // Another template's failing sidecar is not the rollout's failure.
        assert_eq!(failure(&pod(&version, &["other"]), Some(&opted_in)), None);
        // The label and status are claims: where the injector does not serve the template (a
        // namespace not opted in, one the cache does not know, a pod opted out), nothing counts.
        assert!(tracked(&pod(&version, &["agent"]), &live, &engine, |_| Some(namespace(false))).is_none());
        assert!(tracked(&pod(&version, &["agent"]), &live, &engine, |_| None).is_none());
        let mut opted_out = pod(&version, &["agent"]);
        opted_out.metadata.labels.get_or_insert_default().insert(names::INJECT_LABEL.into(), "disabled".into());
        assert!(tracked(&opted_out, &live, &engine, |_| Some(opted_in.clone())).is_none());
        // A pod of another version is not watched.
        assert!(tracked(&pod("0123456789abcdef", &["agent"]), &live, &engine, |_| Some(opted_in.clone())).is_none());
    }
}
