//! The state the HTTP shell (`server`) and the cluster shell (`cluster`) share: the engine in
//! service, the namespace facts, readiness, and the bounds every request passes through. Its own
//! module so that neither shell has to reach into the other for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::engine::templates::set::PreCheck;
use crate::engine::{ClusterFacts, Engine, NamespaceFacts};
use crate::telemetry::Metrics;

/// Where the labels of a request's namespace come from.
pub enum Namespaces {
    /// No cluster: labels unknown, every namespace counts as opted in (the API server's
    /// namespaceSelector has already filtered).
    Unknown,
    /// The watched cache.
    Cache {
        /// The reflector's store.
        store: Store<PartialObjectMeta<Namespace>>,
        /// How long to wait for a namespace the cache has not seen yet.
        wait: Duration,
        /// For a namespace the cache still has not seen after `wait`: one direct read.
        api: Box<kube::Api<Namespace>>,
    },
}

/// The longest a direct read of a namespace the cache has not seen may take: the API server waits
/// for the whole admission call (`timeoutSeconds: 5`), and `cluster.namespace_wait_ms` (2 s by
/// default) comes first, so the two stay well inside it.
pub const NAMESPACE_LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);

impl Namespaces {
    /// The facts of namespace `name`. A namespace the cache does not know yet (created a moment
    /// ago; its watch event may trail the pod's admission, or the watch is failing) is waited
    /// for, briefly, then read directly; when even that fails, the facts say why
    /// (`NamespaceFacts::unavailable`), and no template is judged on labels nobody could read.
    pub async fn facts(&self, name: &str, metrics: &Metrics) -> NamespaceFacts {
        let Namespaces::Cache { store, wait, api } = self else {
            return NamespaceFacts::unknown(name);
        };
        let key = ObjectRef::new(name);
        let deadline = tokio::time::Instant::now() + *wait;
        loop {
            if let Some(namespace) = store.get(&key) {
                return NamespaceFacts::known(name, namespace.labels().clone(), namespace.annotations().clone());
            }
            if tokio::time::Instant::now() >= deadline {
                metrics.namespace_cache_misses.inc();
                return match tokio::time::timeout(NAMESPACE_LOOKUP_TIMEOUT, api.get_metadata_opt(name)).await {
                    Ok(Ok(Some(namespace))) => {
                        tracing::info!(namespace = name, "namespace not in the cache yet; read directly");
                        NamespaceFacts::known(name, namespace.labels().clone(), namespace.annotations().clone())
                    }
                    failed => {
                        let reason = match failed {
                            Ok(Ok(_)) => "the API server has no such namespace".to_owned(),
                            Ok(Err(kube::Error::Api(status))) => format!("reading it failed: {}", status.message),
                            Ok(Err(error)) => format!("reading it failed: {error}"),
                            Err(_) => format!("reading it took over {NAMESPACE_LOOKUP_TIMEOUT:?}"),
                        };
                        metrics.namespace_lookup_failures.inc();
                        tracing::warn!(namespace = name, reason, "namespace neither in the cache nor readable");
                        NamespaceFacts::unavailable(
                            name,
                            format!("not in the watched cache after {wait:?}, and {reason}"),
                        )
                    }
                };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What `/readyz` waits for.
#[derive(Debug, Default)]
pub struct Readiness {
    /// The namespace cache has synced (or there is no cluster).
    pub namespaces_synced: AtomicBool,
    /// The template ConfigMaps have synced (or there is no cluster).
    pub templates_synced: AtomicBool,
    /// At least one template is in service.
    pub templates_valid: AtomicBool,
    /// SIGTERM received: stop taking new work.
    pub stopping: AtomicBool,
    /// One heartbeat per HTTPS worker: when it last ran (ms since the process started). A worker
    /// whose heartbeat stops is blocked, and every request it holds or accepts waits.
    pub heartbeats: std::sync::Mutex<Vec<Arc<std::sync::atomic::AtomicU64>>>,
}

/// A heartbeat older than this marks its worker as stalled.
pub const STALL_AFTER: Duration = Duration::from_secs(3);
const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);

fn process_millis() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl Readiness {
    /// Everything ready at once (no cluster to wait for).
    pub fn ready_now(templates_valid: bool) -> Self {
        Readiness {
            namespaces_synced: true.into(),
            templates_synced: true.into(),
            templates_valid: templates_valid.into(),
            stopping: false.into(),
            heartbeats: Default::default(),
        }
    }

    /// Starts a heartbeat on the current actix worker (call from the app factory, which runs once
    /// on each worker).
    pub(crate) fn start_heartbeat(&self) {
        let beat = Arc::new(std::sync::atomic::AtomicU64::new(process_millis()));
        self.heartbeats.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(beat.clone());
        actix_web::rt::spawn(async move {
            loop {
                beat.store(process_millis(), Ordering::Relaxed);
                actix_web::rt::time::sleep(HEARTBEAT_EVERY).await;
            }
        });
    }

    /// What is not ready yet, empty when ready.
    pub fn problems(&self) -> Vec<&'static str> {
        let mut problems = Vec::new();
        if !self.namespaces_synced.load(Ordering::Relaxed) {
            problems.push("namespace cache not synced");
        }
        if !self.templates_synced.load(Ordering::Relaxed) {
            problems.push("template ConfigMaps not synced");
        } else if !self.templates_valid.load(Ordering::Relaxed) {
            problems.push("no valid template loaded");
        }
        if self.stopping.load(Ordering::Relaxed) {
            problems.push("shutting down");
        }
        let now = process_millis();
        let heartbeats = self.heartbeats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if heartbeats
            .iter()
            .any(|beat| now.saturating_sub(beat.load(Ordering::Relaxed)) > STALL_AFTER.as_millis() as u64)
        {
            problems
                .push("an HTTPS worker is stalled (its event loop has not run for over 3 s): admission requests wait");
        }
        problems
    }
}

/// Everything the handlers share.
pub struct AppState {
    /// The engine in service; swapped whole when templates change.
    pub engine: ArcSwap<Engine>,
    /// Where namespace labels come from.
    pub namespaces: Namespaces,
    /// The cluster's facts (native sidecars), from its version.
    pub cluster: ArcSwap<ClusterFacts>,
    /// The injector's namespace (its template ConfigMaps live there).
    pub own_namespace: String,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Readiness flags.
    pub readiness: Arc<Readiness>,
    /// Largest body accepted.
    pub max_body_bytes: usize,
    /// Most request bytes in flight (`server.max_inflight_bytes`).
    pub max_inflight_bytes: usize,
    /// The room left for them, in KiB: one largest body for large bodies (they are decided one at a
    /// time, their unread bytes waiting in the kernel, so a flood of them cannot take the CPU), the
    /// rest for small ones (up to [`SMALL_BODY_BYTES`], every real pod). The semaphores are fair (first come, first served), so
    /// one shared pool would make a typical review wait behind every queued multi-MiB body.
    pub inflight_kib: InflightRoom,

    /// Time a body may take to arrive.
    pub body_timeout: Duration,
    /// Time a request waits for room among the bodies in flight before it is answered 503 with
    /// `Retry-After` (`server.room_wait_ms`).
    pub room_wait: Duration,
    /// Checks new template text before it is loaded (the child-process sandbox in `serve`).
    pub precheck: Arc<dyn PreCheck + Send + Sync>,
    /// One template check or load at a time (the guard's and hot reload's): each may use up to the
    /// sandbox's memory limit in this process, and only one such amount fits in the container.
    pub template_work: Arc<std::sync::Mutex<()>>,
    /// The template ConfigMap check running (one permit); the next waits up to
    /// `server::TEMPLATE_QUEUE_WAIT`, then is refused.
    pub template_queue: Arc<tokio::sync::Semaphore>,
    /// Where Kubernetes Events go (`cluster::events`); disabled without a cluster.
    pub events: EventSink,
    /// The nodes' kubelet versions, for native sidecars by node (`engine::injection::nodes`); empty without
    /// a cluster or with `cluster.watch_nodes` off.
    pub nodes: ArcSwap<crate::engine::injection::nodes::NodePool>,
}

/// The sending end of the Event publisher: never blocks, drops an Event when the publisher is
/// behind (Events are advice; admission never waits for them).
#[derive(Clone, Default)]
pub struct EventSink(Option<tokio::sync::mpsc::Sender<crate::admission::events::EventIntent>>);

impl EventSink {
    /// A sink feeding `sender`.
    pub fn to(sender: tokio::sync::mpsc::Sender<crate::admission::events::EventIntent>) -> Self {
        EventSink(Some(sender))
    }

    /// Queues the Events; returns how many were dropped (queue full or publisher gone).
    pub fn send(&self, intents: Vec<crate::admission::events::EventIntent>) -> usize {
        let Some(sender) = &self.0 else { return 0 };
        intents.into_iter().filter(|intent| sender.try_send(intent.clone()).is_err()).count()
    }
}

/// Bodies up to this size are "small" for [`InflightRoom`].
pub const SMALL_BODY_BYTES: usize = 64 * 1024;

/// Room for request bodies in flight, split by size (see [`AppState::inflight_kib`]).
#[derive(Debug, Clone)]
pub struct InflightRoom {
    small: Arc<tokio::sync::Semaphore>,
    large: Arc<tokio::sync::Semaphore>,
    /// One turn: a large body's parsing or deciding runs one at a time on the blocking pool, so
    /// two of them released together (after the same namespace wait) never take both cores of a
    /// 2-core pod from the small reviews on the async workers.
    large_work: Arc<tokio::sync::Semaphore>,
}

impl InflightRoom {
    /// Room for `max_inflight_bytes`: `max_body_bytes` of it for large bodies, the rest for small.
    pub fn new(max_inflight_bytes: usize, max_body_bytes: usize) -> Self {
        let total = max_inflight_bytes.div_ceil(1024);
        let large = max_body_bytes.div_ceil(1024);
        let small = total.saturating_sub(large).max(SMALL_BODY_BYTES / 1024);
        InflightRoom {
            small: Arc::new(tokio::sync::Semaphore::new(small)),
            large: Arc::new(tokio::sync::Semaphore::new(large)),
            large_work: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// Waits (asynchronously) for the turn of one large body's parsing or deciding; the turn ends
    /// when the permit is dropped.
    pub(crate) async fn large_turn(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.large_work.clone().acquire_owned().await.ok()
    }

    pub(crate) fn pool(&self, bytes: usize) -> &Arc<tokio::sync::Semaphore> {
        if bytes <= SMALL_BODY_BYTES { &self.small } else { &self.large }
    }
}

impl AppState {
    /// Replaces the engine's templates, counting and logging load errors. The last good version of
    /// a broken template stays in service (see `TemplateSet::update`).
    /// Blocks (the sandbox waits for a child): call it on a blocking thread. Returns the errors.
    pub fn update_templates(&self, sources: Vec<crate::engine::TemplateSource>) -> Vec<crate::engine::TemplateError> {
        self.update_templates_with_kept(sources, &crate::engine::templates::rollout::Kept::default())
    }

    /// [`AppState::update_templates`] with what the kept ConfigMap holds (the versions rollouts
    /// roll from, their halts): see `TemplateSet::update_with_kept`. The engine's set then says
    /// what that ConfigMap should hold (`TemplateSet::kept_wanted`).
    pub fn update_templates_with_kept(
        &self,
        sources: Vec<crate::engine::TemplateSource>,
        kept: &crate::engine::templates::rollout::Kept,
    ) -> Vec<crate::engine::TemplateError> {
        let _one_at_a_time = self.template_work.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = self.engine.load();
        let (templates, errors) = current.templates.update_with_kept(sources, kept, self.precheck.as_ref());
        for notice in templates.rollout_notices() {
            tracing::warn!("{notice}");
        }
        self.metrics.set_rollouts(&templates);
        for error in &errors {
            self.metrics.template_reload_errors.inc();
            tracing::error!(template = %error.template, line = error.line, error = %error.message, "template not loaded; the last good version (if any) stays in service");
        }
        let count = templates.len();
        let names: Vec<&str> = templates.names().collect();
        tracing::info!(templates = ?names, errors = errors.len(), "templates in service");
        self.metrics.templates_loaded.set(count as i64);
        self.readiness.templates_valid.store(count > 0, Ordering::Relaxed);
        self.engine.store(Arc::new(Engine::new(templates, current.excluded_namespaces.clone())));
        errors
    }
}
