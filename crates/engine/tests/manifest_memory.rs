//! The manifest reader's memory on hostile and on the largest real inputs: the peak heap of one
//! `manifest::read`, measured by a counting allocator (this test binary's alone) and printed.
//! An alias bomb of a kilobyte stays within a few MiB; a 3,000-pod `List` still reads.

// The harness calls libc (signals, rlimits, mounts, an allocator) where `unsafe` is the only way.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use sidecar_injector_engine::manifest;

/// Counts the bytes allocated now and the most ever allocated at once since the last reset.
struct Peak;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Peak = Peak;

/// The tests share the counters: one measurement at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The peak heap above what was allocated before, while `f` runs.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - before)
}

const MIB: f64 = 1024.0 * 1024.0;

/// The corpus issue's bomb: a scalar, then eleven levels of lists of nine aliases of the level
/// below (9^11 nodes expanded).
fn alias_bomb() -> String {
    let mut bomb = String::from("a0: &a0 \"x\"\n");
    for level in 1..=11 {
        let below = vec![format!("*a{}", level - 1); 9].join(", ");
        bomb.push_str(&format!("a{level}: &a{level} [{below}]\n"));
    }
    bomb
}

#[test]
fn an_alias_bomb_stops_within_a_few_mib() {
    let bomb = alias_bomb();
    let (result, peak) = peak_during(|| manifest::read(&bomb));
    let err = result.expect_err("the bomb is refused");
    println!(
        "alias bomb of {} bytes: refused with a peak of {:.2} MiB: {}",
        bomb.len(),
        peak as f64 / MIB,
        err.message
    );
    assert!(err.message.contains("nodes per byte of input"), "{}", err.message);
    assert!(peak < 8 * 1024 * 1024, "peak {peak} bytes");
}

#[test]
fn the_largest_real_manifests_still_read() {
    // A List of 3,000 pods as `kubectl get pods -o yaml` prints them (~2.3 MB).
    let mut list = String::from("apiVersion: v1\nkind: List\nitems:\n");
    for i in 0..3000 {
        list.push_str(&format!(
            "- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: web-{i}\n    namespace: shop\n    labels: {{app: web, pod-template-hash: 5d9f8c7b6}}\n    annotations: {{kubectl.kubernetes.io/restartedAt: \"2026-11-25T10:00:00Z\"}}\n  spec:\n    containers:\n    - name: app\n      image: registry.example/web:1.2.3\n      args: [\"--port=8080\", \"--log-level=info\"]\n      ports: [{{containerPort: 8080, name: http}}]\n      env:\n      - {{name: MODE, value: production}}\n      - {{name: POD, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}\n      resources: {{requests: {{cpu: 100m, memory: 128Mi}}, limits: {{memory: 256Mi}}}}\n      volumeMounts: [{{name: data, mountPath: /data}}]\n    volumes: [{{name: data, emptyDir: {{}}}}]\n"
        ));
    }
    let (result, peak) = peak_during(|| manifest::read(&list));
    let documents = result.expect("a 3,000-pod List reads");
    assert_eq!(documents[0]["items"].as_array().map(Vec::len), Some(3000));
    println!("List of 3,000 pods, {} bytes: read with a peak of {:.1} MiB", list.len(), peak as f64 / MIB);

    // Anchors as manifests use them: shared defaults merged into every container.
    let mut anchored = String::from(
        "defaults: &defaults {image: registry.example/base:1, imagePullPolicy: IfNotPresent, resources: {requests: {cpu: 10m}}}\ncontainers:\n",
    );
    for i in 0..2000 {
        anchored.push_str(&format!("- {{<<: *defaults, name: c{i}}}\n"));
    }
    let (result, peak) = peak_during(|| manifest::read(&anchored));
    let documents = result.expect("merged anchors read");
    assert_eq!(documents[0]["containers"][1999]["image"], "registry.example/base:1");
    println!("2,000 merges of an anchor, {} bytes: read with a peak of {:.1} MiB", anchored.len(), peak as f64 / MIB);
}
