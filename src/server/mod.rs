//! The HTTP shell: an HTTPS listener for `POST /mutate` and `POST /validate`, a plain listener for
//! `/healthz`, `/readyz` and `/metrics`. Handlers only read the body (bounded in size and time),
//! look up the namespace, hand over to [`crate::admission`], and report (metrics, one log line and a
//! span per request).

pub mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use arc_swap::ArcSwap;
use futures::StreamExt;
use tracing::Instrument;

use crate::admission::{self, Endpoint, Reply};
use crate::cluster::Namespaces;
use crate::config::ServerSettings;
use crate::engine::template::PreCheck;
use crate::engine::{ClusterFacts, Engine};
use crate::telemetry::{EndpointLabel, Metrics, TemplateLabel};

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
}

impl Readiness {
    /// Everything ready at once (no cluster to wait for).
    pub fn ready_now(templates_valid: bool) -> Self {
        Readiness {
            namespaces_synced: true.into(),
            templates_synced: true.into(),
            templates_valid: templates_valid.into(),
            stopping: false.into(),
        }
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
    /// Time a body may take to arrive.
    pub body_timeout: Duration,
    /// Checks new template text before it is loaded (the child-process sandbox in `serve`).
    pub precheck: Arc<dyn PreCheck + Send + Sync>,
}

impl AppState {
    /// Replaces the engine's templates, counting and logging load errors. The last good version of
    /// a broken template stays in service (see `TemplateSet::update`).
    pub fn update_templates(&self, sources: Vec<crate::engine::TemplateSource>) {
        let current = self.engine.load();
        let (templates, errors) = current.templates.update(sources, self.precheck.as_ref());
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
    }
}

/// Reads the body within the size and time limits; the error is the reply to send instead.
async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    state: &AppState,
) -> Result<web::BytesMut, Box<Reply>> {
    let limit = state.max_body_bytes;
    let declared =
        req.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(Box::new(admission::too_large(limit)));
    }
    let read = async {
        let mut body = web::BytesMut::with_capacity(declared.unwrap_or(8192).min(limit));
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| {
                Box::new(admission::invalid(&admission::BadRequest(format!("reading the body failed: {e}"))))
            })?;
            if body.len() + chunk.len() > limit {
                return Err(Box::new(admission::too_large(limit)));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    tokio::time::timeout(state.body_timeout, read)
        .await
        .unwrap_or_else(|_| Err(Box::new(admission::body_timeout(state.body_timeout))))
}

async fn handle(
    endpoint: Endpoint,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let span = tracing::info_span!(
        "admission",
        endpoint = endpoint.name(),
        uid = tracing::field::Empty,
        namespace = tracing::field::Empty,
        name = tracing::field::Empty,
        operation = tracing::field::Empty,
        result = tracing::field::Empty,
    );
    let reply = decide(endpoint, &req, payload, &state).instrument(span.clone()).await;
    let _entered = span.enter();
    let summary = &reply.summary;
    span.record("operation", summary.operation.as_str());
    span.record("result", summary.result);
    match summary.result {
        "patched" | "allowed" => tracing::info!(result = summary.result, reason = %summary.reason, "admission decided"),
        "denied" => tracing::warn!(reason = %summary.reason, "admission denied"),
        _ => tracing::warn!(status = reply.status, reason = %summary.reason, "bad admission request"),
    }
    let metrics = &state.metrics;
    metrics.request(endpoint.name(), &summary.operation, summary.result);
    for template in &summary.injected {
        metrics.injections.get_or_create(&TemplateLabel { template: template.clone() }).inc();
    }
    if let Some(skip) = summary.skip {
        metrics.skip(skip);
    }
    HttpResponse::build(StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_REQUEST))
        .content_type("application/json")
        .body(reply.body)
}

/// Reads the body, looks up the namespace and lets the admission layer decide.
async fn decide(endpoint: Endpoint, req: &HttpRequest, payload: web::Payload, state: &AppState) -> Reply {
    let body = match read_body(req, payload, state).await {
        Ok(body) => body,
        Err(reply) => return *reply,
    };
    let started = Instant::now();
    let reply = match admission::parse(&body) {
        Err(error) => admission::invalid(&error),
        Ok(request) => {
            let span = tracing::Span::current();
            span.record("uid", request.uid.as_str());
            span.record("namespace", admission::namespace_of(&request));
            let name = request.object.as_ref().map(|o| crate::engine::pod::display_name(&o.json)).unwrap_or_default();
            span.record("name", name.as_str());
            let namespace = state.namespaces.facts(admission::namespace_of(&request), &state.metrics).await;
            let engine = state.engine.load();
            let cluster = **state.cluster.load();
            match endpoint {
                Endpoint::Mutate => admission::mutate(&engine, request, &namespace, cluster),
                Endpoint::Validate => admission::validate(
                    &engine,
                    request,
                    &namespace,
                    cluster,
                    &state.own_namespace,
                    state.precheck.as_ref(),
                ),
            }
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    state.metrics.duration.get_or_create(&EndpointLabel { endpoint: endpoint.name().into() }).observe(seconds);
    reply
}

async fn mutate(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    handle(Endpoint::Mutate, req, payload, state).await
}

async fn validate(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    handle(Endpoint::Validate, req, payload, state).await
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let problems = state.readiness.problems();
    state.metrics.ready.set(i64::from(problems.is_empty()));
    if problems.is_empty() {
        HttpResponse::Ok().content_type("text/plain").body("ok\n")
    } else {
        HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body(format!("not ready: {}\n", problems.join(", ")))
    }
}

async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    state.metrics.ready.set(i64::from(state.readiness.problems().is_empty()));
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(state.metrics.encode())
}

async fn not_found(req: HttpRequest) -> HttpResponse {
    HttpResponse::NotFound().content_type("text/plain").body(format!("no route for {} {}\n", req.method(), req.path()))
}

/// The two listeners, bound and ready to run.
pub struct Servers {
    https: actix_web::dev::Server,
    http: actix_web::dev::Server,
    /// Bound HTTPS address (useful when port 0 was asked for).
    pub https_addr: std::net::SocketAddr,
    /// Bound HTTP address.
    pub http_addr: std::net::SocketAddr,
}

/// Binds both listeners.
pub fn bind(settings: &ServerSettings, state: Arc<AppState>, tls: rustls::ServerConfig) -> std::io::Result<Servers> {
    let data = web::Data::from(state);
    let workers = if settings.workers == 0 {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    } else {
        settings.workers
    };
    let https_data = data.clone();
    let https = HttpServer::new(move || {
        App::new()
            .app_data(https_data.clone())
            .route("/mutate", web::post().to(mutate))
            .route("/validate", web::post().to(validate))
            .default_service(web::to(not_found))
    })
    .workers(workers)
    // The API server's webhook client waits for whole responses; without TCP_NODELAY a response
    // written in two segments can wait out a 40 ms delayed ACK.
    .tcp_nodelay(true)
    .max_connections(settings.max_connections_per_worker)
    .client_request_timeout(Duration::from_millis(settings.client_request_timeout_ms))
    .client_disconnect_timeout(Duration::from_secs(1))
    .keep_alive(Duration::from_secs(settings.keep_alive_seconds))
    .shutdown_timeout(settings.shutdown_timeout_seconds)
    .disable_signals()
    .bind_rustls_0_23((settings.address.as_str(), settings.https_port), tls)?;
    let https_addr = https.addrs()[0];
    let http_data = data;
    let http = HttpServer::new(move || {
        App::new()
            .app_data(http_data.clone())
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/metrics", web::get().to(metrics))
            .default_service(web::to(not_found))
    })
    .workers(1)
    .client_request_timeout(Duration::from_millis(settings.client_request_timeout_ms))
    .shutdown_timeout(settings.shutdown_timeout_seconds)
    .disable_signals()
    .bind((settings.address.as_str(), settings.http_port))?;
    let http_addr = http.addrs()[0];
    Ok(Servers { https: https.run(), http: http.run(), https_addr, http_addr })
}

impl Servers {
    /// Runs until `shutdown` resolves, then stops taking connections, lets in-flight requests finish
    /// (up to `server.shutdown_timeout_seconds`) and returns.
    pub async fn run_until(
        self,
        state: Arc<AppState>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> std::io::Result<()> {
        let (https_handle, http_handle) = (self.https.handle(), self.http.handle());
        let https = tokio::spawn(self.https);
        let http = tokio::spawn(self.http);
        shutdown.await;
        state.readiness.stopping.store(true, Ordering::Relaxed);
        tracing::info!("shutting down: finishing in-flight requests");
        https_handle.stop(true).await;
        http_handle.stop(true).await;
        https.await.map_err(std::io::Error::other)??;
        http.await.map_err(std::io::Error::other)??;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
