//! `sidecar-injector serve`: wires settings, telemetry, the cluster connection, the certificate and
//! the two listeners together, then runs until SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;

use crate::certs;
use crate::cluster;
use crate::config::{ClusterMode, ClusterSettings, Settings, TlsMode, TlsSettings};
use crate::engine::templates::set::PreCheck;
use crate::engine::{ClusterFacts, Engine, TemplateSet};
use crate::sandbox::Sandbox;
use crate::server;
use crate::server::tls::{self, CertStore};
use crate::state::Namespaces;
use crate::state::{AppState, InflightRoom, Readiness};
use crate::telemetry::{self, Metrics};

/// Runs the webhook until SIGTERM or SIGINT.
pub fn serve(config: Option<PathBuf>, templates: Option<PathBuf>) -> anyhow::Result<()> {
    let sandbox = Sandbox::current_exe().context("locating this binary for the template sandbox")?;
    let mut settings = Settings::load(config.as_deref(), std::env::vars())?;
    if templates.is_some() {
        settings.templates.dir = templates;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    actix_web::rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime")
    })
    .block_on(async move {
        let _telemetry = telemetry::init(&settings.telemetry)?;
        run(settings, Arc::new(sandbox), server::shutdown_signal()).await
    })
}

/// Serves with `settings` until `shutdown` resolves (tests pass their own). New template text is
/// checked by `precheck` before it is loaded.
pub async fn run(
    settings: Settings,
    precheck: Arc<dyn PreCheck + Send + Sync>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let started = Starting::new(settings, precheck).await?;
    tracing::info!(https = %started.servers.https_addr, http = %started.servers.http_addr, "serving");
    started.servers.run_until(started.state, shutdown).await?;
    Ok(())
}

/// A server that is bound and about to run; tests read the bound addresses from it.
pub struct Starting {
    /// The bound listeners.
    pub servers: server::Servers,
    /// Shared state.
    pub state: Arc<AppState>,
}

impl Starting {
    /// Connects, loads templates and certificates, starts the watches and binds the listeners.
    pub async fn new(settings: Settings, precheck: Arc<dyn PreCheck + Send + Sync>) -> anyhow::Result<Starting> {
        let metrics = Arc::new(Metrics::default());
        let client = connect(&settings.cluster).await?;
        let own_namespace = own_namespace(&settings.cluster);
        let cluster_facts = match (&settings.cluster.kubernetes_version, &client) {
            (Some(version), _) => ClusterFacts::from_version_string(version).expect("validated with the settings"),
            (None, Some(client)) => cluster::cluster_facts(client).await,
            (None, None) => ClusterFacts::default(),
        };
        let excluded = vec![own_namespace.clone()];
        let (engine, readiness) = match &client {
            Some(_) => (Engine::new(TemplateSet::default(), excluded), Readiness::default()),
            None => {
                // Through the sandbox, off the async runtime: a template from the directory gets the
                // same checks as one from a ConfigMap.
                let (dir, check) = (settings.templates.dir.clone(), precheck.clone());
                let templates = tokio::task::spawn_blocking(move || {
                    crate::cli::load_templates_checked(dir.as_deref(), check.as_ref())
                })
                .await?
                .map_err(|e| anyhow::anyhow!("{e}"))?;
                tracing::info!(templates = ?templates.names().collect::<Vec<_>>(), "no cluster: serving these templates, every namespace counts as opted in");
                metrics.templates_loaded.set(templates.len() as i64);
                let ready = Readiness::ready_now(!templates.is_empty());
                (Engine::new(templates, excluded), ready)
            }
        };
        let readiness = Arc::new(readiness);
        let store = certificate(&settings.tls, client.as_ref(), &own_namespace, &metrics).await?;
        metrics.certificate_expiry.set(store.expiry().unix_timestamp());
        let namespaces = match &client {
            Some(client) => Namespaces::Cache {
                store: cluster::watch_namespaces(client.clone(), readiness.clone(), metrics.clone()),
                wait: Duration::from_millis(settings.cluster.namespace_wait_ms),
                api: Box::new(kube::Api::all(client.clone())),
            },
            None => Namespaces::Unknown,
        };
        let namespace_store = match &namespaces {
            Namespaces::Cache { store, .. } => Some(store.clone()),
            Namespaces::Unknown => None,
        };
        let metrics_for_events = metrics.clone();
        let state = Arc::new(AppState {
            engine: ArcSwap::from_pointee(engine),
            namespaces,
            cluster: ArcSwap::from_pointee(cluster_facts),
            own_namespace: own_namespace.clone(),
            metrics,
            readiness,
            max_body_bytes: settings.server.max_body_bytes,
            max_inflight_bytes: settings.server.max_inflight_bytes,
            inflight_kib: InflightRoom::new(settings.server.max_inflight_bytes, settings.server.max_body_bytes),
            body_timeout: Duration::from_millis(settings.server.body_timeout_ms),
            room_wait: Duration::from_millis(settings.server.room_wait_ms.min(settings.server.body_timeout_ms)),
            precheck,
            template_work: Default::default(),
            template_queue: Arc::new(tokio::sync::Semaphore::new(1)),
            nodes: Default::default(),
            events: match (&client, settings.cluster.events) {
                (Some(client), true) => cluster::events::publish(client.clone(), metrics_for_events),
                _ => Default::default(),
            },
        });
        if let Some(client) = &client {
            cluster::watch_templates(client.clone(), &own_namespace, state.clone());
            let watch_pods = settings.cluster.watch_pods;
            cluster::rollouts::watch_rollouts(client.clone(), own_namespace.clone(), state.clone(), watch_pods);
            if settings.cluster.watch_nodes {
                cluster::watch_nodes(client.clone(), state.clone(), settings.cluster.streaming_lists);
            }
            let modes = cluster::enforcement::Modes {
                enforcement: settings.cluster.enforcement_policy,
                injection: settings.cluster.injection_policy,
            };
            if modes.enforcement || modes.injection {
                cluster::enforcement::keep_current(client.clone(), own_namespace.clone(), state.clone(), modes);
            }
            if let (true, Some(store)) = (settings.cluster.watch_pods, namespace_store) {
                let interval = Duration::from_secs(settings.cluster.drift_interval_seconds);
                cluster::watch_drift(client.clone(), store, state.clone(), interval, settings.cluster.streaming_lists);
            }
        }
        let client_cas = match &settings.tls.client_ca_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading tls.client_ca_file {}", path.display()))?,
            ),
            None => None,
        };
        let tls_config = tls::server_config(store, client_cas.as_deref())?;
        let servers = server::bind(&settings.server, state.clone(), tls_config).with_context(|| {
            format!(
                "binding {}:{} and :{}",
                settings.server.address, settings.server.https_port, settings.server.http_port
            )
        })?;
        Ok(Starting { servers, state })
    }
}

async fn connect(settings: &ClusterSettings) -> anyhow::Result<Option<kube::Client>> {
    let config = match settings.mode {
        ClusterMode::Off => return Ok(None),
        ClusterMode::On => kube::Config::infer().await.context("cluster.mode is on, but no cluster is configured")?,
        ClusterMode::Auto => match kube::Config::infer().await {
            Ok(config) => config,
            Err(error) => {
                tracing::info!(%error, "no kubeconfig and not in a pod: serving without a cluster");
                return Ok(None);
            }
        },
    };
    tracing::info!(server = %config.cluster_url, "using the Kubernetes API");
    Ok(Some(kube::Client::try_from(config)?))
}

fn own_namespace(settings: &ClusterSettings) -> String {
    settings
        .namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok().filter(|n| !n.is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|n| n.trim().to_owned())
        })
        .unwrap_or_else(|| crate::engine::names::INJECTOR_NAMESPACE.to_owned())
}

async fn certificate(
    settings: &TlsSettings,
    client: Option<&kube::Client>,
    namespace: &str,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Arc<CertStore>> {
    let mode = match settings.mode {
        TlsMode::Auto if settings.cert_file.is_some() => TlsMode::Files,
        TlsMode::Auto if client.is_some() => TlsMode::SelfManaged,
        TlsMode::Auto => TlsMode::SelfSigned,
        mode => mode,
    };
    match mode {
        TlsMode::Files => {
            let (cert, key) =
                (settings.cert_file.clone().expect("validated"), settings.key_file.clone().expect("validated"));
            let store = Arc::new(
                CertStore::new(&tls::read_files(&cert, &key)?).with_context(|| format!("{}", cert.display()))?,
            );
            tracing::info!(cert = %cert.display(), "serving the certificate from files, reloaded when they change");
            let interval = Duration::from_secs(settings.reload_interval_seconds);
            tokio::spawn(tls::watch_files(store.clone(), cert, key, interval, metrics.clone()));
            Ok(store)
        }
        TlsMode::SelfManaged => {
            let client = client.context("tls.mode self-managed needs a cluster")?;
            let material = cluster::cert_secret::ensure_secret(client, namespace, settings)
                .await
                .with_context(|| format!("managing the certificate Secret {namespace}/{}", settings.secret_name))?;
            if let Err(error) = cluster::cert_secret::publish_ca_bundle(client, settings, &material.ca_bundle).await {
                metrics.certificate_reload_errors.inc();
                tracing::error!(%error, "could not write the CA into the webhook configurations");
            }
            let store = Arc::new(CertStore::new(&material.serving)?);
            tokio::spawn(cluster::cert_secret::maintain(
                client.clone(),
                namespace.to_owned(),
                settings.clone(),
                store.clone(),
                metrics.clone(),
            ));
            Ok(store)
        }
        TlsMode::SelfSigned | TlsMode::Auto => {
            let now = time::OffsetDateTime::now_utc();
            let ca = certs::generate_ca("sidecar-injector self-signed CA", now, settings.ca_validity_days)?;
            let serving = certs::issue(&ca, &settings.hosts, now, settings.certificate_validity_days)?;
            certs::write_file_safely(&settings.self_signed_ca_file, ca.cert.as_bytes())
                .with_context(|| format!("writing the CA to {}", settings.self_signed_ca_file.display()))?;
            tracing::info!(ca_file = %settings.self_signed_ca_file.display(), hosts = ?settings.hosts, "self-signed certificate generated; trust its CA with curl --cacert");
            eprintln!(
                "sidecar-injector: self-signed certificate; its CA is in {}",
                settings.self_signed_ca_file.display()
            );
            Ok(Arc::new(CertStore::new(&serving)?))
        }
    }
}
