//! The HTTP shell: an HTTPS listener for `POST /mutate` and `POST /validate`, a plain listener for
//! `/healthz`, `/readyz` and `/metrics`. Handlers only read the body (bounded in size and time),
//! look up the namespace, hand over to [`crate::admission`], and report (metrics, one log line and a
//! span per request).

pub mod tls;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use futures::StreamExt;
use tracing::Instrument;

use crate::admission::{self, Endpoint, Reply};
use crate::config::ServerSettings;
use crate::engine::{ClusterFacts, Engine};
use crate::state::{AppState, SMALL_BODY_BYTES};
use crate::telemetry::{CodeLabel, EndpointLabel, TemplateLabel};

/// How long a template ConfigMap check waits for the one before it before it is refused.
const TEMPLATE_QUEUE_WAIT: Duration = Duration::from_secs(2);

/// Room reserved for one request's body until its reply is built.
type BodyRoom = tokio::sync::OwnedSemaphorePermit;

/// Reads the body within the size and time limits, after reserving room for it among the bodies
/// in flight (the declared length, or the size limit when none is declared); the error is the reply
/// to send instead.
async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    state: &AppState,
) -> Result<(web::BytesMut, BodyRoom), Box<Reply>> {
    let limit = state.max_body_bytes;
    let declared =
        req.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(Box::new(admission::too_large(limit)));
    }
    let kib = (declared.unwrap_or(limit).div_ceil(1024)).max(1) as u32;
    let pool = state.inflight_kib.pool(declared.unwrap_or(limit)).clone();
    let room = tokio::time::timeout(state.room_wait, pool.acquire_many_owned(kib)).await;
    let Ok(Ok(room)) = room else {
        return Err(Box::new(admission::busy(state.max_inflight_bytes, state.room_wait)));
    };
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
        Ok((body, room))
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
    for template in &summary.conflicted {
        metrics.injection_conflicts.get_or_create(&TemplateLabel { template: template.clone() }).inc();
    }
    metrics.event("dropped", state.events.send(reply.summary.events.clone()) as u64);
    for template in &summary.audited {
        metrics.enforcement_audit.get_or_create(&TemplateLabel { template: template.clone() }).inc();
    }
    for code in &summary.warnings {
        metrics.decision_warnings.get_or_create(&CodeLabel { code }).inc();
    }
    if let Some(skip) = summary.skip {
        metrics.skip(skip);
    }
    if summary.resize {
        metrics.resize(summary.result);
    }
    let mut response = HttpResponse::build(StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_REQUEST));
    if reply.status == 503 {
        // client-go (the API server's webhook client) retries a 5xx that carries Retry-After,
        // within the webhook's timeout, instead of failing the call.
        response.insert_header(("Retry-After", "1"));
    }
    response.content_type("application/json").body(reply.body)
}

/// Reads the body, looks up the namespace and lets the admission layer decide.
async fn decide(endpoint: Endpoint, req: &HttpRequest, payload: web::Payload, state: &AppState) -> Reply {
    // `_room` is held until the reply is built: the parsed request and its copies count too.
    let (body, _room) = match read_body(req, payload, state).await {
        Ok(read) => read,
        Err(reply) => return *reply,
    };
    let started = Instant::now();
    // A multi-MiB body takes milliseconds of parsing and deciding in one go: on the async worker
    // that would hold up every other request of that worker, so large ones go to the blocking
    // pool, one at a time (`InflightRoom::large_turn`).
    let large = body.len() > SMALL_BODY_BYTES;
    let parsed = match large {
        true => {
            // The turn moves into the job: it ends when the work does, even if this request is
            // dropped (its caller gone) while the blocking thread still parses.
            let turn = state.inflight_kib.large_turn().await;
            web::block(move || {
                let _turn = turn;
                admission::parse(&body)
            })
            .await
            .unwrap_or_else(|e| Err(admission::BadRequest(e.to_string())))
        }
        false => admission::parse(&body),
    };
    let reply = match parsed {
        Err(error) => admission::invalid(&error),
        Ok(request) => {
            let span = tracing::Span::current();
            span.record("uid", request.uid.as_str());
            span.record("namespace", admission::namespace_of(&request));
            let name = request.object.as_ref().map(|o| crate::engine::pod::display_name(&o.json)).unwrap_or_default();
            span.record("name", name.as_str());
            let namespace = state.namespaces.facts(admission::namespace_of(&request), &state.metrics).await;
            let engine = state.engine.load_full();
            // Native sidecars by the kubelets of the nodes the pod can run on (`engine::injection::nodes`).
            let cluster = match &request.object {
                Some(object) if admission::is_kind(&request, "", "Pod") => {
                    state.nodes.load().facts_for(&object.json, **state.cluster.load())
                }
                _ => **state.cluster.load(),
            };
            if endpoint == Endpoint::Validate && admission::is_configmap(&request) {
                check_template_configmap(state, engine, request, namespace, cluster).await
            } else {
                let (own_namespace, precheck) = (state.own_namespace.clone(), state.precheck.clone());
                let decide = move || match endpoint {
                    Endpoint::Mutate => admission::mutate(&engine, request, &namespace, cluster),
                    Endpoint::Validate => {
                        admission::validate(&engine, request, &namespace, cluster, &own_namespace, precheck.as_ref())
                    }
                };
                match large {
                    true => {
                        let turn = state.inflight_kib.large_turn().await;
                        web::block(move || {
                            let _turn = turn;
                            decide()
                        })
                        .await
                        .unwrap_or_else(|e| admission::invalid(&admission::BadRequest(e.to_string())))
                    }
                    false => decide(),
                }
            }
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    state.metrics.duration.get_or_create(&EndpointLabel { endpoint: endpoint.name().into() }).observe(seconds);
    reply
}

/// `/validate` for a ConfigMap: it may test-render templates (child processes, then an in-process
/// load), so it runs on a blocking thread, one at a time; a request that cannot start within
/// [`TEMPLATE_QUEUE_WAIT`] is refused at once instead of piling up.
async fn check_template_configmap(
    state: &AppState,
    engine: Arc<Engine>,
    request: admission::Request,
    namespace: crate::engine::NamespaceFacts,
    cluster: ClusterFacts,
) -> Reply {
    let permit = match tokio::time::timeout(TEMPLATE_QUEUE_WAIT, state.template_queue.clone().acquire_owned()).await {
        Ok(Ok(permit)) => permit,
        _ => return admission::template_check_busy(&request, TEMPLATE_QUEUE_WAIT),
    };
    let (precheck, own_namespace, work) =
        (state.precheck.clone(), state.own_namespace.clone(), state.template_work.clone());
    let check = move || {
        let _permit = permit;
        let _one_at_a_time = work.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        admission::validate(&engine, request, &namespace, cluster, &own_namespace, precheck.as_ref())
    };
    match web::block(check).await {
        Ok(reply) => reply,
        Err(e) => admission::invalid(&admission::BadRequest(format!("the template check failed: {e}"))),
    }
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
    /// How long the HTTPS listener keeps serving, closing each connection after its answer, once
    /// shutdown begins (`server.drain_seconds`).
    drain: Duration,
}

/// The HTTPS listening socket. `TCP_DEFER_ACCEPT`: the kernel hands a connection over only once
/// its first bytes (the TLS ClientHello) arrive, so connections opened and left silent never take
/// a handshake slot or a connection slot from the API server's; the kernel drops them after a
/// few seconds. A large backlog keeps bursts of new connections waiting instead of refused.
fn https_listener(settings: &ServerSettings) -> std::io::Result<std::net::TcpListener> {
    use std::os::fd::AsRawFd;
    let address: std::net::SocketAddr =
        std::net::ToSocketAddrs::to_socket_addrs(&(settings.address.as_str(), settings.https_port))?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{} resolves to no address", settings.address)))?;
    let socket = socket2::Socket::new(socket2::Domain::for_address(address), socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&address.into())?;
    let defer_seconds: libc::c_int = 5;
    // SAFETY: a valid socket and a c_int option value of the right size.
    #[allow(unsafe_code)]
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&defer_seconds as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(std::io::Error::last_os_error());
    }
    socket.listen(4096)?;
    Ok(socket.into())
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
        https_data.readiness.start_heartbeat();
        App::new()
            .app_data(https_data.clone())
            .wrap(actix_web::middleware::from_fn(close_when_draining))
            .route("/mutate", web::post().to(mutate))
            .route("/validate", web::post().to(validate))
            .default_service(web::to(not_found))
    })
    .workers(workers)
    // The API server's webhook client waits for whole responses; without TCP_NODELAY a response
    // written in two segments can wait out a 40 ms delayed ACK.
    .tcp_nodelay(true)
    .max_connections(settings.max_connections_per_worker)
    .max_connection_rate(settings.max_tls_handshakes_per_worker)
    .tls_handshake_timeout(Duration::from_millis(settings.tls_handshake_timeout_ms))
    .client_request_timeout(Duration::from_millis(settings.client_request_timeout_ms))
    .client_disconnect_timeout(Duration::from_secs(1))
    .keep_alive(Duration::from_secs(settings.keep_alive_seconds))
    .shutdown_timeout(settings.shutdown_timeout_seconds)
    .disable_signals()
    .listen_rustls_0_23(https_listener(settings)?, tls)?;
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
    // Probes and scrapes need a handful of connections; idle ones must not pile up.
    .max_connections(256)
    .keep_alive(Duration::from_secs(10))
    .client_request_timeout(Duration::from_millis(settings.client_request_timeout_ms))
    .shutdown_timeout(settings.shutdown_timeout_seconds)
    .disable_signals()
    .bind((settings.address.as_str(), settings.http_port))?;
    let http_addr = http.addrs()[0];
    let drain = Duration::from_secs(settings.drain_seconds);
    Ok(Servers { https: https.run(), http: http.run(), https_addr, http_addr, drain })
}

/// Once shutdown has begun, every answer closes its connection (`Connection: close`). A client
/// that reads the answer knows not to reuse the connection, so the API server retires its pooled
/// connections to a stopping replica one by one, race-free; closing an idle connection from this
/// side instead can cross a request the API server has just sent on it, which it does not resend
/// (a POST) and so fails open.
async fn close_when_draining(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    let mut res = next.call(req).await?;
    let state = res.request().app_data::<web::Data<AppState>>();
    if state.is_some_and(|state| state.readiness.stopping.load(Ordering::Relaxed)) {
        res.response_mut().head_mut().set_connection_type(actix_web::http::ConnectionType::Close);
    }
    Ok(res)
}

impl Servers {
    /// Runs until `shutdown` resolves, then drains (`server.drain_seconds`: still serving, each
    /// answer closing its connection), stops taking connections, lets in-flight requests finish (up
    /// to `server.shutdown_timeout_seconds`) and returns.
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
        tracing::info!(
            seconds = self.drain.as_secs_f64(),
            "shutting down: draining (every answer closes its connection)"
        );
        tokio::time::sleep(self.drain).await;
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
