//! Which pods are in scope, and which templates a pod gets — with the reason for every "no", so
//! `explain`, metrics and the status annotation can say exactly why a pod was not injected.
//!
//! Rules, in the order they are checked ([`select`]):
//! 1. Never: mirror pods, pods in kube-system, kube-public, kube-node-lease or the injector's own
//!    namespace.
//! 2. The namespace must carry `sidecar-injector.io/inject=enabled` (when its labels are known).
//! 3. Templates: those named by `sidecar-injector.io/templates` on the pod, else on the namespace,
//!    else every template with `default: true`; a named template that does not exist is an error.
//! 4. Each chosen template's podSelector and namespaceSelector must match.
//! 5. Every `enforced: true` template whose selectors match is chosen too, whatever the annotation
//!    says.
//! 6. A pod carrying `sidecar-injector.io/inject=disabled` gets only the enforced templates of
//!    rule 5, and is out of scope when there are none. The pod is untrusted input: what it says can
//!    narrow the operator's defaults, never the operator's mandates.
//!
//! Rules 1, 2 and 6 are also what the API server applies before the injector is called:
//! `emit::scope` states them as the selectors and match conditions of the webhook and the
//! policies, and its tests check the shipped manifests and `emit::webhook_rules` against [`select`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::facts::NamespaceFacts;
use crate::names;
use crate::templates::set::TemplateSet;
use crate::templates::template::Template;

/// Why a pod is not considered for injection at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum OutOfScope {
    /// A mirror pod (static pod reflected by the kubelet).
    MirrorPod,
    /// A system namespace or the injector's own.
    ExcludedNamespace {
        /// The namespace.
        namespace: String,
    },
    /// The namespace lacks the opt-in label.
    NamespaceNotOptedIn {
        /// The namespace.
        namespace: String,
    },
    /// The pod carries the opt-out label.
    PodOptedOut,
    /// The API server would refuse the pod the injection makes (pod-level resources that cannot
    /// hold the injected containers, or what `api_limits` checks): admitted as its author wrote it.
    WouldBeInvalid {
        /// What the API server would say, one sentence each.
        reasons: Vec<String>,
        /// The patch the injection would have written (not applied): what the API server's own
        /// judgement of the prediction needs (the oracle, `tests/e2e/oracle.rs`).
        #[serde(skip)]
        refused_patch: Vec<json_patch::PatchOperation>,
    },
    /// The namespace's Pod Security `enforce` level would refuse the pod with what the chosen
    /// templates add, where it admits the pod as written: admitted as its author wrote it.
    PodSecurity {
        /// The templates left out.
        templates: Vec<String>,
        /// The API server's words for the refusal (`violates PodSecurity "restricted:latest": ...`).
        message: Box<str>,
    },
}

impl OutOfScope {
    /// Short stable name, for metrics labels.
    pub fn code(&self) -> &'static str {
        match self {
            OutOfScope::MirrorPod => "mirror_pod",
            OutOfScope::ExcludedNamespace { .. } => "excluded_namespace",
            OutOfScope::NamespaceNotOptedIn { .. } => "namespace_not_opted_in",
            OutOfScope::PodOptedOut => "pod_opted_out",
            OutOfScope::WouldBeInvalid { .. } => "would_be_invalid",
            OutOfScope::PodSecurity { .. } => "pod_security",
        }
    }
}

impl fmt::Display for OutOfScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutOfScope::MirrorPod => {
                write!(f, "mirror pods (annotation {}) are never injected", names::MIRROR_POD_ANNOTATION)
            }
            OutOfScope::ExcludedNamespace { namespace } => {
                write!(f, "namespace {namespace} is excluded from injection (system or the injector's own)")
            }
            OutOfScope::NamespaceNotOptedIn { namespace } => write!(
                f,
                "namespace {namespace} is not opted in (label it {}={})",
                names::INJECT_LABEL,
                names::INJECT_ENABLED
            ),
            OutOfScope::PodOptedOut => {
                write!(f, "the pod opts out with label {}={}", names::INJECT_LABEL, names::INJECT_DISABLED)
            }
            OutOfScope::WouldBeInvalid { reasons, .. } => write!(
                f,
                "the API server would refuse the injected pod ({}); the pod is admitted as written",
                reasons.join("; ")
            ),
            OutOfScope::PodSecurity { templates, message } => write!(
                f,
                "{} {}: the namespace enforces Pod Security, and the API server would refuse the pod with what {} ({message})",
                if templates.len() == 1 { "template" } else { "templates" },
                templates.join(", "),
                if templates.len() == 1 { "it adds" } else { "they add" },
            ),
        }
    }
}

/// Where the list of candidate templates came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ChoiceSource {
    /// The pod's `sidecar-injector.io/templates` annotation.
    PodAnnotation,
    /// The namespace's `sidecar-injector.io/templates` annotation.
    NamespaceAnnotation,
    /// Every template marked `default: true`.
    Defaults,
    /// The pod opts out: only the enforced templates are considered.
    OptedOut,
}

impl fmt::Display for ChoiceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChoiceSource::PodAnnotation => "named by the pod's annotation",
            ChoiceSource::NamespaceAnnotation => "named by the namespace's annotation",
            ChoiceSource::Defaults => "templates marked default: true",
            ChoiceSource::OptedOut => "the pod opts out, so only enforced templates",
        })
    }
}

/// What happened to one template for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum TemplateVerdict {
    /// It will be injected.
    Selected,
    /// It will be injected because it is enforced for this pod, although the pod's annotation or
    /// opt-out label (or not being `default: true`) would leave it out.
    Enforced,
    /// Not injected, but `enforced: audit` and where `enforced: true` would inject it (as
    /// [`TemplateVerdict::Enforced`]): reported, not injected.
    AuditEnforced,
    /// Named by an annotation but not defined.
    NotFound,
    /// Not named and not `default: true`.
    NotDefault,
    /// Its podSelector does not match the pod's labels.
    PodSelectorMismatch {
        /// The selector.
        selector: Arc<str>,
    },
    /// Its namespaceSelector does not match the namespace's labels.
    NamespaceSelectorMismatch {
        /// The selector.
        selector: Arc<str>,
    },
    /// It has a namespaceSelector, and the namespace's labels could not be read (see
    /// `NamespaceFacts::unavailable`): never judged on unknown labels, the pod is refused.
    NamespaceUnavailable {
        /// The selector.
        selector: Arc<str>,
    },
}

impl TemplateVerdict {
    /// Whether the template is injected (selected or enforced).
    pub fn is_chosen(&self) -> bool {
        matches!(self, TemplateVerdict::Selected | TemplateVerdict::Enforced)
    }
}

impl fmt::Display for TemplateVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateVerdict::Selected => f.write_str("selected"),
            TemplateVerdict::Enforced => {
                f.write_str("enforced: injected whatever the pod's annotations and opt-out label say")
            }
            TemplateVerdict::AuditEnforced => f.write_str(
                "enforced: audit: not injected now; with enforced: true it would be, whatever the pod's annotations and opt-out label say",
            ),
            TemplateVerdict::NotFound => f.write_str("no template of that name exists"),
            TemplateVerdict::NotDefault => f.write_str("not default: true and not named by an annotation"),
            TemplateVerdict::PodSelectorMismatch { selector } => {
                write!(f, "podSelector {selector:?} does not match the pod's labels")
            }
            TemplateVerdict::NamespaceSelectorMismatch { selector } => {
                write!(f, "namespaceSelector {selector:?} does not match the namespace's labels")
            }
            TemplateVerdict::NamespaceUnavailable { selector } => {
                write!(f, "namespaceSelector {selector:?} cannot be judged: the namespace's labels could not be read")
            }
        }
    }
}

/// The verdict for each template considered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Choice {
    /// Where the candidates came from.
    pub source: ChoiceSource,
    /// Every template considered, in injection order for the selected ones.
    pub verdicts: Vec<(Arc<str>, TemplateVerdict)>,
    /// For each selected template whose version a rollout or a pin decided: the version and why
    /// (filled in by the decision; see `templates::rollout`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<ChosenVersion>,
}

/// The version of a selected template a rollout or a pin decided on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChosenVersion {
    /// The template.
    pub template: Arc<str>,
    /// The version's content hash.
    pub hash: String,
    /// Why, one sentence.
    pub why: String,
}

impl Choice {
    /// Names of the templates that will be injected, in order.
    pub fn selected(&self) -> impl Iterator<Item = &str> {
        self.verdicts.iter().filter(|(_, v)| v.is_chosen()).map(|(name, _)| &**name)
    }

    /// Names that an annotation gave but that do not exist.
    pub fn missing(&self) -> impl Iterator<Item = &str> {
        self.verdicts.iter().filter(|(_, v)| *v == TemplateVerdict::NotFound).map(|(name, _)| &**name)
    }

    /// Templates that would be considered but choose by the labels of a namespace that could not
    /// be read.
    pub fn undecided(&self) -> impl Iterator<Item = &str> {
        let undecided = |v: &TemplateVerdict| matches!(v, TemplateVerdict::NamespaceUnavailable { .. });
        self.verdicts.iter().filter(move |(_, v)| undecided(v)).map(|(name, _)| &**name)
    }

    /// One line on why nothing was selected.
    pub fn summary_of_none(&self) -> String {
        if self.verdicts.is_empty() {
            return match self.source {
                ChoiceSource::Defaults => "no template is marked default: true".to_owned(),
                ChoiceSource::OptedOut => "the pod opts out and no enforced template applies".to_owned(),
                _ => format!("the {} annotation names no templates", names::TEMPLATES_ANNOTATION),
            };
        }
        let reasons: Vec<String> = self
            .verdicts
            .iter()
            .filter(|(_, v)| !matches!(v, TemplateVerdict::NotDefault))
            .map(|(name, verdict)| format!("{name}: {verdict}"))
            .collect();
        if reasons.is_empty() {
            "no template is marked default: true".to_owned()
        } else {
            format!("no template matched ({})", reasons.join("; "))
        }
    }
}

/// Decides whether the pod is in scope and which templates it gets (rules 1–6 of the module doc).
pub fn select(
    templates: &TemplateSet,
    pod_labels: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
    excluded_namespaces: &[String],
) -> Result<Choice, OutOfScope> {
    scope(pod_annotations, namespace, excluded_namespaces)?;
    let opted_out = pod_labels.get(names::INJECT_LABEL).map(String::as_str) == Some(names::INJECT_DISABLED);
    let choice = choose(templates, pod_labels, pod_annotations, namespace, opted_out);
    if opted_out && choice.selected().next().is_none() {
        return Err(OutOfScope::PodOptedOut);
    }
    Ok(choice)
}

/// The `enforced: audit` templates that `enforced: true` would give a pod that opted out (which
/// [`select`] leaves out of scope when nothing else applies), for the audit report.
pub fn audit_reach_of_opted_out(
    templates: &TemplateSet,
    pod_labels: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
) -> Vec<Arc<str>> {
    let choice = choose(templates, pod_labels, pod_annotations, namespace, true);
    choice.verdicts.into_iter().filter(|(_, v)| *v == TemplateVerdict::AuditEnforced).map(|(n, _)| n).collect()
}

/// Rules 1 and 2: whether the pod's namespace (and kind of pod) is served at all.
fn scope(
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
    excluded_namespaces: &[String],
) -> Result<(), OutOfScope> {
    if pod_annotations.contains_key(names::MIRROR_POD_ANNOTATION) {
        return Err(OutOfScope::MirrorPod);
    }
    if names::SYSTEM_NAMESPACES.contains(&namespace.name.as_str()) || excluded_namespaces.contains(&namespace.name) {
        return Err(OutOfScope::ExcludedNamespace { namespace: namespace.name.clone() });
    }
    if namespace.labels_known
        && namespace.labels.get(names::INJECT_LABEL).map(String::as_str) != Some(names::INJECT_ENABLED)
    {
        return Err(OutOfScope::NamespaceNotOptedIn { namespace: namespace.name.clone() });
    }
    Ok(())
}

/// The template names an annotation lists, in order, without duplicates.
fn named_templates(annotations: &BTreeMap<String, String>) -> Option<Vec<&str>> {
    let list = annotations.get(names::TEMPLATES_ANNOTATION)?;
    let mut names: Vec<&str> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Some(names)
}

/// Chooses the templates for an in-scope pod (rules 3–6).
fn choose(
    templates: &TemplateSet,
    pod_labels: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
    opted_out: bool,
) -> Choice {
    let verdict = |template: &Template| {
        if let Some(selector) = template.pod_selector.as_ref().filter(|s| !s.matches(pod_labels)) {
            return TemplateVerdict::PodSelectorMismatch { selector: selector.text.clone() };
        }
        if let (Some(selector), Some(_)) = (&template.namespace_selector, &namespace.unavailable) {
            return TemplateVerdict::NamespaceUnavailable { selector: selector.text.clone() };
        }
        if let Some(selector) = template.namespace_selector.as_ref().filter(|s| !s.matches(&namespace.labels)) {
            return TemplateVerdict::NamespaceSelectorMismatch { selector: selector.text.clone() };
        }
        TemplateVerdict::Selected
    };
    let (source, names) = match (named_templates(pod_annotations), named_templates(&namespace.annotations)) {
        _ if opted_out => (ChoiceSource::OptedOut, Some(Vec::new())),
        (Some(names), _) => (ChoiceSource::PodAnnotation, Some(names)),
        (None, Some(names)) => (ChoiceSource::NamespaceAnnotation, Some(names)),
        (None, None) => (ChoiceSource::Defaults, None),
    };
    let mut verdicts: Vec<(Arc<str>, TemplateVerdict)> = match names {
        Some(names) => names
            .into_iter()
            .map(|name| match templates.get(name) {
                Some(t) => (t.name.clone(), verdict(t)),
                None => (name.into(), TemplateVerdict::NotFound),
            })
            .collect(),
        None => templates
            .iter()
            .map(|t| {
                let v = if t.default { verdict(t) } else { TemplateVerdict::NotDefault };
                (t.name.clone(), v)
            })
            .collect(),
    };
    // Rule 5: enforced templates the choice above left out come last, in template order.
    // Audited ones (`enforced: audit`) are only marked where they would come.
    for template in templates.iter().filter(|t| t.enforced || t.audit) {
        let listed = verdicts.iter().position(|(name, _)| *name == template.name);
        if listed.is_some_and(|i| verdicts[i].1 == TemplateVerdict::Selected) {
            continue;
        }
        let enforced = match verdict(template) {
            TemplateVerdict::Selected if template.audit => TemplateVerdict::AuditEnforced,
            TemplateVerdict::Selected => TemplateVerdict::Enforced,
            // Whether it applies cannot be known: it must not be skipped unseen (an audited one
            // only reports, so it decides nothing here).
            unavailable @ TemplateVerdict::NamespaceUnavailable { .. } if !template.audit => unavailable,
            // Shown only when the pod opts out, to say why even the enforced ones do not apply.
            mismatch if opted_out => mismatch,
            _ => continue,
        };
        if let Some(i) = listed {
            verdicts.remove(i);
        }
        verdicts.push((template.name.clone(), enforced));
    }
    Choice { source, verdicts, versions: Vec::new() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{engine, opted_in};

    type Map = BTreeMap<String, String>;
    /// (case, pod labels, pod annotations, namespace, expected outcome)
    type ScopeCase = (&'static str, Map, Map, NamespaceFacts, Result<(), &'static str>);
    /// (case, pod labels, pod annotations, namespace, source, selected templates)
    type ChoiceCase = (&'static str, Map, Map, NamespaceFacts, ChoiceSource, Vec<&'static str>);
    /// (case, pod labels, pod annotations, selected templates or the out-of-scope code)
    type EnforcedCase = (&'static str, Map, Map, Result<Vec<&'static str>, &'static str>);

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn scope_rules() {
        let excluded = vec!["sidecar-injector".to_owned()];
        let unknown = |name: &str| NamespaceFacts::unknown(name);
        let not_opted = NamespaceFacts::known("shop", map(&[("team", "a")]), BTreeMap::new());
        let disabled_ns = NamespaceFacts::known("shop", map(&[(names::INJECT_LABEL, "disabled")]), BTreeMap::new());
        let cases: Vec<ScopeCase> = vec![
            ("opted in", map(&[]), map(&[]), opted_in("shop", &[]), Ok(())),
            ("unknown labels count as opted in", map(&[]), map(&[]), unknown("shop"), Ok(())),
            ("namespace without label", map(&[]), map(&[]), not_opted, Err("namespace_not_opted_in")),
            ("namespace label not enabled", map(&[]), map(&[]), disabled_ns, Err("namespace_not_opted_in")),
            (
                "pod opts out",
                map(&[(names::INJECT_LABEL, "disabled")]),
                map(&[]),
                opted_in("shop", &[]),
                Err("pod_opted_out"),
            ),
            (
                "pod label other value",
                map(&[(names::INJECT_LABEL, "enabled")]),
                map(&[]),
                opted_in("shop", &[]),
                Ok(()),
            ),
            (
                "mirror pod",
                map(&[]),
                map(&[(names::MIRROR_POD_ANNOTATION, "abc")]),
                opted_in("shop", &[]),
                Err("mirror_pod"),
            ),
            ("kube-system", map(&[]), map(&[]), opted_in("kube-system", &[]), Err("excluded_namespace")),
            ("kube-public even if unknown", map(&[]), map(&[]), unknown("kube-public"), Err("excluded_namespace")),
            ("kube-node-lease", map(&[]), map(&[]), opted_in("kube-node-lease", &[]), Err("excluded_namespace")),
            ("own namespace", map(&[]), map(&[]), opted_in("sidecar-injector", &[]), Err("excluded_namespace")),
            (
                "mirror pod wins over opt-out",
                map(&[(names::INJECT_LABEL, "disabled")]),
                map(&[(names::MIRROR_POD_ANNOTATION, "x")]),
                opted_in("shop", &[]),
                Err("mirror_pod"),
            ),
        ];
        for (case, labels, annotations, namespace, expected) in cases {
            let got = select(&TemplateSet::default(), &labels, &annotations, &namespace, &excluded)
                .map(|_| ())
                .map_err(|r| r.code());
            assert_eq!(got, expected, "{case}");
        }
        let no_facts = NamespaceFacts::known("shop", map(&[]), map(&[]));
        let message =
            select(&TemplateSet::default(), &map(&[]), &map(&[]), &no_facts, &excluded).unwrap_err().to_string();
        assert_eq!(message, "namespace shop is not opted in (label it sidecar-injector.io/inject=enabled)");
    }

    const DEFAULT: &str = "default: true\ninject:\n  labels: {a: b}\n";
    const OPTIONAL: &str = "inject:\n  labels: {a: b}\n";
    const WEB_ONLY: &str = "default: true\npodSelector:\n  matchExpressions:\n    - {key: app, operator: In, values: [web, api]}\n    - {key: canary, operator: DoesNotExist}\ninject:\n  labels: {a: b}\n";
    const PROD_ONLY: &str = "default: true\nnamespaceSelector:\n  matchLabels: {env: prod}\n  matchExpressions:\n    - {key: tier, operator: NotIn, values: [batch]}\n    - {key: owner, operator: Exists}\ninject:\n  labels: {a: b}\n";

    #[test]
    fn template_choice_rules() {
        let engine = engine(&[("base", DEFAULT), ("extra", OPTIONAL), ("web", WEB_ONLY), ("prod", PROD_ONLY)]);
        let prod = opted_in("shop", &[("env", "prod"), ("owner", "x")]);
        let mut prod_annotated = prod.clone();
        prod_annotated.annotations = map(&[(names::TEMPLATES_ANNOTATION, "extra")]);
        let cases: Vec<ChoiceCase> = vec![
            (
                "defaults that match",
                map(&[("app", "web")]),
                map(&[]),
                prod.clone(),
                ChoiceSource::Defaults,
                vec!["base", "prod", "web"],
            ),
            (
                "podSelector In fails",
                map(&[("app", "db")]),
                map(&[]),
                prod.clone(),
                ChoiceSource::Defaults,
                vec!["base", "prod"],
            ),
            (
                "podSelector DoesNotExist fails",
                map(&[("app", "web"), ("canary", "1")]),
                map(&[]),
                prod.clone(),
                ChoiceSource::Defaults,
                vec!["base", "prod"],
            ),
            (
                "namespaceSelector matchLabels fails",
                map(&[("app", "api")]),
                map(&[]),
                opted_in("dev", &[("env", "dev"), ("owner", "x")]),
                ChoiceSource::Defaults,
                vec!["base", "web"],
            ),
            (
                "namespaceSelector NotIn fails",
                map(&[]),
                map(&[]),
                opted_in("b", &[("env", "prod"), ("owner", "x"), ("tier", "batch")]),
                ChoiceSource::Defaults,
                vec!["base"],
            ),
            (
                "namespaceSelector Exists fails",
                map(&[]),
                map(&[]),
                opted_in("b", &[("env", "prod")]),
                ChoiceSource::Defaults,
                vec!["base"],
            ),
            (
                "pod annotation names templates in its order",
                map(&[("app", "web")]),
                map(&[(names::TEMPLATES_ANNOTATION, "web, extra,web")]),
                prod.clone(),
                ChoiceSource::PodAnnotation,
                vec!["web", "extra"],
            ),
            (
                "named templates still honour selectors",
                map(&[("app", "db")]),
                map(&[(names::TEMPLATES_ANNOTATION, "web,extra")]),
                prod.clone(),
                ChoiceSource::PodAnnotation,
                vec!["extra"],
            ),
            (
                "namespace annotation",
                map(&[]),
                map(&[]),
                prod_annotated.clone(),
                ChoiceSource::NamespaceAnnotation,
                vec!["extra"],
            ),
            (
                "pod annotation wins over namespace's",
                map(&[]),
                map(&[(names::TEMPLATES_ANNOTATION, "base")]),
                prod_annotated.clone(),
                ChoiceSource::PodAnnotation,
                vec!["base"],
            ),
            (
                "empty annotation means none",
                map(&[]),
                map(&[(names::TEMPLATES_ANNOTATION, " , ")]),
                prod.clone(),
                ChoiceSource::PodAnnotation,
                vec![],
            ),
        ];
        for (case, labels, annotations, namespace, source, selected) in cases {
            let choice = choose(&engine.templates, &labels, &annotations, &namespace, false);
            assert_eq!(choice.source, source, "{case}");
            assert_eq!(choice.selected().collect::<Vec<_>>(), selected, "{case}");
        }
    }

    #[test]
    fn verdicts_say_why_a_template_was_not_chosen() {
        let engine = engine(&[("base", DEFAULT), ("extra", OPTIONAL), ("web", WEB_ONLY), ("prod", PROD_ONLY)]);
        let choice = choose(&engine.templates, &map(&[("app", "db")]), &map(&[]), &opted_in("dev", &[]), false);
        let verdicts: BTreeMap<&str, String> = choice.verdicts.iter().map(|(n, v)| (&**n, v.to_string())).collect();
        assert_eq!(verdicts["base"], "selected");
        assert_eq!(verdicts["extra"], "not default: true and not named by an annotation");
        assert_eq!(verdicts["web"], "podSelector \"app in (api,web),!canary\" does not match the pod's labels");
        assert_eq!(
            verdicts["prod"],
            "namespaceSelector \"env=prod,tier notin (batch),owner\" does not match the namespace's labels"
        );

        let choice = choose(
            &engine.templates,
            &map(&[]),
            &map(&[(names::TEMPLATES_ANNOTATION, "nope,base")]),
            &opted_in("dev", &[]),
            false,
        );
        assert_eq!(choice.missing().collect::<Vec<_>>(), vec!["nope"]);

        let none = choose(
            &engine.templates,
            &map(&[("app", "db")]),
            &map(&[(names::TEMPLATES_ANNOTATION, "web")]),
            &opted_in("dev", &[]),
            false,
        );
        assert_eq!(
            none.summary_of_none(),
            "no template matched (web: podSelector \"app in (api,web),!canary\" does not match the pod's labels)"
        );
    }

    const ENFORCED_WEB: &str =
        "enforced: true\npodSelector: {matchLabels: {app: web}}\ninject:\n  labels: {audit: on}\n";

    #[test]
    fn enforced_templates_cannot_be_skipped_by_the_pod() {
        let engine = engine(&[("base", DEFAULT), ("extra", OPTIONAL), ("audit", ENFORCED_WEB)]);
        let excluded = vec!["sidecar-injector".to_owned()];
        let web = map(&[("app", "web")]);
        let opted_out_web = map(&[("app", "web"), (names::INJECT_LABEL, names::INJECT_DISABLED)]);
        let opted_out_db = map(&[("app", "db"), (names::INJECT_LABEL, names::INJECT_DISABLED)]);
        let ns = opted_in("dev", &[]);
        let named = |list: &str| map(&[(names::TEMPLATES_ANNOTATION, list)]);
        // (case, pod labels, pod annotations, selected templates or out-of-scope code)
        let cases: Vec<EnforcedCase> = vec![
            ("defaults plus the enforced one", web.clone(), map(&[]), Ok(vec!["base", "audit"])),
            ("annotation naming none", web.clone(), named(" , "), Ok(vec!["audit"])),
            ("annotation naming others", web.clone(), named("extra"), Ok(vec!["extra", "audit"])),
            ("annotation naming it keeps its place", web.clone(), named("audit,extra"), Ok(vec!["audit", "extra"])),
            ("opted out: only the enforced one", opted_out_web, map(&[]), Ok(vec!["audit"])),
            ("opted out, enforced does not match", opted_out_db, map(&[]), Err("pod_opted_out")),
            ("selectors still decide", map(&[("app", "db")]), named(""), Ok(vec![])),
        ];
        for (case, labels, annotations, expected) in cases {
            let got = select(&engine.templates, &labels, &annotations, &ns, &excluded)
                .map(|c| c.selected().map(str::to_owned).collect::<Vec<_>>())
                .map_err(|r| r.code());
            let expected = expected.map(|v| v.into_iter().map(str::to_owned).collect::<Vec<_>>());
            assert_eq!(got, expected, "{case}");
        }
        let choice = select(&engine.templates, &web, &named(""), &ns, &excluded).unwrap();
        assert_eq!(choice.verdicts, vec![("audit".into(), TemplateVerdict::Enforced)]);
        // Not opted in: enforcement works within the namespaces the injector serves.
        let not_opted = NamespaceFacts::known("dev", map(&[]), map(&[]));
        assert_eq!(
            select(&engine.templates, &web, &map(&[]), &not_opted, &excluded).unwrap_err().code(),
            "namespace_not_opted_in"
        );
    }
}
