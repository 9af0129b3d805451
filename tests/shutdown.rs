//! SIGTERM while requests are in flight: the real binary drains (keeps serving, every answer closing
//! its connection), stops accepting, finishes every in-flight request, and exits 0.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::fixtures::{admission_review, huge_pod};
use common::process::ServeProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_every_in_flight_request_finish() {
    // The bodies below are chunked (no Content-Length), so each reserves the whole large-body room
    // and they are read one after another: the wait for room must outlast the others' reads (this
    // test is about shutdown, not about the 503 an overloaded server answers).
    let mut server = ServeProcess::start(&[
        ("SIDECAR_INJECTOR__SERVER__SHUTDOWN_TIMEOUT_SECONDS", "15".to_owned()),
        ("SIDECAR_INJECTOR__SERVER__ROOM_WAIT_MS", "10000".to_owned()),
    ])
    .await;
    let client = server.client_builder().pool_max_idle_per_host(0).build().unwrap();

    // 24 requests whose bodies (a 430 KiB pod each) arrive in 20 slices over about 2 s: all of them
    // are in flight when SIGTERM arrives after 0.7 s.
    let body = serde_json::to_vec(&admission_review(&huge_pod(10, 1000), "shop", "in-flight")).unwrap();
    let url = server.url("/mutate");
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
    server.sigterm();

    let mut ok = 0;
    for request in requests {
        let (status, answer) = request.await.unwrap().expect("an in-flight request failed");
        assert_eq!(status, 200);
        assert!(answer["response"]["patch"].is_string(), "{answer}");
        ok += 1;
    }
    let status = server.wait_exit(Duration::from_secs(20)).await;
    println!(
        "SIGTERM with {ok} requests in flight: {ok} answered 200, exit {status} after {:.1} s",
        sigterm.elapsed().as_secs_f64()
    );
    assert!(status.success(), "exit status {status}");
    assert!(
        Command::new("curl")
            .args(["-s", "--max-time", "1", &server.ready_url()])
            .status()
            .map(|s| !s.success())
            .unwrap_or(true),
        "still listening"
    );
}

/// During the drain a pooled connection still gets its answer, marked `Connection: close` (so the
/// client retires it instead of the server closing it under a request), a new connection is still
/// served, and the process exits once the drain is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_with_connection_close_before_stopping() {
    let drain = Duration::from_secs(2);
    let mut server =
        ServeProcess::start(&[("SIDECAR_INJECTOR__SERVER__DRAIN_SECONDS", drain.as_secs().to_string())]).await;
    let pooled = server.client_builder().build().unwrap();
    let body = serde_json::to_vec(&admission_review(&huge_pod(1, 1), "shop", "drain")).unwrap();
    let url = server.url("/mutate");
    let post = |client: &reqwest::Client| client.post(&url).body(body.clone()).send();
    let connection = |response: &reqwest::Response| {
        response.headers().get("connection").map(|v| v.to_str().unwrap().to_ascii_lowercase())
    };

    let before = post(&pooled).await.unwrap();
    assert_eq!(before.status(), 200);
    assert_eq!(connection(&before), None, "keep-alive before shutdown");
    before.bytes().await.unwrap();

    let sigterm = Instant::now();
    server.sigterm();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let on_the_pooled_connection = post(&pooled).await.expect("a pooled connection is served during the drain");
    assert_eq!(on_the_pooled_connection.status(), 200);
    assert_eq!(connection(&on_the_pooled_connection).as_deref(), Some("close"));
    let fresh = server.client_builder().build().unwrap();
    let on_a_new_connection = post(&fresh).await.expect("a new connection is accepted during the drain");
    assert_eq!(on_a_new_connection.status(), 200);
    assert_eq!(connection(&on_a_new_connection).as_deref(), Some("close"));

    let status = server.wait_exit(Duration::from_secs(20)).await;
    let took = sigterm.elapsed();
    println!(
        "SIGTERM with a {drain:?} drain: served on pooled and new connections with Connection: close, exit {status} after {:.1} s",
        took.as_secs_f64()
    );
    assert!(status.success(), "exit status {status}");
    assert!(took >= drain, "exited {took:?} after SIGTERM, before the {drain:?} drain was over");
}

use futures::StreamExt as _;
