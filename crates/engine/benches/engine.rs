//! Micro-benchmark of the engine: the cost of one admission decision (parse the pod JSON, evaluate,
//! serialize the patch) for a typical pod and for huge ones, and how it scales with pod size.
//! Prints a table and the ratios, and the heap allocations of one typical decision (counted by a
//! wrapping global allocator); run with `make bench`.

#[path = "../../../tests/common/fixtures.rs"]
mod fixtures;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use sidecar_injector_engine::templates::template::embedded_sources;
use sidecar_injector_engine::{ClusterFacts, Engine, NamespaceFacts, Outcome, PodRequest, TemplateSet, TemplateSource};

/// The system allocator, counting allocations (a relaxed add per call: noise next to a decision).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
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

/// One decision: parse the pod, evaluate, serialize the patch.
fn measure_once(engine: &Engine, body: &[u8]) -> usize {
    let pod: Value = serde_json::from_slice(black_box(body)).unwrap();
    let request = PodRequest {
        pod: Arc::new(pod),
        namespace: NamespaceFacts::unknown("shop"),
        cluster: ClusterFacts::default(),
        workload: None,
    };
    match engine.evaluate(&request).outcome {
        Outcome::Inject(injection) => black_box(serde_json::to_vec(&injection.patch).unwrap().len()),
        other => panic!("expected an injection, got {other:?}"),
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

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let budget = Duration::from_millis(if quick { 200 } else { 2000 });
    let (templates, errors) = TemplateSet::load(embedded_sources());
    assert!(errors.is_empty(), "{errors:?}");
    let engine = Engine::new(templates, Vec::new());

    let typical = serde_json::to_vec(&fixtures::typical_pod()).unwrap();
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
}
