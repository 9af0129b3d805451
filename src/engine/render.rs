//! Rendering a compiled template for one pod: expressions evaluated, `when:` items dropped,
//! overrides applied, all within hard bounds.
//!
//! Bounds (a hostile or careless template cannot hang the webhook or exhaust its memory):
//! - MiniJinja fuel caps the instructions of each expression ([`FUEL_PER_EXPRESSION`]) and the
//!   template as a whole ([`FUEL_PER_TEMPLATE`]); there are no macros, includes or imports.
//! - Each expression's output is written through a writer that stops at [`MAX_EXPRESSION_OUTPUT`],
//!   and a template's total rendered text is capped at [`MAX_TEMPLATE_OUTPUT`].
//!
//! Undefined values: printing, iterating or filtering an undefined value is an error (so a typo
//! never renders as an empty string); testing one in a condition (`when`, `{% if %}`) is false.
//!
//! Overrides: `sidecar-injector.io/<template>.<value>` on the pod replaces a value listed in
//! `overridable`; the annotation text is converted to the default's scalar type (a number stays a
//! number, a boolean a boolean, anything else a string) and is never parsed as YAML.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, Serde};
use minijinja::{Environment, UndefinedBehavior, Value as JinjaValue};
use serde_json::Value;

use super::facts::NamespaceFacts;
use super::names;
use super::template::{Piece, SeqItem, Template, TemplateError};

/// Instructions one expression may execute.
pub const FUEL_PER_EXPRESSION: u64 = 50_000;
/// Instructions all expressions of one template may execute for one pod.
pub const FUEL_PER_TEMPLATE: u64 = 500_000;
/// Bytes one expression may output.
pub const MAX_EXPRESSION_OUTPUT: usize = 64 * 1024;
/// Bytes all expressions of one template may output for one pod.
pub const MAX_TEMPLATE_OUTPUT: usize = 1024 * 1024;

/// Whether a string scalar contains MiniJinja syntax.
pub(crate) fn has_expression(s: &str) -> bool {
    s.contains("{{") || s.contains("{%") || s.contains("{#")
}

/// The expression of a scalar that is exactly one `{{ ... }}`, without the braces.
pub(crate) fn single_expression(s: &str) -> Option<String> {
    let inner = s.trim().strip_prefix("{{")?.strip_suffix("}}")?;
    let inner = inner.strip_prefix('-').unwrap_or(inner);
    let inner = inner.strip_suffix('-').unwrap_or(inner).trim();
    let nested = inner.contains("{{")
        || inner.contains("}}")
        || inner.contains("{%")
        || inner.contains("%}");
    (!inner.is_empty() && !nested).then(|| inner.to_owned())
}

/// The path of a scalar that is exactly a plain reference into values: `{{ values.a.b }}`.
pub(crate) fn value_reference(s: &str) -> Option<Vec<String>> {
    let expression = single_expression(s)?;
    let mut parts = expression.split('.');
    if parts.next()? != "values" {
        return None;
    }
    let path: Vec<String> = parts.map(str::to_owned).collect();
    let identifiers = path.iter().all(|p| {
        let mut b = p.bytes();
        matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
    });
    (!path.is_empty() && identifiers).then_some(path)
}

/// The value at `path` inside `values`.
pub(crate) fn lookup_path<'v>(
    values: &'v serde_json::Map<String, Value>,
    path: &[String],
) -> Option<&'v Value> {
    let (first, rest) = path.split_first()?;
    rest.iter()
        .try_fold(values.get(first)?, |v, key| v.get(key))
}

/// A compiled expression string: its line and its name in the template's environment.
#[derive(Debug, Clone)]
pub(crate) struct CompiledText {
    line: u64,
    id: String,
    source: String,
}

/// The compiled expressions of one template.
#[derive(Debug, Default)]
pub(crate) struct Expressions {
    env: Option<Arc<Environment<'static>>>,
}

/// Collects a template's expression strings while it is compiled.
pub(crate) struct ExpressionsBuilder {
    env: Environment<'static>,
    count: usize,
}

impl Default for ExpressionsBuilder {
    fn default() -> Self {
        // `Environment::empty` would drop the filters; `new` brings builtins (no loader, no
        // macros, includes or imports are compiled in).
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
        env.set_fuel(Some(FUEL_PER_EXPRESSION));
        env.set_recursion_limit(64);
        ExpressionsBuilder { env, count: 0 }
    }
}

impl ExpressionsBuilder {
    fn add(
        &mut self,
        template: &str,
        line: u64,
        display: &str,
        source: String,
    ) -> Result<CompiledText, TemplateError> {
        let id = self.count.to_string();
        self.count += 1;
        self.env
            .add_template_owned(id.clone(), source)
            .map_err(|e| {
                TemplateError::at(template, line, format!("{} in {display:?}", describe(&e)))
            })?;
        Ok(CompiledText {
            line,
            id,
            source: display.to_owned(),
        })
    }

    /// A string scalar containing expressions.
    pub(crate) fn text(
        &mut self,
        template: &str,
        line: u64,
        text: &str,
    ) -> Result<CompiledText, TemplateError> {
        self.add(template, line, text, text.to_owned())
    }

    /// A `when:` condition: renders `true` when the expression is truthy.
    pub(crate) fn condition(
        &mut self,
        template: &str,
        line: u64,
        expression: &str,
    ) -> Result<CompiledText, TemplateError> {
        let display = format!("{{{{ {expression} }}}}");
        self.add(
            template,
            line,
            &display,
            format!("{{% if ({expression}) %}}true{{% endif %}}"),
        )
    }

    pub(crate) fn build(self) -> Expressions {
        Expressions {
            env: (self.count > 0).then(|| Arc::new(self.env)),
        }
    }
}

fn describe(err: &minijinja::Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

/// What one template adds to one pod, rendered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderedTemplate {
    /// Template name.
    pub name: String,
    /// Template content hash.
    pub hash: String,
    /// Labels to add.
    pub labels: BTreeMap<String, String>,
    /// Annotations to add.
    pub annotations: BTreeMap<String, String>,
    /// Init containers, placed before the pod's own.
    pub init_containers: Vec<Value>,
    /// Sidecar containers (native or classic is decided when planning).
    pub sidecars: Vec<Value>,
    /// Pod volumes.
    pub volumes: Vec<Value>,
    /// Env vars for every app container.
    pub env: Vec<Value>,
    /// Volume mounts for every app container.
    pub volume_mounts: Vec<Value>,
    /// Override annotations that were ignored, with the reason.
    pub warnings: Vec<String>,
}

/// A render error that is the pod's fault rather than the template's: an override annotation whose
/// text does not fit the value's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidOverride {
    /// The annotation key.
    pub annotation: String,
    /// What is wrong.
    pub message: String,
}

/// Why rendering failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderError {
    /// The template failed (undefined value, fuel, output size, bad type).
    Template(TemplateError),
    /// An override annotation on the pod is invalid.
    Override(InvalidOverride),
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderError::Template(e) => e.fmt(f),
            RenderError::Override(o) => write!(f, "annotation {}: {}", o.annotation, o.message),
        }
    }
}

/// The pod as the templates see it: a zero-copy view over the submitted JSON.
pub fn pod_value(pod: Arc<Value>) -> JinjaValue {
    JsonView::root(pod)
}

/// Renders `template` for a pod in a namespace.
pub fn render(
    template: &Template,
    pod: &JinjaValue,
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
) -> Result<RenderedTemplate, RenderError> {
    let mut warnings = Vec::new();
    let values = effective_values(template, pod_annotations, &mut warnings)
        .map_err(RenderError::Override)?;
    let context = JinjaValue::from_pairs([
        ("pod", pod.clone()),
        (
            "namespace",
            JinjaValue::from_pairs([
                ("name", JinjaValue::from(namespace.name.as_str())),
                ("labels", JinjaValue::from(Serde(&namespace.labels))),
                (
                    "annotations",
                    JinjaValue::from(Serde(&namespace.annotations)),
                ),
            ]),
        ),
        ("values", JinjaValue::from(Serde(&values))),
        (
            "template",
            JinjaValue::from_pairs([("name", JinjaValue::from(template.name.as_str()))]),
        ),
    ]);
    let mut renderer = Renderer {
        template,
        context,
        values: &values,
        fuel_left: FUEL_PER_TEMPLATE,
        output_left: MAX_TEMPLATE_OUTPUT,
    };
    let spec = &template.inject;
    let err = RenderError::Template;
    Ok(RenderedTemplate {
        name: template.name.clone(),
        hash: template.hash.clone(),
        labels: renderer
            .string_map(&spec.labels, "inject.labels")
            .map_err(err)?,
        annotations: renderer
            .string_map(&spec.annotations, "inject.annotations")
            .map_err(err)?,
        init_containers: renderer.items(&spec.init_containers).map_err(err)?,
        sidecars: renderer.items(&spec.sidecars).map_err(err)?,
        volumes: renderer.items(&spec.volumes).map_err(err)?,
        env: renderer.items(&spec.env).map_err(err)?,
        volume_mounts: renderer.items(&spec.volume_mounts).map_err(err)?,
        warnings,
    })
}

/// Defaults with the pod's overrides applied.
fn effective_values(
    template: &Template,
    annotations: &BTreeMap<String, String>,
    warnings: &mut Vec<String>,
) -> Result<serde_json::Map<String, Value>, InvalidOverride> {
    let prefix = format!("{}{}.", names::PREFIX, template.name);
    let mut values = template.values.clone();
    for (key, text) in annotations.range(prefix.clone()..) {
        let Some(value_name) = key.strip_prefix(&prefix) else {
            break;
        };
        if !template.overridable.iter().any(|o| o == value_name) {
            warnings.push(format!(
                "annotation {key} ignored: value {value_name:?} of template {:?} is not overridable{}",
                template.name,
                if template.overridable.is_empty() {
                    String::new()
                } else {
                    format!(" (overridable: {})", template.overridable.join(", "))
                }
            ));
            continue;
        }
        let default = &template.values[value_name];
        let value = coerce_override(default, text).ok_or_else(|| InvalidOverride {
            annotation: key.clone(),
            message: format!(
                "{text:?} is not a valid {} (the default of {value_name} in template {:?} is {default})",
                match default {
                    Value::Bool(_) => "boolean",
                    Value::Number(n) if n.is_f64() => "number",
                    _ => "integer",
                },
                template.name
            ),
        })?;
        values.insert(value_name.to_owned(), value);
    }
    Ok(values)
}

/// The annotation text as the default's scalar type; never parsed as YAML, so it cannot add
/// structure.
fn coerce_override(default: &Value, text: &str) -> Option<Value> {
    match default {
        Value::Bool(_) => match text {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        Value::Number(n) if n.is_f64() => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number),
        Value::Number(_) => text.parse::<i64>().ok().map(Value::from),
        _ => Some(Value::String(text.to_owned())),
    }
}

struct Renderer<'t> {
    template: &'t Template,
    context: JinjaValue,
    values: &'t serde_json::Map<String, Value>,
    fuel_left: u64,
    output_left: usize,
}

impl Renderer<'_> {
    fn err(&self, line: u64, message: impl Into<String>) -> TemplateError {
        TemplateError::at(&self.template.name, line, message)
    }

    fn text(&mut self, text: &CompiledText) -> Result<String, TemplateError> {
        let env = self
            .template
            .expressions
            .env
            .as_ref()
            .expect("a compiled text implies an environment");
        let compiled = env
            .get_template(&text.id)
            .expect("compiled texts are registered by id");
        let limit = self.output_left.min(MAX_EXPRESSION_OUTPUT);
        let mut out = LimitedWriter {
            buf: Vec::new(),
            limit,
        };
        let result = compiled.render_captured_to(self.context.clone(), &mut out);
        let overflowed = out.buf.len() >= limit && result.is_err();
        let captured = result.map_err(|e| {
            let message = if overflowed {
                format!(
                    "rendered output of {:?} is larger than {} bytes",
                    text.source,
                    if limit == MAX_EXPRESSION_OUTPUT {
                        MAX_EXPRESSION_OUTPUT
                    } else {
                        MAX_TEMPLATE_OUTPUT
                    }
                )
            } else if e.kind() == minijinja::ErrorKind::OutOfFuel {
                format!(
                    "{:?} did not finish within {FUEL_PER_EXPRESSION} instructions",
                    text.source
                )
            } else {
                format!("{} in {:?}", describe(&e), text.source)
            };
            self.err(text.line, message)
        })?;
        let consumed = captured
            .state()
            .fuel_levels()
            .map_or(0, |(consumed, _)| consumed);
        self.fuel_left = self.fuel_left.checked_sub(consumed).ok_or_else(|| {
            self.err(text.line, format!("the template's expressions did not finish within {FUEL_PER_TEMPLATE} instructions"))
        })?;
        self.output_left -= out.buf.len();
        String::from_utf8(out.buf)
            .map_err(|_| self.err(text.line, "rendered output is not valid UTF-8"))
    }

    fn piece(&mut self, piece: &Piece) -> Result<Value, TemplateError> {
        Ok(match piece {
            Piece::Literal(v) => v.clone(),
            Piece::Text(text) => Value::String(self.text(text)?),
            Piece::ValueRef { line, path } => {
                lookup_path(self.values, path).cloned().ok_or_else(|| {
                    self.err(*line, format!("values.{} is not defined", path.join(".")))
                })?
            }
            Piece::Seq(items) => Value::Array(self.items(items)?),
            Piece::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, p)| Ok((k.clone(), self.piece(p)?)))
                    .collect::<Result<_, TemplateError>>()?,
            ),
        })
    }

    fn items(&mut self, items: &[SeqItem]) -> Result<Vec<Value>, TemplateError> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            if let Some(when) = &item.when
                && self.text(when)? != "true"
            {
                continue;
            }
            out.push(self.piece(&item.piece)?);
        }
        Ok(out)
    }

    fn string_map(
        &mut self,
        entries: &[(String, Piece)],
        what: &str,
    ) -> Result<BTreeMap<String, String>, TemplateError> {
        entries
            .iter()
            .map(|(key, piece)| {
                let value = match self.piece(piece)? {
                    Value::String(s) => s,
                    Value::Null => String::new(),
                    v @ (Value::Bool(_) | Value::Number(_)) => v.to_string(),
                    other => {
                        let line = match piece {
                            Piece::ValueRef { line, .. } => *line,
                            _ => 0,
                        };
                        return Err(self.err(
                            line,
                            format!("{what}.{key} must render to a string, not {other}"),
                        ));
                    }
                };
                Ok((key.clone(), value))
            })
            .collect()
    }
}

struct LimitedWriter {
    buf: Vec<u8>,
    limit: usize,
}

impl Write for LimitedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.buf
                .extend_from_slice(&data[..self.limit - self.buf.len()]);
            return Err(io::Error::other("output limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A sample pod and namespace every template must render against when it is loaded, so that syntax
/// errors, undefined values and runaway expressions are found before any pod is admitted.
pub(crate) fn check(template: &Template) -> Result<(), TemplateError> {
    let pod = Arc::new(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "example", "namespace": "default", "labels": {"app": "example"}, "annotations": {}},
        "spec": {"containers": [{"name": "app", "image": "example:latest"}]},
    }));
    let namespace = NamespaceFacts::unknown("default");
    match render(template, &pod_value(pod), &BTreeMap::new(), &namespace) {
        Ok(rendered) => check_rendered(template, &rendered),
        Err(RenderError::Template(e)) => Err(TemplateError {
            message: format!("{} (while test-rendering against a sample pod)", e.message),
            ..e
        }),
        Err(RenderError::Override(o)) => Err(TemplateError::at(&template.name, 0, o.message)),
    }
}

/// Checks the shape that the injection relies on: named items with string names.
pub(crate) fn check_rendered(
    template: &Template,
    rendered: &RenderedTemplate,
) -> Result<(), TemplateError> {
    let sections: [(&str, &[Value], &[&str]); 5] = [
        (
            "inject.initContainers",
            &rendered.init_containers,
            &["name"],
        ),
        ("inject.sidecars", &rendered.sidecars, &["name"]),
        ("inject.volumes", &rendered.volumes, &["name"]),
        ("inject.appContainers.env", &rendered.env, &["name"]),
        (
            "inject.appContainers.volumeMounts",
            &rendered.volume_mounts,
            &["name", "mountPath"],
        ),
    ];
    for (section, items, keys) in sections {
        for (index, item) in items.iter().enumerate() {
            for key in keys {
                match item.get(key) {
                    Some(Value::String(s)) if !s.is_empty() => {}
                    _ => {
                        return Err(TemplateError::at(
                            &template.name,
                            0,
                            format!("{section}[{index}].{key} must render to a non-empty string"),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// A lazy MiniJinja view of a JSON value: only the parts an expression touches are converted.
#[derive(Debug)]
struct JsonView {
    root: Arc<Value>,
    path: Vec<PathStep>,
}

#[derive(Debug, Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

impl JsonView {
    fn root(root: Arc<Value>) -> JinjaValue {
        Self::wrap(&root.clone(), root, Vec::new())
    }

    fn node(&self) -> &Value {
        self.path.iter().fold(&*self.root, |v, step| match step {
            PathStep::Key(k) => &v[k.as_str()],
            PathStep::Index(i) => &v[*i],
        })
    }

    fn wrap(node: &Value, root: Arc<Value>, path: Vec<PathStep>) -> JinjaValue {
        match node {
            Value::Null => JinjaValue::from(()),
            Value::Bool(b) => JinjaValue::from(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => JinjaValue::from(i),
                (None, Some(u), _) => JinjaValue::from(u),
                (_, _, Some(f)) => JinjaValue::from(f),
                _ => JinjaValue::from(()),
            },
            Value::String(s) => JinjaValue::from(s.as_str()),
            Value::Array(_) | Value::Object(_) => JinjaValue::from_object(JsonView { root, path }),
        }
    }

    fn child(&self, step: PathStep) -> JinjaValue {
        let mut path = self.path.clone();
        let node = match &step {
            PathStep::Key(k) => &self.node()[k.as_str()],
            PathStep::Index(i) => &self.node()[*i],
        };
        path.push(step);
        Self::wrap(node, self.root.clone(), path)
    }
}

impl Object for JsonView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        if self.node().is_array() {
            ObjectRepr::Seq
        } else {
            ObjectRepr::Map
        }
    }

    fn get_value(self: &Arc<Self>, key: &JinjaValue) -> Option<JinjaValue> {
        match self.node() {
            Value::Object(map) => {
                let key = key.as_str()?;
                map.contains_key(key)
                    .then(|| self.child(PathStep::Key(key.to_owned())))
            }
            Value::Array(items) => {
                let index = key.as_i64()?;
                let index = if index < 0 {
                    items.len() as i64 + index
                } else {
                    index
                };
                usize::try_from(index)
                    .ok()
                    .filter(|i| *i < items.len())
                    .map(|i| self.child(PathStep::Index(i)))
            }
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match self.node() {
            Value::Object(map) => {
                Enumerator::Values(map.keys().map(|k| JinjaValue::from(k.as_str())).collect())
            }
            Value::Array(items) => Enumerator::Seq(items.len()),
            _ => Enumerator::Empty,
        }
    }
}
