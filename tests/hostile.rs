//! The hostile-input matrix: malformed, oversized, deeply nested, slow and plain wrong inputs against
//! the running server over TLS, each with its exact expected answer, while a canary client keeps
//! sending normal requests that must all succeed (nothing may crash, hang or starve other clients).
//! Run with `cargo test --test hostile -- --nocapture` to see the matrix.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::fixtures::{admission_review, typical_pod};
use common::server::TestServer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a case must produce.
#[derive(Debug)]
enum Expect {
    /// This HTTP status and a review message starting with this text.
    Status(u16, &'static str),
    /// 200, allowed, with a patch (and the check below on the patched pod).
    Patched,
    /// 200, allowed, no patch.
    AllowedUnchanged,
    /// 200, refused, with this text in the message.
    Denied(&'static str),
}

struct Case {
    name: &'static str,
    path: &'static str,
    body: Vec<u8>,
    expect: Expect,
}

fn review_with(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut review = admission_review(&typical_pod(), "shop", "hostile");
    edit(&mut review);
    serde_json::to_vec(&review).unwrap()
}

fn configmap_review(template: &str) -> Vec<u8> {
    let configmap = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "sidecar-templates", "namespace": "sidecar-injector", "labels": {"sidecar-injector.io/templates": "true"}},
        "data": {"evil.yaml": template}
    });
    review_with(|r| {
        r["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
        r["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "configmaps"});
        r["request"]["namespace"] = json!("sidecar-injector");
        r["request"]["name"] = json!("sidecar-templates");
        r["request"]["operation"] = json!("UPDATE");
        r["request"]["object"] = configmap;
    })
}

fn body_cases() -> Vec<Case> {
    let review = serde_json::to_vec(&admission_review(&typical_pod(), "shop", "hostile")).unwrap();
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes();
    let mut many_labels = typical_pod();
    many_labels["metadata"]["labels"] =
        Value::Object((0..100_000).map(|i| (format!("label-{i}"), json!("v"))).collect());
    // A claim of one template with 20,000 made-up versions, over a container of that name with
    // another image (so the version is looked for by rebuilding too): one is looked for, not 20,000.
    let mut many_claims = typical_pod();
    let refs: Vec<Value> = (0..20_000).map(|i| json!({"name": "log-shipper", "hash": format!("{i:016x}")})).collect();
    let claim = json!({"templates": refs, "initContainers": ["log-shipper"], "nativeSidecars": ["log-shipper"]});
    many_claims["metadata"]["annotations"]["sidecar-injector.io/status"] = json!(claim.to_string());
    many_claims["spec"]["initContainers"] =
        json!([{"name": "log-shipper", "image": "fluent/fluent-bit:0.1", "restartPolicy": "Always"}]);
    let mut huge_annotation = typical_pod();
    huge_annotation["metadata"]["annotations"]["note"] = json!("x".repeat(3 * 1024 * 1024));
    vec![
        Case {
            name: "truncated JSON",
            path: "/mutate",
            body: review[..review.len() / 2].to_vec(),
            expect: Expect::Status(400, "the body is not valid JSON: EOF while parsing"),
        },
        Case {
            name: "invalid JSON",
            path: "/mutate",
            body: b"{\"apiVersion\": admission}".to_vec(),
            expect: Expect::Status(400, "the body is not valid JSON: expected value at line 1 column 16"),
        },
        Case {
            name: "empty body",
            path: "/mutate",
            body: Vec::new(),
            expect: Expect::Status(400, "the body is not valid JSON: EOF while parsing a value at line 1 column 0"),
        },
        Case {
            name: "JSON but not an object",
            path: "/validate",
            body: b"\"AdmissionReview\"".to_vec(),
            expect: Expect::Status(400, "the body is not an AdmissionReview: invalid type: string"),
        },
        Case {
            name: "UTF-8 byte order mark",
            path: "/mutate",
            body: [b"\xEF\xBB\xBF".as_slice(), &review].concat(),
            expect: Expect::Status(400, "the body is not valid JSON: expected value at line 1 column 1"),
        },
        Case {
            name: "invalid UTF-8",
            path: "/mutate",
            body: [&review[..40], b"\xC3\x28", &review[40..]].concat(),
            expect: Expect::Status(400, "the body is not UTF-8: invalid byte at offset 40"),
        },
        Case {
            name: "wrong apiVersion",
            path: "/mutate",
            body: review_with(|r| r["apiVersion"] = json!("admission.k8s.io/v1beta1")),
            expect: Expect::Status(
                400,
                "unsupported apiVersion \"admission.k8s.io/v1beta1\": only admission.k8s.io/v1 is served",
            ),
        },
        Case {
            name: "wrong kind",
            path: "/mutate",
            body: review_with(|r| r["kind"] = json!("ConversionReview")),
            expect: Expect::Status(400, "unsupported kind \"ConversionReview\": expected AdmissionReview"),
        },
        Case {
            name: "missing request",
            path: "/mutate",
            body: review_with(|r| drop(r.as_object_mut().unwrap().remove("request"))),
            expect: Expect::Status(400, "the AdmissionReview has no request"),
        },
        Case {
            name: "missing uid",
            path: "/mutate",
            body: review_with(|r| drop(r["request"].as_object_mut().unwrap().remove("uid"))),
            expect: Expect::Status(400, "request.uid is missing"),
        },
        Case {
            name: "uid of the wrong type",
            path: "/mutate",
            body: review_with(|r| r["request"]["uid"] = json!(42)),
            expect: Expect::Status(400, "request.uid: invalid type: integer `42`, expected a string"),
        },
        Case {
            name: "missing object",
            path: "/mutate",
            body: review_with(|r| drop(r["request"].as_object_mut().unwrap().remove("object"))),
            expect: Expect::Status(400, "request.object is missing"),
        },
        Case {
            name: "unknown operation",
            path: "/mutate",
            body: review_with(|r| r["request"]["operation"] = json!("PATCH")),
            expect: Expect::Status(400, "request.operation: unknown variant `PATCH`"),
        },
        Case {
            name: "duplicate keys",
            path: "/mutate",
            body: br#"{"apiVersion":"admission.k8s.io/v1","apiVersion":"x","kind":"AdmissionReview"}"#.to_vec(),
            expect: Expect::Status(400, "the body is not an AdmissionReview: duplicate field `apiVersion`"),
        },
        Case {
            name: "number out of range",
            path: "/mutate",
            body: review_with(|r| r["request"]["object"]["spec"]["priority"] = json!(1))
                .replace_first(b"\"priority\":1", b"\"priority\":1e400"),
            expect: Expect::Status(400, "the body is not valid JSON: number out of range"),
        },
        Case {
            name: "100,000 nested arrays",
            path: "/mutate",
            body: nested(100_000),
            expect: Expect::Status(400, "the body is not an AdmissionReview: invalid type: sequence"),
        },
        // serde_json skips an unknown field's value without recursing: read, ignored, then judged.
        Case {
            name: "100,000 nested arrays under an unknown key",
            path: "/mutate",
            body: [
                b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"extra\":".as_slice(),
                &nested(100_000),
                b"}",
            ]
            .concat(),
            expect: Expect::Status(400, "the AdmissionReview has no request"),
        },
        Case {
            name: "deeply nested pod field",
            path: "/mutate",
            body: review_with(|r| r["request"]["object"]["spec"]["x"] = json!(null))
                .replace_first(b"\"x\":null", &[b"\"x\":".as_slice(), &nested(5000)].concat()),
            expect: Expect::Status(400, "the body is not valid JSON: recursion limit exceeded"),
        },
        Case {
            name: "10 MiB body",
            path: "/mutate",
            body: vec![b' '; 10 * 1024 * 1024],
            expect: Expect::Status(
                413,
                "the request body is larger than the limit of 4194304 bytes (server.max_body_bytes)",
            ),
        },
        Case {
            name: "a Deployment instead of a pod",
            path: "/mutate",
            body: review_with(|r| {
                r["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"})
            }),
            expect: Expect::AllowedUnchanged,
        },
        Case {
            name: "100,000 labels",
            path: "/mutate",
            body: serde_json::to_vec(&admission_review(&many_labels, "shop", "hostile")).unwrap(),
            expect: Expect::Patched,
        },
        Case {
            name: "a 3 MiB annotation",
            path: "/mutate",
            body: serde_json::to_vec(&admission_review(&huge_annotation, "shop", "hostile")).unwrap(),
            expect: Expect::Patched,
        },
        Case {
            name: "a status naming one template 20,000 times",
            path: "/mutate",
            body: serde_json::to_vec(&admission_review(&many_claims, "shop", "hostile")).unwrap(),
            expect: Expect::Patched,
        },
        Case {
            name: "YAML injection in an override",
            path: "/mutate",
            body: review_with(|r| {
                r["request"]["object"]["metadata"]["annotations"]["sidecar-injector.io/log-shipper.logLevel"] =
                    json!("x\"\nprivileged: true\n- name: evil\n  image: evil")
            }),
            expect: Expect::Patched,
        },
        Case {
            name: "template that loops forever",
            path: "/validate",
            body: configmap_review(
                "inject:\n  annotations:\n    a: \"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}\"\n",
            ),
            expect: Expect::Denied("template \"evil\" line 3: \"{% for i in range(100000) %}"),
        },
        Case {
            name: "template that renders gigabytes",
            path: "/validate",
            body: configmap_review("inject:\n  annotations:\n    a: \"{{ 'x' * 100000000 }}{{ 'x' * 100000000 }}\"\n"),
            expect: Expect::Denied("test-rendering it exceeded the sandbox limits (96 MiB of memory"),
        },
        Case {
            name: "template with undefined variables",
            path: "/validate",
            body: configmap_review("inject:\n  annotations:\n    a: \"{{ secrets.token }}\"\n"),
            expect: Expect::Denied("template \"evil\" line 3: undefined value in \"{{ secrets.token }}\""),
        },
        Case {
            name: "template that doubles a string to gigabytes",
            path: "/validate",
            body: configmap_review(&format!(
                "inject:\n  annotations:\n    a: \"{{% set x = 'x' * 100000000 %}}{}{{{{ x | length }}}}\"\n",
                "{% set x = x ~ x %}".repeat(6)
            )),
            expect: Expect::Denied(
                "template \"evil\": test-rendering it exceeded the sandbox limits (96 MiB of memory, 2 s of CPU)",
            ),
        },
        Case {
            name: "template with a billion-laughs alias bomb",
            path: "/validate",
            body: configmap_review(&alias_bomb()),
            expect: Expect::Denied("template \"evil\""),
        },
    ]
}

/// YAML anchors that would expand to 10^9 nodes.
fn alias_bomb() -> String {
    let mut text = String::from("values:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = i - 1;
        text.push_str(&format!(
            "  a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    text
}

trait ReplaceFirst {
    fn replace_first(self, from: &[u8], to: &[u8]) -> Vec<u8>;
}

impl ReplaceFirst for Vec<u8> {
    fn replace_first(self, from: &[u8], to: &[u8]) -> Vec<u8> {
        let at = self.windows(from.len()).position(|w| w == from).expect("pattern present");
        [&self[..at], to, &self[at + from.len()..]].concat()
    }
}

fn check_patched(answer: &Value, name: &str) {
    use base64::Engine as _;
    let patch =
        base64::engine::general_purpose::STANDARD.decode(answer["response"]["patch"].as_str().unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    if name == "YAML injection in an override" {
        let mut pod = typical_pod();
        json_patch::patch(&mut pod, &patch).unwrap();
        let shipper =
            pod["spec"]["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "log-shipper").unwrap();
        assert!(
            shipper.get("privileged").is_none() && !shipper["args"].as_array().unwrap().iter().any(|a| a == "evil")
        );
        assert_eq!(
            shipper["args"][5], "--log_level=x\"\nprivileged: true\n- name: evil\n  image: evil",
            "only inside the string"
        );
    }
}

/// Normal requests on their own connections for the whole test; every one must succeed.
struct Canary {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    slowest_micros: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Canary {
    fn start(server: &TestServer) -> Canary {
        let client = server.client();
        let url = server.url("/mutate");
        let body = serde_json::to_vec(&admission_review(&typical_pod(), "shop", "canary")).unwrap();
        let (stop, ok, failed) =
            (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let slowest_micros = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (stop, ok, failed, slowest) = (stop.clone(), ok.clone(), failed.clone(), slowest_micros.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    match client.post(&url).body(body.clone()).send().await {
                        Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                    slowest.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        Canary { stop, ok, failed, slowest_micros, task }
    }

    async fn finish(self) -> (usize, usize, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        let slowest = Duration::from_micros(self.slowest_micros.load(Ordering::Relaxed));
        (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed), slowest)
    }
}

async fn tls(
    server: &TestServer,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(server.client_tls(versions)));
    let tcp = tokio::net::TcpStream::connect(server.https).await.unwrap();
    connector.connect("localhost".try_into().unwrap(), tcp).await.unwrap()
}

/// Reads until the peer closes or `limit` passes; returns what arrived and how long it took.
async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    limit: Duration,
) -> (Vec<u8>, Duration, bool) {
    let started = Instant::now();
    let mut received = Vec::new();
    let closed = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (received, started.elapsed(), closed)
}

/// A TLS ClientHello that offers only `version` (0x0301 TLS 1.0, 0x0302 TLS 1.1).
fn legacy_client_hello(version: u16) -> Vec<u8> {
    let [major, minor] = version.to_be_bytes();
    let mut hello = vec![major, minor];
    hello.extend_from_slice(&[7u8; 32]); // random
    hello.push(0); // session id
    hello.extend_from_slice(&[0x00, 0x04, 0x00, 0x2f, 0x00, 0x35]); // TLS_RSA_WITH_AES_128/256_CBC_SHA
    hello.extend_from_slice(&[0x01, 0x00]); // no compression
    let mut handshake = vec![0x01, 0x00, (hello.len() >> 8) as u8, hello.len() as u8];
    handshake.extend_from_slice(&hello);
    let mut record = vec![0x16, major, minor, (handshake.len() >> 8) as u8, handshake.len() as u8];
    record.extend_from_slice(&handshake);
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_hostile_input_matrix() {
    let fds = common::raise_fd_limit(16_384);
    let server = TestServer::start(|s| {
        s.server.client_request_timeout_ms = 1000;
        s.server.body_timeout_ms = 1000;
        s.server.room_wait_ms = 200;
    });
    let canary = Canary::start(&server);
    let client = server.client();
    let mut matrix = Vec::new();

    for case in body_cases() {
        let started = Instant::now();
        let response = client.post(server.url(case.path)).body(case.body).send().await.unwrap();
        let status = response.status().as_u16();
        let answer: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        let message = answer["response"]["status"]["message"].as_str().unwrap_or_default().to_owned();
        let allowed = answer["response"]["allowed"].as_bool();
        match &case.expect {
            Expect::Status(want, text) => {
                assert_eq!(status, *want, "{}: {message}", case.name);
                assert!(message.starts_with(text), "{}: {message}", case.name);
            }
            Expect::Patched => {
                assert_eq!((status, allowed), (200, Some(true)), "{}: {message}", case.name);
                check_patched(&answer, case.name);
            }
            Expect::AllowedUnchanged => {
                assert_eq!((status, allowed), (200, Some(true)), "{}", case.name);
                assert!(answer["response"].get("patch").is_none(), "{}", case.name);
            }
            Expect::Denied(text) => {
                assert_eq!((status, allowed), (200, Some(false)), "{}: {message}", case.name);
                assert!(message.contains(text), "{}: {message}", case.name);
            }
        }
        let shown = if message.is_empty() { format!("{:?}", case.expect) } else { message.chars().take(90).collect() };
        matrix.push(format!("| {} | {status} | {shown} | {} ms |", case.name, started.elapsed().as_millis()));
    }

    // Slow loris: headers dribbled a byte at a time are cut off after client_request_timeout_ms.
    let mut slow = tls(&server, &[&rustls::version::TLS13]).await;
    let started = Instant::now();
    let mut cut_off = false;
    for byte in b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n".iter() {
        if slow.write_all(&[*byte]).await.is_err() || slow.flush().await.is_err() {
            cut_off = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if started.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    let (reply, _, closed) = read_until_closed(&mut slow, Duration::from_secs(3)).await;
    assert!(cut_off || closed, "a slow client was not cut off");
    assert!(started.elapsed() < Duration::from_secs(8), "cut off after {:?}", started.elapsed());
    matrix.push(format!(
        "| slow loris (headers at 10 bytes/s) | {} | connection closed after {:.1} s | - |",
        String::from_utf8_lossy(&reply).lines().next().unwrap_or("-"),
        started.elapsed().as_secs_f64()
    ));

    // A body that stops half-way gets 408 after body_timeout_ms.
    let mut stalled = tls(&server, &[&rustls::version::TLS13]).await;
    stalled
        .write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000\r\n\r\n{\"apiVersion\":")
        .await
        .unwrap();
    let (reply, took, _) = read_until_closed(&mut stalled, Duration::from_secs(5)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 408") && reply.contains("did not arrive within 1000 ms"), "{reply}");
    matrix.push(format!(
        "| body stalls half-way | 408 | the request body did not arrive within 1000 ms | {} ms |",
        took.as_millis()
    ));

    // No room among the bodies in flight: a stalled request holds the whole large-body room, so
    // the next large one waits room_wait_ms and gets 503 with Retry-After (the API server
    // retries such an answer within its timeout instead of failing open).
    let max_body = 4 * 1024 * 1024;
    let mut holder = tls(&server, &[&rustls::version::TLS13]).await;
    holder
        .write_all(
            format!("POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: {max_body}\r\n\r\n{{").as_bytes(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = tls(&server, &[&rustls::version::TLS13]).await;
    second.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n").await.unwrap();
    let (reply, took, _) = read_until_closed(&mut second, Duration::from_secs(3)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.to_ascii_lowercase().contains("retry-after: 1\r\n"), "{reply}");
    assert!(reply.contains("no room within 200 ms (server.room_wait_ms); retry"), "{reply}");
    drop(holder);
    matrix.push(format!(
        "| no room among the bodies in flight (a stalled 4 MiB body holds it) | 503, Retry-After: 1 | no room within 200 ms | {} ms |",
        took.as_millis()
    ));

    // A Content-Length that lies: the client closes early; the server frees the connection.
    let mut liar = tls(&server, &[&rustls::version::TLS13]).await;
    liar.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n{}").await.unwrap();
    liar.shutdown().await.unwrap();
    let (_, took, closed) = read_until_closed(&mut liar, Duration::from_secs(5)).await;
    assert!(closed);
    matrix.push(format!(
        "| Content-Length larger than the body, then EOF | - | connection closed | {} ms |",
        took.as_millis()
    ));

    // TLS 1.0 and 1.1 are refused during the handshake.
    for (version, name) in [(0x0301u16, "TLS 1.0 ClientHello"), (0x0302, "TLS 1.1 ClientHello")] {
        let mut tcp = tokio::net::TcpStream::connect(server.https).await.unwrap();
        tcp.write_all(&legacy_client_hello(version)).await.unwrap();
        let (reply, took, closed) = read_until_closed(&mut tcp, Duration::from_secs(5)).await;
        assert!(closed, "{name}: not closed");
        // A TLS alert record (content type 21); protocol_version (70) or handshake_failure (40).
        assert_eq!(reply.first(), Some(&21), "{name}: {reply:?}");
        assert!(matches!(reply.get(6), Some(70 | 40)), "{name}: alert {reply:?}");
        matrix.push(format!("| {name} | - | TLS alert {} and close | {} ms |", reply[6], took.as_millis()));
    }

    // Plain HTTP on the TLS port: closed, no hang.
    let mut plain = tokio::net::TcpStream::connect(server.https).await.unwrap();
    plain.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}").await.unwrap();
    let (_, took, closed) = read_until_closed(&mut plain, Duration::from_secs(5)).await;
    assert!(closed, "plain HTTP on the TLS port was not closed");
    matrix.push(format!("| plain HTTP on the TLS port | - | connection closed | {} ms |", took.as_millis()));

    // Thousands of idle connections do not starve a normal client.
    let idle_count = if fds >= 8192 { 3000 } else { (fds as usize / 3).min(3000) };
    let mut idle = Vec::with_capacity(idle_count);
    for _ in 0..idle_count {
        idle.push(tokio::net::TcpStream::connect(server.https).await.unwrap());
    }
    let started = Instant::now();
    let response = client
        .post(server.url("/mutate"))
        .body(serde_json::to_vec(&admission_review(&typical_pod(), "shop", "x")).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    matrix.push(format!(
        "| {idle_count} idle connections, then a normal request | 200 | answered | {} ms |",
        started.elapsed().as_millis()
    ));
    drop(idle);

    // Unknown routes.
    let response = client.get(server.url("/admin")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    matrix.push("| GET /admin | 404 | no route for GET /admin | - |".to_owned());

    let (ok, failed, slowest) = canary.finish().await;
    println!("| case | status | answer | time |\n| --- | --- | --- | --- |\n{}", matrix.join("\n"));
    println!("canary: {ok} normal requests during the matrix, {failed} failed, slowest {} ms", slowest.as_millis());
    assert!(matrix.len() >= 25, "the matrix has {} cases", matrix.len());
    assert_eq!(failed, 0, "normal requests failed during the hostile inputs");
    assert!(ok > 10, "the canary did not run");
    assert!(slowest < Duration::from_secs(3), "a normal request took {slowest:?}: starved");
    server.stop();
}
