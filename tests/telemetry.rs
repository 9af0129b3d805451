//! OpenTelemetry traces: with `telemetry.otlp_endpoint` set, the real binary exports a span per
//! admission request (with its uid and decision) over OTLP/HTTP to a receiver on loopback.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::fixtures::{admission_review, typical_pod};
use common::process::ServeProcess;

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
    let (otlp_port, received) = receiver().await;
    let mut server =
        ServeProcess::start(&[("SIDECAR_INJECTOR__TELEMETRY__OTLP_ENDPOINT", format!("http://127.0.0.1:{otlp_port}"))])
            .await;
    let client = server.client_builder().build().unwrap();
    let body = serde_json::to_vec(&admission_review(&typical_pod(), "shop", "trace-me-4242")).unwrap();
    let response = client.post(server.url("/mutate")).body(body).send().await.unwrap();
    assert_eq!(response.status(), 200);

    // Stopping flushes the batch exporter.
    server.sigterm();
    server.wait_exit(Duration::from_secs(20)).await;
    let received = received.lock().unwrap();
    let traces: Vec<&Vec<u8>> =
        received.iter().filter(|(path, _)| path == "/v1/traces").map(|(_, body)| body).collect();
    assert!(!traces.is_empty(), "no OTLP export received: {:?}", received.iter().map(|(p, _)| p).collect::<Vec<_>>());
    let contains = |needle: &[u8]| traces.iter().any(|b| b.windows(needle.len()).any(|w| w == needle));
    for needle in [b"admission".as_slice(), b"trace-me-4242", b"patched", b"sidecar-injector"] {
        assert!(contains(needle), "the exported spans do not mention {:?}", String::from_utf8_lossy(needle));
    }
}
