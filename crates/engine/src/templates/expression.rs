//! Template expressions: each MiniJinja string of a template compiled once when it is loaded, and
//! evaluated per pod within its own bounds.
//!
//! Both sides of a template use this module: `template` compiles the expressions it finds in string
//! scalars, `render` evaluates them for a pod. Keeping the environment and its bounds here is what
//! lets the compiler not depend on the renderer.
//!
//! Bounds per expression: [`FUEL_PER_EXPRESSION`] instructions and [`MAX_EXPRESSION_OUTPUT`] bytes
//! (the renderer adds the per-template budgets). The environment has the builtins and one `string`
//! filter, no loader: no macros, includes or imports can be compiled in.

use std::io::{self, Write};
use std::sync::Arc;

use minijinja::value::{Serde, ValueKind};
use minijinja::{Environment, UndefinedBehavior, Value as JinjaValue};
use serde_json::Value;

/// Instructions one expression may execute.
pub const FUEL_PER_EXPRESSION: u64 = 50_000;
/// Bytes one expression may output.
pub const MAX_EXPRESSION_OUTPUT: usize = 64 * 1024;

/// Whether a string scalar contains MiniJinja syntax.
pub(crate) fn has_expression(s: &str) -> bool {
    s.contains("{{") || s.contains("{%") || s.contains("{#")
}

/// The expression of a scalar that is exactly one `{{ ... }}`, without the braces.
pub(crate) fn single_expression(s: &str) -> Option<String> {
    let inner = s.trim().strip_prefix("{{")?.strip_suffix("}}")?;
    let inner = inner.strip_prefix('-').unwrap_or(inner);
    let inner = inner.strip_suffix('-').unwrap_or(inner).trim();
    let nested = inner.contains("{{") || inner.contains("}}") || inner.contains("{%") || inner.contains("%}");
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
pub(crate) fn lookup_path<'v>(values: &'v serde_json::Map<String, Value>, path: &[String]) -> Option<&'v Value> {
    let (first, rest) = path.split_first()?;
    rest.iter().try_fold(values.get(first)?, |v, key| v.get(key))
}

/// A compiled expression string: its line and its name in the template's environment.
#[derive(Debug, Clone)]
pub(crate) struct CompiledText {
    /// Its line in the template.
    pub(crate) line: u64,
    id: String,
    /// The expression as written in the template (`{{ ... }}` included).
    pub(crate) source: String,
    /// Whether it reads `pod`: its result may differ between the mutating call and a later look at
    /// the stored pod (the API server fills `metadata.name` from `generateName` in between, other
    /// mutators change labels), so the validating recomputation does not compare it.
    pub(crate) reads_pod: bool,
    /// Whether it reads `namespace`.
    reads_namespace: bool,
    /// Whether it reads `values` (so a pod's override can change it).
    pub(crate) reads_values: bool,
    /// Its output when it reads neither `pod` nor `namespace`, with the default values: rendered
    /// once when the template is loaded, used for every pod that overrides nothing it reads.
    pub(crate) constant: Option<Constant>,
}

impl CompiledText {
    /// Its output with the default values when it reads neither `pod` nor `namespace` (and
    /// rendered without error when the template was loaded).
    pub(crate) fn constant_output(&self) -> Option<&str> {
        self.constant.as_ref().map(|c| c.output.as_str())
    }
}

/// A pre-rendered expression and the fuel it took, which still counts against the template's budget
/// so that a template behaves the same whether or not its expressions were pre-rendered.
#[derive(Debug, Clone)]
pub(crate) struct Constant {
    pub(crate) output: String,
    pub(crate) fuel: u64,
}

/// The compiled expressions of one template.
#[derive(Default)]
pub(crate) struct Expressions {
    env: Option<Arc<Environment<'static>>>,
    /// The template's default `values` as expressions see them, converted once: what every pod
    /// that overrides nothing renders with.
    pub(crate) default_values: JinjaValue,
}

impl std::fmt::Debug for Expressions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.env.as_ref().map_or(0, |env| env.templates().count());
        write!(f, "Expressions({count} compiled)")
    }
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
        // MiniJinja prints booleans Python-style (`True`); Kubernetes and YAML spell them `true`.
        env.set_formatter(|out, state, value| match lowercase_bool(value) {
            Some(text) => out.write_str(text).map_err(minijinja::Error::from),
            None => minijinja::escape_formatter(out, state, value),
        });
        env.add_filter("string", |value: JinjaValue| {
            if value.is_undefined() {
                return Err(minijinja::Error::from(minijinja::ErrorKind::UndefinedError));
            }
            Ok(match lowercase_bool(&value) {
                Some(text) => JinjaValue::from(text),
                None if value.kind() == ValueKind::String => value,
                None => JinjaValue::from(value.to_string()),
            })
        });
        ExpressionsBuilder { env, count: 0 }
    }
}

impl ExpressionsBuilder {
    /// Compiles one expression string; the error says what is wrong with it (the compiler adds the
    /// template and the line).
    fn add(&mut self, line: u64, display: &str, source: String) -> Result<CompiledText, String> {
        let id = self.count.to_string();
        self.count += 1;
        self.env.add_template_owned(id.clone(), source).map_err(|e| format!("{} in {display:?}", describe(&e)))?;
        let variables = self.env.get_template(&id).expect("just added").undeclared_variables(false);
        Ok(CompiledText {
            line,
            id,
            source: display.to_owned(),
            // `workload` is derived from the pod's metadata.
            reads_pod: variables.contains("pod") || variables.contains("workload"),
            // `namespace` is also MiniJinja's namespace() function; either way it is not constant.
            reads_namespace: variables.contains("namespace"),
            reads_values: variables.contains("values"),
            constant: None,
        })
    }

    /// A string scalar containing expressions.
    pub(crate) fn text(&mut self, line: u64, text: &str) -> Result<CompiledText, String> {
        self.add(line, text, text.to_owned())
    }

    /// A `when:` condition: renders `true` when the expression is truthy.
    pub(crate) fn condition(&mut self, line: u64, expression: &str) -> Result<CompiledText, String> {
        let display = format!("{{{{ {expression} }}}}");
        self.add(line, &display, format!("{{% if ({expression}) %}}true{{% endif %}}"))
    }

    /// The compiled expressions of a template whose default values are `values`.
    pub(crate) fn build(self, values: &serde_json::Map<String, Value>) -> Expressions {
        Expressions {
            env: (self.count > 0).then(|| Arc::new(self.env)),
            default_values: JinjaValue::from(Serde(values)),
        }
    }
}

fn lowercase_bool(value: &JinjaValue) -> Option<&'static str> {
    (value.kind() == ValueKind::Bool).then(|| if value.is_true() { "true" } else { "false" })
}

fn describe(err: &minijinja::Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

/// Why an expression produced no output.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Its output reached the limit it was given.
    TooLarge,
    /// It ran out of fuel ([`FUEL_PER_EXPRESSION`]).
    OutOfFuel,
    /// It failed (undefined value, wrong type, ...): what MiniJinja says.
    Failed(String),
    /// Its output is not UTF-8.
    NotUtf8,
}

/// An expression's output and the fuel it took.
pub(crate) struct Output {
    pub(crate) text: String,
    pub(crate) fuel: u64,
}

impl Expressions {
    /// Evaluates one of this template's expressions against `context`, writing at most `limit`
    /// bytes.
    pub(crate) fn evaluate(&self, text: &CompiledText, context: JinjaValue, limit: usize) -> Result<Output, Failure> {
        let env = self.env.as_ref().expect("a compiled text implies an environment");
        let compiled = env.get_template(&text.id).expect("compiled texts are registered by id");
        let mut out = LimitedWriter { buf: Vec::new(), limit };
        let result = compiled.render_captured_to(context, &mut out);
        let overflowed = out.buf.len() >= limit && result.is_err();
        let captured = result.map_err(|e| match () {
            _ if overflowed => Failure::TooLarge,
            _ if e.kind() == minijinja::ErrorKind::OutOfFuel => Failure::OutOfFuel,
            _ => Failure::Failed(describe(&e)),
        })?;
        let fuel = captured.state().fuel_levels().map_or(0, |(consumed, _)| consumed);
        let text = String::from_utf8(out.buf).map_err(|_| Failure::NotUtf8)?;
        Ok(Output { text, fuel })
    }

    /// Renders `text` once with `context` (the template's default values and name) when it reads
    /// neither `pod` nor `namespace`, and keeps the output in it for every pod that overrides
    /// nothing it reads. An expression that fails here is left to fail, with its message, per pod.
    pub(crate) fn precompute(&self, text: &mut CompiledText, context: &JinjaValue) {
        if text.reads_pod || text.reads_namespace {
            return;
        }
        if let Ok(Output { text: output, fuel }) = self.evaluate(text, context.clone(), MAX_EXPRESSION_OUTPUT) {
            text.constant = Some(Constant { output, fuel });
        }
    }
}

struct LimitedWriter {
    buf: Vec<u8>,
    limit: usize,
}

impl Write for LimitedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.buf.extend_from_slice(&data[..self.limit - self.buf.len()]);
            return Err(io::Error::other("output limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expression_detection() {
        assert_eq!(value_reference("{{ values.a.b }}"), Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(value_reference(" {{- values.port -}} "), Some(vec!["port".to_owned()]));
        for not_plain in [
            "{{ values }}",
            "{{ values.a }}x",
            "{{ values.a | int }}",
            "{{ values['a'] }}",
            "{{ pod.a }}",
            "{{ values.a }}{{ values.b }}",
        ] {
            assert_eq!(value_reference(not_plain), None, "{not_plain}");
        }
        assert!(has_expression("a {# c #}") && has_expression("{% if x %}y{% endif %}") && !has_expression("{ a }"));
    }
}
