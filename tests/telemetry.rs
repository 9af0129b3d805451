//! OpenTelemetry traces: with `telemetry.otlp_endpoint` set, the real binary exports a span per
//! admission request (with its uid and decision) over OTLP/HTTP to a receiver on loopback.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::fixtures::{admission_review, typical_pod};

/// A minimal OTLP/HTTP receiver: records (path, body) of every POST and answers 200.
async fn receiver() -> (u16, Arc<Mutex<Vec<(String, Vec<u8>)>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = Arc::new(Mutex::new(Vec::new()));
    let store = received.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let store = store.clone();
            tokio::spawn(async move {
                let mut data = Vec::new();
                let mut buf = [0u8; 8192];
                loop {
                    let Ok(n) = socket.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    data.extend_from_slice(&buf[..n]);
                    let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
                    let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if data.len() < end + 4 + length {
                        continue;
                    }
                    let path = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
                    store.lock().unwrap().push((path, data[end + 4..end + 4 + length].to_vec()));
                    data.drain(..end + 4 + length);
                    let _ = socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
                        )
                        .await;
                }
            });
        }
    });
    (port, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_per_admission_request_is_exported_over_otlp() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (otlp_port, received) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (https, http) = (free(), free());
    let mut server = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .arg("serve")
        .env("SIDECAR_INJECTOR__CLUSTER__MODE", "off")
        .env("SIDECAR_INJECTOR__SERVER__ADDRESS", "127.0.0.1")
        .env("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", https.to_string())
        .env("SIDECAR_INJECTOR__SERVER__HTTP_PORT", http.to_string())
        .env("SIDECAR_INJECTOR__TELEMETRY__OTLP_ENDPOINT", format!("http://127.0.0.1:{otlp_port}"))
        .env("SIDECAR_INJECTOR__TLS__SELF_SIGNED_CA_FILE", &ca_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = format!("http://127.0.0.1:{http}/readyz");
    let started = Instant::now();
    while reqwest::get(&ready).await.map(|r| r.status() != 200).unwrap_or(true) {
        assert!(started.elapsed() < Duration::from_secs(20), "the server did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(&ca_file).unwrap()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client = reqwest::Client::builder().tls_backend_preconfigured(tls).build().unwrap();
    let body = serde_json::to_vec(&admission_review(&typical_pod(), "shop", "trace-me-4242")).unwrap();
    let response = client.post(format!("https://localhost:{https}/mutate")).body(body).send().await.unwrap();
    assert_eq!(response.status(), 200);

    // Stopping flushes the batch exporter.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the server did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = received.lock().unwrap();
    let traces: Vec<&Vec<u8>> =
        received.iter().filter(|(path, _)| path == "/v1/traces").map(|(_, body)| body).collect();
    assert!(!traces.is_empty(), "no OTLP export received: {:?}", received.iter().map(|(p, _)| p).collect::<Vec<_>>());
    let contains = |needle: &[u8]| traces.iter().any(|b| b.windows(needle.len()).any(|w| w == needle));
    for needle in [b"admission".as_slice(), b"trace-me-4242", b"patched", b"sidecar-injector"] {
        assert!(contains(needle), "the exported spans do not mention {:?}", String::from_utf8_lossy(needle));
    }
}
