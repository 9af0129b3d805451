//! The cluster shell: kube-rs reflectors for namespaces (metadata only, cluster-wide) and for the
//! template ConfigMaps (the injector's namespace, by label only — never a cluster-wide ConfigMap
//! watch), the cluster version, and where the self-managed certificate is kept (`cert_secret`).
//!
//! Admission requests read namespace labels from the reflector's store, never from an API call.
//! Watches reconnect with backoff; while the API server is away the stores keep their last state and
//! the webhook keeps answering from them. The backoff is capped at 1 s rather than kube's default
//! 30 s: a restarted API server first answers the old watches with errors (403 while its RBAC cache
//! warms up, then 410 Expired, which forces a re-list), each followed by a backoff, so after an
//! outage of a minute the default would delay a template edit by half a minute and a 3 s cap still
//! by 6 s (measured in the e2e outage scenario). Two watches retrying once a second — one
//! namespaced ConfigMap watch, one metadata-only namespace watch — cost the API server nothing.

pub mod cert_secret;
pub mod enforcement;
pub mod events;
pub mod rollouts;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::engine::drift::pod_index::{PodIndex, WatchedPod, drift_counts};
use crate::engine::injection::nodes::{KnownNodes, NodeFacts, NodeObject};
use crate::engine::review::validate::template_sources;
use crate::engine::{ClusterFacts, NamespaceFacts, TemplateSource, names};
use crate::state::{AppState, Readiness};
use crate::telemetry::Metrics;

/// The reconnect backoff of the watches: 0.25 s doubling to 1 s, with jitter.
pub(crate) fn backoff() -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(1))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// Starts the namespace reflector; returns its store. The readiness flag turns on when it has synced.
pub fn watch_namespaces(
    client: Client,
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
) -> Store<PartialObjectMeta<Namespace>> {
    let (reader, writer) = reflector::store();
    let stream = watcher(Api::<PartialObjectMeta<Namespace>>::all(client), watcher::Config::default())
        .backoff(backoff())
        .modify(|ns| ns.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects();
    let counted = reader.clone();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(_)) => drop(metrics.namespaces_watched.set(counted.len() as i64)),
                Ok(None) => break,
                Err(error) => tracing::warn!(%error, "namespace watch failed; retrying with backoff"),
            }
        }
    });
    let ready = reader.clone();
    tokio::spawn(async move {
        if ready.wait_until_ready().await.is_ok() {
            readiness.namespaces_synced.store(true, Ordering::Relaxed);
            tracing::info!(namespaces = ready.len(), "namespace cache synced");
        }
    });
    reader
}

/// Nodes per page of a paged list: a real Node is 10-20 KiB of JSON, so kube's default of 500 made
/// pages of 8 MiB, each read whole before it was parsed (the scale run's restart with paged lists
/// at 5,000 nodes ended 18 MiB above the same start without nodes).
const NODE_PAGE_SIZE: u32 = 100;

/// Starts a watch of the nodes that keeps, per node, only its name, labels, kubelet and runtime
/// versions (`engine::injection::nodes::KnownNodes`), and publishes a new pool to `state.nodes`
/// whenever one of those changes (a node's status heartbeat changes nothing kept, so it costs the
/// decoding of the fields read and one comparison). Events the watch already holds are applied
/// together before a pool is built: events that come faster than pools are built share one build,
/// and no pool is published without an event that had arrived. With `streaming` the first list
/// comes as watch events from the API server's cache, one node at a time.
pub fn watch_nodes(client: Client, state: Arc<AppState>, streaming: bool) {
    let config = watcher::Config::default().page_size(NODE_PAGE_SIZE);
    let config = if streaming { config.streaming_lists() } else { config };
    let stream = watcher(Api::<NodeObject>::all(client), config).backoff(backoff());
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        let mut watch = NodeWatch::default();
        while let Some(event) = stream.next().await {
            let mut changed = watch.apply(event);
            for _ in 0..NODE_EVENTS_PER_BUILD {
                match stream.next().now_or_never() {
                    Some(Some(event)) => changed |= watch.apply(event),
                    Some(None) | None => break,
                }
            }
            if changed {
                watch.known = publish_nodes(std::mem::take(&mut watch.known), &state).await;
            }
        }
    });
}

/// Most events applied before a pool is built, so a flood of events cannot hold one back.
const NODE_EVENTS_PER_BUILD: usize = 1000;

/// The node watch's state: the nodes known, and those of a list in progress.
#[derive(Default)]
struct NodeWatch {
    known: KnownNodes,
    listing: Option<KnownNodes>,
}

impl NodeWatch {
    /// Applies one event of the watch; true when the pool has to be built again.
    fn apply(&mut self, event: Result<watcher::Event<NodeObject>, watcher::Error>) -> bool {
        match event {
            Ok(watcher::Event::Apply(node)) => self.known.upsert(&NodeFacts::of(&node)),
            Ok(watcher::Event::Delete(node)) => self.known.remove(&node.name_any()),
            Ok(watcher::Event::Init) => {
                self.listing = Some(KnownNodes::default());
                false
            }
            Ok(watcher::Event::InitApply(node)) => {
                self.listing.get_or_insert_with(KnownNodes::default).upsert(&NodeFacts::of(&node));
                false
            }
            Ok(watcher::Event::InitDone) => {
                self.known = self.listing.take().unwrap_or_default();
                true
            }
            Err(error) => {
                tracing::warn!(%error, "node watch failed; retrying with backoff");
                false
            }
        }
    }
}

/// Builds a pool of `known` off the async workers (tens of milliseconds at thousands of nodes) and
/// publishes it; returns `known`.
async fn publish_nodes(mut known: KnownNodes, state: &Arc<AppState>) -> KnownNodes {
    let state = state.clone();
    let built = tokio::task::spawn_blocking(move || {
        let pool = known.pool();
        // Every node create or label change builds a pool (5,000 builds in a burst of creates), so
        // only a new oldest kubelet, which decides the pods without node constraints, is an info line.
        if pool.oldest() != state.nodes.load().oldest() {
            tracing::info!(nodes = known.len(), readable = pool.len(), oldest_kubelet = ?pool.oldest(), "the oldest kubelet changed");
        } else {
            tracing::debug!(nodes = known.len(), readable = pool.len(), oldest_kubelet = ?pool.oldest(), "node pool rebuilt");
        }
        // The pool first: whoever sees the gauge count a node finds it in the pool in service.
        state.nodes.store(Arc::new(pool));
        state.metrics.nodes_watched.set(known.len() as i64);
        known
    });
    match built.await {
        Ok(known) => known,
        // Only a panic in the pure build gets here: the pool in service stays, and the nodes come
        // back with their next update or the next list.
        Err(error) => {
            tracing::error!(%error, "building the node pool failed");
            KnownNodes::default()
        }
    }
}

/// Starts the template ConfigMap reflector; every change rebuilds the templates in service.
pub fn watch_templates(client: Client, namespace: &str, state: Arc<AppState>) {
    let (reader, writer) = reflector::store::<ConfigMap>();
    // The kept ConfigMap (`rollouts`) comes with the templates: one watch.
    let config = watcher::Config::default().labels(&rollouts::watch_selector());
    let api = Api::<ConfigMap>::namespaced(client, namespace);
    let stream =
        watcher(api.clone(), config).backoff(backoff()).modify(|cm| cm.managed_fields_mut().clear()).reflect(writer);
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        // A failed write of the kept ConfigMap is retried here, between events, so that what the
        // watch read (the store) and the templates built from it (the engine) are read together:
        // a retry never undoes a write that came back through the watch (another replica's halt).
        let mut retry: Option<Duration> = None;
        loop {
            let wait = async {
                match retry {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
            };
            let write = tokio::select! {
                event = stream.next() => match event {
                    None => break,
                    // Loading templates runs the sandbox and waits for it: not on an async worker.
                    Some(Ok(event)) => {
                        let (on_state, on_reader) = (state.clone(), reader.clone());
                        let loaded = tokio::task::spawn_blocking(move || on_template_event(&on_state, &on_reader, &event));
                        match loaded.await {
                            Err(error) => {
                                tracing::error!(%error, "loading templates failed");
                                None
                            }
                            Ok(write) => write,
                        }
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "template ConfigMap watch failed; retrying with backoff");
                        None
                    }
                },
                () = wait => {
                    let (kept, exists) = rollouts::kept_of(&reader.state());
                    let write = rollouts::kept_write(&state.engine.load().templates, &kept, exists);
                    if write.is_none() {
                        retry = None;
                    }
                    write
                }
            };
            let Some(write) = write else { continue };
            match rollouts::write_kept(&api, &write).await {
                Ok(()) => retry = None,
                Err(error) => {
                    let delay = retry.map_or(KEPT_RETRY_FIRST, |d| (d * 2).min(KEPT_RETRY_LONGEST));
                    tracing::warn!(%error, "writing {} failed; retrying in {delay:?}", names::KEPT_CONFIGMAP);
                    retry = Some(delay);
                }
            }
        }
    });
}

/// The first wait before a failed write of the kept ConfigMap is tried again, and the longest.
const KEPT_RETRY_FIRST: Duration = Duration::from_secs(2);
const KEPT_RETRY_LONGEST: Duration = Duration::from_secs(60);

/// Reacts to one template ConfigMap watch event (already applied to `store`): once the initial
/// list is complete, and on every change after it, the templates in service are rebuilt from the
/// whole store (the kept ConfigMap included: `rollouts`). Returns the write the kept ConfigMap
/// then needs, if any.
pub fn on_template_event(
    state: &AppState,
    store: &Store<ConfigMap>,
    event: &watcher::Event<ConfigMap>,
) -> Option<rollouts::KeptWrite> {
    if matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
        return None;
    }
    let all = store.state();
    let (kept, exists) = rollouts::kept_of(&all);
    let templates: Vec<Arc<ConfigMap>> = all.into_iter().filter(|cm| rollouts::is_templates(cm)).collect();
    let errors = state.update_templates_with_kept(sources_of(&templates), &kept);
    state.readiness.templates_synced.store(true, Ordering::Relaxed);
    // An edit that broke one of this ConfigMap's templates: the last good version stays in
    // service, and the ConfigMap says so (the validating webhook refuses such edits first, when
    // it is up).
    if let watcher::Event::Apply(configmap) = event {
        let own: Vec<String> = sources_of(&[Arc::new(configmap.clone())]).into_iter().map(|s| s.name).collect();
        let mine: Vec<String> = errors.iter().filter(|e| own.contains(&e.template)).map(ToString::to_string).collect();
        if !mine.is_empty() {
            let regarding = crate::admission::events::configmap(
                &configmap.namespace().unwrap_or_default(),
                &configmap.name_any(),
                configmap.uid(),
            );
            let message = format!("not applied, the last good version stays in service: {}", mine.join("; "));
            let dropped = state.events.send(vec![crate::admission::events::template_edit(regarding, false, &message)]);
            state.metrics.event("dropped", dropped as u64);
        }
    }
    rollouts::kept_write(&state.engine.load().templates, &kept, exists)
}

/// Pods per page of a paged pod list. The API server's watch cache copies out every pod after a
/// page's first to serve it, so its work grows with pods × pages: at 150,000 pods (the scale run)
/// it alone served pages of 500, kube's default, in 20-41 s, and pages of 2,000 in 11 s. A page is
/// read whole (~2 KiB of metadata JSON a pod, managed fields included: ~4 MiB, held about twice
/// while it is read) and decoded as [`WatchedPod`], which keeps ~200 bytes of each pod. The paged
/// restart at that size synced in 11.6 s with an RSS of 80.7 MiB after the sync (peak 95.3 MiB);
/// with pages of 1,000 decoded as whole metadata objects it had been 41 s and 117 MiB.
pub const POD_PAGE_SIZE: u32 = 2_000;

/// Starts a metadata-only watch of every pod, read as [`WatchedPod`] and kept in a [`PodIndex`]
/// (only what drift reads, in a compact form: see its module), and every `interval` counts the
/// drifted pods into `sidecar_injector_drifted_pods`. With `streaming`, the initial list and every
/// re-list come as a streaming list (a watch with `sendInitialEvents`, the API server's
/// `WatchList`): the API server sends the pods one by one from its watch cache instead of building
/// pages, and the injector decodes one pod at a time. An API server that refuses it (the feature
/// turned off, as it is by default in Kubernetes 1.33) gets paged lists of [`POD_PAGE_SIZE`] pods.
pub fn watch_drift(
    client: Client,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    state: Arc<AppState>,
    interval: Duration,
    streaming: bool,
) {
    let index = Arc::new(Mutex::new(PodIndex::new()));
    let metrics = state.metrics.clone();
    let fed = index.clone();
    tokio::spawn(async move {
        let mut streaming = streaming;
        'strategy: loop {
            let config = watcher::Config::default().page_size(POD_PAGE_SIZE);
            let config = if streaming { config.streaming_lists() } else { config };
            let stream = watcher(Api::<WatchedPod>::all(client.clone()), config).backoff(backoff());
            futures::pin_mut!(stream);
            let started = std::time::Instant::now();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        let pods = apply_pod_event(&mut fed.lock().expect("pod index lock"), &event);
                        metrics.pods_watched.set(pods as i64);
                        if matches!(event, watcher::Event::InitDone) {
                            let seconds = started.elapsed().as_secs_f64();
                            tracing::info!(pods, seconds, streaming, "pod index synced");
                        }
                    }
                    Err(watcher::Error::WatchStartFailed(kube::Error::Api(status)))
                        if streaming
                            && matches!(status.code, 400 | 422)
                            && !fed.lock().expect("pod index lock").synced() =>
                    {
                        tracing::warn!(error = %status.message, "the API server refuses streaming lists; using paged lists");
                        streaming = false;
                        continue 'strategy;
                    }
                    Err(error) => tracing::warn!(%error, "pod metadata watch failed; retrying with backoff"),
                }
            }
            break;
        }
    });
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        loop {
            ticker.tick().await;
            let (state, index, namespaces) = (state.clone(), index.clone(), namespaces.clone());
            // 150,000 pods are a few milliseconds of work: not for an async worker.
            let counted = tokio::task::spawn_blocking(move || count_drift(&state, &index, &namespaces));
            if let Err(error) = counted.await {
                tracing::error!(%error, "counting drifted pods failed");
            }
        }
    });
}

/// Applies one pod watch event to the index; returns how many pods it holds.
pub fn apply_pod_event(index: &mut PodIndex, event: &watcher::Event<WatchedPod>) -> usize {
    let apply = |index: &mut PodIndex, pod: &WatchedPod| {
        index.apply(&pod.namespace().unwrap_or_default(), &pod.name_any(), pod.labels(), pod.annotations());
    };
    match event {
        watcher::Event::Init => index.begin_list(),
        watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => apply(index, pod),
        watcher::Event::InitDone => index.end_list(),
        watcher::Event::Delete(pod) => index.remove(&pod.namespace().unwrap_or_default(), &pod.name_any()),
    }
    index.len()
}

/// Recomputes the drift gauges from the pod index (once it has synced: a partial count would
/// report pods as missing).
pub fn count_drift(state: &AppState, index: &Mutex<PodIndex>, namespaces: &Store<PartialObjectMeta<Namespace>>) {
    use crate::telemetry::DriftLabels;
    let groups = {
        let mut index = index.lock().expect("pod index lock");
        if !index.synced() {
            return;
        }
        index.prune();
        index.groups()
    };
    let engine = state.engine.load();
    let counts = drift_counts(&engine, &groups, |name| {
        let namespace = namespaces.get(&ObjectRef::new(name))?;
        Some(NamespaceFacts::known(name, namespace.labels().clone(), namespace.annotations().clone()))
    });
    let family = &state.metrics.drifted_pods;
    family.clear();
    for ((namespace, template, state), count) in counts {
        family.get_or_create(&DriftLabels { namespace, template, state: state.into() }).set(count);
    }
}

/// The templates of every ConfigMap, ConfigMaps in name order (a name defined twice: the first wins).
pub fn sources_of(configmaps: &[Arc<ConfigMap>]) -> Vec<TemplateSource> {
    let mut configmaps: Vec<&Arc<ConfigMap>> = configmaps.iter().collect();
    configmaps.sort_by_key(|cm| cm.name_any());
    let mut sources = Vec::new();
    for configmap in configmaps {
        let data: BTreeMap<String, String> = configmap.data.clone().unwrap_or_default();
        let (found, warnings) = template_sources(&data);
        for warning in warnings {
            tracing::warn!(configmap = %configmap.name_any(), "{warning}");
        }
        sources.extend(found);
    }
    sources
}

/// The cluster's facts from its version; recent-cluster defaults when it cannot be read.
pub async fn cluster_facts(client: &Client) -> ClusterFacts {
    match client.apiserver_version().await {
        Ok(info) => match ClusterFacts::from_version(&info.major, &info.minor) {
            Some(facts) => {
                tracing::info!(version = %info.git_version, native_sidecars = facts.native_sidecars, "Kubernetes version");
                facts
            }
            None => {
                tracing::warn!(major = %info.major, minor = %info.minor, "unreadable Kubernetes version; assuming native sidecars");
                ClusterFacts::default()
            }
        },
        Err(error) => {
            tracing::warn!(%error, "cannot read the Kubernetes version; assuming native sidecars");
            ClusterFacts::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::engine::Engine;
    use kube::runtime::reflector::store::Writer;

    fn state() -> AppState {
        AppState {
            engine: arc_swap::ArcSwap::from_pointee(Engine::default()),
            namespaces: crate::state::Namespaces::Unknown,
            cluster: arc_swap::ArcSwap::from_pointee(ClusterFacts::default()),
            own_namespace: "sidecar-injector".into(),
            metrics: Arc::new(Metrics::default()),
            readiness: Arc::new(Readiness { namespaces_synced: true.into(), ..Readiness::default() }),
            max_body_bytes: 1 << 20,
            max_inflight_bytes: 1 << 20,
            inflight_kib: crate::state::InflightRoom::new(1 << 20, 1 << 20),
            body_timeout: Duration::from_secs(1),
            room_wait: Duration::from_secs(1),
            precheck: Arc::new(crate::engine::templates::set::InProcess),
            template_work: Default::default(),
            template_queue: Arc::new(tokio::sync::Semaphore::new(1)),
            events: Default::default(),
            nodes: Default::default(),
        }
    }

    fn configmap(name: &str, data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("sidecar-injector".into()),
                labels: Some([(names::TEMPLATES_CONFIGMAP_LABEL.to_owned(), "true".to_owned())].into()),
                ..Default::default()
            },
            data: Some(data.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn a_rollout_has_the_version_it_rolls_from_kept_once_and_every_replica_reads_it_back() {
        let v1 = "default: true\ninject:\n  labels: {a: b}\n";
        let v2 = "default: true\nrollout: {share: 30}\ninject:\n  labels: {a: c}\n";
        let state = state();
        let mut writer = Writer::<ConfigMap>::default();
        let store = writer.as_reader();
        let mut apply = |event: watcher::Event<ConfigMap>| {
            writer.apply_watcher_event(&event);
            on_template_event(&state, &store, &event)
        };
        apply(watcher::Event::Init);
        apply(watcher::Event::InitApply(configmap("sidecar-templates", &[("logs.yaml", v1)])));
        assert_eq!(apply(watcher::Event::InitDone), None, "no rollout, nothing written");
        let write = apply(watcher::Event::Apply(configmap("sidecar-templates", &[("logs.yaml", v2)])))
            .expect("the version rolled from is written");
        assert!(!write.exists);
        let data = write.patch["data"].as_object().unwrap();
        let old = crate::engine::Template::load("logs", v1).unwrap().hash;
        assert_eq!(data[&format!("logs.{old}.yaml")], json!(v1));
        assert!(data["logs.json"].as_str().unwrap().contains(&old));
        // The kept ConfigMap as written comes back through the same watch: nothing more to write.
        let mut kept = configmap(names::KEPT_CONFIGMAP, &[]);
        kept.metadata.labels =
            Some([(names::TEMPLATES_CONFIGMAP_LABEL.to_owned(), names::KEPT_LABEL_VALUE.to_owned())].into());
        kept.data = Some(data.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).collect());
        assert_eq!(apply(watcher::Event::Apply(kept.clone())), None);
        assert_eq!(state.engine.load().templates.names().collect::<Vec<_>>(), vec!["logs"], "not read as templates");
        assert_eq!(state.engine.load().templates.rollout("logs").map(|a| a.from.hash.clone()), Some(old.clone()));
        // A ConfigMap labelled `kept` under another name is neither templates nor the state.
        let mut stray = configmap("stray", &[("evil.yaml", v1), ("logs.json", "{\"from\": \"0000000000000000\"}")]);
        stray.metadata.labels = kept.metadata.labels.clone();
        assert_eq!(apply(watcher::Event::Apply(stray)), None);
        assert_eq!(state.engine.load().templates.names().collect::<Vec<_>>(), vec!["logs"]);
        assert_eq!(state.engine.load().templates.rollout("logs").map(|a| a.from.hash.clone()), Some(old.clone()));
        assert_eq!(
            state
                .metrics
                .rollout_share
                .get_or_create(&crate::telemetry::TemplateLabel { template: "logs".into() })
                .get(),
            30
        );

        // A replica started now reads the same rollout from the two ConfigMaps.
        let fresh = super::tests::state();
        let mut writer = Writer::<ConfigMap>::default();
        let store = writer.as_reader();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(configmap("sidecar-templates", &[("logs.yaml", v2)])),
            watcher::Event::InitApply(kept),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&event);
            assert_eq!(on_template_event(&fresh, &store, &event), None);
        }
        assert_eq!(fresh.engine.load().templates.rollout("logs").map(|a| a.from.hash.clone()), Some(old));
    }

    const GOOD: &str = "default: true\ninject:\n  labels: {a: b}\n";
    const BETTER: &str = "default: true\ninject:\n  labels: {a: c}\n";
    const BROKEN: &str = "default: true\ninject:\n  labels: {a: \"{{ oops }}\"}\n";

    #[test]
    fn templates_reload_from_the_cache_keep_the_last_good_version_and_gate_readiness() {
        let state = state();
        let mut writer = Writer::<ConfigMap>::default();
        let store = writer.as_reader();
        let mut apply = |event: watcher::Event<ConfigMap>| {
            writer.apply_watcher_event(&event);
            on_template_event(&state, &store, &event);
        };
        assert_eq!(state.readiness.problems(), vec!["template ConfigMaps not synced"]);

        // Initial list: not ready until it is complete, then ready with its templates.
        apply(watcher::Event::Init);
        apply(watcher::Event::InitApply(configmap("sidecar-templates", &[("logs.yaml", GOOD)])));
        assert_eq!(state.readiness.problems(), vec!["template ConfigMaps not synced"]);
        apply(watcher::Event::InitDone);
        assert!(state.readiness.problems().is_empty());
        let first = state.engine.load().templates.get("logs").unwrap().hash.clone();

        // An edit takes effect.
        apply(watcher::Event::Apply(configmap("sidecar-templates", &[("logs.yaml", BETTER)])));
        let second = state.engine.load().templates.get("logs").unwrap().hash.clone();
        assert_ne!(first, second);

        // A broken edit keeps the last good version, counts and stays ready.
        apply(watcher::Event::Apply(configmap("sidecar-templates", &[("logs.yaml", BROKEN), ("new.yaml", GOOD)])));
        assert_eq!(state.engine.load().templates.get("logs").unwrap().hash, second);
        assert!(state.engine.load().templates.get("new").is_some());
        assert_eq!(state.metrics.template_reload_errors.get(), 1);
        assert!(state.readiness.problems().is_empty());

        // A second ConfigMap adds templates; deleting every template makes the server unready.
        apply(watcher::Event::Apply(configmap("more-templates", &[("extra.yaml", GOOD)])));
        assert_eq!(state.engine.load().templates.names().collect::<Vec<_>>(), vec!["extra", "logs", "new"]);
        apply(watcher::Event::Delete(configmap("more-templates", &[])));
        apply(watcher::Event::Delete(configmap("sidecar-templates", &[])));
        assert!(state.engine.load().templates.is_empty());
        assert_eq!(state.readiness.problems(), vec!["no valid template loaded"]);
        assert_eq!(state.metrics.templates_loaded.get(), 0);
    }
}
