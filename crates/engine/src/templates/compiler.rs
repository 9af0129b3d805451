//! The template compiler: a template's YAML ([`SourceNode`]) into its compiled form ([`Template`]),
//! strictly (an unknown key is an error naming it), with its expressions compiled once and its
//! content hash (of the parsed template, so comments and formatting do not count).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_core::Selector;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::model::env::{EnvMerge, Position};
use crate::model::kinds::{APP_LISTS, ContainerPosition, ENV, ENV_FROM, MAPS, POD_LISTS};
use crate::model::sizing::Sizing;
use crate::model::yaml::{MapEntry, SourceNode, SourceValue};
use crate::templates::expression::{self, CompiledText};
use crate::templates::rollout::{HaltThresholds, Rollout};
use crate::templates::template::*;

/// The longest template name: `<template>.<value>` must fit the 63 characters of an annotation name.
const MAX_TEMPLATE_NAME: usize = 40;

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
            rollout: None,
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
                "rollout" => template.rollout = self.rollout(node)?,
                other => {
                    return Err(self.err(
                        *key_line,
                        format!(
                            "unknown key {other:?} (expected description, default, enforced, ownProcessNamespace, podSelector, namespaceSelector, sidecarMode, podResources, values, overridable, podChoices, uncheckedFields, inject, rollout)"
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

    /// `rollout:` (see `rollout`): `share` (a whole percent, `25` or `"25%"`), `selector` (pod
    /// labels), `halt: {failedPods, restarts, unreadySeconds}`.
    fn rollout(&self, node: &SourceNode) -> Result<Option<Rollout>, TemplateError> {
        if matches!(node.value, SourceValue::Null) {
            return Ok(None);
        }
        let mut rollout = Rollout { share: 0, selector: None, halt: HaltThresholds::default() };
        let mut share_given = false;
        for MapEntry { key, key_line, value } in self.mapping(node, "rollout")? {
            match key.as_str() {
                "share" => {
                    let percent = match &value.value {
                        SourceValue::Number(n) => n.as_u64(),
                        SourceValue::String(s) => s.strip_suffix('%').and_then(|p| p.trim().parse::<u64>().ok()),
                        _ => None,
                    };
                    rollout.share =
                        percent.filter(|p| *p <= 100).and_then(|p| u8::try_from(p).ok()).ok_or_else(|| {
                            self.err(value.line, "rollout.share must be a whole percent from 0 to 100 (25 or \"25%\")")
                        })?;
                    share_given = true;
                }
                "selector" => rollout.selector = self.selector(value, "rollout.selector")?,
                "halt" => {
                    for MapEntry { key, key_line, value } in self.mapping(value, "rollout.halt")? {
                        let number = match &value.value {
                            SourceValue::Number(n) => {
                                n.as_u64().and_then(|n| u32::try_from(n).ok()).filter(|n| *n >= 1)
                            }
                            _ => None,
                        };
                        let number = || {
                            number.ok_or_else(|| {
                                self.err(value.line, format!("rollout.halt.{key} must be a whole number, 1 or more"))
                            })
                        };
                        match key.as_str() {
                            "failedPods" => rollout.halt.failed_pods = number()?,
                            "restarts" => rollout.halt.restarts = number()?,
                            "unreadySeconds" => rollout.halt.unready_seconds = number()?,
                            other => {
                                return Err(self.err(
                                    *key_line,
                                    format!("unknown key rollout.halt.{other} (expected failedPods, restarts, unreadySeconds)"),
                                ));
                            }
                        }
                    }
                }
                other => {
                    return Err(
                        self.err(*key_line, format!("unknown key rollout.{other} (expected share, selector, halt)"))
                    );
                }
            }
        }
        if !share_given && rollout.selector.is_none() {
            return Err(self.err(
                node.line,
                "rollout needs a share (a percent of workloads, 0 for none until promoted) or a selector",
            ));
        }
        Ok(Some(rollout))
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
                ItemKeys::Container => {
                    seq_item.position = self.position(item)?;
                    seq_item.sizing = self.sizing(item)?;
                }
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
            return Ok(SeqItem::new(None, piece));
        };
        let mut when = None;
        let mut rest = Vec::with_capacity(entries.len());
        for entry in entries {
            let injectors = match keys {
                ItemKeys::Env => entry.key == "merge",
                ItemKeys::Container => entry.key == "position" || entry.key == "sizing",
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
        Ok(SeqItem::new(when, piece))
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

    /// The `sizing:` of an init container or sidecar, literal (`sizing`).
    fn sizing(&mut self, item: &SourceNode) -> Result<Option<Box<(u64, Sizing)>>, TemplateError> {
        let SourceValue::Map(entries) = &item.value else { return Ok(None) };
        let Some(entry) = entries.iter().find(|e| e.key == "sizing") else { return Ok(None) };
        let sizing = entry.value.to_json();
        if has_expression_inside(&sizing) {
            return Err(self.err(entry.value.line, "sizing must be literal: its rules cannot read the pod or values"));
        }
        let sizing = Sizing::parse(&sizing).map_err(|why| self.err(entry.value.line, why))?;
        Ok(Some(Box::new((entry.value.line, sizing))))
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

///
/// `rollout:` does not count: it says how a version reaches pods, not what it injects, so
/// promoting a version (deleting it) keeps the pods that got it up to date.
pub(crate) fn content_hash(root: &SourceNode) -> String {
    let mut json = root.to_json();
    if let Value::Object(entries) = &mut json {
        entries.remove("rollout");
    }
    let canonical = json.to_string();
    let digest = Sha256::digest(canonical.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a literal value holds a template expression anywhere.
fn has_expression_inside(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(text) => expression::has_expression(text),
        serde_json::Value::Array(items) => items.iter().any(has_expression_inside),
        serde_json::Value::Object(entries) => {
            entries.iter().any(|(k, v)| expression::has_expression(k) || has_expression_inside(v))
        }
        _ => false,
    }
}
