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
use crate::templates::rollout::Pins;
use crate::workload::{Restart, workload_kind};
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
pub const ANNOTATIONS_READ: [&str; 4] =
    [names::STATUS_ANNOTATION, names::TEMPLATES_ANNOTATION, names::MIRROR_POD_ANNOTATION, names::PINS_ANNOTATION];

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
    // While a rollout is under way, either version may be a pod's (its workload's bucket decides,
    // which metadata alone does not tell): a pod is drifted only where it holds a version no new
    // pod gets (`TemplateSet::serves`), and `current` names the version an unpinned pod outside
    // the rollout's reach gets.
    let pins = Pins::of(annotations, &namespace.annotations).unwrap_or_default();
    let current: BTreeMap<&str, &str> = choice
        .selected()
        .filter_map(|name| engine.templates.default_version(name))
        .map(|t| (&*t.name, t.hash.as_str()))
        .collect();
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
        .filter(|n| match (injected.get(n), current.get(n)) {
            (Some(hash), Some(_)) => !engine.templates.serves(n, hash, &pins),
            (injected, current) => injected != current,
        })
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

/// How a workload of this kind is brought up to date (`workload::WORKLOAD_KINDS`).
pub fn restart_action(workload: &WorkloadRef) -> RestartAction {
    match workload_kind(&workload.kind).map(|w| w.restart) {
        Some(Restart::Rollout) => RestartAction::Restart,
        Some(Restart::NextRun) => RestartAction::NextRun,
        Some(Restart::Manual(advice)) => RestartAction::Manual { advice: advice.to_owned() },
        Some(Restart::Never) | None => {
            RestartAction::Manual { advice: format!("{} is not restarted automatically", workload.kind) }
        }
    }
}

/// A pod as `drift` reads it from the cluster: its metadata only.
#[derive(Debug, Clone, Copy)]
pub struct PodMetadata<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its annotations.
    pub annotations: &'a BTreeMap<String, String>,
    /// Its owner references.
    pub owner_references: &'a [OwnerReference],
}

/// A ReplicaSet or a Job and its controller, which lift a pod's workload to the Deployment or the
/// CronJob a user restarts.
#[derive(Debug, Clone, Copy)]
pub struct OwnerMetadata<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// `ReplicaSet` or `Job`.
    pub kind: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its owner references.
    pub owner_references: &'a [OwnerReference],
}

/// A workload with drifted pods, as `drift` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DriftedWorkload {
    /// Its namespace.
    pub namespace: String,
    /// The workload.
    pub workload: WorkloadRef,
    /// Pods injected with template versions that changed since.
    pub stale_pods: Vec<String>,
    /// Pods never injected although they should have been.
    pub not_injected_pods: Vec<String>,
    /// Pods whose templates applied with conflicts: listed, never restarted (a restart changes
    /// nothing; the pod template has to).
    pub conflicted_pods: Vec<String>,
    /// Pods an `enforced: audit` template reports (refused or changed under `enforced: true`):
    /// listed, never restarted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub enforcement_audit_pods: Vec<String>,
    /// The templates concerned, in the order first met.
    pub templates: Vec<String>,
    /// What `drift --restart` does for it.
    pub action: RestartAction,
}

/// Which list of a drifted workload a pod goes in.
type PodList = fn(&mut DriftedWorkload) -> &mut Vec<String>;

/// The drifted pods of `pods` grouped by workload (in namespace and workload order): each pod
/// classified ([`classify`]) in its namespace (a pod whose namespace is not in `namespaces` is
/// skipped), its workload lifted through `owners` ([`workload_of`]), and each workload's restart
/// action ([`restart_action`]), none for one whose pods only conflict or are audited (a restart
/// changes nothing for those).
pub fn drifted_workloads<'a>(
    engine: &Engine,
    pods: impl IntoIterator<Item = PodMetadata<'a>>,
    owners: &[OwnerMetadata<'_>],
    namespaces: &BTreeMap<String, NamespaceFacts>,
) -> Vec<DriftedWorkload> {
    let mut lifted: BTreeMap<&str, BTreeMap<(String, String), WorkloadRef>> = BTreeMap::new();
    for owner in owners {
        if let Some(controller) = owner.owner_references.iter().find(|o| o.controller == Some(true)) {
            lifted.entry(owner.namespace).or_default().insert(
                (owner.kind.to_owned(), owner.name.to_owned()),
                WorkloadRef { kind: controller.kind.clone(), name: controller.name.clone() },
            );
        }
    }
    let none = BTreeMap::new();
    let mut workloads: BTreeMap<(String, WorkloadRef), DriftedWorkload> = BTreeMap::new();
    for pod in pods {
        let Some(facts) = namespaces.get(pod.namespace) else { continue };
        let (list, templates): (PodList, Vec<String>) = match classify(engine, pod.labels, pod.annotations, facts) {
            PodDrift::Stale { templates } => (|w| &mut w.stale_pods, templates.into_iter().map(|t| t.name).collect()),
            PodDrift::NotInjected { templates } => (|w| &mut w.not_injected_pods, templates),
            PodDrift::Conflicts { templates } => (|w| &mut w.conflicted_pods, templates),
            PodDrift::EnforcementAudit { templates } => (|w| &mut w.enforcement_audit_pods, templates),
            PodDrift::Current | PodDrift::OutOfScope => continue,
        };
        let owners = lifted.get(pod.namespace).unwrap_or(&none);
        let workload = workload_of(pod.name, pod.owner_references, owners);
        let entry = workloads.entry((pod.namespace.to_owned(), workload.clone())).or_insert_with(|| DriftedWorkload {
            namespace: pod.namespace.to_owned(),
            action: restart_action(&workload),
            workload,
            stale_pods: Vec::new(),
            not_injected_pods: Vec::new(),
            conflicted_pods: Vec::new(),
            enforcement_audit_pods: Vec::new(),
            templates: Vec::new(),
        });
        list(entry).push(pod.name.to_owned());
        for template in templates {
            if !entry.templates.contains(&template) {
                entry.templates.push(template);
            }
        }
    }
    for workload in workloads.values_mut() {
        if workload.stale_pods.is_empty() && workload.not_injected_pods.is_empty() {
            let advice = match workload.conflicted_pods.is_empty() {
                true => "none: a restart changes nothing; what enforced: true would do is in sidecar-injector why",
                false => {
                    "none: a restart changes nothing; remove the pod template's items that conflict (sidecar-injector why)"
                }
            };
            workload.action = RestartAction::Manual { advice: advice.to_owned() };
        }
    }
    workloads.into_values().collect()
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

    #[test]
    fn drifted_pods_are_grouped_by_the_workload_a_user_restarts() {
        let engine = engine(&[("a", A)]);
        let a = engine.templates.get("a").unwrap().hash.clone();
        let namespaces: BTreeMap<String, NamespaceFacts> = [("shop".to_owned(), opted_in("shop", &[]))].into();
        let controlled = |kind: &str, name: &str| {
            vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: kind.into(),
                name: name.into(),
                uid: "u".into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]
        };
        let conflicted = InjectionStatus {
            templates: vec![TemplateRef { name: "a".into(), hash: a.clone() }],
            skipped: vec![crate::model::status::Skipped {
                template: "a".into(),
                kind: crate::model::status::ItemKind::Label,
                name: "a".into(),
                container: None,
                owner: "pod".into(),
            }],
            ..InjectionStatus::default()
        }
        .to_annotation();
        let none = map(&[]);
        let (stale, current) = (
            map(&[(names::STATUS_ANNOTATION, &status(&[("a", "0000")]))]),
            map(&[(names::STATUS_ANNOTATION, &status(&[("a", &a)]))]),
        );
        let conflicts = map(&[(names::STATUS_ANNOTATION, &conflicted)]);
        let (web, job, solo) = (controlled("ReplicaSet", "web-7d9f"), controlled("Job", "report-2901"), Vec::new());
        let pod = |namespace, name, annotations, owner_references| PodMetadata {
            namespace,
            name,
            labels: &none,
            annotations,
            owner_references,
        };
        let pods = [
            pod("shop", "web-7d9f-a", &stale, &web[..]),
            pod("shop", "web-7d9f-b", &none, &web[..]),
            pod("shop", "web-7d9f-c", &current, &web[..]),
            pod("shop", "report-2901-x", &stale, &job[..]),
            pod("shop", "solo", &conflicts, &solo[..]),
            // A namespace nobody listed: skipped.
            pod("elsewhere", "lost", &stale, &solo[..]),
        ];
        let (deployment, cronjob) = (controlled("Deployment", "web"), controlled("CronJob", "report"));
        let owners = [
            OwnerMetadata { namespace: "shop", kind: "ReplicaSet", name: "web-7d9f", owner_references: &deployment },
            OwnerMetadata { namespace: "shop", kind: "Job", name: "report-2901", owner_references: &cronjob },
            // The same names in another namespace lift nothing here.
            OwnerMetadata { namespace: "other", kind: "ReplicaSet", name: "solo", owner_references: &deployment },
        ];
        let found = drifted_workloads(&engine, pods, &owners, &namespaces);
        type Row = (String, Vec<String>, Vec<String>, Vec<String>, RestartAction);
        let summary: Vec<Row> = found
            .iter()
            .map(|w| {
                (
                    w.workload.to_string(),
                    w.stale_pods.clone(),
                    w.not_injected_pods.clone(),
                    w.conflicted_pods.clone(),
                    w.action.clone(),
                )
            })
            .collect();
        let manual = RestartAction::Manual {
            advice:
                "none: a restart changes nothing; remove the pod template's items that conflict (sidecar-injector why)"
                    .into(),
        };
        assert_eq!(
            summary,
            [
                ("cronjob/report".to_owned(), vec!["report-2901-x".to_owned()], vec![], vec![], RestartAction::NextRun),
                (
                    "deployment/web".to_owned(),
                    vec!["web-7d9f-a".to_owned()],
                    vec!["web-7d9f-b".to_owned()],
                    vec![],
                    RestartAction::Restart
                ),
                ("pod/solo".to_owned(), vec![], vec![], vec!["solo".to_owned()], manual),
            ]
        );
        assert!(found.iter().all(|w| w.namespace == "shop" && w.templates == ["a"]), "{found:?}");
    }
}
