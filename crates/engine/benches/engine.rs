//! Micro-benchmark of the engine: the cost of one admission decision (parse the pod JSON, evaluate,
//! serialize the patch) for a typical pod and for huge ones, and how it scales with pod size.
//! Prints a table and the ratios, and the heap allocations of one typical decision (counted by a
//! wrapping global allocator); then what the node pool costs per decision and in memory from one
//! node to 15,000 (the nodes decide native sidecars and image volumes); run with `make bench`.

#[path = "../../../tests/common/fixtures.rs"]
mod fixtures;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sidecar_injector_engine::injection::nodes::{KnownNodes, NodeFacts, NodeObject};
use sidecar_injector_engine::templates::set::{InProcess, embedded_sources};
use sidecar_injector_engine::{ClusterFacts, Engine, NamespaceFacts, Outcome, PodRequest, TemplateSet, TemplateSource};

/// The system allocator, counting allocations (a relaxed add per call: noise next to a decision).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not yet freed.
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is passed to the system allocator unchanged.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap allocations (and reallocations) of one decision.
fn allocations(engine: &Engine, body: &[u8]) -> u64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    measure_once(engine, body);
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

/// Median time of one decision (parse, evaluate, serialize the patch), over batches that together
/// run for about `budget`.
fn measure(engine: &Engine, body: &[u8], budget: Duration) -> Duration {
    median_time(budget, || measure_once(engine, body))
}

/// The request for a pod's JSON, parsed, in namespace `shop`.
fn request_of(body: &[u8]) -> PodRequest {
    let pod: Value = serde_json::from_slice(black_box(body)).unwrap();
    PodRequest {
        pod: Arc::new(pod),
        namespace: NamespaceFacts::unknown("shop"),
        cluster: ClusterFacts::default(),
        workload: None,
    }
}

/// One decision: parse the pod, evaluate, serialize the patch.
fn measure_once(engine: &Engine, body: &[u8]) -> usize {
    match engine.evaluate(&request_of(body)).outcome {
        Outcome::Inject(injection) => black_box(serde_json::to_vec(&injection.patch).unwrap().len()),
        other => panic!("expected an injection, got {other:?}"),
    }
}

/// One decision whatever its outcome (a claimed pod may be up to date): parse, evaluate, and
/// serialize the patch if there is one.
fn decide_once(engine: &Engine, body: &[u8]) -> usize {
    match engine.evaluate(&request_of(body)).outcome {
        Outcome::Inject(injection) => black_box(serde_json::to_vec(&injection.patch).unwrap().len()),
        Outcome::UpToDate(status) => black_box(status.templates.len()),
        other => panic!("expected an injection or up to date, got {other:?}"),
    }
}

/// Re-admissions of a pod that carries an injection (a copy of an injected pod, a pod created
/// from `kubectl get -o yaml`): up to date; after a template edit (its claim proved, then replaced);
/// and with an injected container resized in place since (its resources carried over). Each with
/// the time and allocations of one decision, beside a fresh pod's.
/// The re-admission rows; with `profile`, only the remembered-versions edit of an injected copy,
/// decided for a while (for `perf record`).
fn claimed_pods(engine: &Engine, typical: &[u8], budget: Duration, profile: bool) {
    let request = request_of(typical);
    let Outcome::Inject(injection) = engine.evaluate(&request).outcome else { panic!("the typical pod is injected") };
    let mut injected = (*request.pod).clone();
    json_patch::patch(&mut injected, &injection.patch).unwrap();
    // Every template edited: another image tag for each of its containers.
    let edited_sources = embedded_sources().into_iter().map(|mut source| {
        source.text = source.text.replace("fluent-bit:3.2.10", "fluent-bit:3.2.11");
        source.text =
            source.text.replace("contrib:0.120.0", "contrib:0.121.0").replace("envoy:v1.33.2", "envoy:v1.33.3");
        source
    });
    let edited_sources: Vec<TemplateSource> = edited_sources.collect();
    let (fresh, errors) = TemplateSet::load(edited_sources.clone());
    assert!(errors.is_empty(), "{errors:?}");
    let edited = Engine::new(fresh, Vec::new());
    // A replica that served the versions the pod names remembers them (`TemplateSet::update`).
    let (updated, errors) = engine.templates.update(edited_sources, &InProcess);
    assert!(errors.is_empty(), "{errors:?}");
    let remembering = Engine::new(updated, Vec::new());
    // The first injected container resized in place.
    let sidecar = injection.status.native_sidecars.first().or(injection.status.containers.first()).unwrap().clone();
    let mut resized = injected.clone();
    for list in ["initContainers", "containers"] {
        for container in resized["spec"][list].as_array_mut().into_iter().flatten() {
            if container["name"] == sidecar.as_str() {
                container["resources"] =
                    json!({"requests": {"cpu": "300m", "memory": "96Mi"}, "limits": {"memory": "192Mi"}});
            }
        }
    }
    let injected = serde_json::to_vec(&injected).unwrap();
    let resized = serde_json::to_vec(&resized).unwrap();
    println!();
    println!("{:<56} {:>12} {:>12}", "re-admission", "µs/decision", "allocations");
    let cases: [(&str, &Engine, &[u8]); 6] = [
        ("a fresh typical pod", engine, typical),
        ("its injected copy, templates unchanged (up to date)", engine, &injected),
        ("its injected copy after a template edit", &edited, &injected),
        ("the same, the claimed versions remembered", &remembering, &injected),
        ("its copy with a resized sidecar, after an edit", &edited, &resized),
        ("the same, the claimed versions remembered", &remembering, &resized),
    ];
    if profile {
        let (_, engine, body) = cases[3];
        measure(engine, body, Duration::from_secs(5));
        return;
    }
    for (name, engine, body) in cases {
        let time = median_time(budget, || decide_once(engine, body));
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        decide_once(engine, body);
        let count = ALLOCATIONS.load(Ordering::Relaxed) - before;
        println!("{name:<56} {:>12.1} {count:>12}", time.as_secs_f64() * 1e6);
    }
}

/// Median time of parsing (and dropping) the pod JSON alone: the floor under any decision.
fn measure_parse(body: &[u8], budget: Duration) -> Duration {
    median_time(budget, || black_box(serde_json::from_slice::<Value>(black_box(body)).unwrap()).is_object() as usize)
}

fn median_time(budget: Duration, mut once: impl FnMut() -> usize) -> Duration {
    let start = Instant::now();
    let mut calibration = 0u32;
    while start.elapsed() < budget / 10 {
        once();
        calibration += 1;
    }
    let per_batch = (calibration / 2).max(1);
    let mut batches = Vec::new();
    let start = Instant::now();
    while start.elapsed() < budget || batches.len() < 5 {
        let batch = Instant::now();
        for _ in 0..per_batch {
            once();
        }
        batches.push(batch.elapsed() / per_batch);
    }
    batches.sort();
    batches[batches.len() / 2]
}

/// The embedded templates plus `extra` default ones, each for pods with a label of its own: every
/// decision evaluates all of their selectors (the shape of part B of `bench/run.sh`).
fn with_unmatched_defaults(extra: usize) -> TemplateSet {
    let extras = (0..extra).map(|i| TemplateSource {
        name: format!("extra-{i}"),
        text: format!(
            "default: true\npodSelector: {{matchLabels: {{bench-template: \"{i}\"}}}}\ninject:\n  labels: {{bench-{i}: x}}\n"
        ),
    });
    let (templates, errors) = TemplateSet::load(embedded_sources().into_iter().chain(extras));
    assert!(errors.is_empty(), "{errors:?}");
    templates
}

/// Node `i` of a cluster labelled as a cloud provider labels its nodes (20 labels: a hostname of
/// its own, 4 zones, 10 node groups, 3 instance types), kubelets of four versions and one in 50
/// unreadable.
fn cloud_node(i: usize) -> NodeFacts {
    let (zone, group, size) = (["a", "b", "c", "d"][i % 4], i % 10, ["large", "xlarge", "2xlarge"][i % 3]);
    let host = format!("ip-10-0-{}-{}.eu-west-1.compute.internal", i / 250, i % 250);
    let labels = [
        ("kubernetes.io/hostname", host.clone()),
        ("kubernetes.io/os", "linux".into()),
        ("beta.kubernetes.io/os", "linux".into()),
        ("kubernetes.io/arch", "amd64".into()),
        ("beta.kubernetes.io/arch", "amd64".into()),
        ("topology.kubernetes.io/zone", format!("eu-west-1{zone}")),
        ("failure-domain.beta.kubernetes.io/zone", format!("eu-west-1{zone}")),
        ("topology.kubernetes.io/region", "eu-west-1".into()),
        ("failure-domain.beta.kubernetes.io/region", "eu-west-1".into()),
        ("topology.k8s.aws/zone-id", format!("euw1-az{}", i % 4)),
        ("topology.ebs.csi.aws.com/zone", format!("eu-west-1{zone}")),
        ("node.kubernetes.io/instance-type", format!("m6i.{size}")),
        ("beta.kubernetes.io/instance-type", format!("m6i.{size}")),
        ("eks.amazonaws.com/nodegroup", format!("group-{group}")),
        ("eks.amazonaws.com/nodegroup-image", format!("ami-0f3c2a9b8e7d6c5{group}")),
        ("eks.amazonaws.com/capacityType", "ON_DEMAND".into()),
        ("eks.amazonaws.com/sourceLaunchTemplateId", format!("lt-0a1b2c3d4e5f6a7b{group}")),
        ("eks.amazonaws.com/sourceLaunchTemplateVersion", "3".into()),
        ("k8s.io/cloud-provider-aws", "8c5b1f0e7a2d4c9b6e3f1a0d5c7b9e2f".into()),
        ("team", format!("team-{}", group % 3)),
    ];
    let labels = labels.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let kubelet =
        if i % 50 == 49 { "unknown" } else { ["v1.37.1", "v1.36.4", "v1.35.2", "v1.34.3-eks-113cf36"][i % 4] };
    NodeFacts::new(host, labels, kubelet).with_runtime("containerd://2.2.1")
}

/// Node `i` as the API server sends it in a watch event: [`cloud_node`]'s labels and versions with
/// what a real Node carries besides (annotations, managed fields, conditions, addresses, 50 images),
/// about 15 KiB of JSON.
fn cloud_node_json(i: usize) -> Vec<u8> {
    let facts = cloud_node(i);
    let kubelet = ["v1.37.1", "v1.36.4", "v1.35.2", "v1.34.3-eks-113cf36"][i % 4];
    let condition = |kind: &str, status: &str| {
        json!({"type": kind, "status": status, "lastHeartbeatTime": "2026-11-26T06:00:00Z",
        "lastTransitionTime": "2026-11-20T00:00:00Z", "reason": format!("Kubelet{kind}"), "message": format!("kubelet reports {kind} {status}")})
    };
    let images: Vec<Value> = (0..50)
        .map(|k| json!({"names": [format!("123456789012.dkr.ecr.eu-west-1.amazonaws.com/team-{k}/service@sha256:{:064x}", k * 7919 + i),
                                   format!("123456789012.dkr.ecr.eu-west-1.amazonaws.com/team-{k}/service:v1.{k}.{i}")], "sizeBytes": 50_000_000 + k * 1_000}))
        .collect();
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": facts.name, "uid": "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f", "resourceVersion": "123456789", "labels": facts.labels,
            "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.0.1", "csi.volume.kubernetes.io/nodeid": "{\"ebs.csi.aws.com\":\"i-0123456789abcdef0\"}",
                "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "subresource": "status", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:conditions": {}, "f:images": {}, "f:nodeInfo": {"f:bootID": {}}}}}]},
        "spec": {"providerID": "aws:///eu-west-1a/i-0123456789abcdef0", "podCIDR": "10.1.0.0/24"},
        "status": {"capacity": {"cpu": "8", "memory": "32408984Ki", "pods": "110", "ephemeral-storage": "104845292Ki"},
            "allocatable": {"cpu": "7910m", "memory": "31391128Ki", "pods": "110", "ephemeral-storage": "95551679124"},
            "conditions": [condition("MemoryPressure", "False"), condition("DiskPressure", "False"), condition("PIDPressure", "False"), condition("Ready", "True")],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": facts.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "ec2c0ffee0123456789abcdef0123456", "systemUUID": "ec2c0ffee-0123-4567-89ab-cdef01234567", "bootID": "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d",
                "kernelVersion": "6.1.115-126.197.amzn2023.x86_64", "osImage": "Amazon Linux 2023.6.20241121", "containerRuntimeVersion": "containerd://2.2.1",
                "kubeletVersion": kubelet, "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images}});
    serde_json::to_vec(&node).unwrap()
}

/// The node pool from 1 node to 15,000: what building it costs, what the watch's store and the
/// pool keep, and the cost of one decision for a pod that says nothing of nodes, one whose
/// required node affinity allows half of them, and one bound to a node by name.
fn node_pools(budget: Duration) {
    let api = ClusterFacts::api_server(true);
    let anywhere = json!({"spec": {"containers": [{"name": "app"}]}});
    let half = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-west-1a", "eu-west-1b"]},
                              {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}}});
    let named = json!({"spec": {"nodeName": "ip-10-0-0-1.eu-west-1.compute.internal"}});
    // A status update of a node the watch knows: read the event's object, compare, keep nothing.
    let mut known = KnownNodes::default();
    known.upsert(&cloud_node(1));
    let event = cloud_node_json(1);
    let update = median_time(budget / 2, || {
        let node: NodeObject = serde_json::from_slice(black_box(&event)).unwrap();
        known.upsert(&NodeFacts::of(&node)) as usize
    });
    assert!(!known.upsert(&NodeFacts::of(&serde_json::from_slice(&event).unwrap())), "a heartbeat changes nothing");
    println!();
    println!(
        "a node's status update ({:.1} KiB of JSON) costs the node watch {:.1} µs; the pool from 1 node to 15,000:",
        event.len() as f64 / 1024.0,
        update.as_secs_f64() * 1e6
    );
    println!(
        "{:>7} {:>11} {:>11} {:>14} {:>14} {:>14}",
        "nodes", "build ms", "KiB kept", "µs anywhere", "µs half", "µs nodeName"
    );
    for count in [1, 500, 5_000, 15_000] {
        let nodes: Vec<NodeFacts> = (0..count).map(cloud_node).collect();
        let before = LIVE_BYTES.load(Ordering::Relaxed);
        let started = Instant::now();
        let mut known = KnownNodes::default();
        for node in &nodes {
            known.upsert(node);
        }
        let pool = known.pool();
        let build = started.elapsed();
        let kept = LIVE_BYTES.load(Ordering::Relaxed) - before;
        let time = |pod: &Value| {
            median_time(budget / 4, || black_box(pool.facts_for(black_box(pod), api)).native_sidecars as usize)
        };
        println!(
            "{count:>7} {:>11.1} {:>11.0} {:>14.2} {:>14.2} {:>14.2}",
            build.as_secs_f64() * 1e3,
            kept as f64 / 1024.0,
            time(&anywhere).as_secs_f64() * 1e6,
            time(&half).as_secs_f64() * 1e6,
            time(&named).as_secs_f64() * 1e6
        );
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let budget = Duration::from_millis(if quick { 200 } else { 2000 });
    let (templates, errors) = TemplateSet::load(embedded_sources());
    assert!(errors.is_empty(), "{errors:?}");
    let engine = Engine::new(templates, Vec::new());

    let typical = serde_json::to_vec(&fixtures::typical_pod()).unwrap();
    if std::env::args().any(|a| a == "--profile-claimed") {
        claimed_pods(&engine, &typical, budget, true);
        return;
    }
    if std::env::args().any(|a| a == "--profile-typical") {
        // For `perf record`: only the typical decision, for a while.
        measure(&engine, &typical, Duration::from_secs(5));
        return;
    }
    let typical_time = measure(&engine, &typical, budget);
    println!("{:<34} {:>10} {:>12} {:>12} {:>14}", "pod", "JSON bytes", "µs/decision", "µs parsing", "ns per byte");
    let row = |name: &str, body: &[u8], time: Duration| {
        let parse = measure_parse(body, budget / 2);
        println!(
            "{name:<34} {:>10} {:>12.1} {:>12.1} {:>14.2}",
            body.len(),
            time.as_secs_f64() * 1e6,
            parse.as_secs_f64() * 1e6,
            time.as_nanos() as f64 / body.len() as f64
        );
    };
    row("typical (2 containers)", &typical, typical_time);
    println!("allocations per typical decision: {}", allocations(&engine, &typical));

    let mut series = Vec::new();
    for env in [125, 250, 500, 1000, 2000] {
        let body = serde_json::to_vec(&fixtures::huge_pod(10, env)).unwrap();
        let time = measure(&engine, &body, budget);
        row(&format!("10 containers x {env} env vars"), &body, time);
        series.push((env, body.len(), time));
    }
    let (_, huge_bytes, huge_time) = series.iter().find(|(env, _, _)| *env == 1000).copied().unwrap();
    println!();
    println!(
        "huge (10 x 1000 env, {} KiB) / typical: {:.1}x the time for {:.0}x the bytes",
        huge_bytes / 1024,
        huge_time.as_secs_f64() / typical_time.as_secs_f64(),
        huge_bytes as f64 / typical.len() as f64
    );
    let (first, last) = (series.first().unwrap(), series.last().unwrap());
    let many = Engine::new(with_unmatched_defaults(197), Vec::new());
    let many_time = measure(&many, &typical, budget);
    println!(
        "typical pod with 200 templates loaded (197 default ones whose podSelector it does not match) / 3: {:.2}x the time ({:.1} vs {:.1} µs)",
        many_time.as_secs_f64() / typical_time.as_secs_f64(),
        many_time.as_secs_f64() * 1e6,
        typical_time.as_secs_f64() * 1e6
    );
    println!(
        "scaling from {} to {} env vars per container (16x the pod): {:.1}x the time (linear = 16x, quadratic = 256x)",
        first.0,
        last.0,
        last.2.as_secs_f64() / first.2.as_secs_f64()
    );
    claimed_pods(&engine, &typical, budget, false);
    node_pools(budget);
}
