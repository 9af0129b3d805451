//! Templates: the YAML format operators write, parsed once into a compiled, immutable [`Template`].
//!
//! A template is valid YAML *before* rendering. Its structure (every key, every list item) comes
//! from the YAML alone; MiniJinja expressions live only inside string scalars and are compiled here,
//! once, so a request only evaluates them. This is what makes the safety rule hold by construction:
//! a rendered string is never parsed again, so nothing from a pod, a namespace or an annotation can
//! add a key or an item. The one typed substitution is a scalar that is exactly a reference into
//! `values` (`"{{ values.port }}"`), whose value comes from the template itself or from an override
//! coerced to the default's scalar type (see `render`).
//!
//! This module holds the compiled form ([`Template`] and its pieces); `compiler` makes it from the
//! YAML, and `set` keeps the templates in service.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_core::Selector;
use serde_json::Value;

use crate::model::env::EnvMerge;
use crate::model::kinds::{ContainerPosition, PerAppList, PerMap, PerPodList, VOLUMES};
use crate::model::sizing::Sizing;
use crate::templates::expression::{self, CompiledText};

/// An error in a template, naming the template, the line (when known) and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// Template name.
    pub template: String,
    /// 1-based line in the template's YAML, when known.
    pub line: Option<u64>,
    /// What is wrong.
    pub message: String,
}

impl TemplateError {
    pub(crate) fn at(template: &str, line: u64, message: impl Into<String>) -> Self {
        TemplateError { template: template.to_owned(), line: (line > 0).then_some(line), message: message.into() }
    }
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "template \"{}\" line {line}: {}", self.template, self.message),
            None => write!(f, "template \"{}\": {}", self.template, self.message),
        }
    }
}

impl std::error::Error for TemplateError {}

/// `podResources`: what a template's containers do to a pod that sets pod-level resources
/// (`spec.resources`, KEP-2837). A pod without them is untouched either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodResources {
    /// The injected containers keep their requests and limits, and the pod-level values the pod
    /// sets grow by what they add (see `pod_resources`): the app keeps its budget.
    Pad,
    /// The injected containers lose their requests and limits and run inside the pod's budget.
    Share,
}

pub use crate::model::native::SidecarMode;

/// A label selector as written in the template, with the matcher built from it.
#[derive(Debug, Clone)]
pub struct TemplateSelector {
    /// The selector in Kubernetes syntax (`app in (web),tier!=db`), for explanations.
    pub text: Arc<str>,
    pub(crate) selector: Selector,
    pub(crate) label_selector: LabelSelector,
}

impl TemplateSelector {
    /// The label keys the selector reads (its `matchLabels` and `matchExpressions`), sorted, once each.
    pub fn label_keys(&self) -> Vec<&str> {
        let selector = &self.label_selector;
        let mut keys: Vec<&str> = selector.match_labels.iter().flatten().map(|(k, _)| k.as_str()).collect();
        keys.extend(selector.match_expressions.iter().flatten().map(|e| e.key.as_str()));
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Labels that satisfy the selector, added to `base` (used to build the sample pod and
    /// namespace a template is test-rendered against).
    pub(crate) fn satisfying_labels(&self, mut base: BTreeMap<String, String>) -> BTreeMap<String, String> {
        base.extend(self.label_selector.match_labels.clone().unwrap_or_default());
        for expression in self.label_selector.match_expressions.iter().flatten() {
            let values = expression.values.as_deref().unwrap_or_default();
            match expression.operator.as_str() {
                "In" => {
                    base.insert(expression.key.clone(), values.first().cloned().unwrap_or_default());
                }
                "Exists" => {
                    base.entry(expression.key.clone()).or_insert_with(|| "example".to_owned());
                }
                "NotIn" if base.get(&expression.key).is_some_and(|v| values.contains(v)) => {
                    base.remove(&expression.key);
                }
                "DoesNotExist" => {
                    base.remove(&expression.key);
                }
                _ => {}
            }
        }
        base
    }

    /// Whether the labels match, with Kubernetes LabelSelector semantics.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        use kube_core::SelectorExt;
        self.selector.matches(labels)
    }
}

/// A value a pod may override by annotation (`sidecar-injector.io/<template>.<name>`), and what an
/// override must look like. Written in `overridable` as a name, or as a mapping
/// `{name, pattern, enum, minimum, maximum}`.
#[derive(Debug, Clone)]
pub struct Overridable {
    /// The value's name in `values`.
    pub name: String,
    /// The whole override text must match this (anchored at both ends).
    pub pattern: Option<regex::Regex>,
    /// The override must be one of these (compared after conversion to the default's type).
    pub one_of: Option<Vec<Value>>,
    /// Smallest number allowed.
    pub minimum: Option<f64>,
    /// Largest number allowed.
    pub maximum: Option<f64>,
}

impl Overridable {
    /// Whether there is any constraint beyond the default's type.
    pub fn is_constrained(&self) -> bool {
        self.pattern.is_some() || self.one_of.is_some() || self.minimum.is_some() || self.maximum.is_some()
    }

    /// Checks an override (its `text` and its value converted to the default's type).
    pub fn check(&self, text: &str, value: &Value) -> Result<(), String> {
        if let Some(pattern) = &self.pattern
            && !pattern.is_match(text)
        {
            let shown = pattern.as_str().trim_start_matches("^(?:").trim_end_matches(")$");
            return Err(format!("{text:?} does not match the pattern {shown:?} required for {}", self.name));
        }
        if let Some(allowed) = &self.one_of
            && !allowed.contains(value)
        {
            let allowed: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return Err(format!("{text:?} is not one of {} (allowed for {})", allowed.join(", "), self.name));
        }
        let number = value.as_f64();
        if let (Some(min), Some(n)) = (self.minimum, number)
            && n < min
        {
            return Err(format!("{text} is below the minimum {min} for {}", self.name));
        }
        if let (Some(max), Some(n)) = (self.maximum, number)
            && n > max
        {
            return Err(format!("{text} is above the maximum {max} for {}", self.name));
        }
        Ok(())
    }
}

/// One compiled piece of a template's `inject` tree.
#[derive(Debug)]
pub(crate) enum Piece {
    /// A subtree without expressions, rendered by cloning.
    Literal(Value),
    /// A string scalar with expressions; renders to a string.
    Text(CompiledText),
    /// A scalar that is exactly `{{ values.a.b }}`; renders to that value with its type.
    ValueRef { line: u64, path: Vec<String> },
    /// A list whose items may carry `when:`.
    Seq(Vec<SeqItem>),
    /// A mapping, keys literal.
    Map(Vec<(String, Piece)>),
}

/// An item of a list, kept only when its `when:` condition (if any) is true.
#[derive(Debug)]
pub(crate) struct SeqItem {
    pub(crate) when: Option<CompiledText>,
    pub(crate) piece: Piece,
    /// `merge:` of an `appContainers.env` item (see `env_merge`); `None` everywhere else.
    pub(crate) merge: Option<EnvMerge>,
    /// `position:` of an init container or sidecar (`kinds::ContainerPosition`); `None` elsewhere.
    pub(crate) position: Option<ContainerPosition>,
    /// `fallback:` of an image volume (`image_volumes`); `None` elsewhere.
    pub(crate) fallback: Option<Box<VolumeFallback>>,
    /// `sizing:` of an init container or sidecar (`sizing`), with its line; `None` elsewhere.
    pub(crate) sizing: Option<Box<(u64, Sizing)>>,
    /// `keys:` of an `appContainers.envFrom` source of an enforced template: the keys of the
    /// source the app must get from it, which no `env` entry of the app container may replace
    /// (an `env` entry wins over `envFrom` in Kubernetes). Empty elsewhere.
    pub(crate) keys: Vec<String>,
}

impl SeqItem {
    /// An item with its `when:` and none of the injector's own keys (the compiler adds those its
    /// list has).
    pub(crate) fn new(when: Option<CompiledText>, piece: Piece) -> Self {
        SeqItem { when, piece, merge: None, position: None, fallback: None, sizing: None, keys: Vec::new() }
    }
}

/// An image volume's `fallback:`: the emptyDir that stands in for the image where the nodes
/// cannot mount it, and the init container that fills it (see `image_volumes`).
#[derive(Debug)]
pub(crate) struct VolumeFallback {
    /// `emptyDir:` (`{}` when absent).
    pub(crate) empty_dir: Option<Piece>,
    /// `initContainer:`.
    pub(crate) init_container: Piece,
}

/// What a template injects, compiled.
#[derive(Debug, Default)]
pub(crate) struct InjectSpec {
    /// The entries of each kind of map (`kinds::MAPS`).
    pub(crate) maps: PerMap<Vec<(String, Piece)>>,
    pub(crate) init_containers: Vec<SeqItem>,
    pub(crate) sidecars: Vec<SeqItem>,
    /// The items of each kind of spec list (`kinds::POD_LISTS`).
    pub(crate) pod_lists: PerPodList<Vec<SeqItem>>,
    /// The items of each kind of app-container list (`kinds::APP_LISTS`).
    pub(crate) app_lists: PerAppList<Vec<SeqItem>>,
    /// Which app containers get `env`, `envFrom` and `volumeMounts`.
    pub(crate) targets: AppTargets,
}

impl InjectSpec {
    /// Every list of items, in a fixed order.
    pub(crate) fn lists(&self) -> impl Iterator<Item = &Vec<SeqItem>> {
        [&self.init_containers, &self.sidecars].into_iter().chain(&self.app_lists).chain(&self.pod_lists)
    }

    /// Every compiled expression of the tree, `when:` conditions included.
    pub(crate) fn texts(&self) -> Vec<&CompiledText> {
        fn walk<'a>(piece: &'a Piece, out: &mut Vec<&'a CompiledText>) {
            match piece {
                Piece::Text(text) => out.push(text),
                Piece::Seq(items) => items.iter().for_each(|i| walk_item(i, out)),
                Piece::Map(entries) => entries.iter().for_each(|(_, p)| walk(p, out)),
                Piece::Literal(_) | Piece::ValueRef { .. } => {}
            }
        }
        fn walk_item<'a>(item: &'a SeqItem, out: &mut Vec<&'a CompiledText>) {
            out.extend(&item.when);
            walk(&item.piece, out);
            if let Some(fallback) = &item.fallback {
                fallback.empty_dir.iter().chain([&fallback.init_container]).for_each(|p| walk(p, out));
            }
        }
        let mut out = Vec::new();
        self.maps.iter().flatten().for_each(|(_, p)| walk(p, &mut out));
        self.lists().flatten().for_each(|i| walk_item(i, &mut out));
        out
    }

    /// Every compiled expression of the tree, to change in place (see [`InjectSpec::texts`]).
    pub(crate) fn texts_mut(&mut self) -> Vec<&mut CompiledText> {
        fn walk<'a>(piece: &'a mut Piece, out: &mut Vec<&'a mut CompiledText>) {
            match piece {
                Piece::Text(text) => out.push(text),
                Piece::Seq(items) => items.iter_mut().for_each(|i| walk_item(i, out)),
                Piece::Map(entries) => entries.iter_mut().for_each(|(_, p)| walk(p, out)),
                Piece::Literal(_) | Piece::ValueRef { .. } => {}
            }
        }
        fn walk_item<'a>(item: &'a mut SeqItem, out: &mut Vec<&'a mut CompiledText>) {
            out.extend(&mut item.when);
            walk(&mut item.piece, out);
            if let Some(fallback) = &mut item.fallback {
                let VolumeFallback { empty_dir, init_container } = &mut **fallback;
                empty_dir.iter_mut().chain([init_container]).for_each(|p| walk(p, out));
            }
        }
        let mut out = Vec::new();
        let InjectSpec { maps, init_containers, sidecars, pod_lists, app_lists, .. } = self;
        maps.iter_mut().flatten().for_each(|(_, p)| walk(p, &mut out));
        for list in [init_containers, sidecars].into_iter().chain(app_lists).chain(pod_lists) {
            list.iter_mut().for_each(|i| walk_item(i, &mut out));
        }
        out
    }
}

/// Which of a pod's app containers a template's `appContainers` additions go into.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppTargets {
    /// Only these (by name); `None`: every app container.
    pub only: Option<Vec<String>>,
    /// Never these.
    pub except: Vec<String>,
}

impl AppTargets {
    /// Whether the app container `name` gets the additions.
    pub fn includes(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|only| only.iter().any(|n| n == name)) && !self.except.iter().any(|n| n == name)
    }
}

/// What a pod may choose for a template by annotation, besides overridable values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodChoices {
    /// `sidecar-injector.io/<template>.app-containers: "a,b"`: which app containers get the
    /// additions (never one the template excludes).
    pub app_containers: bool,
    /// `sidecar-injector.io/<template>.sidecar-mode: native|container`.
    pub sidecar_mode: bool,
}

/// A parsed, compiled and checked template.
#[derive(Debug)]
pub struct Template {
    /// Template name (the ConfigMap key or file name without `.yaml`); shared, because every
    /// decision names the templates it considered.
    pub name: Arc<str>,
    /// Human description.
    pub description: String,
    /// Injected when no `sidecar-injector.io/templates` annotation names templates.
    pub default: bool,
    /// Injected into every pod its selectors match in an opted-in namespace, whatever the pod says:
    /// its opt-out label and its templates annotation cannot remove it, and a same-name item in the
    /// pod that differs from the template's refuses the pod (see `enforce`).
    pub enforced: bool,
    /// `enforced: audit`: a dry run of `enforced: true`. Selected like any template; every pod that
    /// `enforced: true` would refuse, or would give the template against its annotations, is
    /// reported (admission warning, metric, drift state, a Warn/Audit policy binding) and admitted.
    pub audit: bool,
    /// `ownProcessNamespace: true` (enforced templates only): its containers need a process
    /// namespace the app cannot reach, so a pod that shares one among its containers
    /// (`shareProcessNamespace: true`, where the app could signal or stop the agent) is refused.
    pub own_process_namespace: bool,
    /// Optional selector on pod labels.
    pub pod_selector: Option<TemplateSelector>,
    /// Optional selector on namespace labels.
    pub namespace_selector: Option<TemplateSelector>,
    /// Native or classic sidecars.
    pub sidecar_mode: SidecarMode,
    /// What the injected containers do to a pod that sets pod-level resources (`podResources`).
    pub pod_resources: PodResources,
    /// Default values, referenced as `values.<key>`.
    pub values: serde_json::Map<String, Value>,
    /// Values a pod may override by annotation, with what an override must look like.
    pub overridable: Vec<Overridable>,
    /// What else a pod may choose by annotation (`podChoices`).
    pub pod_choices: PodChoices,
    /// Things the operator should know that do not stop the template (see `check-templates`).
    pub warnings: Vec<String>,
    /// Content hash of the template (canonical JSON of the parsed document, so comments and
    /// formatting do not count); recorded in the status annotation to detect stale pods.
    pub hash: String,
    /// Field paths of rendered items (`inject.sidecars[0].someField`) the load check passes
    /// although the Kubernetes types it reads items as do not know them: fields newer than
    /// `load::CHECKED_KUBERNETES_VERSION` (`uncheckedFields`).
    pub unchecked_fields: Vec<String>,
    /// The YAML text it was loaded from: an earlier version differing only in images is rebuilt
    /// from it (`drift::in_place`).
    pub(crate) source: Arc<str>,
    /// `rollout:`: while a rollout is under way, who gets this version rather than the one in
    /// service before (see `rollout`). Not part of `hash`.
    pub rollout: Option<Rollout>,
    pub(crate) inject: InjectSpec,
    pub(crate) expressions: expression::Expressions,
}

/// A warning for each injected container that does not set cpu and memory requests and limits: a
/// namespace whose ResourceQuota counts one of them refuses pods with a container that lacks it,
/// unless the namespace's LimitRange gives a default.
pub(crate) fn resource_warnings(spec: &InjectSpec) -> Vec<String> {
    /// Whether the compiled item sets a field at `path` (whatever its value renders to).
    fn sets(piece: &Piece, path: &[&str]) -> bool {
        match (piece, path.split_first()) {
            (_, None) => true,
            (Piece::Literal(value), Some(_)) => path.iter().try_fold(value, |v, key| v.get(*key)).is_some(),
            (Piece::Map(entries), Some((first, rest))) => {
                entries.iter().find(|(key, _)| key == first).is_some_and(|(_, piece)| sets(piece, rest))
            }
            _ => false,
        }
    }
    let mut warnings = Vec::new();
    for (kind, items) in [("init container", &spec.init_containers), ("sidecar", &spec.sidecars)] {
        for (index, item) in items.iter().enumerate() {
            let missing: Vec<String> =
                [["requests", "cpu"], ["requests", "memory"], ["limits", "cpu"], ["limits", "memory"]]
                    .into_iter()
                    .filter(|[section, resource]| !sets(&item.piece, &["resources", section, resource]))
                    .map(|path| path.join("."))
                    .collect();
            if missing.is_empty() {
                continue;
            }
            let name = item_name(item, index);
            warnings.push(format!(
                "{kind} {name} sets no {}: a namespace whose ResourceQuota counts them refuses its pods (\"must specify {}\") unless the namespace's LimitRange gives defaults, which Kubernetes applies to injected containers too",
                missing.join(", "),
                missing[0]
            ));
        }
    }
    warnings
}

/// A warning for each sidecar that says `position: last` where it can run as a native sidecar,
/// which goes before the pod's init containers whatever it says (they may need it); where it runs
/// as a classic container, last is where it goes anyway.
pub(crate) fn position_warnings(template: &Template) -> Vec<String> {
    if template.sidecar_mode == SidecarMode::Container && !template.pod_choices.sidecar_mode {
        return Vec::new();
    }
    let last = template.inject.sidecars.iter().enumerate().filter(|(_, i)| i.position == Some(ContainerPosition::Last));
    last.map(|(index, item)| {
        format!(
            "sidecar {} says position: last, which does nothing: a native sidecar goes before the pod's init containers (which may need it) and a classic one after the app's containers anyway",
            item_name(item, index)
        )
    })
    .collect()
}

/// An image volume without a `fallback:` fails wherever the nodes cannot mount it.
pub(crate) fn image_volume_warnings(template: &Template) -> Vec<String> {
    let volumes = template.inject.pod_lists[VOLUMES.index].iter().enumerate();
    let is_image = |item: &SeqItem| match &item.piece {
        Piece::Map(entries) => entries.iter().any(|(key, _)| key == "image"),
        Piece::Literal(volume) => volume.get("image").is_some(),
        _ => false,
    };
    volumes
        .filter(|(_, item)| item.fallback.is_none() && is_image(item))
        .map(|(index, item)| {
            format!(
                "volume {} is an image volume without a fallback: a pod that can run on a node whose kubelet is older than 1.35, or whose runtime is older than containerd 2.1 or CRI-O 1.31, does not start there (and containerd before 2.2 or CRI-O before 1.33 ignore a subPath into it); fallback: declares the emptyDir and copy init container injected there instead",
                item_name(item, index)
            )
        })
        .collect()
}

/// An item of a list, for messages: its literal name, or `#<position>`.
fn item_name(item: &SeqItem, index: usize) -> String {
    let name = match &item.piece {
        Piece::Map(entries) => match entries.iter().find(|(k, _)| k == "name").map(|(_, p)| p) {
            Some(Piece::Literal(Value::String(n))) => Some(n.as_str()),
            _ => None,
        },
        Piece::Literal(item) => item.get("name").and_then(Value::as_str),
        _ => None,
    };
    name.map_or_else(|| format!("#{}", index + 1), |n| format!("{n:?}"))
}

/// Pods of the new version whose injected containers failed that halt a rollout, by default.
pub const DEFAULT_FAILED_PODS: u32 = 2;
/// Restarts of an injected container that make it count as failed, by default.
pub const DEFAULT_RESTARTS: u32 = 3;
/// How long an injected container may run unready before it counts as failed, by default: long
/// enough for an agent that starts slowly (a readiness probe's own delays and failures included).
pub const DEFAULT_UNREADY_SECONDS: u32 = 300;

/// A template's `rollout:` key: who gets its version while the previous one still serves others.
#[derive(Debug, Clone)]
pub struct Rollout {
    /// Percent of workloads (0–100) that get the new version.
    pub share: u8,
    /// Workloads whose pods' labels it matches get the new version whatever their bucket.
    pub selector: Option<TemplateSelector>,
    /// When the new version's failures halt the rollout.
    pub halt: HaltThresholds,
}

impl PartialEq for Rollout {
    fn eq(&self, other: &Self) -> bool {
        let text = |s: &Option<TemplateSelector>| s.as_ref().map(|s| s.text.clone());
        self.share == other.share && text(&self.selector) == text(&other.selector) && self.halt == other.halt
    }
}

/// `rollout.halt`: when the pods that got the new version have failed enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HaltThresholds {
    /// Pods with a failed injected container that halt the rollout.
    pub failed_pods: u32,
    /// Restarts that make an injected container count as failed.
    pub restarts: u32,
    /// Seconds an injected container may run unready before it counts as failed.
    pub unready_seconds: u32,
}

impl Default for HaltThresholds {
    fn default() -> Self {
        HaltThresholds {
            failed_pods: DEFAULT_FAILED_PODS,
            restarts: DEFAULT_RESTARTS,
            unready_seconds: DEFAULT_UNREADY_SECONDS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::set::*;
    use crate::test_support::template;

    const MINIMAL: &str = "inject:\n  sidecars:\n    - name: s\n      image: x\n";

    #[test]
    fn a_sidecar_position_that_does_nothing_is_a_warning() {
        let with = |mode: &str, position: &str| {
            let text = format!(
                "sidecarMode: {mode}\ninject:\n  sidecars:\n    - {{name: agent, image: a, position: {position}}}\n"
            );
            template("t", &text).warnings.into_iter().filter(|w| w.contains("position")).collect::<Vec<_>>()
        };
        for mode in ["native", "auto"] {
            let warnings = with(mode, "last");
            assert_eq!(warnings.len(), 1, "{mode}: {warnings:?}");
            assert!(warnings[0].contains("sidecar \"agent\" says position: last, which does nothing"), "{warnings:?}");
        }
        assert!(with("container", "last").is_empty(), "a classic sidecar's default, said");
        assert!(with("native", "first").is_empty(), "first is native's place anyway, and a classic sidecar's choice");
    }

    #[test]
    fn load_errors_name_the_line_and_the_problem() {
        // (case, template text, expected line, expected message fragment)
        let cases: &[(&str, &str, Option<u64>, &str)] = &[
            ("yaml syntax", "inject:\n  sidecars: [\n", Some(2), "unclosed bracket"),
            ("duplicate key", "default: true\ndefault: false\n", Some(2), "duplicate mapping key: default"),
            ("not a mapping", "- a\n- b\n", Some(1), "the template must be a mapping"),
            ("unknown top-level key", "description: x\nsidecar:\n  - name: a\n", Some(2), "unknown key \"sidecar\""),
            ("default not bool", "default: yes please\n", Some(1), "default must be true or false"),
            ("bad sidecarMode", "sidecarMode: sometimes\n", Some(1), "sidecarMode must be native, container or auto"),
            (
                "bad position",
                "inject:\n  sidecars:\n    - name: a\n      image: a\n      position: middle\n",
                Some(5),
                "position must be first or last, not \"middle\"",
            ),
            (
                "a label key the API server refuses",
                "inject:\n  labels:\n    Example.com/team: a\n",
                Some(3),
                "inject.labels.Example.com/team is not a valid key: a qualified name's prefix must be a lowercase RFC 1123 subdomain",
            ),
            (
                "selector with In and no values",
                "podSelector:\n  matchExpressions:\n    - {key: app, operator: In}\n",
                Some(2),
                "podSelector is not a valid LabelSelector",
            ),
            (
                "selector unknown field",
                "namespaceSelector:\n  matchLabel: {a: b}\n",
                Some(2),
                "unknown key \"matchLabel\" in namespaceSelector",
            ),
            (
                "selector expression unknown field",
                "podSelector:\n  matchExpressions:\n    - {key: a, operator: Exists, value: [x]}\n",
                Some(3),
                "unknown key \"value\" in podSelector.matchExpressions",
            ),
            (
                "selector bad operator",
                "podSelector:\n  matchExpressions:\n    - {key: a, operator: Equals}\n",
                Some(2),
                "not a valid LabelSelector",
            ),
            (
                "enforced neither true, false nor audit",
                "enforced: maybe\n",
                Some(1),
                "enforced must be true, false or audit",
            ),
            (
                "merge on an item without a value",
                "inject:\n  appContainers:\n    env:\n      - name: J\n        valueFrom: {fieldRef: {fieldPath: metadata.name}}\n        merge: {append: \" \"}\n",
                Some(6),
                "an env item that merges needs a value",
            ),
            (
                "merge with an unknown position",
                "inject:\n  appContainers:\n    env:\n      - {name: J, value: x, merge: {after: \" \"}}\n",
                Some(4),
                "merge must be {append: \"<separator>\"} or {prepend: \"<separator>\"}, not \"after\"",
            ),
            (
                "merge not a mapping",
                "inject:\n  appContainers:\n    env:\n      - {name: J, value: x, merge: append}\n",
                Some(4),
                "merge must be {append",
            ),
            (
                "merge separator from an expression",
                "inject:\n  appContainers:\n    env:\n      - {name: J, value: x, merge: {append: \"{{ pod.metadata.name }}\"}}\n",
                Some(4),
                "the merge separator must be a literal string",
            ),
            (
                "overridable unknown value",
                "values: {a: 1}\noverridable: [b]\n",
                Some(2),
                "overridable names \"b\", which is not in values",
            ),
            (
                "overridable non-scalar",
                "values:\n  a: [1]\noverridable:\n  - a\n",
                Some(4),
                "only scalar values can be overridable",
            ),
            ("overridable not identifier", "values: {a-b: 1}\noverridable: [a-b]\n", Some(2), "must be an identifier"),
            (
                "overridable entry with an unknown key",
                "values: {a: x}\noverridable:\n  - {name: a, regex: x}\n",
                Some(3),
                "unknown key \"regex\" in an overridable entry (expected name, pattern, enum, minimum, maximum)",
            ),
            (
                "overridable entry without a name",
                "values: {a: x}\noverridable:\n  - {pattern: x}\n",
                Some(3),
                "needs a name",
            ),
            (
                "overridable pattern that does not compile",
                "values: {a: x}\noverridable:\n  - {name: a, pattern: \"(\"}\n",
                Some(3),
                "pattern \"(\" is not a valid regular expression",
            ),
            (
                "overridable range on a string",
                "values: {a: x}\noverridable:\n  - {name: a, minimum: 1}\n",
                Some(3),
                "minimum and maximum need a number",
            ),
            (
                "overridable default that breaks its constraint",
                "values: {a: 500}\noverridable:\n  - {name: a, minimum: 1, maximum: 100}\n",
                Some(3),
                "the default of a breaks its own constraint: 500 is above the maximum 100 for a",
            ),
            ("unknown inject key", "inject:\n  containers: []\n", Some(2), "unknown key \"containers\" in inject"),
            (
                "unknown appContainers key",
                "inject:\n  appContainers:\n    envFrm: []\n",
                Some(3),
                "unknown key \"envFrm\" in inject.appContainers",
            ),
            (
                "container names are literal",
                "inject:\n  appContainers:\n    containers: [\"{{ pod.metadata.name }}\"]\n",
                Some(3),
                "is not a container name (a DNS label, no expressions)",
            ),
            (
                "unknown pod choice",
                "podChoices: [image]\ninject: {}\n",
                Some(1),
                "podChoices lists what a pod may choose: appContainers, sidecarMode",
            ),
            (
                "envFrom without a reference",
                "inject:\n  appContainers:\n    envFrom:\n      - prefix: X_\n",
                None,
                "inject.appContainers.envFrom[0] needs exactly one of configMapRef or secretRef",
            ),
            (
                "sidecar without name",
                "inject:\n  sidecars:\n    - image: x\n",
                Some(3),
                "an item of inject.sidecars has no name",
            ),
            (
                "mount without mountPath",
                "inject:\n  appContainers:\n    volumeMounts:\n      - name: v\n",
                Some(4),
                "has no mountPath",
            ),
            ("sidecars not a list", "inject:\n  sidecars: {name: a}\n", Some(2), "inject.sidecars must be a list"),
            ("label value is a list", "inject:\n  labels:\n    a: [1]\n", Some(3), "inject.labels.a must be a string"),
            (
                "undefined value reference",
                "values: {a: 1}\ninject:\n  sidecars:\n    - name: s\n      image: \"{{ values.b }}\"\n",
                Some(5),
                "values.b is not defined",
            ),
            (
                "expression syntax error",
                "inject:\n  sidecars:\n    - name: s\n      image: \"{{ pod.metadata.name | }}\"\n",
                Some(4),
                "syntax error",
            ),
            (
                "undefined variable at render",
                "inject:\n  sidecars:\n    - name: s\n      image: x\n      args: [\"{{ pod.metadata.labels.missing }}\"]\n",
                Some(5),
                "undefined value",
            ),
            (
                "unknown filter",
                "inject:\n  annotations:\n    a: \"{{ pod.metadata.name | shout }}\"\n",
                Some(3),
                "unknown filter",
            ),
            (
                "when not an expression",
                "inject:\n  sidecars:\n    - name: s\n      when: maybe\n",
                Some(4),
                "when must be exactly one expression",
            ),
            (
                "rendered name empty",
                "inject:\n  volumes:\n    - name: \"{{ '' }}\"\n",
                None,
                "inject.volumes[0].name must render to a non-empty string",
            ),
            (
                "infinite loop",
                "inject:\n  annotations:\n    a: \"{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}\"\n",
                Some(3),
                "did not finish within 50000 instructions",
            ),
            (
                "huge output",
                "inject:\n  annotations:\n    a: \"{{ 'x' * 10000000 }}\"\n",
                Some(3),
                "is larger than 65536 bytes",
            ),
        ];
        for (case, text, line, fragment) in cases {
            let err = Template::load("t", text).expect_err(case);
            assert_eq!(err.template, "t", "{case}");
            assert_eq!(err.line, *line, "{case}: {err}");
            assert!(err.message.contains(fragment), "{case}: expected {fragment:?} in {:?}", err.message);
        }
    }

    #[test]
    fn empty_sections_mean_none() {
        // Found by the template fuzzer: `values:` with no value is YAML null.
        for text in
            ["values:\n", "values:\ninject:\n", "inject:\n  labels:\n  sidecars:\n", "overridable: []\nvalues: ~\n"]
        {
            let t = Template::load("t", text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(t.values.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn template_names_are_checked() {
        for bad in ["", "Logs", "-a", "a-", "a_b", "a.b", &"x".repeat(41)] {
            let err = Template::load(bad, MINIMAL).expect_err(bad);
            assert!(err.message.contains("invalid template name"), "{bad}: {err}");
        }
        for good in ["a", "log-shipper", "otel2", &"x".repeat(40)] {
            Template::load(good, MINIMAL).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }

    #[test]
    fn fields_are_read() {
        let t = template(
            "t",
            "description: d\ndefault: true\nsidecarMode: container\npodSelector: {matchLabels: {app: web}}\nvalues: {port: 80, name: x}\noverridable: [port]\n",
        );
        assert_eq!(t.description, "d");
        assert!(t.default);
        assert_eq!(t.sidecar_mode, SidecarMode::Container);
        assert_eq!(&*t.pod_selector.as_ref().unwrap().text, "app=web");
        assert!(t.namespace_selector.is_none());
        assert_eq!(t.values["port"], 80);
        assert_eq!(t.overridable.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["port"]);
    }

    #[test]
    fn the_hash_ignores_comments_and_layout_but_not_content() {
        let a = template("t", "values: {a: 1}\ninject:\n  labels: {x: y}\n");
        let b = template("t", "# a comment\ninject:\n  labels:\n    x: y   # here too\nvalues:\n  a: 1\n");
        let c = template("t", "values: {a: 2}\ninject:\n  labels: {x: y}\n");
        assert_eq!(a.hash, b.hash);
        assert_ne!(a.hash, c.hash);
        assert_eq!(a.hash.len(), 16);
    }

    #[test]
    fn update_keeps_the_last_good_version_of_a_broken_template() {
        let source = |name: &str, text: &str| TemplateSource { name: name.into(), text: text.into() };
        let (v1, errors) = TemplateSet::load([source("a", MINIMAL), source("b", MINIMAL)]);
        assert!(errors.is_empty());
        let a_v1 = v1.get("a").unwrap().clone();

        let (v2, errors) = v1.update(
            [source("a", "inject: [broken\n"), source("b", "default: true\n"), source("c", MINIMAL)],
            &InProcess,
        );
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].template, "a");
        assert!(Arc::ptr_eq(v2.get("a").unwrap(), &a_v1), "the broken template keeps its last good version");
        assert!(v2.get("b").unwrap().default, "the good edit is taken");
        assert!(v2.get("c").is_some(), "a new template is added");

        let (v3, errors) = v2.update([source("c", MINIMAL)], &InProcess);
        assert!(errors.is_empty());
        assert_eq!(v3.names().collect::<Vec<_>>(), vec!["c"], "templates removed from the source are dropped");
        assert!(Arc::ptr_eq(v3.get("c").unwrap(), v2.get("c").unwrap()), "unchanged templates are not recompiled");

        let (v4, errors) = TemplateSet::load([source("d", MINIMAL), source("d", MINIMAL)]);
        assert_eq!((v4.len(), errors.len()), (1, 1));
        assert!(errors[0].message.contains("defined more than once"));
    }

    #[test]
    fn a_precheck_sees_only_changed_text_and_its_refusal_keeps_the_last_good_version() {
        struct Refuse {
            name: &'static str,
            seen: std::cell::RefCell<Vec<String>>,
        }
        impl PreCheck for Refuse {
            fn precheck(&self, sources: &[TemplateSource]) -> Vec<TemplateError> {
                self.seen.borrow_mut().extend(sources.iter().map(|s| s.name.clone()));
                let refused = sources.iter().filter(|s| s.name == self.name);
                refused
                    .map(|s| TemplateError { template: s.name.clone(), line: None, message: "too big".into() })
                    .collect()
            }
        }
        let source = |name: &str, text: &str| TemplateSource { name: name.into(), text: text.into() };
        let (v1, _) = TemplateSet::load([source("a", MINIMAL), source("b", MINIMAL)]);
        let refuse = Refuse { name: "b", seen: Default::default() };
        let edited = MINIMAL.replace("image: x", "image: y");
        let (v2, errors) = v1.update([source("a", MINIMAL), source("b", &edited), source("c", MINIMAL)], &refuse);
        assert_eq!(*refuse.seen.borrow(), vec!["b", "c"], "unchanged text is not checked again");
        assert_eq!(errors, vec![TemplateError { template: "b".into(), line: None, message: "too big".into() }]);
        assert!(
            Arc::ptr_eq(v2.get("b").unwrap(), v1.get("b").unwrap()),
            "the refused edit keeps the last good version"
        );
        assert!(v2.get("c").is_some());
    }

    #[test]
    fn embedded_defaults_load() {
        let (set, errors) = TemplateSet::load(embedded_sources());
        assert!(errors.is_empty(), "{errors:?}");
        assert!(set.len() >= 3);
        let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../templates"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "yaml"))
            .count();
        assert_eq!(set.len(), files, "every file in templates/ is embedded");
    }
}
