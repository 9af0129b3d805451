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
//! A set of templates ([`TemplateSet`]) is what the webhook, the CLI and the validating checks share;
//! [`TemplateSet::update`] keeps the last good version of a template whose new text is broken.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_core::Selector;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::model::env::{EnvMerge, Position};
use crate::model::kinds::{
    APP_LISTS, ContainerPosition, ENV, ENV_FROM, MAPS, POD_LISTS, PerAppList, PerMap, PerPodList, VOLUMES,
};
use crate::model::yaml::{MapEntry, SourceNode, SourceValue};
use crate::templates::expression::{self, CompiledText};

/// The longest template name: `<template>.<value>` must fit the 63 characters of an annotation name.
const MAX_TEMPLATE_NAME: usize = 40;

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
    /// `keys:` of an `appContainers.envFrom` source of an enforced template: the keys of the
    /// source the app must get from it, which no `env` entry of the app container may replace
    /// (an `env` entry wins over `envFrom` in Kubernetes). Empty elsewhere.
    pub(crate) keys: Vec<String>,
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

/// Which keys of a list's items belong to the injector rather than to the rendered item.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ItemKeys {
    /// None: the item is rendered whole.
    Plain,
    /// `merge:` (an `appContainers.env` item).
    Env,
    /// `position:` (an init container or sidecar).
    Container,
    /// `fallback:` (a volume).
    Volume,
    /// `keys:` (an `appContainers.envFrom` source).
    EnvFrom,
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
    pub(crate) inject: InjectSpec,
    pub(crate) expressions: expression::Expressions,
}

/// Parses and compiles a template, without the checks that render it (`load` adds those: a
/// template is used only once [`Template::load`] accepted it).
pub(crate) fn compile(name: &str, source: &str) -> Result<Template, TemplateError> {
    validate_template_name(name)?;
    let root = SourceNode::parse(source).map_err(|e| TemplateError {
        template: name.to_owned(),
        line: e.line,
        message: e.message,
    })?;
    let mut template = Compiler::new(name).template(&root)?;
    template.source = source.into();
    Ok(template)
}

fn validate_template_name(name: &str) -> Result<(), TemplateError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_TEMPLATE_NAME
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(TemplateError {
            template: name.to_owned(),
            line: None,
            message: format!(
                "invalid template name: use lowercase letters, digits and '-', at most {MAX_TEMPLATE_NAME} characters, starting and ending with a letter or digit"
            ),
        })
    }
}

fn is_identifier(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Turns the line-annotated YAML tree into a [`Template`], reporting the first error with its line.
struct Compiler<'a> {
    name: &'a str,
    expressions: expression::ExpressionsBuilder,
    /// The line of the first `keys:` of an `envFrom` source (only an enforced template may say it).
    env_from_keys_line: Option<u64>,
}

impl<'a> Compiler<'a> {
    fn new(name: &'a str) -> Self {
        Compiler { name, expressions: expression::ExpressionsBuilder::default(), env_from_keys_line: None }
    }

    fn err(&self, line: u64, message: impl Into<String>) -> TemplateError {
        TemplateError::at(self.name, line, message)
    }

    fn template(mut self, root: &SourceNode) -> Result<Template, TemplateError> {
        let entries = self.mapping(root, "the template")?;
        let mut template = Template {
            name: self.name.into(),
            description: String::new(),
            default: false,
            enforced: false,
            audit: false,
            own_process_namespace: false,
            pod_selector: None,
            namespace_selector: None,
            sidecar_mode: SidecarMode::Auto,
            pod_resources: PodResources::Pad,
            values: serde_json::Map::new(),
            overridable: Vec::new(),
            pod_choices: PodChoices::default(),
            warnings: Vec::new(),
            hash: content_hash(root),
            unchecked_fields: Vec::new(),
            source: "".into(),
            inject: InjectSpec::default(),
            expressions: expression::Expressions::default(),
        };
        let mut overridable_node = None;
        let mut own_process_namespace_line = 0;
        for MapEntry { key, key_line, value: node } in entries {
            match key.as_str() {
                "description" => template.description = self.plain_string(node, key)?,
                "default" => match node.value {
                    SourceValue::Bool(b) => template.default = b,
                    _ => {
                        return Err(
                            self.err(node.line, format!("default must be true or false, not {}", node.type_name()))
                        );
                    }
                },
                "enforced" => match &node.value {
                    SourceValue::Bool(b) => template.enforced = *b,
                    SourceValue::String(s) if s == "audit" => template.audit = true,
                    _ => {
                        return Err(self.err(
                            node.line,
                            format!("enforced must be true, false or audit, not {}", node.type_name()),
                        ));
                    }
                },
                "ownProcessNamespace" => match node.value {
                    SourceValue::Bool(b) => {
                        template.own_process_namespace = b;
                        own_process_namespace_line = *key_line;
                    }
                    _ => {
                        return Err(self.err(
                            node.line,
                            format!("ownProcessNamespace must be true or false, not {}", node.type_name()),
                        ));
                    }
                },
                "podSelector" => template.pod_selector = self.selector(node, key)?,
                "namespaceSelector" => template.namespace_selector = self.selector(node, key)?,
                "podResources" => {
                    template.pod_resources = match self.plain_string(node, key)?.as_str() {
                        "pad" => PodResources::Pad,
                        "share" => PodResources::Share,
                        other => {
                            return Err(
                                self.err(node.line, format!("podResources must be pad or share, not {other:?}"))
                            );
                        }
                    }
                }
                "sidecarMode" => {
                    template.sidecar_mode = match self.plain_string(node, key)?.as_str() {
                        "native" => SidecarMode::Native,
                        "container" => SidecarMode::Container,
                        "auto" => SidecarMode::Auto,
                        other => {
                            return Err(self.err(
                                node.line,
                                format!("sidecarMode must be native, container or auto, not {other:?}"),
                            ));
                        }
                    }
                }
                "values" => {
                    self.mapping(node, key)?;
                    // A mapping, or null (`values:` with nothing after it) meaning none.
                    if let Value::Object(values) = node.to_json() {
                        template.values = values;
                    }
                }
                "overridable" => overridable_node = Some(node),
                "podChoices" => template.pod_choices = self.pod_choices(node)?,
                "uncheckedFields" => template.unchecked_fields = self.unchecked_fields(node)?,
                "inject" => template.inject = self.inject(node)?,
                other => {
                    return Err(self.err(
                        *key_line,
                        format!(
                            "unknown key {other:?} (expected description, default, enforced, ownProcessNamespace, podSelector, namespaceSelector, sidecarMode, podResources, values, overridable, podChoices, uncheckedFields, inject)"
                        ),
                    ));
                }
            }
        }
        self.check_enforced_only(&template, own_process_namespace_line)?;
        if let Some(node) = overridable_node {
            template.overridable = self.overridable(node, &template.values)?;
        }
        self.check_value_refs(&template.inject, &template.values)?;
        template.warnings = self.override_warnings(&template);
        template.expressions = self.expressions.build(&template.values);
        Ok(template)
    }

    /// What only an enforced template may say: a template that is not enforced cannot refuse pods.
    fn check_enforced_only(&self, template: &Template, own_process_namespace_line: u64) -> Result<(), TemplateError> {
        if template.enforced || template.audit {
            return Ok(());
        }
        if template.own_process_namespace {
            return Err(self.err(
                own_process_namespace_line,
                "ownProcessNamespace: true is a requirement of an enforced template (enforced: true or audit): a template that is not enforced cannot refuse pods",
            ));
        }
        match self.env_from_keys_line {
            Some(line) => Err(self.err(
                line,
                "keys: on an envFrom source is for an enforced template (enforced: true or audit): a template that is not enforced cannot refuse pods whose env replaces a key",
            )),
            None => Ok(()),
        }
    }

    fn mapping<'n>(&self, node: &'n SourceNode, what: &str) -> Result<&'n [MapEntry], TemplateError> {
        match &node.value {
            SourceValue::Map(entries) => Ok(entries),
            SourceValue::Null => Ok(&[]),
            _ => Err(self.err(node.line, format!("{what} must be a mapping, not {}", node.type_name()))),
        }
    }

    fn plain_string(&self, node: &SourceNode, key: &str) -> Result<String, TemplateError> {
        match &node.value {
            SourceValue::String(s) => Ok(s.clone()),
            SourceValue::Null => Ok(String::new()),
            _ => Err(self.err(node.line, format!("{key} must be a string, not {}", node.type_name()))),
        }
    }

    fn selector(&self, node: &SourceNode, key: &str) -> Result<Option<TemplateSelector>, TemplateError> {
        if matches!(node.value, SourceValue::Null) {
            return Ok(None);
        }
        self.check_selector_keys(node, key)?;
        let label_selector: LabelSelector = serde_json::from_value(node.to_json())
            .map_err(|e| self.err(node.line, format!("{key} is not a valid LabelSelector: {e}")))?;
        let selector = Selector::try_from(label_selector.clone())
            .map_err(|e| self.err(node.line, format!("{key} is not a valid LabelSelector: {e}")))?;
        Ok(Some(TemplateSelector { text: selector.to_string().into(), selector, label_selector }))
    }

    /// k8s-openapi ignores unknown LabelSelector fields, so a typo (`matchLabel`) would silently
    /// become the empty selector, which matches everything. Refuse unknown keys instead.
    fn check_selector_keys(&self, node: &SourceNode, key: &str) -> Result<(), TemplateError> {
        for entry in self.mapping(node, key)? {
            match entry.key.as_str() {
                "matchLabels" => {}
                "matchExpressions" => {
                    let SourceValue::Seq(items) = &entry.value.value else { continue };
                    for item in items {
                        for field in self.mapping(item, &format!("{key}.matchExpressions[]"))? {
                            if !["key", "operator", "values"].contains(&field.key.as_str()) {
                                return Err(self.err(
                                    field.key_line,
                                    format!(
                                        "unknown key {:?} in {key}.matchExpressions (expected key, operator, values)",
                                        field.key
                                    ),
                                ));
                            }
                        }
                    }
                }
                other => {
                    return Err(self.err(
                        entry.key_line,
                        format!("unknown key {other:?} in {key} (expected matchLabels, matchExpressions)"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `uncheckedFields`: a list of `inject.<section>[<index>].<field path>`, as the load check's
    /// error names a field it does not know.
    fn unchecked_fields(&self, node: &SourceNode) -> Result<Vec<String>, TemplateError> {
        let SourceValue::Seq(items) = &node.value else {
            return Err(
                self.err(node.line, format!("uncheckedFields must be a list of field paths, not {}", node.type_name()))
            );
        };
        items
            .iter()
            .map(|item| match &item.value {
                SourceValue::String(path) if path.starts_with("inject.") && path.contains("].") => Ok(path.clone()),
                _ => Err(self.err(
                    item.line,
                    "uncheckedFields items are field paths like \"inject.sidecars[0].someField\", as the error for an unknown field names them",
                )),
            })
            .collect()
    }

    fn overridable(
        &self,
        node: &SourceNode,
        values: &serde_json::Map<String, Value>,
    ) -> Result<Vec<Overridable>, TemplateError> {
        let SourceValue::Seq(items) = &node.value else {
            return Err(self.err(
                node.line,
                format!(
                    "overridable must be a list of value names or {{name, pattern, enum, minimum, maximum}}, not {}",
                    node.type_name()
                ),
            ));
        };
        let mut overridables = Vec::new();
        for item in items {
            let entry = self.overridable_entry(item)?;
            let name = entry.name.as_str();
            let default = match values.get(name) {
                None => {
                    return Err(self.err(item.line, format!("overridable names {name:?}, which is not in values")));
                }
                Some(Value::Array(_) | Value::Object(_)) => {
                    return Err(self.err(
                        item.line,
                        format!("value {name:?} is a list or mapping; only scalar values can be overridable"),
                    ));
                }
                Some(default) => default,
            };
            if !is_identifier(name)
                || crate::names::override_annotation(self.name, name).len() - crate::names::PREFIX.len() > 63
            {
                return Err(self.err(
                    item.line,
                    format!(
                        "overridable value {name:?} must be an identifier (letters, digits, '_') short enough for the annotation name \"{}.{name}\" to fit 63 characters",
                        self.name
                    ),
                ));
            }
            if (entry.minimum.is_some() || entry.maximum.is_some()) && !default.is_number() {
                return Err(self.err(
                    item.line,
                    format!("minimum and maximum need a number, but the default of {name} is {default}"),
                ));
            }
            let default_text = default.as_str().map_or_else(|| default.to_string(), str::to_owned);
            if let Err(why) = entry.check(&default_text, default) {
                return Err(self.err(item.line, format!("the default of {name} breaks its own constraint: {why}")));
            }
            overridables.push(entry);
        }
        Ok(overridables)
    }

    /// Warnings for overridable values without a constraint that land where a string can become
    /// structure: an argument in a configuration language (`yaml:`, `json:`) or multi-line text. A
    /// pod's override fills only the string, but the sidecar may parse that string again.
    fn override_warnings(&self, template: &Template) -> Vec<String> {
        let risky: Vec<&Overridable> = template.overridable.iter().filter(|o| !o.is_constrained()).collect();
        let mut warnings = Vec::new();
        for text in template.inject.texts() {
            let (line, source) = (text.line, text.source.as_str());
            let config_language = ["yaml:", "json:"].iter().any(|p| source.contains(p)) || source.contains('\n');
            if !config_language {
                continue;
            }
            for o in &risky {
                if source.contains(&format!("values.{}", o.name)) {
                    warnings.push(format!(
                        "template {:?} line {line}: overridable value {} lands in a configuration-language or multi-line string, so an override could add structure to what the sidecar parses; constrain it (overridable: [{{name: {}, pattern: ...}}] or enum)",
                        self.name, o.name, o.name
                    ));
                }
            }
        }
        warnings
    }

    /// One `overridable` item: a name, or `{name, pattern, enum, minimum, maximum}`.
    fn overridable_entry(&self, item: &SourceNode) -> Result<Overridable, TemplateError> {
        let bare = |name: &str| Overridable {
            name: name.to_owned(),
            pattern: None,
            one_of: None,
            minimum: None,
            maximum: None,
        };
        let entries = match &item.value {
            SourceValue::String(name) => return Ok(bare(name)),
            SourceValue::Map(entries) => entries,
            _ => {
                return Err(
                    self.err(item.line, "overridable must list value names or {name, pattern, enum, minimum, maximum}")
                );
            }
        };
        let mut entry = bare("");
        for MapEntry { key, key_line, value } in entries {
            let number = || match &value.value {
                SourceValue::Number(n) => {
                    n.as_f64().ok_or_else(|| self.err(value.line, format!("{key} must be a number")))
                }
                _ => Err(self.err(value.line, format!("{key} must be a number, not {}", value.type_name()))),
            };
            match key.as_str() {
                "name" => match &value.value {
                    SourceValue::String(name) => entry.name = name.clone(),
                    _ => return Err(self.err(value.line, "name must be a string")),
                },
                "pattern" => {
                    let SourceValue::String(pattern) = &value.value else {
                        return Err(self.err(value.line, "pattern must be a string (a regular expression)"));
                    };
                    let anchored = format!("^(?:{pattern})$");
                    let regex = regex::RegexBuilder::new(&anchored).size_limit(1 << 20).build().map_err(|e| {
                        self.err(value.line, format!("pattern {pattern:?} is not a valid regular expression: {e}"))
                    })?;
                    entry.pattern = Some(regex);
                }
                "enum" => {
                    let SourceValue::Seq(items) = &value.value else {
                        return Err(self.err(value.line, "enum must be a list of allowed values"));
                    };
                    let allowed: Vec<Value> = items.iter().map(SourceNode::to_json).collect();
                    if allowed.iter().any(|v| v.is_array() || v.is_object()) {
                        return Err(self.err(value.line, "enum must list scalars"));
                    }
                    entry.one_of = Some(allowed);
                }
                "minimum" => entry.minimum = Some(number()?),
                "maximum" => entry.maximum = Some(number()?),
                other => {
                    return Err(self.err(
                        *key_line,
                        format!("unknown key {other:?} in an overridable entry (expected name, pattern, enum, minimum, maximum)"),
                    ));
                }
            }
        }
        if entry.name.is_empty() {
            return Err(self.err(item.line, "an overridable entry needs a name"));
        }
        Ok(entry)
    }

    fn inject(&mut self, node: &SourceNode) -> Result<InjectSpec, TemplateError> {
        let mut spec = InjectSpec::default();
        for MapEntry { key, key_line, value: child } in self.mapping(node, "inject")? {
            match key.as_str() {
                field if MAPS.iter().any(|k| k.field == field) => {
                    let kind = MAPS.iter().find(|k| k.field == field).expect("matched above");
                    spec.maps[kind.index] = self.string_map(child, kind.section)?
                }
                "initContainers" => {
                    spec.init_containers = self.items(child, "inject.initContainers", &["name"], ItemKeys::Container)?
                }
                "sidecars" => spec.sidecars = self.items(child, "inject.sidecars", &["name"], ItemKeys::Container)?,
                field if POD_LISTS.iter().any(|k| k.field == field) => {
                    let kind = POD_LISTS.iter().find(|k| k.field == field).expect("matched above");
                    let keys = if kind.may_fall_back { ItemKeys::Volume } else { ItemKeys::Plain };
                    spec.pod_lists[kind.index] = self.items(child, &kind.section(), &[kind.key], keys)?
                }
                "appContainers" => {
                    for MapEntry { key, key_line, value: grandchild } in self.mapping(child, "inject.appContainers")? {
                        match key.as_str() {
                            field if APP_LISTS.iter().any(|k| k.field == field) => {
                                let kind = APP_LISTS.iter().find(|k| k.field == field).expect("matched above");
                                let keys = match kind.index {
                                    index if index == ENV.index => ItemKeys::Env,
                                    index if index == ENV_FROM.index => ItemKeys::EnvFrom,
                                    _ => ItemKeys::Plain,
                                };
                                spec.app_lists[kind.index] =
                                    self.items(grandchild, &kind.section(), kind.required, keys)?
                            }
                            "containers" => {
                                spec.targets.only = Some(self.names(grandchild, "inject.appContainers.containers")?)
                            }
                            "excludeContainers" => {
                                spec.targets.except =
                                    self.names(grandchild, "inject.appContainers.excludeContainers")?
                            }
                            other => {
                                return Err(self.err(
                                    *key_line,
                                    format!(
                                        "unknown key {other:?} in inject.appContainers (expected containers, excludeContainers, env, envFrom, volumeMounts)"
                                    ),
                                ));
                            }
                        }
                    }
                }
                other => {
                    return Err(self.err(
                        *key_line,
                        format!(
                            "unknown key {other:?} in inject (expected labels, annotations, initContainers, sidecars, {}, appContainers)",
                            POD_LISTS.map(|k| k.field).join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(spec)
    }

    /// A list of container names, written literally (they select containers, so they are never
    /// rendered).
    fn names(&self, node: &SourceNode, what: &str) -> Result<Vec<String>, TemplateError> {
        let SourceValue::Seq(items) = &node.value else {
            return Err(
                self.err(node.line, format!("{what} must be a list of container names, not {}", node.type_name()))
            );
        };
        items
            .iter()
            .map(|item| match &item.value {
                SourceValue::String(name) if crate::model::api_limits::is_dns_label(name) => Ok(name.clone()),
                SourceValue::String(name) => Err(self
                    .err(item.line, format!("{what}: {name:?} is not a container name (a DNS label, no expressions)"))),
                _ => Err(self.err(item.line, format!("{what} must list container names, not {}", item.type_name()))),
            })
            .collect()
    }

    fn pod_choices(&self, node: &SourceNode) -> Result<PodChoices, TemplateError> {
        let SourceValue::Seq(items) = &node.value else {
            return Err(self.err(node.line, format!("podChoices must be a list, not {}", node.type_name())));
        };
        let mut choices = PodChoices::default();
        for item in items {
            match &item.value {
                SourceValue::String(s) if s == "appContainers" => choices.app_containers = true,
                SourceValue::String(s) if s == "sidecarMode" => choices.sidecar_mode = true,
                _ => {
                    return Err(self.err(
                        item.line,
                        format!(
                            "podChoices lists what a pod may choose: appContainers, sidecarMode (not {})",
                            item.to_json()
                        ),
                    ));
                }
            }
        }
        Ok(choices)
    }

    fn string_map(&mut self, node: &SourceNode, what: &str) -> Result<Vec<(String, Piece)>, TemplateError> {
        let mut out = Vec::new();
        for MapEntry { key, key_line, value } in self.mapping(node, what)? {
            if let Some(problem) = crate::model::api_limits::qualified_name_problem(key) {
                return Err(self.err(*key_line, format!("{what}.{key} is not a valid key: {problem}")));
            }
            if matches!(value.value, SourceValue::Seq(_) | SourceValue::Map(_)) {
                return Err(self.err(value.line, format!("{what}.{key} must be a string, not {}", value.type_name())));
            }
            out.push((key.clone(), self.piece(value)?));
        }
        Ok(out)
    }

    /// A list of mappings (containers, volumes, env vars, mounts), each with the `required` keys;
    /// `env`: the items of `appContainers.env`, which may say `merge:`.
    fn items(
        &mut self,
        node: &SourceNode,
        what: &str,
        required: &[&str],
        keys: ItemKeys,
    ) -> Result<Vec<SeqItem>, TemplateError> {
        let items = match &node.value {
            SourceValue::Seq(items) => items.as_slice(),
            SourceValue::Null => &[],
            _ => {
                return Err(self.err(node.line, format!("{what} must be a list, not {}", node.type_name())));
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let entries = match &item.value {
                SourceValue::Map(entries) => entries,
                _ => {
                    return Err(
                        self.err(item.line, format!("each item of {what} must be a mapping, not {}", item.type_name()))
                    );
                }
            };
            for key in required {
                if !entries.iter().any(|e| e.key == *key) {
                    return Err(self.err(item.line, format!("an item of {what} has no {key}")));
                }
            }
            let mut seq_item = self.seq_item(item, keys)?;
            match keys {
                ItemKeys::Env => seq_item.merge = self.env_merge(item)?,
                ItemKeys::Container => seq_item.position = self.position(item)?,
                ItemKeys::Volume => seq_item.fallback = self.volume_fallback(item)?,
                ItemKeys::EnvFrom => seq_item.keys = self.env_from_keys(item)?,
                ItemKeys::Plain => {}
            }
            out.push(seq_item);
        }
        Ok(out)
    }

    /// An item of a list, without `when:` and the injector's own keys (`keys`), which are not
    /// part of the rendered item.
    fn seq_item(&mut self, item: &SourceNode, keys: ItemKeys) -> Result<SeqItem, TemplateError> {
        let SourceValue::Map(entries) = &item.value else {
            let piece = self.piece(item)?;
            return Ok(SeqItem { when: None, piece, merge: None, position: None, fallback: None, keys: Vec::new() });
        };
        let mut when = None;
        let mut rest = Vec::with_capacity(entries.len());
        for entry in entries {
            let injectors = match keys {
                ItemKeys::Env => entry.key == "merge",
                ItemKeys::Container => entry.key == "position",
                ItemKeys::Volume => entry.key == "fallback",
                ItemKeys::EnvFrom => entry.key == "keys",
                ItemKeys::Plain => false,
            };
            if entry.key == "when" {
                when = Some(self.condition(&entry.value)?);
            } else if !injectors {
                rest.push(entry.clone());
            }
        }
        let piece = self.piece(&SourceNode { line: item.line, value: SourceValue::Map(rest) })?;
        Ok(SeqItem { when, piece, merge: None, position: None, fallback: None, keys: Vec::new() })
    }

    /// The `fallback:` of a volume: only on an image volume, `{initContainer: <container>,
    /// emptyDir: <emptyDir, optional>}`.
    fn volume_fallback(&mut self, item: &SourceNode) -> Result<Option<Box<VolumeFallback>>, TemplateError> {
        let SourceValue::Map(entries) = &item.value else { return Ok(None) };
        let Some(fallback) = entries.iter().find(|e| e.key == "fallback") else { return Ok(None) };
        if !entries.iter().any(|e| e.key == "image") {
            return Err(self.err(
                fallback.key_line,
                "fallback is for image volumes: this volume has no image (its fallback would never be used)",
            ));
        }
        let SourceValue::Map(keys) = &fallback.value.value else {
            return Err(self.err(
                fallback.value.line,
                format!(
                    "fallback must be {{initContainer: <the container that fills the emptyDir>, emptyDir: <optional>}}, not {}",
                    fallback.value.type_name()
                ),
            ));
        };
        let (mut empty_dir, mut init_container) = (None, None);
        for MapEntry { key, key_line, value } in keys {
            match key.as_str() {
                "emptyDir" if matches!(value.value, SourceValue::Map(_) | SourceValue::Null) => {
                    empty_dir = Some(self.piece(value)?)
                }
                "emptyDir" => {
                    return Err(
                        self.err(value.line, format!("fallback.emptyDir must be a mapping, not {}", value.type_name()))
                    );
                }
                "initContainer" => {
                    let SourceValue::Map(fields) = &value.value else {
                        return Err(self.err(
                            value.line,
                            format!(
                                "fallback.initContainer must be a container (a mapping), not {}",
                                value.type_name()
                            ),
                        ));
                    };
                    if !fields.iter().any(|f| f.key == "name") {
                        return Err(self.err(value.line, "fallback.initContainer has no name"));
                    }
                    init_container = Some(self.piece(value)?);
                }
                other => {
                    return Err(self.err(
                        *key_line,
                        format!("unknown key {other:?} in fallback (expected initContainer, emptyDir)"),
                    ));
                }
            }
        }
        let Some(init_container) = init_container else {
            return Err(self.err(
                fallback.value.line,
                "fallback needs an initContainer (the container that copies the image's files into the emptyDir)",
            ));
        };
        Ok(Some(Box::new(VolumeFallback { empty_dir, init_container })))
    }

    /// The `keys:` of an `envFrom` source: literal ConfigMap or Secret keys (letters, digits, `-`,
    /// `_`, `.`), which the app container gets as env vars named with the source's `prefix`.
    fn env_from_keys(&mut self, item: &SourceNode) -> Result<Vec<String>, TemplateError> {
        let SourceValue::Map(entries) = &item.value else { return Ok(Vec::new()) };
        let Some(entry) = entries.iter().find(|e| e.key == "keys") else { return Ok(Vec::new()) };
        self.env_from_keys_line.get_or_insert(entry.key_line);
        let expected = "keys must be a list of the source's keys, like [LD_PRELOAD, JAVA_TOOL_OPTIONS]";
        let SourceValue::Seq(items) = &entry.value.value else {
            return Err(self.err(entry.value.line, format!("{expected}, not {}", entry.value.type_name())));
        };
        let is_key = |k: &str| {
            !k.is_empty() && k.len() <= 253 && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        let mut keys = Vec::with_capacity(items.len());
        for key in items {
            match &key.value {
                SourceValue::String(k) if is_key(k) => keys.push(k.clone()),
                SourceValue::String(k) => {
                    return Err(self.err(
                        key.line,
                        format!("{k:?} is not a ConfigMap or Secret key (letters, digits, '-', '_' and '.', literal)"),
                    ));
                }
                _ => return Err(self.err(key.line, format!("{expected}, not a list holding {}", key.type_name()))),
            }
        }
        if keys.is_empty() {
            return Err(self.err(entry.value.line, format!("{expected}: the list is empty")));
        }
        Ok(keys)
    }

    /// The `position:` of an init container or sidecar: `first` or `last`, literal.
    fn position(&mut self, item: &SourceNode) -> Result<Option<ContainerPosition>, TemplateError> {
        let SourceValue::Map(entries) = &item.value else { return Ok(None) };
        let Some(entry) = entries.iter().find(|e| e.key == "position") else { return Ok(None) };
        match &entry.value.value {
            SourceValue::String(text) => ContainerPosition::parse(text)
                .map(Some)
                .ok_or_else(|| self.err(entry.value.line, format!("position must be first or last, not {text:?}"))),
            _ => {
                Err(self
                    .err(entry.value.line, format!("position must be first or last, not {}", entry.value.type_name())))
            }
        }
    }

    /// The `merge:` of an `appContainers.env` item: `{append: "<separator>"}` or
    /// `{prepend: "<separator>"}`, literal, on an item that has a `value`.
    fn env_merge(&mut self, item: &SourceNode) -> Result<Option<EnvMerge>, TemplateError> {
        let SourceValue::Map(entries) = &item.value else { return Ok(None) };
        let Some(merge) = entries.iter().find(|e| e.key == "merge") else { return Ok(None) };
        let expected = "merge must be {append: \"<separator>\"} or {prepend: \"<separator>\"}";
        let SourceValue::Map(how) = &merge.value.value else {
            return Err(self.err(merge.value.line, format!("{expected}, not {}", merge.value.type_name())));
        };
        let [MapEntry { key, value, .. }] = how.as_slice() else {
            return Err(self.err(merge.value.line, expected));
        };
        let position = match key.as_str() {
            "append" => Position::Append,
            "prepend" => Position::Prepend,
            _ => return Err(self.err(merge.value.line, format!("{expected}, not {key:?}"))),
        };
        let separator = match &value.value {
            SourceValue::String(s) if !expression::has_expression(s) => s.clone(),
            _ => return Err(self.err(value.line, "the merge separator must be a literal string, like \" \" or \":\"")),
        };
        if !entries.iter().any(|e| e.key == "value") {
            return Err(self.err(
                merge.value.line,
                "an env item that merges needs a value (its fragment); valueFrom cannot be merged into another value",
            ));
        }
        Ok(Some(EnvMerge { position, separator }))
    }

    fn condition(&mut self, node: &SourceNode) -> Result<CompiledText, TemplateError> {
        let expression = match &node.value {
            SourceValue::String(s) => expression::single_expression(s).ok_or_else(|| {
                self.err(
                    node.line,
                    format!("when must be exactly one expression, like \"{{{{ values.enabled }}}}\", not {s:?}"),
                )
            })?,
            SourceValue::Bool(b) => b.to_string(),
            _ => {
                return Err(self.err(
                    node.line,
                    format!("when must be an expression string or a boolean, not {}", node.type_name()),
                ));
            }
        };
        self.expressions.condition(node.line, &expression).map_err(|message| self.err(node.line, message))
    }

    fn piece(&mut self, node: &SourceNode) -> Result<Piece, TemplateError> {
        let piece = match &node.value {
            SourceValue::String(s) if expression::has_expression(s) => match expression::value_reference(s) {
                Some(path) => Piece::ValueRef { line: node.line, path },
                None => {
                    Piece::Text(self.expressions.text(node.line, s).map_err(|message| self.err(node.line, message))?)
                }
            },
            SourceValue::Seq(items) => {
                let items = items.iter().map(|i| self.seq_item(i, ItemKeys::Plain)).collect::<Result<Vec<_>, _>>()?;
                if items.iter().all(|i| i.when.is_none() && matches!(i.piece, Piece::Literal(_))) {
                    Piece::Literal(Value::Array(
                        items
                            .into_iter()
                            .map(|i| match i.piece {
                                Piece::Literal(v) => v,
                                _ => unreachable!(),
                            })
                            .collect(),
                    ))
                } else {
                    Piece::Seq(items)
                }
            }
            SourceValue::Map(entries) => {
                let entries = entries
                    .iter()
                    .map(|e| Ok((e.key.clone(), self.piece(&e.value)?)))
                    .collect::<Result<Vec<_>, TemplateError>>()?;
                if entries.iter().all(|(_, p)| matches!(p, Piece::Literal(_))) {
                    Piece::Literal(Value::Object(
                        entries
                            .into_iter()
                            .map(|(k, p)| match p {
                                Piece::Literal(v) => (k, v),
                                _ => unreachable!(),
                            })
                            .collect(),
                    ))
                } else {
                    Piece::Map(entries)
                }
            }
            _ => Piece::Literal(node.to_json()),
        };
        Ok(piece)
    }

    /// Every `{{ values.x.y }}` must name a value the template defines, so a typo fails at load time.
    fn check_value_refs(
        &self,
        spec: &InjectSpec,
        values: &serde_json::Map<String, Value>,
    ) -> Result<(), TemplateError> {
        fn collect<'p>(piece: &'p Piece, refs: &mut Vec<(u64, &'p [String])>) {
            match piece {
                Piece::ValueRef { line, path } => refs.push((*line, path)),
                Piece::Seq(items) => items.iter().for_each(|i| collect(&i.piece, refs)),
                Piece::Map(entries) => entries.iter().for_each(|(_, p)| collect(p, refs)),
                Piece::Literal(_) | Piece::Text(_) => {}
            }
        }
        let mut refs = Vec::new();
        spec.maps.iter().flatten().for_each(|(_, p)| collect(p, &mut refs));
        spec.lists().flatten().for_each(|i| collect(&i.piece, &mut refs));
        match refs.into_iter().find(|(_, path)| expression::lookup_path(values, path).is_none()) {
            Some((line, path)) => Err(self.err(line, format!("values.{} is not defined in values", path.join(".")))),
            None => Ok(()),
        }
    }
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

pub(crate) fn content_hash(root: &SourceNode) -> String {
    let canonical = root.to_json().to_string();
    let digest = Sha256::digest(canonical.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A check that runs on new template text before it is compiled and test-rendered in this process.
///
/// Fuel and output caps bound what an expression *writes*, but MiniJinja's string operations (`~`,
/// `*`, `replace`, ...) can allocate without bound before anything is written, and Rust cannot
/// recover from running out of memory. The webhook therefore first test-renders new template text
/// in a child process with memory and CPU limits (`crate::sandbox`); a template that does not
/// survive there is never loaded, so a hostile or broken edit cannot crash every replica at once.
pub trait PreCheck {
    /// Errors for the sources that must not be loaded in this process.
    fn precheck(&self, sources: &[TemplateSource]) -> Vec<TemplateError>;
}

/// No pre-check: templates are loaded in this process directly (the CLI, tests).
pub struct InProcess;

impl PreCheck for InProcess {
    fn precheck(&self, _sources: &[TemplateSource]) -> Vec<TemplateError> {
        Vec::new()
    }
}

/// A named source of one template: where it came from (for messages) and its YAML text.
#[derive(Debug, Clone)]
pub struct TemplateSource {
    /// Template name.
    pub name: String,
    /// YAML text.
    pub text: String,
}

/// The templates in service, by name. Cheap to clone (templates are shared).
#[derive(Debug, Clone, Default)]
pub struct TemplateSet {
    templates: BTreeMap<String, Arc<Template>>,
    /// Versions replaced or removed by earlier updates, newest first, at most
    /// [`RETIRED_VERSIONS_KEPT`]: a pod injected with one of them can still prove which items are
    /// the injector's own (see `ownership`) and be re-injected cleanly after a template edit.
    retired: Vec<Arc<Template>>,
}

/// How many replaced template versions a [`TemplateSet`] remembers.
pub const RETIRED_VERSIONS_KEPT: usize = 32;

impl TemplateSet {
    /// Loads every source; returns the templates that loaded and the errors of those that did not.
    pub fn load(sources: impl IntoIterator<Item = TemplateSource>) -> (TemplateSet, Vec<TemplateError>) {
        TemplateSet::default().update(sources, &InProcess)
    }

    /// The set that results from replacing this one's templates by `sources`: templates absent from
    /// `sources` are dropped, a template whose new text fails (the `precheck` or loading) keeps its
    /// last good version (and its error is returned), templates that load are replaced. Unchanged
    /// templates are neither pre-checked nor recompiled.
    pub fn update(
        &self,
        sources: impl IntoIterator<Item = TemplateSource>,
        precheck: &dyn PreCheck,
    ) -> (TemplateSet, Vec<TemplateError>) {
        // Each source with the version in service when its text is unchanged (same content hash).
        let sources: Vec<(TemplateSource, Option<&Arc<Template>>)> = sources
            .into_iter()
            .map(|source| {
                let hash = hash_of_source(&source.text);
                let unchanged = self.templates.get(&source.name).filter(|t| hash.as_ref() == Some(&t.hash));
                (source, unchanged)
            })
            .collect();
        let changed: Vec<TemplateSource> =
            sources.iter().filter(|(_, u)| u.is_none()).map(|(s, _)| s.clone()).collect();
        let mut refused: BTreeMap<String, TemplateError> = match changed.is_empty() {
            true => BTreeMap::new(),
            false => precheck.precheck(&changed).into_iter().map(|e| (e.template.clone(), e)).collect(),
        };
        let mut templates = BTreeMap::new();
        let mut errors = Vec::new();
        for (source, unchanged) in sources {
            if templates.contains_key(&source.name) {
                errors.push(TemplateError {
                    template: source.name.clone(),
                    line: None,
                    message: "defined more than once; the first definition is used".into(),
                });
                continue;
            }
            let loaded = match (unchanged, refused.remove(&source.name)) {
                (Some(previous), _) => {
                    templates.insert(source.name, previous.clone());
                    continue;
                }
                (None, Some(error)) => Err(error),
                (None, None) => Template::load(&source.name, &source.text),
            };
            match loaded {
                Ok(template) => {
                    templates.insert(source.name, Arc::new(template));
                }
                Err(error) => {
                    if let Some(previous) = self.templates.get(&source.name) {
                        templates.insert(source.name, previous.clone());
                    }
                    errors.push(error);
                }
            }
        }
        let retired = self
            .templates
            .values()
            .filter(|old| templates.get(&*old.name).is_none_or(|new| new.hash != old.hash))
            .chain(&self.retired)
            .filter(|old| templates.get(&*old.name).is_none_or(|new| new.hash != old.hash))
            .take(RETIRED_VERSIONS_KEPT)
            .cloned()
            .collect();
        (TemplateSet { templates, retired }, errors)
    }

    /// The template of that name.
    pub fn get(&self, name: &str) -> Option<&Arc<Template>> {
        self.templates.get(name)
    }

    /// The template of that name with that content hash: the one in service, or a version that an
    /// earlier update replaced and this set still remembers.
    pub fn version(&self, name: &str, hash: &str) -> Option<&Arc<Template>> {
        self.templates.get(name).into_iter().chain(&self.retired).find(|t| &*t.name == name && t.hash == hash)
    }

    /// Templates in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Template>> {
        self.templates.values()
    }

    /// Template names in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.templates.keys().map(String::as_str)
    }

    /// Number of templates.
    pub fn len(&self) -> usize {
        self.templates.len()
    }

    /// Whether there are no templates.
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }
}

/// The content hash a source would get, without compiling it (used to skip recompiling unchanged
/// templates on every ConfigMap event).
fn hash_of_source(text: &str) -> Option<String> {
    SourceNode::parse(text).ok().map(|root| content_hash(&root))
}

/// The default templates, from `templates/` at build time.
pub fn embedded_sources() -> Vec<TemplateSource> {
    include!(concat!(env!("OUT_DIR"), "/embedded_templates.rs"))
        .iter()
        .map(|(name, text)| TemplateSource { name: (*name).to_owned(), text: (*text).to_owned() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
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
