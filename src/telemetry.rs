//! Logs, traces and metrics. Logs and traces go through `tracing` (text or JSON lines; spans exported
//! over OTLP/HTTP when an endpoint is configured); metrics are Prometheus counters, gauges and
//! histograms named `sidecar_injector_*`, listed with their meaning in docs/metrics.md (a test compares the names).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogFormat, TelemetrySettings};

/// Labels of an admission request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `mutate` or `validate`.
    pub endpoint: String,
    /// `CREATE`, `UPDATE`, ... or `unknown` for unreadable requests.
    pub operation: String,
    /// `patched`, `allowed`, `denied`, `invalid` (400) or `too_large` (413).
    pub result: String,
}

/// One label: `template`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TemplateLabel {
    /// Template name.
    pub template: String,
}

/// One label: `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// One label: `result` of an Event (`published`, `suppressed`, `dropped`, `failed`) or of a
/// resize check (`allowed`, `denied`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventResultLabel {
    /// What became of it.
    pub result: String,
}

/// Labels of a drift count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    /// Namespace of the pods.
    pub namespace: String,
    /// The template that differs.
    pub template: String,
    /// `stale` (injected with another version) or `not_injected`.
    pub state: String,
}

/// One label: `code`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// A warning's stable code.
    pub code: &'static str,
}

/// One label: `endpoint`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    /// `mutate` or `validate`.
    pub endpoint: String,
}

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    /// `sidecar_injector_admission_requests_total{endpoint,operation,result}`.
    pub requests: Family<RequestLabels, Counter>,
    /// `sidecar_injector_injections_total{template}`: pods a template was injected into, every
    /// item of it (a template applied with conflicts counts in `injection_conflicts` instead).
    pub injections: Family<TemplateLabel, Counter>,
    /// `sidecar_injector_injection_conflicts_total{template}`: pods a template was applied to with
    /// conflicts (some of its items were already in the pod, whose own stand).
    pub injection_conflicts: Family<TemplateLabel, Counter>,
    /// `sidecar_injector_enforcement_audit_total{template}`: pods an `enforced: audit` template
    /// would have refused (or been injected into against their annotations) with `enforced: true`.
    pub enforcement_audit: Family<TemplateLabel, Counter>,
    /// `sidecar_injector_decision_warnings_total{code}`: warnings of admission decisions, by their
    /// stable code (`engine::WarningCode`).
    pub decision_warnings: Family<CodeLabel, Counter>,
    /// `sidecar_injector_enforcement_sync_errors_total`: failed writes of the enforcement policy's
    /// bindings and params (see `cluster::enforcement`).
    pub enforcement_sync_errors: Counter,
    /// `sidecar_injector_events_total{result}`: Kubernetes Events `published`, `suppressed` (the
    /// same Event within 30 s), `dropped` (queue full) or `failed` (the API refused them).
    pub events: Family<EventResultLabel, Counter>,
    /// `sidecar_injector_skips_total{reason}`: pods not injected, by reason.
    pub skips: Family<ReasonLabel, Counter>,
    /// `sidecar_injector_resizes_total{result}`: in-place resizes (`pods/resize`) checked,
    /// `allowed` or `denied` (an enforced template's container below what the template sets).
    pub resizes: Family<EventResultLabel, Counter>,
    /// `sidecar_injector_admission_duration_seconds{endpoint}`: time from body received to answer.
    pub duration: Family<EndpointLabel, Histogram>,
    /// `sidecar_injector_template_reload_errors_total`: template edits that failed to load.
    pub template_reload_errors: Counter,
    /// `sidecar_injector_templates_loaded`: templates in service.
    pub templates_loaded: Gauge,
    /// `sidecar_injector_rollout_share{template}`: for each rollout under way, the percent of
    /// workloads that get the new version (0 while halted).
    pub rollout_share: Family<TemplateLabel, Gauge>,
    /// `sidecar_injector_rollout_halted{template}`: 1 while a rollout is halted, else 0.
    pub rollout_halted: Family<TemplateLabel, Gauge>,
    /// The templates with rollout series (a family cannot list its own).
    rollout_series: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// `sidecar_injector_rollout_halts_total{template}`: rollouts this replica halted.
    pub rollout_halts: Family<TemplateLabel, Counter>,
    /// `sidecar_injector_certificate_expiry_timestamp_seconds`: when the serving certificate expires.
    pub certificate_expiry: Gauge,
    /// `sidecar_injector_certificate_reload_errors_total`: certificate files or Secrets that failed to load.
    pub certificate_reload_errors: Counter,
    /// `sidecar_injector_namespace_cache_misses_total`: requests for a namespace the cache did not know.
    pub namespace_cache_misses: Counter,
    /// `sidecar_injector_namespace_lookup_failures_total`: of those, the ones a direct read could not
    /// answer either (pods whose templates choose by namespace labels are then refused).
    pub namespace_lookup_failures: Counter,
    /// `sidecar_injector_ready`: 1 when `/readyz` answers ok.
    pub ready: Gauge,
    /// `sidecar_injector_namespaces_watched`: namespaces in the cache.
    pub namespaces_watched: Gauge,
    /// `sidecar_injector_pods_watched`: pods in the drift watch's pod index, kept current with every
    /// watch event.
    pub pods_watched: Gauge,
    /// `sidecar_injector_nodes_watched`: nodes the node watch knows, whether their kubelet version
    /// can be read or not (those that can decide native sidecars and image volumes).
    pub nodes_watched: Gauge,
    /// `sidecar_injector_drifted_pods{namespace,template,state}`: pods whose injection is not what
    /// the templates would do now. Only non-zero series exist.
    pub drifted_pods: Family<DriftLabels, Gauge>,
}

fn duration_histogram() -> Histogram {
    // Sub-millisecond resolution: a decision normally takes tens of microseconds.
    Histogram::new([0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0])
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sidecar_injector");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission requests by endpoint, operation and result",
            requests.clone(),
        );
        let injections = Family::<TemplateLabel, Counter>::default();
        registry.register("injections", "Pods a template was injected into, every item of it", injections.clone());
        let injection_conflicts = Family::<TemplateLabel, Counter>::default();
        registry.register(
            "injection_conflicts",
            "Pods a template was applied to with conflicts: the pod's own items stand where some of the template's would be",
            injection_conflicts.clone(),
        );
        let enforcement_audit = Family::<TemplateLabel, Counter>::default();
        registry.register(
            "enforcement_audit",
            "Pods an enforced: audit template would have refused, or been injected into against their annotations, with enforced: true",
            enforcement_audit.clone(),
        );
        let decision_warnings = Family::<CodeLabel, Counter>::default();
        registry.register(
            "decision_warnings",
            "Warnings of admission decisions (ignored overrides, audit findings, doubted claims, ...), by code",
            decision_warnings.clone(),
        );
        let enforcement_sync_errors = Counter::default();
        registry.register(
            "enforcement_sync_errors",
            "Failed writes of the enforcement policy's bindings and params for enforced templates",
            enforcement_sync_errors.clone(),
        );
        let events = Family::<EventResultLabel, Counter>::default();
        registry.register(
            "events",
            "Kubernetes Events by result: published, suppressed (the same Event within 30 s), dropped (queue full), failed",
            events.clone(),
        );
        let skips = Family::<ReasonLabel, Counter>::default();
        registry.register("skips", "Pods not injected, by reason", skips.clone());
        let resizes = Family::<EventResultLabel, Counter>::default();
        registry.register(
            "resizes",
            "In-place resizes of pods checked, by result: allowed, or denied (an enforced template's container below what it sets)",
            resizes.clone(),
        );
        let duration =
            Family::<EndpointLabel, Histogram>::new_with_constructor(duration_histogram as fn() -> Histogram);
        registry.register("admission_duration_seconds", "Time to decide an admission request", duration.clone());
        let template_reload_errors = Counter::default();
        registry.register(
            "template_reload_errors",
            "Template edits that failed to load",
            template_reload_errors.clone(),
        );
        let templates_loaded = Gauge::default();
        registry.register("templates_loaded", "Templates in service", templates_loaded.clone());
        let rollout_share = Family::<TemplateLabel, Gauge>::default();
        registry.register(
            "rollout_share",
            "For each rollout under way, the percent of workloads that get the new version (0 while halted)",
            rollout_share.clone(),
        );
        let rollout_halted = Family::<TemplateLabel, Gauge>::default();
        registry.register("rollout_halted", "1 while a template's rollout is halted", rollout_halted.clone());
        let rollout_halts = Family::<TemplateLabel, Counter>::default();
        registry.register(
            "rollout_halts",
            "Rollouts this replica halted because pods of the new version failed",
            rollout_halts.clone(),
        );
        let certificate_expiry = Gauge::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "Unix time at which the serving certificate expires",
            certificate_expiry.clone(),
        );
        let certificate_reload_errors = Counter::default();
        registry.register(
            "certificate_reload_errors",
            "Certificates that failed to load",
            certificate_reload_errors.clone(),
        );
        let namespace_cache_misses = Counter::default();
        registry.register(
            "namespace_cache_misses",
            "Requests for a namespace the cache had not seen (labels unknown)",
            namespace_cache_misses.clone(),
        );
        let namespace_lookup_failures = Counter::default();
        registry.register(
            "namespace_lookup_failures",
            "Namespaces neither in the cache nor readable directly (labels could not be read)",
            namespace_lookup_failures.clone(),
        );
        let ready = Gauge::default();
        registry.register("ready", "1 when the server is ready", ready.clone());
        let namespaces_watched = Gauge::default();
        registry.register("namespaces_watched", "Namespaces in the namespace cache", namespaces_watched.clone());
        let pods_watched = Gauge::default();
        registry.register("pods_watched", "Pods in the drift watch's pod index", pods_watched.clone());
        let nodes_watched = Gauge::default();
        registry.register("nodes_watched", "Nodes the node watch knows", nodes_watched.clone());
        let drifted_pods = Family::<DriftLabels, Gauge>::default();
        registry.register(
            "drifted_pods",
            "Pods injected with template versions that changed (stale) or never injected although templates apply (not_injected)",
            drifted_pods.clone(),
        );
        Metrics {
            registry,
            requests,
            injections,
            injection_conflicts,
            enforcement_audit,
            decision_warnings,
            enforcement_sync_errors,
            events,
            skips,
            resizes,
            duration,
            template_reload_errors,
            templates_loaded,
            rollout_share,
            rollout_halted,
            rollout_series: Default::default(),
            rollout_halts,
            certificate_expiry,
            certificate_reload_errors,
            namespace_cache_misses,
            namespace_lookup_failures,
            ready,
            namespaces_watched,
            pods_watched,
            nodes_watched,
            drifted_pods,
        }
    }
}

impl Metrics {
    /// Sets the rollout gauges from the templates in service: a template whose rollout ended
    /// (promoted, or its template gone) reads 0 on both, so an alert on a halt resolves.
    pub fn set_rollouts(&self, templates: &crate::engine::TemplateSet) {
        let mut series = self.rollout_series.lock().expect("rollout series lock");
        // Only templates that ever rolled out get series.
        series.extend(templates.rollouts().map(|(name, _)| name.to_owned()));
        for template in series.iter() {
            let label = TemplateLabel { template: template.clone() };
            let active = templates.rollout(template);
            let halted = active.is_some_and(|a| a.halted.is_some());
            let share = active.filter(|_| !halted).map_or(0, |a| i64::from(a.spec.share));
            self.rollout_share.get_or_create(&label).set(share);
            self.rollout_halted.get_or_create(&label).set(i64::from(halted));
        }
    }

    /// Counts `count` Kubernetes Events with `result`.
    pub fn event(&self, result: &str, count: u64) {
        if count > 0 {
            self.events.get_or_create(&EventResultLabel { result: result.to_owned() }).inc_by(count);
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// Counts one admission request.
    pub fn request(&self, endpoint: &str, operation: &str, result: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.into(),
                operation: operation.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts an in-place resize the validating webhook checked (`allowed` or `denied`).
    pub fn resize(&self, result: &str) {
        self.resizes.get_or_create(&EventResultLabel { result: result.to_owned() }).inc();
    }

    /// Counts a skip.
    pub fn skip(&self, reason: &str) {
        self.skips.get_or_create(&ReasonLabel { reason: reason.into() }).inc();
    }
}

/// Keeps the trace exporter alive; flushes it when dropped.
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the global subscriber: log lines to stderr, spans to OTLP when configured.
pub fn init(settings: &TelemetrySettings) -> anyhow::Result<TelemetryGuard> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;

    let filter = EnvFilter::try_new(&settings.log_level)?;
    let (json, text) = match settings.log_format {
        LogFormat::Json => (Some(tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr)), None),
        LogFormat::Text => {
            use std::io::IsTerminal;
            (
                None,
                Some(
                    tracing_subscriber::fmt::layer()
                        .with_ansi(std::io::stderr().is_terminal())
                        .with_writer(std::io::stderr),
                ),
            )
        }
    };
    let provider = match &settings.otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
                .build()?;
            let resource =
                opentelemetry_sdk::Resource::builder().with_service_name(settings.service_name.clone()).build();
            Some(
                opentelemetry_sdk::trace::SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            )
        }
        None => None,
    };
    let otel = provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("sidecar-injector")));
    tracing_subscriber::registry().with(filter).with(json).with(text).with(otel).try_init()?;
    Ok(TelemetryGuard { provider })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_halted_rollout_reads_0_once_its_template_is_gone() {
        use crate::engine::templates::rollout::{Halt, Kept};
        use crate::engine::templates::set::{InProcess, TemplateSet};
        let source = |text: &str| vec![crate::engine::TemplateSource { name: "agent".into(), text: text.into() }];
        let v1 = "default: true\ninject:\n  labels: {a: b}\n";
        let v2 = "default: true\nrollout: {share: 30}\ninject:\n  labels: {a: c}\n";
        let (first, _) = TemplateSet::default().update_with_kept(source(v1), &Kept::default(), &InProcess);
        let (rolling, _) = first.update_with_kept(source(v2), &Kept::default(), &InProcess);
        let mut kept = rolling.kept_wanted().clone();
        let version = rolling.get("agent").unwrap().hash.clone();
        kept.records.get_mut("agent").unwrap().halted =
            Some(Halt { version, reason: "2 pods failed".into(), at: "2026-11-29T00:00:00Z".into() });
        let (halted, _) = TemplateSet::default().update_with_kept(source(v2), &kept, &InProcess);
        let metrics = Metrics::default();
        let label = TemplateLabel { template: "agent".into() };
        metrics.set_rollouts(&halted);
        assert_eq!(metrics.rollout_halted.get_or_create(&label).get(), 1);
        let (gone, _) = halted.update_with_kept(Vec::new(), &kept, &InProcess);
        metrics.set_rollouts(&gone);
        assert_eq!(metrics.rollout_halted.get_or_create(&label).get(), 0, "the alert resolves");
        assert_eq!(metrics.rollout_share.get_or_create(&label).get(), 0);
    }

    #[test]
    fn metrics_are_exposed_with_the_prefix() {
        let metrics = Metrics::default();
        metrics.request("mutate", "CREATE", "patched");
        metrics.injections.get_or_create(&TemplateLabel { template: "logs".into() }).inc();
        metrics.duration.get_or_create(&EndpointLabel { endpoint: "mutate".into() }).observe(0.0002);
        metrics.templates_loaded.set(3);
        let text = metrics.encode();
        for line in [
            "sidecar_injector_admission_requests_total{endpoint=\"mutate\",operation=\"CREATE\",result=\"patched\"} 1",
            "sidecar_injector_injections_total{template=\"logs\"} 1",
            "sidecar_injector_admission_duration_seconds_bucket{le=\"0.00025\",endpoint=\"mutate\"} 1",
            "sidecar_injector_templates_loaded 3",
            "# TYPE sidecar_injector_certificate_expiry_timestamp_seconds gauge",
            "# TYPE sidecar_injector_ready gauge",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
