//! Features nodes declare (`status.declaredFeatures`, KEP-5328 "Node Declared Features", GA in
//! 1.37): each kubelet lists the features **still in development** it has enabled, and the
//! scheduler places a pod that needs one only on a node that lists it (the API server likewise
//! refuses an update of a running pod that needs one its node does not list). GA features
//! (native sidecars, image volumes) are never listed: for them kubelet versions stay the rule
//! (`nodes`, `image_volumes`).
//!
//! Kubelet 1.37.1 with its default feature gates declares `ExtendWebSocketsToKubelet`,
//! `InPlacePodLevelResourcesVerticalScaling`, `InPlacePodVerticalScalingInitContainers` and
//! `RestartAllContainersOnContainerExits` (seen on the real node: node-e2e `n18`). Of the
//! features in Kubernetes' registry, one is needed by what a template can inject into a new pod:
//! a container whose `restartPolicyRules` use the action `RestartAllContainers`. The others are
//! needed by updates of running pods (resizes of pod-level resources, of run-to-completion init
//! containers, of memory-backed volumes), which the injector never writes: `drift --in-place`
//! changes images only. So [`NodeFeature`] has that one member, and the decision it feeds is a
//! warning: a template whose containers need a feature no node the pod can run on offers makes a
//! pod the scheduler never places (it stays `Pending` until such a node joins, which is why the
//! template is not left out).
//!
//! A node that declares nothing (a kubelet before 1.35, or one with the `NodeDeclaredFeatures`
//! gate off) offers nothing to a scheduler that reads declarations (on by default from 1.36,
//! taken as the API server's version; its `NodeDeclaredFeatures` filter has no fallback), and is
//! judged by its kubelet version for an older one: the feature is taken as offered from the
//! version that enables it by default. Pure.

use serde_json::Value;

/// A feature a node may declare that a decision of the injector reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeFeature {
    /// `RestartAllContainersOnContainerExits`: a container's `restartPolicyRules` may restart
    /// every container of the pod (action `RestartAllContainers`).
    RestartAllContainers,
}

impl NodeFeature {
    /// Every feature the injector reads.
    pub const ALL: [NodeFeature; 1] = [NodeFeature::RestartAllContainers];

    /// The name a node declares it by.
    pub fn declared_as(self) -> &'static str {
        match self {
            NodeFeature::RestartAllContainers => "RestartAllContainersOnContainerExits",
        }
    }

    /// The kubelet version that enables it by default: what decides for a node that declares
    /// nothing.
    pub fn on_by_default_since(self) -> (u32, u32) {
        match self {
            NodeFeature::RestartAllContainers => (1, 36),
        }
    }

    /// What in a container needs it, as a message says it.
    pub fn use_in_words(self) -> &'static str {
        match self {
            NodeFeature::RestartAllContainers => "restartPolicyRules with action RestartAllContainers",
        }
    }

    /// Whether a container needs it on the node that runs the pod (what the scheduler infers
    /// from a pod, for this feature).
    pub fn needed_by(self, container: &Value) -> bool {
        match self {
            NodeFeature::RestartAllContainers => {
                let rules = container.get("restartPolicyRules").and_then(Value::as_array);
                rules
                    .into_iter()
                    .flatten()
                    .any(|rule| rule.get("action").and_then(Value::as_str) == Some("RestartAllContainers"))
            }
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// What one node offers of the [`NodeFeature`]s, and whether its declaration said so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct NodeFeatures {
    offered: u8,
    declared: bool,
}

impl NodeFeatures {
    /// A node's features: its `status.declaredFeatures` when it has the field (`None`: it
    /// declares nothing), else what its kubelet version enables by default (which only a
    /// scheduler that does not read declarations goes by: [`FeatureReach::of`]).
    pub fn of(declared: Option<&[String]>, kubelet: Option<(u32, u32)>) -> Self {
        let offered = |feature: NodeFeature| match declared {
            Some(names) => names.iter().any(|name| name == feature.declared_as()),
            None => kubelet.is_some_and(|version| version >= feature.on_by_default_since()),
        };
        let offered = NodeFeature::ALL.into_iter().filter(|&f| offered(f)).fold(0, |set, f| set | f.bit());
        NodeFeatures { offered, declared: declared.is_some() }
    }

    /// Whether the node offers `feature`.
    pub fn offers(self, feature: NodeFeature) -> bool {
        self.offered & feature.bit() != 0
    }
}

/// The first API server (and scheduler) version whose scheduler places a pod only on nodes that
/// declare the features it needs (`NodeDeclaredFeatures` on by default).
pub const SCHEDULER_READS_DECLARATIONS_SINCE: u32 = 36;

/// What the nodes a pod can run on offer of the [`NodeFeature`]s: a feature is in reach when at
/// least one of them offers it (the scheduler then places the pod there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureReach {
    offered: u8,
    /// How the nodes said it.
    pub by: DeclaredBy,
    /// Whether the scheduler reads declarations (a node that declares nothing then offers
    /// nothing).
    pub scheduler_reads: bool,
}

/// Whether the nodes that decided declared their features or were judged by kubelet version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclaredBy {
    /// No node is known: everything is taken as offered (an unknown cluster counts as recent).
    NoNodes,
    /// Every one of them declares its features.
    All,
    /// Some declare, the others count by kubelet version.
    Some,
    /// None declares: kubelet versions decided.
    None,
}

impl Default for FeatureReach {
    fn default() -> Self {
        FeatureReach::UNKNOWN
    }
}

impl FeatureReach {
    /// Where no node is known.
    pub const UNKNOWN: FeatureReach = FeatureReach { offered: u8::MAX, by: DeclaredBy::NoNodes, scheduler_reads: true };

    /// What a set of nodes offers, from each distinct kind of node among them, to a scheduler
    /// that reads declarations or not.
    pub fn of(nodes: impl IntoIterator<Item = NodeFeatures>, scheduler_reads: bool) -> Self {
        let (mut offered, mut declaring, mut silent) = (0, false, false);
        for node in nodes {
            if node.declared || !scheduler_reads {
                offered |= node.offered;
            }
            declaring |= node.declared;
            silent |= !node.declared;
        }
        let by = match (declaring, silent) {
            (false, false) => return FeatureReach::UNKNOWN,
            (true, false) => DeclaredBy::All,
            (true, true) => DeclaredBy::Some,
            (false, true) => DeclaredBy::None,
        };
        FeatureReach { offered, by, scheduler_reads }
    }

    /// Whether the scheduler of an API server of this minor version (unknown: a recent one)
    /// reads declarations.
    pub fn scheduler_reads(api_server_minor: Option<u32>) -> bool {
        api_server_minor.is_none_or(|minor| minor >= SCHEDULER_READS_DECLARATIONS_SINCE)
    }

    /// Whether a node the pod can run on offers `feature`.
    pub fn offers(self, feature: NodeFeature) -> bool {
        self.offered & feature.bit() != 0
    }

    /// How the nodes said what they offer, for a message.
    pub fn how(self) -> String {
        let version = |feature: NodeFeature| {
            let (major, minor) = feature.on_by_default_since();
            format!("{major}.{minor}")
        };
        let since = NodeFeature::ALL.map(version).join(", ");
        let silent = match self.scheduler_reads {
            true => "a node that declares none offers none to the scheduler (1.36+)".to_owned(),
            false => format!("by kubelet version for the scheduler before 1.36 (on by default from {since})"),
        };
        match self.by {
            DeclaredBy::NoNodes => "no node is known".to_owned(),
            DeclaredBy::All => "by their status.declaredFeatures".to_owned(),
            DeclaredBy::Some => format!("by status.declaredFeatures where a node declares them; {silent}"),
            DeclaredBy::None => format!("none of them declares features: {silent}"),
        }
    }
}

/// The features a rendered template's containers need that no node the pod can run on offers,
/// each with the first container that needs it.
pub fn missing<'c>(
    containers: impl IntoIterator<Item = &'c Value>,
    reach: FeatureReach,
) -> Vec<(NodeFeature, &'c str)> {
    let mut missing: Vec<(NodeFeature, &str)> = Vec::new();
    for container in containers {
        for feature in NodeFeature::ALL {
            if !reach.offers(feature) && feature.needed_by(container) && missing.iter().all(|(f, _)| *f != feature) {
                missing.push((feature, container.get("name").and_then(Value::as_str).unwrap_or_default()));
            }
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const DECLARED_BY_1_37_1: [&str; 4] = [
        "ExtendWebSocketsToKubelet",
        "InPlacePodLevelResourcesVerticalScaling",
        "InPlacePodVerticalScalingInitContainers",
        "RestartAllContainersOnContainerExits",
    ];

    fn declared(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_node_offers_what_it_declares_else_what_its_kubelet_enables_by_default() {
        let all = declared(&DECLARED_BY_1_37_1);
        let without = declared(&DECLARED_BY_1_37_1[..3]);
        let restart_all = NodeFeature::RestartAllContainers;
        type Case<'a> = (Option<&'a [String]>, Option<(u32, u32)>, bool);
        let cases: [Case; 6] = [
            (Some(&all), Some((1, 37)), true),
            // A declaration decides over the version, either way.
            (Some(&without), Some((1, 37)), false),
            (Some(&all), Some((1, 30)), true),
            (None, Some((1, 36)), true),
            (None, Some((1, 35)), false),
            (None, None, false),
        ];
        for (list, kubelet, offered) in cases {
            assert_eq!(NodeFeatures::of(list, kubelet).offers(restart_all), offered, "{list:?} {kubelet:?}");
        }
    }

    #[test]
    fn a_feature_is_in_reach_where_one_node_offers_it_and_the_message_says_how() {
        let declaring = NodeFeatures::of(Some(&declared(&DECLARED_BY_1_37_1)), Some((1, 37)));
        let declaring_not = NodeFeatures::of(Some(&declared(&["ExtendWebSocketsToKubelet"])), Some((1, 37)));
        let old = NodeFeatures::of(None, Some((1, 34)));
        let restart_all = NodeFeature::RestartAllContainers;
        let silent_recent = NodeFeatures::of(None, Some((1, 36)));
        assert!(FeatureReach::of([declaring_not, declaring], true).offers(restart_all));
        assert_eq!(FeatureReach::of([declaring_not, declaring], true).by, DeclaredBy::All);
        let mixed = FeatureReach::of([declaring_not, old], true);
        assert!(!mixed.offers(restart_all));
        assert_eq!(mixed.by, DeclaredBy::Some);
        assert!(
            mixed.how().ends_with("a node that declares none offers none to the scheduler (1.36+)"),
            "{}",
            mixed.how()
        );
        assert_eq!(FeatureReach::of([old], true).by, DeclaredBy::None);
        // A node that declares nothing: nothing to a scheduler that filters on declarations, its
        // kubelet version's defaults to one that does not.
        assert!(!FeatureReach::of([silent_recent], true).offers(restart_all));
        let older_scheduler = FeatureReach::of([silent_recent], false);
        assert!(older_scheduler.offers(restart_all));
        assert!(
            older_scheduler
                .how()
                .contains("by kubelet version for the scheduler before 1.36 (on by default from 1.36)")
        );
        assert!(!FeatureReach::of([old], false).offers(restart_all));
        assert_eq!(FeatureReach::of([], true), FeatureReach::UNKNOWN);
        assert!(FeatureReach::UNKNOWN.offers(restart_all));
        let reads = FeatureReach::scheduler_reads;
        assert_eq!((reads(Some(35)), reads(Some(36)), reads(None)), (false, true, true));
    }

    #[test]
    fn only_a_restart_all_containers_rule_needs_the_feature() {
        let rule = |action: &str| {
            json!({"name": "agent", "restartPolicy": "Always",
                "restartPolicyRules": [{"action": action, "exitCodes": {"operator": "In", "values": [42]}}]})
        };
        let reach = FeatureReach::of([NodeFeatures::of(None, Some((1, 34)))], true);
        let containers = [json!({"name": "plain"}), rule("Restart"), rule("RestartAllContainers")];
        assert_eq!(missing(&containers, reach), vec![(NodeFeature::RestartAllContainers, "agent")]);
        assert_eq!(missing(&containers[..2], reach), vec![]);
        assert_eq!(missing(&containers, FeatureReach::UNKNOWN), vec![]);
    }
}
