//! Pods for tests and benchmarks: a typical Deployment pod and a huge one. Shared with `benches/`
//! through `#[path]` (and with the engine crate's bench, `crates/engine/benches/`).
#![allow(dead_code)]

use serde_json::{Value, json};

/// A typical Deployment pod: two containers with probes, env, resources and volumes (about 2 KiB).
pub fn typical_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "checkout-7d9f8b6c5-",
            "namespace": "shop",
            "labels": {"app": "checkout", "app.kubernetes.io/name": "checkout", "pod-template-hash": "7d9f8b6c5"},
            "annotations": {"sidecar-injector.io/templates": "log-shipper,otel-agent"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "checkout-7d9f8b6c5", "uid": "0c4a-11", "controller": true}]
        },
        "spec": {
            "serviceAccountName": "checkout",
            "containers": [
                {
                    "name": "checkout",
                    "image": "shop/checkout:2.4.1",
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "env": [
                        {"name": "DB_HOST", "value": "postgres.shop.svc"},
                        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                        {"name": "LOG_LEVEL", "value": "info"}
                    ],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
                    "livenessProbe": {"httpGet": {"path": "/live", "port": "http"}, "periodSeconds": 20},
                    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/checkout"}, {"name": "tmp", "mountPath": "/tmp"}]
                },
                {
                    "name": "cache",
                    "image": "redis:7.4",
                    "args": ["--save", ""],
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "checkout-config"}},
                {"name": "tmp", "emptyDir": {}}
            ]
        }
    })
}

/// A pod with `containers` containers of `env_per_container` env vars each. 10 × 1,000 is about
/// 400 KiB of JSON.
pub fn huge_pod(containers: usize, env_per_container: usize) -> Value {
    let mut pod = typical_pod();
    let template = pod["spec"]["containers"][0].clone();
    pod["spec"]["containers"] = Value::Array(
        (0..containers)
            .map(|c| {
                let mut container = template.clone();
                container["name"] = json!(format!("app-{c}"));
                container["env"] = Value::Array(
                    (0..env_per_container)
                        .map(|e| json!({"name": format!("VAR_{e:05}"), "value": format!("value-{c}-{e}")}))
                        .collect(),
                );
                container
            })
            .collect(),
    );
    pod
}

/// An AdmissionReview for a pod CREATE.
pub fn admission_review(pod: &Value, namespace: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}
