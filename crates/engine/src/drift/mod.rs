//! Drift: pods whose injection is not what the templates in service would do now — injected with
//! template versions that have since changed (stale), or never injected although they should have
//! been (created while the injector was down, or before their namespace opted in). Decided from a
//! pod's metadata alone (labels, annotations, owner), so a cluster-wide metadata watch can keep it
//! current cheaply; and which workload to restart for it. `pod_index` keeps, for every pod of the
//! cluster, exactly what [`classify`] reads.

pub mod in_place;
pub mod pod_index;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde::Serialize;

use crate::model::status::InjectionStatus;
use crate::{Engine, NamespaceFacts, injection::select, names};

/// A template whose injected version differs from the one in service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaleTemplate {
    /// Template name.
    pub name: String,
    /// Hash the pod was injected with (`None`: the template applies now but was not injected).
    pub injected: Option<String>,
    /// Hash in service (`None`: the template no longer applies to this pod).
    pub current: Option<String>,
}

/// The drift state of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum PodDrift {
    /// Injected with exactly what the templates would inject now (or nothing applies).
    Current,
    /// Injected, but with other template versions or another set of templates.
    Stale {
        /// What differs.
        templates: Vec<StaleTemplate>,
    },
    /// Injected with the current templates, but some applied with conflicts: the pod's own items
    /// stand where theirs would be (labelled `injected=partial`). A restart does not change that;
    /// the pod's spec has to.
    Conflicts {
        /// The templates applied with conflicts.
        templates: Vec<String>,
    },
    /// Templates marked `enforced: audit` that, were they `enforced: true`, would have refused this
    /// pod (it has a conflicting item of theirs: applied with conflicts) or would be injected into
    /// it against its annotations or opt-out label. Otherwise current.
    EnforcementAudit {
        /// Those templates.
        templates: Vec<String>,
    },
    /// In scope and templates apply, but the pod was never injected.
    NotInjected {
        /// The templates it would get.
        templates: Vec<String>,
    },
    /// Not considered for injection (namespace not opted in, opted out, excluded).
    OutOfScope,
}

/// The pod annotations [`classify`] reads (besides them, only labels): what a cache of pods kept
/// for drift needs of a pod's annotations.
pub const ANNOTATIONS_READ: [&str; 3] =
    [names::STATUS_ANNOTATION, names::TEMPLATES_ANNOTATION, names::MIRROR_POD_ANNOTATION];

/// Classifies a pod from its labels and annotations.
pub fn classify(
    engine: &Engine,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
) -> PodDrift {
    let Ok(choice) = select::select(&engine.templates, labels, annotations, namespace, &engine.excluded_namespaces)
    else {
        return PodDrift::OutOfScope;
    };
    let current: BTreeMap<&str, &str> =
        choice.selected().filter_map(|name| engine.templates.get(name)).map(|t| (&*t.name, t.hash.as_str())).collect();
    let status = annotations.get(names::STATUS_ANNOTATION).and_then(|s| InjectionStatus::parse(s).ok());
    let Some(status) = status else {
        return if current.is_empty() {
            PodDrift::Current
        } else {
            PodDrift::NotInjected { templates: current.keys().map(|n| (*n).to_owned()).collect() }
        };
    };
    let injected: BTreeMap<&str, &str> = status.templates.iter().map(|t| (&*t.name, t.hash.as_str())).collect();
    let mut names: Vec<&str> = injected.keys().chain(current.keys()).copied().collect();
    names.sort_unstable();
    names.dedup();
    let templates: Vec<StaleTemplate> = names
        .into_iter()
        .filter(|n| injected.get(n) != current.get(n))
        .map(|n| StaleTemplate {
            name: n.to_owned(),
            injected: injected.get(n).map(|h| (*h).to_owned()),
            current: current.get(n).map(|h| (*h).to_owned()),
        })
        .collect();
    if !templates.is_empty() {
        return PodDrift::Stale { templates };
    }
    let conflicted = status.conflicted_templates();
    let audited: Vec<String> = choice
        .verdicts
        .iter()
        .filter(|(name, verdict)| {
            *verdict == select::TemplateVerdict::AuditEnforced
                || (conflicted.contains(&&**name) && engine.templates.get(name).is_some_and(|t| t.audit))
        })
        .map(|(name, _)| name.to_string())
        .collect();
    if !audited.is_empty() {
        return PodDrift::EnforcementAudit { templates: audited };
    }
    match conflicted {
        conflicted if conflicted.is_empty() => PodDrift::Current,
        conflicted => PodDrift::Conflicts { templates: conflicted.into_iter().map(str::to_owned).collect() },
    }
}

/// A workload: what owns a pod, up to the object a user would restart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct WorkloadRef {
    /// `Deployment`, `StatefulSet`, `DaemonSet`, `ReplicaSet`, `Job`, `CronJob` or `Pod`.
    pub kind: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind.to_lowercase(), self.name)
    }
}

/// The workload of a pod: its controller, lifted from a ReplicaSet to its Deployment and from a
/// Job to its CronJob when `owners` (name → owner of that ReplicaSet or Job) knows one.
pub fn workload_of(
    pod_name: &str,
    owner_references: &[OwnerReference],
    owners: &BTreeMap<(String, String), WorkloadRef>,
) -> WorkloadRef {
    let controller = owner_references.iter().find(|o| o.controller == Some(true)).or(owner_references.first());
    match controller {
        None => WorkloadRef { kind: "Pod".into(), name: pod_name.into() },
        Some(owner) => {
            let direct = WorkloadRef { kind: owner.kind.clone(), name: owner.name.clone() };
            owners.get(&(owner.kind.clone(), owner.name.clone())).cloned().unwrap_or(direct)
        }
    }
}

/// What `drift --restart` does for a workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum RestartAction {
    /// Patch the pod template's `kubectl.kubernetes.io/restartedAt`, as `kubectl rollout restart` does.
    Restart,
    /// Nothing: its next run gets the current templates.
    NextRun,
    /// Not restarted automatically; what to do by hand.
    Manual {
        /// The advice.
        advice: String,
    },
}

/// The annotation `kubectl rollout restart` sets on a pod template.
pub const RESTARTED_AT_ANNOTATION: &str = "kubectl.kubernetes.io/restartedAt";

/// How a workload of this kind is brought up to date.
pub fn restart_action(workload: &WorkloadRef) -> RestartAction {
    match workload.kind.as_str() {
        "Deployment" | "StatefulSet" | "DaemonSet" => RestartAction::Restart,
        "CronJob" => RestartAction::NextRun,
        "Job" => RestartAction::Manual { advice: "a Job's pods are not restarted; re-run the Job to get the current templates".into() },
        "ReplicaSet" => RestartAction::Manual {
            advice: "a ReplicaSet without a Deployment does not replace pods when its template changes; delete its pods to re-create them".into(),
        },
        "Pod" => RestartAction::Manual { advice: "a bare pod is never deleted by sidecar-injector; re-create it".into() },
        other => RestartAction::Manual { advice: format!("{other} is not restarted automatically") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{engine, opted_in};
    use crate::{InjectionStatus, model::status::TemplateRef};

    const A: &str = "default: true\ninject:\n  labels: {a: \"1\"}\n";
    const B: &str = "default: true\npodSelector: {matchLabels: {app: web}}\ninject:\n  labels: {b: \"1\"}\n";

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn status(refs: &[(&str, &str)]) -> String {
        InjectionStatus {
            templates: refs.iter().map(|(n, h)| TemplateRef { name: (*n).into(), hash: (*h).into() }).collect(),
            ..InjectionStatus::default()
        }
        .to_annotation()
    }

    #[test]
    fn pods_are_classified_from_their_metadata() {
        let engine = engine(&[("a", A), ("b", B)]);
        let (a, b) = (engine.templates.get("a").unwrap().hash.clone(), engine.templates.get("b").unwrap().hash.clone());
        let shop = opted_in("shop", &[]);
        let stale = |name: &str, injected: Option<&str>, current: Option<&str>| StaleTemplate {
            name: name.into(),
            injected: injected.map(Into::into),
            current: current.map(Into::into),
        };
        let conflicted = InjectionStatus {
            templates: vec![
                TemplateRef { name: "a".into(), hash: a.clone() },
                TemplateRef { name: "b".into(), hash: b.clone() },
            ],
            skipped: vec![crate::model::status::Skipped {
                template: "b".into(),
                kind: crate::model::status::ItemKind::Label,
                name: "b".into(),
                container: None,
                owner: "pod".into(),
            }],
            ..InjectionStatus::default()
        }
        .to_annotation();
        /// (case, pod labels, pod annotations, namespace, expected)
        type Case = (&'static str, BTreeMap<String, String>, BTreeMap<String, String>, NamespaceFacts, PodDrift);
        let cases: Vec<Case> = vec![
            (
                "current",
                map(&[("app", "web")]),
                map(&[(names::STATUS_ANNOTATION, &status(&[("a", &a), ("b", &b)]))]),
                shop.clone(),
                PodDrift::Current,
            ),
            (
                "a template changed",
                map(&[("app", "web")]),
                map(&[(names::STATUS_ANNOTATION, &status(&[("a", "0000"), ("b", &b)]))]),
                shop.clone(),
                PodDrift::Stale { templates: vec![stale("a", Some("0000"), Some(&a))] },
            ),
            (
                "a template now applies",
                map(&[("app", "web")]),
                map(&[(names::STATUS_ANNOTATION, &status(&[("a", &a)]))]),
                shop.clone(),
                PodDrift::Stale { templates: vec![stale("b", None, Some(&b))] },
            ),
            (
                "a template no longer applies",
                map(&[("app", "db")]),
                map(&[(names::STATUS_ANNOTATION, &status(&[("a", &a), ("b", &b)]))]),
                shop.clone(),
                PodDrift::Stale { templates: vec![stale("b", Some(&b), None)] },
            ),
            (
                "current, but applied with conflicts",
                map(&[("app", "web")]),
                map(&[(names::STATUS_ANNOTATION, &conflicted)]),
                shop.clone(),
                PodDrift::Conflicts { templates: vec!["b".into()] },
            ),
            (
                "never injected",
                map(&[("app", "web")]),
                map(&[]),
                shop.clone(),
                PodDrift::NotInjected { templates: vec!["a".into(), "b".into()] },
            ),
            (
                "opted out",
                map(&[("sidecar-injector.io/inject", "disabled")]),
                map(&[]),
                shop.clone(),
                PodDrift::OutOfScope,
            ),
            (
                "namespace not opted in",
                map(&[]),
                map(&[]),
                NamespaceFacts::known("dev", map(&[]), map(&[])),
                PodDrift::OutOfScope,
            ),
            (
                "the pod names its templates",
                map(&[("app", "web")]),
                map(&[(names::TEMPLATES_ANNOTATION, "a"), (names::STATUS_ANNOTATION, &status(&[("a", &a)]))]),
                shop.clone(),
                PodDrift::Current,
            ),
            ("a mirror pod", map(&[]), map(&[(names::MIRROR_POD_ANNOTATION, "x")]), shop.clone(), PodDrift::OutOfScope),
        ];
        for (case, labels, mut annotations, namespace, expected) in cases {
            assert_eq!(classify(&engine, &labels, &annotations, &namespace), expected, "{case}");
            // What the pod index keeps of the annotations is enough to classify the pod.
            annotations.insert("kubectl.kubernetes.io/last-applied-configuration".into(), "{}".into());
            annotations.retain(|k, _| ANNOTATIONS_READ.contains(&k.as_str()));
            assert_eq!(classify(&engine, &labels, &annotations, &namespace), expected, "{case}, read annotations only");
        }
        let nothing = engine_with_none();
        assert_eq!(
            classify(&nothing, &map(&[]), &map(&[]), &shop),
            PodDrift::Current,
            "nothing applies: nothing to do"
        );
    }

    fn engine_with_none() -> Engine {
        engine(&[("b", B)])
    }

    #[test]
    fn workloads_are_resolved_up_to_what_a_user_restarts() {
        let owner = |kind: &str, name: &str| OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        let owners: BTreeMap<(String, String), WorkloadRef> = [
            (("ReplicaSet".into(), "web-7d9f".into()), WorkloadRef { kind: "Deployment".into(), name: "web".into() }),
            (("Job".into(), "report-2901".into()), WorkloadRef { kind: "CronJob".into(), name: "report".into() }),
        ]
        .into();
        let cases = [
            (vec![owner("ReplicaSet", "web-7d9f")], "deployment/web", RestartAction::Restart),
            (
                vec![owner("ReplicaSet", "orphan-rs")],
                "replicaset/orphan-rs",
                restart_action(&WorkloadRef { kind: "ReplicaSet".into(), name: String::new() }),
            ),
            (vec![owner("StatefulSet", "db")], "statefulset/db", RestartAction::Restart),
            (vec![owner("DaemonSet", "agent")], "daemonset/agent", RestartAction::Restart),
            (vec![owner("Job", "report-2901")], "cronjob/report", RestartAction::NextRun),
            (vec![], "pod/debug", restart_action(&WorkloadRef { kind: "Pod".into(), name: String::new() })),
        ];
        for (references, expected, action) in cases {
            let workload = workload_of("debug", &references, &owners);
            assert_eq!(workload.to_string(), expected);
            assert_eq!(restart_action(&workload), action, "{expected}");
        }
        assert!(
            matches!(restart_action(&WorkloadRef { kind: "Pod".into(), name: "x".into() }), RestartAction::Manual { advice } if advice.contains("never deleted"))
        );
    }
}
