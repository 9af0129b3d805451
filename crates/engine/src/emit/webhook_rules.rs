//! What the API server will do with the injector's MutatingWebhookConfiguration for a given
//! namespace and pod: the rules that decide whether the webhook is even called, checked in the order
//! the API server applies them, each with a message that says what to change. `explain --cluster`
//! puts these in front of the engine's own decision, so "why was my pod not injected?" is answered
//! by the first rule that fails.
//!
//! Pure: the configuration, the namespace's labels, the pod's labels and annotations and whether the
//! webhook's Service has ready endpoints are arguments.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use kube_core::{Selector, SelectorExt};
use serde::Serialize;

use crate::names;

/// One rule and whether it passed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short stable name of the rule.
    pub rule: &'static str,
    /// Whether it lets the injection happen.
    pub passed: bool,
    /// What was found, and what to change when it failed.
    pub detail: String,
}

impl Check {
    fn pass(rule: &'static str, detail: impl Into<String>) -> Check {
        Check { rule, passed: true, detail: detail.into() }
    }
    fn fail(rule: &'static str, detail: impl Into<String>) -> Check {
        Check { rule, passed: false, detail: detail.into() }
    }
}

/// Whether the webhook's Service has ready endpoints, when that can be known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reachability {
    /// Ready endpoints exist (count).
    Ready(usize),
    /// The Service exists but no endpoint is ready.
    NoReadyEndpoints,
    /// The webhook calls a URL, or the endpoints could not be read.
    Unknown,
}

fn selector_matches(
    selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    match selector {
        None => Ok(true),
        Some(selector) => Selector::try_from(selector.clone()).map(|s| s.matches(labels)).map_err(|e| e.to_string()),
    }
}

fn selector_text(selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>) -> String {
    selector.and_then(|s| Selector::try_from(s.clone()).ok()).map(|s| s.to_string()).unwrap_or_default()
}

fn covers_pod_create(webhook: &MutatingWebhook) -> bool {
    let any = |list: &Option<Vec<String>>, want: &str| list.iter().flatten().any(|v| v == want || v == "*");
    webhook.rules.iter().flatten().any(|rule| {
        any(&rule.operations, "CREATE")
            && any(&rule.resources, "pods")
            && any(&rule.api_groups, "")
            && any(&rule.api_versions, "v1")
    })
}

/// The webhook-level rules, in the order the API server applies them. `configuration` is the
/// injector's MutatingWebhookConfiguration as read from the cluster (`None`: not found).
pub fn checks(
    configuration: Option<&MutatingWebhookConfiguration>,
    configuration_name: &str,
    reachability: Reachability,
    namespace: &str,
    namespace_labels: &BTreeMap<String, String>,
    pod_labels: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
) -> Vec<Check> {
    let mut checks = Vec::new();
    let Some(configuration) = configuration else {
        checks.push(Check::fail(
            "webhook-installed",
            format!("MutatingWebhookConfiguration {configuration_name} does not exist: the injector is not installed (kubectl apply -k deploy/)"),
        ));
        return checks;
    };
    let webhooks: Vec<&MutatingWebhook> =
        configuration.webhooks.iter().flatten().filter(|w| covers_pod_create(w)).collect();
    // The entry the API server calls for this pod (the injector's configuration splits pods by the
    // opt-out label into two entries); the first one when none selects the pod.
    let selecting = webhooks.iter().find(|w| selector_matches(w.object_selector.as_ref(), pod_labels) == Ok(true));
    let Some(webhook) = selecting.or(webhooks.first()) else {
        checks.push(Check::fail(
            "webhook-installed",
            format!("MutatingWebhookConfiguration {configuration_name} has no webhook for pods on CREATE"),
        ));
        return checks;
    };
    checks.push(Check::pass("webhook-installed", format!("webhook {} is called for pods on CREATE", webhook.name)));

    let client = &webhook.client_config;
    let trusted = client.ca_bundle.as_ref().is_some_and(|b| !b.0.is_empty());
    checks.push(match (trusted, client.url.is_some()) {
        (true, _) => Check::pass("webhook-trusted", "the caBundle is set"),
        (false, true) => Check::pass("webhook-trusted", "no caBundle: the API server verifies the URL with its own roots"),
        (false, false) => Check::fail(
            "webhook-trusted",
            "the webhook has no caBundle, so the API server cannot verify the injector: with self-managed certificates the injector writes it when it starts (is it running?); with cert-manager, check the CA injector",
        ),
    });

    let mut namespace_labels = namespace_labels.clone();
    namespace_labels.entry(names::NAMESPACE_NAME_LABEL.into()).or_insert_with(|| namespace.to_owned());
    checks.push(match selector_matches(webhook.namespace_selector.as_ref(), &namespace_labels) {
        Ok(true) => Check::pass("namespace-selected", format!("namespace {namespace} matches the webhook's namespaceSelector")),
        Ok(false) if namespace_labels.get(names::INJECT_LABEL).map(String::as_str) != Some(names::INJECT_ENABLED) => Check::fail(
            "namespace-selected",
            format!(
                "namespace {namespace} is not opted in: kubectl label namespace {namespace} {}={}",
                names::INJECT_LABEL,
                names::INJECT_ENABLED
            ),
        ),
        Ok(false) => Check::fail(
            "namespace-selected",
            format!(
                "namespace {namespace} does not match the webhook's namespaceSelector {:?} (it excludes system namespaces and the injector's own, or was changed)",
                selector_text(webhook.namespace_selector.as_ref())
            ),
        ),
        Err(e) => Check::fail("namespace-selected", format!("the webhook's namespaceSelector is invalid: {e}")),
    });

    checks.push(match selector_matches(webhook.object_selector.as_ref(), pod_labels) {
        Ok(true) => Check::pass("pod-selected", "the pod's labels match the webhook's objectSelector"),
        Ok(false) if pod_labels.get(names::INJECT_LABEL).map(String::as_str) == Some(names::INJECT_DISABLED) => {
            Check::fail(
                "pod-selected",
                format!("the pod opts out with the label {}={}", names::INJECT_LABEL, names::INJECT_DISABLED),
            )
        }
        Ok(false) => Check::fail(
            "pod-selected",
            format!(
                "the pod's labels do not match the webhook's objectSelector {:?}",
                selector_text(webhook.object_selector.as_ref())
            ),
        ),
        Err(e) => Check::fail("pod-selected", format!("the webhook's objectSelector is invalid: {e}")),
    });

    checks.push(if pod_annotations.contains_key(names::MIRROR_POD_ANNOTATION) {
        Check::fail("not-a-mirror-pod", "mirror pods (static pods) are never injected")
    } else {
        Check::pass("not-a-mirror-pod", "not a mirror pod")
    });

    checks.push(match reachability {
        Reachability::Ready(count) => Check::pass("injector-ready", format!("{count} ready injector endpoint(s)")),
        Reachability::NoReadyEndpoints => Check::fail(
            "injector-ready",
            format!(
                "the injector's Service has no ready endpoints: the webhook fails open ({}), so new pods are admitted without injection and the ValidatingAdmissionPolicy refuses them in opted-in namespaces; check kubectl -n {} get pods",
                webhook.failure_policy.as_deref().unwrap_or("Fail"),
                client.service.as_ref().map_or("sidecar-injector", |s| s.namespace.as_str())
            ),
        ),
        Reachability::Unknown => Check::pass("injector-ready", "not checked (the webhook calls a URL)"),
    });
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn configuration() -> MutatingWebhookConfiguration {
        let text = include_str!("../../../../deploy/base/mutatingwebhookconfiguration.yaml");
        let value: serde_json::Value = crate::manifest::read(text).unwrap().remove(0);
        let mut configuration: MutatingWebhookConfiguration = serde_json::from_value(value).unwrap();
        for webhook in configuration.webhooks.as_mut().unwrap() {
            webhook.client_config.ca_bundle = Some(k8s_openapi::ByteString(b"CA".to_vec()));
        }
        configuration
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn first_failure(checks: &[Check]) -> Option<(&'static str, String)> {
        checks.iter().find(|c| !c.passed).map(|c| (c.rule, c.detail.clone()))
    }

    #[test]
    fn every_rule_that_stops_the_webhook_names_itself() {
        let opted_in = map(&[("sidecar-injector.io/inject", "enabled")]);
        let installed = configuration();
        let mut no_bundle = configuration();
        no_bundle.webhooks.as_mut().unwrap()[0].client_config.ca_bundle = None;
        let mut narrowed = configuration();
        narrowed.webhooks.as_mut().unwrap()[0].namespace_selector = Some(
            serde_json::from_value(
                json!({"matchLabels": {"sidecar-injector.io/inject": "enabled", "team": "payments"}}),
            )
            .unwrap(),
        );
        let mut updates_only = configuration();
        for webhook in updates_only.webhooks.as_mut().unwrap() {
            webhook.rules.as_mut().unwrap()[0].operations = Some(vec!["UPDATE".into()]);
        }
        // An install from before enforced templates: no entry for the pods that opt out.
        let mut without_enforce_entry = configuration();
        without_enforce_entry.webhooks.as_mut().unwrap().truncate(1);
        // (case, configuration, reachability, namespace, namespace labels, pod labels, pod annotations, expected first failure)
        type Case<'a> = (
            &'a str,
            Option<&'a MutatingWebhookConfiguration>,
            Reachability,
            &'a str,
            BTreeMap<String, String>,
            BTreeMap<String, String>,
            BTreeMap<String, String>,
            Option<(&'a str, &'a str)>,
        );
        let cases: Vec<Case> = vec![
            ("all good", Some(&installed), Reachability::Ready(2), "shop", opted_in.clone(), map(&[]), map(&[]), None),
            (
                "not installed",
                None,
                Reachability::Unknown,
                "shop",
                opted_in.clone(),
                map(&[]),
                map(&[]),
                Some(("webhook-installed", "does not exist: the injector is not installed")),
            ),
            (
                "no pod CREATE rule",
                Some(&updates_only),
                Reachability::Ready(1),
                "shop",
                opted_in.clone(),
                map(&[]),
                map(&[]),
                Some(("webhook-installed", "has no webhook for pods on CREATE")),
            ),
            (
                "no caBundle",
                Some(&no_bundle),
                Reachability::Ready(1),
                "shop",
                opted_in.clone(),
                map(&[]),
                map(&[]),
                Some(("webhook-trusted", "has no caBundle")),
            ),
            (
                "namespace not labelled",
                Some(&installed),
                Reachability::Ready(1),
                "shop",
                map(&[]),
                map(&[]),
                map(&[]),
                Some((
                    "namespace-selected",
                    "namespace shop is not opted in: kubectl label namespace shop sidecar-injector.io/inject=enabled",
                )),
            ),
            (
                "system namespace",
                Some(&installed),
                Reachability::Ready(1),
                "kube-system",
                opted_in.clone(),
                map(&[]),
                map(&[]),
                Some(("namespace-selected", "does not match the webhook's namespaceSelector")),
            ),
            (
                "selector narrowed",
                Some(&narrowed),
                Reachability::Ready(1),
                "shop",
                opted_in.clone(),
                map(&[]),
                map(&[]),
                Some((
                    "namespace-selected",
                    "namespace shop does not match the webhook's namespaceSelector \"sidecar-injector.io/inject=enabled,team=payments\"",
                )),
            ),
            (
                "pod opts out: the enforce entry is called (only enforced templates apply)",
                Some(&installed),
                Reachability::Ready(1),
                "shop",
                opted_in.clone(),
                map(&[("sidecar-injector.io/inject", "disabled")]),
                map(&[]),
                None,
            ),
            (
                "pod opts out, no enforce entry",
                Some(&without_enforce_entry),
                Reachability::Ready(1),
                "shop",
                opted_in.clone(),
                map(&[("sidecar-injector.io/inject", "disabled")]),
                map(&[]),
                Some(("pod-selected", "the pod opts out with the label sidecar-injector.io/inject=disabled")),
            ),
            (
                "mirror pod",
                Some(&installed),
                Reachability::Ready(1),
                "shop",
                opted_in.clone(),
                map(&[]),
                map(&[("kubernetes.io/config.mirror", "x")]),
                Some(("not-a-mirror-pod", "mirror pods")),
            ),
            (
                "injector down",
                Some(&installed),
                Reachability::NoReadyEndpoints,
                "shop",
                opted_in.clone(),
                map(&[]),
                map(&[]),
                Some(("injector-ready", "no ready endpoints: the webhook fails open (Ignore)")),
            ),
        ];
        for (case, configuration, reachability, namespace, ns_labels, pod_labels, annotations, expected) in cases {
            let checks = checks(
                configuration,
                "sidecar-injector",
                reachability,
                namespace,
                &ns_labels,
                &pod_labels,
                &annotations,
            );
            match (first_failure(&checks), expected) {
                (None, None) => {}
                (Some((rule, detail)), Some((want_rule, fragment))) => {
                    assert_eq!(rule, want_rule, "{case}: {detail}");
                    assert!(detail.contains(fragment), "{case}: {detail}");
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }
}
