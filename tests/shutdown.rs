//! SIGTERM while requests are in flight: the real binary stops accepting, finishes every in-flight
//! request, and exits 0.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::fixtures::{admission_review, huge_pod};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_every_in_flight_request_finish() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    let https = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let http = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .arg("serve")
        .env("SIDECAR_INJECTOR__CLUSTER__MODE", "off")
        .env("SIDECAR_INJECTOR__SERVER__ADDRESS", "127.0.0.1")
        .env("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", https.to_string())
        .env("SIDECAR_INJECTOR__SERVER__HTTP_PORT", http.to_string())
        .env("SIDECAR_INJECTOR__SERVER__SHUTDOWN_TIMEOUT_SECONDS", "15")
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
    let client = reqwest::Client::builder().tls_backend_preconfigured(tls).pool_max_idle_per_host(0).build().unwrap();

    // 24 requests whose bodies (a 430 KiB pod each) arrive in 20 slices over about 2 s: all of them
    // are in flight when SIGTERM arrives after 0.7 s.
    let body = serde_json::to_vec(&admission_review(&huge_pod(10, 1000), "shop", "in-flight")).unwrap();
    let url = format!("https://localhost:{https}/mutate");
    let mut requests = Vec::new();
    for _ in 0..24 {
        let chunks: Vec<Vec<u8>> = body.chunks(body.len() / 20 + 1).map(<[u8]>::to_vec).collect();
        let slow = futures::stream::iter(chunks).then(|chunk| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, std::io::Error>(chunk)
        });
        let request = client.post(&url).body(reqwest::Body::wrap_stream(slow));
        requests.push(tokio::spawn(async move {
            let response = request.send().await?;
            let status = response.status();
            let answer: serde_json::Value = response.json().await?;
            Ok::<_, reqwest::Error>((status, answer))
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let sigterm = Instant::now();
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };

    let mut ok = 0;
    for request in requests {
        let (status, answer) = request.await.unwrap().expect("an in-flight request failed");
        assert_eq!(status, 200);
        assert!(answer["response"]["patch"].is_string(), "{answer}");
        ok += 1;
    }
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(sigterm.elapsed() < Duration::from_secs(20), "the server did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "SIGTERM with {ok} requests in flight: {ok} answered 200, exit {status} after {:.1} s",
        sigterm.elapsed().as_secs_f64()
    );
    assert!(status.success(), "exit status {status}");
    assert!(
        Command::new("curl").args(["-s", "--max-time", "1", &ready]).status().map(|s| !s.success()).unwrap_or(true),
        "still listening"
    );
}

use futures::StreamExt as _;
