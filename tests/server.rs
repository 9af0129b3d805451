//! The server over real sockets with real TLS: injection, every bad input with its status and
//! message, TLS versions, certificate reload by Secret-volume symlink swap under load.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::fixtures::{admission_review, typical_pod};
use common::server::{TestServer, issue};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn post(server: &TestServer, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let response = server
        .client()
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// A raw TLS connection, to see the certificate served and to send bytes at our own pace.
async fn connect(
    server: &TestServer,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(server.client_tls(versions)));
    let tcp = tokio::net::TcpStream::connect(server.https).await?;
    connector.connect("localhost".try_into().unwrap(), tcp).await
}

async fn served_certificate(server: &TestServer) -> Vec<u8> {
    let stream = connect(server, &[&rustls::version::TLS13]).await.unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn der(pem: &str) -> Vec<u8> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_review_over_tls_gets_a_patch_that_injects_it() {
    let server = TestServer::start(|_| {});
    let pod = typical_pod();
    let (status, answer) =
        post(&server, "/mutate", serde_json::to_vec(&admission_review(&pod, "shop", "uid-42")).unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["uid"], "uid-42");
    assert_eq!(answer["response"]["allowed"], true);
    use base64::Engine as _;
    let patch =
        base64::engine::general_purpose::STANDARD.decode(answer["response"]["patch"].as_str().unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut injected = pod.clone();
    json_patch::patch(&mut injected, &patch).unwrap();
    let init: Vec<&str> =
        injected["spec"]["initContainers"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(init, vec!["log-shipper", "otel-agent"], "the pod's annotation names both templates");
    assert_eq!(injected["metadata"]["labels"]["sidecar-injector.io/injected"], "true");

    // The same body with dryRun is mutated exactly the same way.
    let mut dry = admission_review(&pod, "shop", "uid-43");
    dry["request"]["dryRun"] = json!(true);
    let (_, dry_answer) = post(&server, "/mutate", serde_json::to_vec(&dry).unwrap()).await;
    assert_eq!(dry_answer["response"]["patch"], answer["response"]["patch"]);
    server.stop();
}

/// docs/cli.md's laptop commands post these files as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_reviews_in_the_readme_do_what_it_says() {
    let server = TestServer::start(|_| {});
    let create = std::fs::read("examples/review-pod.json").unwrap();
    let (status, answer) = post(&server, "/mutate", create).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["uid"], "0b8f3a1e-example-pod-create");
    assert!(answer["response"]["patch"].is_string(), "{answer}");
    let update = std::fs::read("examples/review-pod-update.json").unwrap();
    let (status, answer) = post(&server, "/validate", update).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("the image of injected container \"log-shipper\" cannot be changed by an update"),
        "{message}"
    );
    let readme = std::fs::read_to_string("docs/cli.md").unwrap();
    for file in ["examples/review-pod.json", "examples/review-pod-update.json"] {
        assert!(readme.contains(&format!("-d @{file}")), "docs/cli.md no longer uses {file}");
    }
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_their_exact_status_and_message() {
    let server = TestServer::start(|s| s.server.max_body_bytes = 1024 * 1024);
    let review = admission_review(&typical_pod(), "shop", "u");
    let mut no_uid = review.clone();
    no_uid["request"].as_object_mut().unwrap().remove("uid");
    let mut no_object = review.clone();
    no_object["request"].as_object_mut().unwrap().remove("object");
    let huge = vec![b' '; 2 * 1024 * 1024];
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        (
            "truncated JSON",
            "/mutate",
            serde_json::to_vec(&review).unwrap()[..200].to_vec(),
            400,
            "the body is not valid JSON: EOF while parsing",
        ),
        ("not JSON", "/validate", b"hello".to_vec(), 400, "the body is not valid JSON"),
        (
            "wrong apiVersion",
            "/mutate",
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#.to_vec(),
            400,
            "unsupported apiVersion \"admission.k8s.io/v1beta1\"",
        ),
        (
            "wrong kind",
            "/mutate",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"Status"}"#.to_vec(),
            400,
            "unsupported kind \"Status\"",
        ),
        (
            "no request",
            "/mutate",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            400,
            "the AdmissionReview has no request",
        ),
        ("no uid", "/mutate", serde_json::to_vec(&no_uid).unwrap(), 400, "request.uid is missing"),
        ("no object", "/validate", serde_json::to_vec(&no_object).unwrap(), 400, "request.object is missing"),
        ("body over the limit", "/mutate", huge, 413, "the request body is larger than the limit of 1048576 bytes"),
    ];
    for (case, path, body, status, message) in cases {
        let (got, answer) = post(&server, path, body).await;
        assert_eq!(got, status, "{case}: {answer}");
        let text = answer["response"]["status"]["message"].as_str().unwrap_or_default();
        assert!(text.starts_with(message), "{case}: {text}");
    }

    // A body streamed without Content-Length is cut off at the limit, too.
    let chunks = futures::stream::iter((0..40).map(|_| Ok::<_, std::io::Error>(vec![b' '; 64 * 1024])));
    let (status, _) = post(&server, "/mutate", reqwest::Body::wrap_stream(chunks)).await;
    assert_eq!(status, 413);

    // Unknown routes and methods.
    let response = server.client().get(server.url("/mutate")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 404);
    assert_eq!(response.text().await.unwrap(), "no route for GET /mutate\n");

    // Metrics count what happened.
    let metrics = reqwest::get(server.plain_url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("sidecar_injector_admission_requests_total{endpoint=\"mutate\",operation=\"unknown\",result=\"too_large\"} 2"), "{metrics}");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_gets_408() {
    let server = TestServer::start(|s| s.server.body_timeout_ms = 500);
    let mut stream = connect(&server, &[&rustls::version::TLS13]).await.unwrap();
    let head = "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"apiVersion\":";
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response)).await;
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    assert!(response.contains("the request body did not arrive within 500 ms"), "{response}");
    assert!(started.elapsed() < Duration::from_secs(3));
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_and_1_3_are_served() {
    let server = TestServer::start(|_| {});
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let stream = connect(&server, &[version]).await.unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(version.version));
    }
    server.stop();
}

/// HTTP/2 stays off on :8443: the API server never speaks it to a webhook behind a Service, and
/// actix-http's HTTP/2 server has no limit on concurrent streams per connection (bench/README.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_http_1_1_is_negotiated_even_when_a_client_prefers_h2() {
    let server = TestServer::start(|_| {});
    let handshake = |offered: Vec<&'static [u8]>| {
        let mut config = server.client_tls(&[&rustls::version::TLS13]);
        config.alpn_protocols = offered.into_iter().map(<[u8]>::to_vec).collect();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        async move {
            let tcp = tokio::net::TcpStream::connect(server.https).await?;
            connector.connect("localhost".try_into().unwrap(), tcp).await
        }
    };
    let both = handshake(vec![b"h2", b"http/1.1"]).await.unwrap();
    assert_eq!(both.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let error = handshake(vec![b"h2"]).await.expect_err("a client that speaks only h2 must not get in");
    assert!(error.to_string().contains("NoApplicationProtocol"), "{error}");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_swapped_like_a_secret_volume_is_served_without_restart_or_failed_requests() {
    let mut server = TestServer::start(|_| {});
    let old = served_certificate(&server).await;
    let body = serde_json::to_vec(&admission_review(&typical_pod(), "shop", "u")).unwrap();

    // Steady load on fresh connections while the certificate is rotated.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut load = Vec::new();
    for _ in 0..4 {
        let tls = server.client_tls(&[&rustls::version::TLS13, &rustls::version::TLS12]);
        let client =
            reqwest::Client::builder().tls_backend_preconfigured(tls).pool_max_idle_per_host(0).build().unwrap();
        let (url, body, stop, ok, failed) =
            (server.url("/mutate"), body.clone(), stop.clone(), ok.clone(), failed.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match client.post(&url).body(body.clone()).send().await {
                    Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let mut served = vec![old.clone()];
    let rotating = Instant::now();
    for _ in 0..10 {
        let next = issue(&server.ca);
        server.rotate(&next);
        let deadline = Instant::now() + Duration::from_secs(5);
        while served_certificate(&server).await != der(&next.cert) {
            assert!(Instant::now() < deadline, "the new certificate was not served within 5 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        served.push(der(&next.cert));
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!(
        "10 rotations in {:.1} s under load: {ok} requests on fresh connections, {failed} failed",
        rotating.elapsed().as_secs_f64()
    );
    assert_eq!(failed, 0, "no request failed during rotation");
    assert!(ok > 50, "the load ran: {ok} requests");
    served.dedup();
    assert_eq!(served.len(), 11, "every rotation was served to new connections");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_new_certificate_keeps_the_old_one_in_service() {
    let mut server = TestServer::start(|_| {});
    let old = served_certificate(&server).await;
    let (a, b) = (issue(&server.ca), issue(&server.ca));
    server.rotate(&sidecar_injector::certs::Pem { cert: a.cert, key: b.key });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(served_certificate(&server).await, old);
    let metrics = reqwest::get(server.plain_url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("sidecar_injector_certificate_reload_errors_total 1"), "{metrics}");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_are_on_the_plain_port() {
    let server = TestServer::start(|_| {});
    let get = |path: &'static str| {
        let url = server.plain_url(path);
        async move {
            let r = reqwest::get(url).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(get("/healthz").await, (200, "ok\n".to_owned()));
    assert_eq!(get("/readyz").await, (200, "ok\n".to_owned()));
    let (status, metrics) = get("/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "sidecar_injector_templates_loaded 3",
        "sidecar_injector_ready 1",
        "sidecar_injector_certificate_expiry_timestamp_seconds",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    assert_eq!(get("/mutate").await.0, 404, "admission is not served on the plain port");
    server.stop();
}

/// With `tls.client_ca_file`, only a client presenting a certificate from that CA (the API server,
/// as its AdmissionConfiguration configures it) gets through the handshake; anyone else is refused
/// before a single byte of a request is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_the_api_servers_certificate_gets_in() {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let now = time::OffsetDateTime::now_utc();
    let api_server_ca = sidecar_injector::certs::generate_ca("API server client CA", now, 30).unwrap();
    let other_ca = sidecar_injector::certs::generate_ca("someone else", now, 30).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("client-ca.pem");
    std::fs::write(&ca_file, &api_server_ca.cert).unwrap();
    let server = TestServer::start(|s| s.tls.client_ca_file = Some(ca_file.clone()));
    let body = serde_json::to_vec(&admission_review(&typical_pod(), "shop", "mtls")).unwrap();

    // (case, client certificate, answered)
    let api_server = sidecar_injector::certs::issue_client(&api_server_ca, "kube-apiserver", now, 30).unwrap();
    let impostor = sidecar_injector::certs::issue_client(&other_ca, "kube-apiserver", now, 30).unwrap();
    let cases = [
        ("the API server's certificate", Some(&api_server), true),
        ("another CA's certificate", Some(&impostor), false),
        ("no certificate", None, false),
    ];
    for (case, certificate, answered) in cases {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(server.ca.cert.as_bytes()).unwrap()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let tls = match certificate {
            None => builder.with_no_client_auth(),
            Some(pem) => {
                let chain = vec![CertificateDer::from_pem_slice(pem.cert.as_bytes()).unwrap()];
                builder
                    .with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).unwrap())
                    .unwrap()
            }
        };
        let client = reqwest::Client::builder().tls_backend_preconfigured(tls).build().unwrap();
        let result = client.post(server.url("/mutate")).body(body.clone()).send().await;
        match (answered, result) {
            (true, Ok(response)) => assert_eq!(response.status(), 200, "{case}"),
            (false, Err(_)) => {}
            (want, got) => panic!("{case}: expected answered={want}, got {got:?}"),
        }
    }
    server.stop();
}
