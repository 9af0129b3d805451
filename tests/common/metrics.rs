//! The metrics the injector exports, by name, as `/metrics` shows them (`Metrics::encode` is what
//! the server's handler writes): for the documentation, alert and dashboard checks.

use std::collections::BTreeMap;

use sidecar_injector::telemetry::{DriftLabels, EndpointLabel, Metrics, TemplateLabel};

/// Every exported metric family and its type (`counter` names end in `_total`, as exported).
pub fn exported() -> BTreeMap<String, String> {
    // A labelled family is exported once it has a series: give each one.
    let metrics = Metrics::default();
    metrics.request("mutate", "CREATE", "patched");
    metrics.skip("not_a_pod");
    let template = TemplateLabel { template: "t".into() };
    metrics.injections.get_or_create(&template).inc();
    metrics.injection_conflicts.get_or_create(&template).inc();
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
