//! The metrics the injector exports, by name, as `/metrics` shows them (`Metrics::encode` is what
//! the server's handler writes): for the documentation, alert and dashboard checks.

use std::collections::BTreeMap;

use sidecar_injector::telemetry::{CodeLabel, DriftLabels, EndpointLabel, Metrics, TemplateLabel};

/// Every exported metric family and its type (`counter` names end in `_total`, as exported).
pub fn exported() -> BTreeMap<String, String> {
    // A labelled family is exported once it has a series: give each one.
    let metrics = Metrics::default();
    metrics.request("mutate", "CREATE", "patched");
    metrics.skip("not_a_pod");
    metrics.resize("allowed");
    let template = TemplateLabel { template: "t".into() };
    metrics.injections.get_or_create(&template).inc();
    metrics.injection_conflicts.get_or_create(&template).inc();
    metrics.enforcement_audit.get_or_create(&template).inc();
    metrics.rollout_share.get_or_create(&template).set(25);
    metrics.rollout_halted.get_or_create(&template).set(0);
    metrics.rollout_halts.get_or_create(&template).inc();
    metrics.decision_warnings.get_or_create(&CodeLabel { code: "override_ignored" }).inc();
    metrics.event("published", 1);
    metrics.duration.get_or_create(&EndpointLabel { endpoint: "mutate".into() }).observe(0.001);
    let drift = DriftLabels { namespace: "n".into(), template: "t".into(), state: "stale".into() };
    metrics.drifted_pods.get_or_create(&drift).set(1);
    let families: BTreeMap<String, String> = metrics
        .encode()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| match kind {
            "counter" => (format!("{name}_total"), kind.to_owned()),
            _ => (name.to_owned(), kind.to_owned()),
        })
        .collect();
    // Every metric registered is exported above (a new labelled family needs a series here).
    let registered = include_str!("../../src/telemetry.rs").matches("registry.register(").count();
    assert_eq!(families.len(), registered, "exported {families:?}");
    families
}

/// Every series name a query can select: a histogram's `_bucket`, `_sum` and `_count` too.
pub fn series_names() -> Vec<String> {
    let mut names = Vec::new();
    for (name, kind) in exported() {
        if kind == "histogram" {
            names.extend(["_bucket", "_sum", "_count"].map(|suffix| format!("{name}{suffix}")));
        }
        names.push(name);
    }
    names
}

/// The metric names a PromQL expression uses that start with `prefix`.
pub fn used_in(expression: &str, prefix: &str) -> Vec<String> {
    let mut used = Vec::new();
    let mut rest = expression;
    while let Some(at) = rest.find(prefix) {
        let preceded = rest[..at].chars().last().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let name: String =
            rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
        if !preceded {
            used.push(name.clone());
        }
        rest = &rest[at + name.len().max(1)..];
    }
    used
}

/// Every PromQL expression of `deploy/components/monitoring`: the PrometheusRule's alerts (by
/// alert name) and the dashboard's panel targets (by panel title).
pub fn monitoring_expressions() -> Vec<(String, String)> {
    let dir = "deploy/components/monitoring";
    let rule = std::fs::read_to_string(format!("{dir}/prometheusrule.yaml")).expect("the PrometheusRule");
    let rule = sidecar_injector::engine::manifest::read(&rule).expect("the PrometheusRule is YAML").remove(0);
    let dashboard = std::fs::read_to_string(format!("{dir}/dashboard.json")).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let mut all: Vec<(String, String)> = rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| (text(&r["alert"]), text(&r["expr"])))
        .collect();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            all.push((format!("panel {:?}", text(&panel["title"])), text(&target["expr"])));
        }
    }
    all
}
