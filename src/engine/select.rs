//! Which pods are in scope, and which templates a pod gets — with the reason for every "no", so
//! `explain`, metrics and the status annotation can say exactly why a pod was not injected.
//!
//! Rules, in the order they are checked:
//! 1. Never: mirror pods, pods in kube-system, kube-public, kube-node-lease or the injector's own
//!    namespace.
//! 2. The namespace must carry `sidecar-injector.io/inject=enabled` (when its labels are known).
//! 3. The pod must not carry `sidecar-injector.io/inject=disabled`.
//! 4. Templates: those named by `sidecar-injector.io/templates` on the pod, else on the namespace,
//!    else every template with `default: true`; a named template that does not exist is an error.
//! 5. Each chosen template's podSelector and namespaceSelector must match.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::facts::NamespaceFacts;
use super::names;
use super::template::{Template, TemplateSet};

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
}

impl OutOfScope {
    /// Short stable name, for metrics labels.
    pub fn code(&self) -> &'static str {
        match self {
            OutOfScope::MirrorPod => "mirror_pod",
            OutOfScope::ExcludedNamespace { .. } => "excluded_namespace",
            OutOfScope::NamespaceNotOptedIn { .. } => "namespace_not_opted_in",
            OutOfScope::PodOptedOut => "pod_opted_out",
        }
    }
}

impl fmt::Display for OutOfScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutOfScope::MirrorPod => write!(
                f,
                "mirror pods (annotation {}) are never injected",
                names::MIRROR_POD_ANNOTATION
            ),
            OutOfScope::ExcludedNamespace { namespace } => {
                write!(
                    f,
                    "namespace {namespace} is excluded from injection (system or the injector's own)"
                )
            }
            OutOfScope::NamespaceNotOptedIn { namespace } => write!(
                f,
                "namespace {namespace} is not opted in (label it {}={})",
                names::INJECT_LABEL,
                names::INJECT_ENABLED
            ),
            OutOfScope::PodOptedOut => {
                write!(
                    f,
                    "the pod opts out with label {}={}",
                    names::INJECT_LABEL,
                    names::INJECT_DISABLED
                )
            }
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
}

impl fmt::Display for ChoiceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChoiceSource::PodAnnotation => "named by the pod's annotation",
            ChoiceSource::NamespaceAnnotation => "named by the namespace's annotation",
            ChoiceSource::Defaults => "templates marked default: true",
        })
    }
}

/// What happened to one template for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum TemplateVerdict {
    /// It will be injected.
    Selected,
    /// Named by an annotation but not defined.
    NotFound,
    /// Not named and not `default: true`.
    NotDefault,
    /// Its podSelector does not match the pod's labels.
    PodSelectorMismatch {
        /// The selector.
        selector: String,
    },
    /// Its namespaceSelector does not match the namespace's labels.
    NamespaceSelectorMismatch {
        /// The selector.
        selector: String,
    },
}

impl fmt::Display for TemplateVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateVerdict::Selected => f.write_str("selected"),
            TemplateVerdict::NotFound => f.write_str("no template of that name exists"),
            TemplateVerdict::NotDefault => {
                f.write_str("not default: true and not named by an annotation")
            }
            TemplateVerdict::PodSelectorMismatch { selector } => {
                write!(
                    f,
                    "podSelector {selector:?} does not match the pod's labels"
                )
            }
            TemplateVerdict::NamespaceSelectorMismatch { selector } => {
                write!(
                    f,
                    "namespaceSelector {selector:?} does not match the namespace's labels"
                )
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
    pub verdicts: Vec<(String, TemplateVerdict)>,
}

impl Choice {
    /// Names of the templates that will be injected, in order.
    pub fn selected(&self) -> impl Iterator<Item = &str> {
        self.verdicts
            .iter()
            .filter(|(_, v)| *v == TemplateVerdict::Selected)
            .map(|(name, _)| name.as_str())
    }

    /// Names that an annotation gave but that do not exist.
    pub fn missing(&self) -> impl Iterator<Item = &str> {
        self.verdicts
            .iter()
            .filter(|(_, v)| *v == TemplateVerdict::NotFound)
            .map(|(name, _)| name.as_str())
    }

    /// One line on why nothing was selected.
    pub fn summary_of_none(&self) -> String {
        if self.verdicts.is_empty() {
            return match self.source {
                ChoiceSource::Defaults => "no template is marked default: true".to_owned(),
                _ => format!(
                    "the {} annotation names no templates",
                    names::TEMPLATES_ANNOTATION
                ),
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

/// Decides whether the pod is in scope at all.
pub fn scope(
    pod_labels: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
    excluded_namespaces: &[String],
) -> Result<(), OutOfScope> {
    if pod_annotations.contains_key(names::MIRROR_POD_ANNOTATION) {
        return Err(OutOfScope::MirrorPod);
    }
    if names::SYSTEM_NAMESPACES.contains(&namespace.name.as_str())
        || excluded_namespaces.contains(&namespace.name)
    {
        return Err(OutOfScope::ExcludedNamespace {
            namespace: namespace.name.clone(),
        });
    }
    if namespace.labels_known
        && namespace
            .labels
            .get(names::INJECT_LABEL)
            .map(String::as_str)
            != Some(names::INJECT_ENABLED)
    {
        return Err(OutOfScope::NamespaceNotOptedIn {
            namespace: namespace.name.clone(),
        });
    }
    if pod_labels.get(names::INJECT_LABEL).map(String::as_str) == Some(names::INJECT_DISABLED) {
        return Err(OutOfScope::PodOptedOut);
    }
    Ok(())
}

/// Chooses the templates for an in-scope pod.
pub fn choose(
    templates: &TemplateSet,
    pod_labels: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
) -> Choice {
    let named = |annotations: &BTreeMap<String, String>| {
        annotations.get(names::TEMPLATES_ANNOTATION).map(|list| {
            let mut seen = Vec::new();
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                if !seen.iter().any(|s| s == name) {
                    seen.push(name.to_owned());
                }
            }
            seen
        })
    };
    let verdict = |template: &Template| {
        if let Some(selector) = template
            .pod_selector
            .as_ref()
            .filter(|s| !s.matches(pod_labels))
        {
            return TemplateVerdict::PodSelectorMismatch {
                selector: selector.text.clone(),
            };
        }
        if let Some(selector) = template
            .namespace_selector
            .as_ref()
            .filter(|s| !s.matches(&namespace.labels))
        {
            return TemplateVerdict::NamespaceSelectorMismatch {
                selector: selector.text.clone(),
            };
        }
        TemplateVerdict::Selected
    };
    let (source, names) = match (named(pod_annotations), named(&namespace.annotations)) {
        (Some(names), _) => (ChoiceSource::PodAnnotation, Some(names)),
        (None, Some(names)) => (ChoiceSource::NamespaceAnnotation, Some(names)),
        (None, None) => (ChoiceSource::Defaults, None),
    };
    let verdicts = match names {
        Some(names) => names
            .into_iter()
            .map(|name| {
                let v = templates
                    .get(&name)
                    .map_or(TemplateVerdict::NotFound, |t| verdict(t));
                (name, v)
            })
            .collect(),
        None => templates
            .iter()
            .map(|t| {
                let v = if t.default {
                    verdict(t)
                } else {
                    TemplateVerdict::NotDefault
                };
                (t.name.clone(), v)
            })
            .collect(),
    };
    Choice { source, verdicts }
}
