//! Compiling templates into a MutatingAdmissionPolicy that the API server runs itself.
//!
//! The policy does what the webhook does on a pod's *first* admission, for the pods that need
//! nothing the webhook alone can give: in an opted-in namespace, not opted out, without a status
//! or templates annotation, in a namespace that names no templates. Its selected templates are the
//! `default: true` (and enforced) ones whose selectors match, in the engine's order. Every other
//! pod is left untouched, so the webhook decides it exactly as before: one for which a selected
//! template is *webhook-only* (see below), an enforced template meets a same-name item, a
//! template's volume meets a same-name one (what mounts it may be displaced), a pod that sets
//! pod-level `spec.resources` (padded by the webhook, see `pod_resources`), an
//! override is invalid or is of an integer (admission CEL has no `int(string)`), or a pod choice is
//! made. The stored pod is the webhook's, item for item: the same positions, "the pod's own wins",
//! the token mount of `inject`, the status annotation byte for byte (so the webhook, seeing it,
//! has nothing to do) and the `injected` label.
//!
//! The expression subset (MiniJinja, compiled to CEL from the parser's AST): string literals,
//! `values.*` (string and boolean overrides followed, with their patterns), `template.name`,
//! `pod.metadata.name|generateName|namespace`, `pod.metadata.labels` / `annotations` and
//! `namespace.labels` / `annotations` lookups, `namespace.name`, `default(...)`, `~`, and in `when:`
//! conditions `is defined`, `not`, `and`, `or`. A value that may be undefined must be given a
//! `default` before it is printed, or sit in an item whose `when:` says it `is defined` (the webhook
//! refuses a pod where it is undefined; the policy cannot refuse). Names of items (containers,
//! volumes, env vars, mount paths, label and annotation keys) must not depend on the pod.
//!
//! Pure: the output is the policy and binding as JSON.

use std::collections::BTreeMap;

use minijinja::machinery::ast::{self, Expr, Stmt};
use serde_json::{Value, json};

use super::scope::{self, Pods};
use crate::model::kinds::{
    APP_LISTS, CONTAINER_LISTS, CONTAINERS, ENV, INIT_CONTAINERS, Identity, MAPS, POD_LISTS, PerAppList, PerMap,
    PerPodList, Place, Placement, PodListKind, VOLUMES, WhenHeld,
};
use crate::model::status::ItemKind;
use crate::names;
use crate::names::SERVICE_ACCOUNT_TOKEN_PATH;
use crate::templates::expression::CompiledText;
use crate::templates::template::{AppTargets, Piece, SeqItem, Template, TemplateSelector, TemplateSet};

/// Why a template cannot be compiled: the expression (or item) and what keeps it out.
pub type WebhookOnly = String;

/// The policy, its binding, and the templates left to the webhook.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    /// The `MutatingAdmissionPolicy`.
    pub policy: Value,
    /// Its `MutatingAdmissionPolicyBinding`.
    pub binding: Value,
    /// Templates a pod may get that the policy leaves to the webhook, with the reason.
    pub webhook_only: Vec<(String, WebhookOnly)>,
    /// Templates the policy injects, in its order.
    pub compiled: Vec<String>,
}

/// The identities of `kind` that a template's containers and app-container items refer to
/// (`PodListKind::referenced_by`: the volumes they mount); `None` when one is an expression (then
/// any of its items may be).
fn referenced_identities(kind: &PodListKind, spec: &crate::templates::template::InjectSpec) -> Option<Vec<String>> {
    /// The `key`s of the references in the list at `path` of `piece` (a container, or the list).
    fn keys_at(piece: &Piece, path: &[&str], key: &str, out: &mut Vec<String>) -> Option<()> {
        match (piece, path.split_first()) {
            (Piece::Literal(value), _) => {
                let list = path.iter().try_fold(value, |at, field| at.get(field));
                let entries = list.and_then(Value::as_array).into_iter().flatten();
                out.extend(entries.filter_map(|e| e.get(key).and_then(Value::as_str).map(str::to_owned)));
                Some(())
            }
            (Piece::Map(entries), Some((first, rest))) => match entries.iter().find(|(k, _)| k == first) {
                Some((_, inner)) => keys_at(inner, rest, key, out),
                None => Some(()),
            },
            (Piece::Seq(items), None) => items.iter().try_for_each(|item| key_of(&item.piece, key, out)),
            _ => None,
        }
    }
    /// The `key` of one reference.
    fn key_of(entry: &Piece, key: &str, out: &mut Vec<String>) -> Option<()> {
        match entry {
            Piece::Literal(m) => out.extend(m.get(key).and_then(Value::as_str).map(str::to_owned)),
            Piece::Map(entries) => match entries.iter().find(|(k, _)| k == key).map(|(_, p)| p) {
                Some(Piece::Literal(Value::String(name))) => out.push(name.clone()),
                Some(_) => return None,
                None => {}
            },
            _ => return None,
        }
        Some(())
    }
    let mut names = Vec::new();
    for container in spec.sidecars.iter().chain(&spec.init_containers) {
        for reference in kind.referenced_by {
            keys_at(&container.piece, reference.list, reference.key, &mut names)?;
        }
    }
    for app_kind in &APP_LISTS {
        let Some(reference) = kind.referenced_by.iter().find(|r| r.list == [app_kind.field]) else { continue };
        for item in &spec.app_lists[app_kind.index] {
            key_of(&item.piece, reference.key, &mut names)?;
        }
    }
    Some(names)
}

/// Why `template` is webhook-only, or `None` when it compiles.
pub fn webhook_only_reason(template: &Template, native_sidecars: bool) -> Option<WebhookOnly> {
    compile_template(template, native_sidecars, "true").err()
}

/// Compiles the templates a pod can get without annotations (`default: true` or enforced) into
/// one policy and its binding. `native_sidecars`: whether the cluster runs native sidecars (the
/// `auto` mode's choice); `excluded_namespaces`: the injector's own, besides the system ones.
pub fn compile(templates: &TemplateSet, native_sidecars: bool, excluded_namespaces: &[String]) -> CompiledPolicy {
    // The engine's order (`select::choose`): defaults in template order, then enforced
    // templates that are not defaults.
    let ordered = templates.iter().filter(|t| t.default).chain(templates.iter().filter(|t| t.enforced && !t.default));
    let mut plans = Vec::new();
    let mut webhook_only = Vec::new();
    let mut leave_to_webhook = Vec::new();
    for template in ordered {
        let selected = selection(template);
        match compile_template(template, native_sidecars, &selected) {
            Ok(plan) => plans.push(plan),
            Err(reason) => {
                leave_to_webhook.push(selected);
                webhook_only.push((template.name.to_string(), reason));
            }
        }
    }
    let compiled = plans.iter().map(|p| p.name.clone()).collect();
    let program = Program::new(&plans, &leave_to_webhook);
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": names::INJECTION_POLICY, "labels": {"app.kubernetes.io/name": "sidecar-injector"}},
        "spec": {
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                }],
                "matchPolicy": "Equivalent",
            },
            // Like the webhook: never block pod creation; the ValidatingAdmissionPolicy refuses
            // pods that should have been injected and were not.
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "IfNeeded",
            "matchConditions": [
                scope::mirror_pod_condition(),
                // A status (reinvocation, re-admission) and a templates list are the webhook's to
                // read; so are overrides the policy cannot follow (see `handled`).
                {"name": "no-status-or-templates-annotation", "expression": format!(
                    "!has(object.metadata.annotations) || !({} in object.metadata.annotations || {} in object.metadata.annotations)",
                    lit(names::STATUS_ANNOTATION), lit(names::TEMPLATES_ANNOTATION))},
            ],
            "variables": program.variables,
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": program.patch}}],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": names::INJECTION_POLICY, "labels": {"app.kubernetes.io/name": "sidecar-injector"}},
        "spec": {
            "policyName": names::INJECTION_POLICY,
            // The webhook's scope, for the pods that do not opt out (opted-out pods get only
            // enforced templates, which the webhook's entry for them decides).
            "matchResources": {
                "namespaceSelector": scope::namespace_selector(excluded_namespaces),
                "objectSelector": scope::object_selector(Pods::NotOptedOut),
            },
        },
    });
    CompiledPolicy { policy, binding, webhook_only, compiled }
}

// ---------------------------------------------------------------------------------------------
// CEL text helpers.

/// A CEL string literal (JSON's escapes are CEL's).
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// A CEL literal of a JSON value; members of maps and lists are `dyn` so that mixed types pass
/// the type checker. (Public for the benchmark's constant-patch policy.)
pub fn json_lit(value: &Value) -> String {
    match value {
        Value::String(s) => lit(s),
        Value::Array(items) => {
            format!("[{}]", items.iter().map(|i| format!("dyn({})", json_lit(i))).collect::<Vec<_>>().join(", "))
        }
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter().map(|(k, v)| format!("{}: dyn({})", lit(k), json_lit(v))).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

/// A CEL literal of a string's JSON text (quotes included), for the status annotation.
fn json_text_lit(s: &str) -> String {
    lit(&serde_json::to_string(s).expect("strings serialize"))
}

/// A CEL list of scalars of one type (no `dyn`: `in` compares them as they are).
fn scalars_lit(values: impl IntoIterator<Item = Value>) -> String {
    format!("[{}]", values.into_iter().map(|v| json_lit(&v)).collect::<Vec<_>>().join(", "))
}

/// `a || b || ...`, `false` when empty.
fn any(terms: impl IntoIterator<Item = String>) -> String {
    let terms: Vec<String> = terms.into_iter().collect();
    if terms.is_empty() { "false".to_owned() } else { format!("({})", terms.join(" || ")) }
}

/// A JSON pointer segment.
fn pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The CEL condition of a label selector over the labels map `labels`.
fn selector_cel(selector: &TemplateSelector, labels: &str) -> String {
    let s = &selector.label_selector;
    let mut terms = Vec::new();
    for (k, v) in s.match_labels.iter().flatten() {
        terms.push(format!("({k} in {labels} && {labels}[{k}] == {v})", k = lit(k), v = lit(v)));
    }
    for e in s.match_expressions.iter().flatten() {
        let k = lit(&e.key);
        let values = scalars_lit(e.values.iter().flatten().map(|v| Value::String(v.clone())));
        terms.push(match e.operator.as_str() {
            "In" => format!("({k} in {labels} && {labels}[{k}] in {values})"),
            "NotIn" => format!("(!({k} in {labels}) || !({labels}[{k}] in {values}))"),
            "Exists" => format!("({k} in {labels})"),
            // DoesNotExist (the selector was checked when the template loaded).
            _ => format!("!({k} in {labels})"),
        });
    }
    if terms.is_empty() { "true".to_owned() } else { format!("({})", terms.join(" && ")) }
}

/// When a template is selected for a pod the policy sees.
fn selection(template: &Template) -> String {
    let pod = template.pod_selector.as_ref().map(|s| selector_cel(s, "variables.podLabels"));
    let ns = template.namespace_selector.as_ref().map(|s| selector_cel(s, "variables.namespaceLabels"));
    let terms: Vec<String> = pod.into_iter().chain(ns).collect();
    if terms.is_empty() { "true".to_owned() } else { terms.join(" && ") }
}

// ---------------------------------------------------------------------------------------------
// A template's compile context: its overridable values as CEL.

/// One overridable value: the pod's annotation if valid, else the default (`render::effective_values`).
#[derive(Debug, Clone)]
struct Override {
    /// The value in expressions.
    ex: Ex,
    /// The value with its type, for `{{ values.x }}` scalars.
    typed: String,
    /// Whether the annotation is absent or valid (an invalid one makes the webhook refuse the
    /// pod, so the policy leaves such a pod to it).
    valid: String,
}

impl Override {
    fn of(template: &Template, o: &crate::templates::template::Overridable) -> Result<Override, String> {
        let key = format!("{}{}.{}", names::PREFIX, template.name, o.name);
        let annotation = format!("object.metadata.?annotations[?{}]", lit(&key));
        let text = format!("{annotation}.value()");
        let mut checks = Vec::new();
        if let Some(pattern) = &o.pattern {
            checks.push(format!("{text}.matches({})", lit(pattern.as_str())));
        }
        let default = template.values.get(&o.name).cloned().unwrap_or(Value::Null);
        let (ex, typed) = match &default {
            Value::String(d) => {
                if let Some(allowed) = &o.one_of {
                    checks.push(format!("{text} in {}", scalars_lit(allowed.iter().cloned())));
                }
                let cel = format!("{annotation}.orValue({})", lit(d));
                (Ex::Str(cel.clone()), cel)
            }
            Value::Number(n) if n.as_i64().is_some() => {
                // CEL in admission policies has no `int(string)` (checked on the API server), so a
                // pod that overrides an integer is left to the webhook.
                checks.insert(0, "false".to_owned());
                (Ex::Const(default.clone()), n.to_string())
            }
            Value::Bool(b) => {
                checks.insert(0, format!("{text} in [\"true\", \"false\"]"));
                if let Some(allowed) = &o.one_of {
                    checks.push(format!("({text} == \"true\") in {}", scalars_lit(allowed.iter().cloned())));
                }
                let cel = format!("({annotation}.hasValue() ? {text} == \"true\" : {b})");
                (Ex::Bool(cel.clone()), cel)
            }
            other => {
                return Err(format!(
                    "overridable value {} ({other}) is not a string, integer or boolean: not in the policy subset",
                    o.name
                ));
            }
        };
        let valid = match checks.is_empty() {
            true => "true".to_owned(),
            false => format!("(!{annotation}.hasValue() || ({}))", checks.join(" && ")),
        };
        Ok(Override { ex, typed, valid })
    }
}

/// What compiling one template needs besides the template.
struct Cx<'t> {
    template: &'t Template,
    overrides: BTreeMap<String, Override>,
    /// Optional values (CEL) the `when:` of the item being compiled proves defined: its value may
    /// print them, since CEL's `?:` evaluates the item only when the condition holds.
    defined: std::cell::RefCell<Vec<String>>,
}

impl Cx<'_> {
    /// Compiles an item with what its `when:` proves defined (`x is defined`, joined by `and`).
    fn guarded<T>(
        &self,
        when: Option<&CompiledText>,
        compile: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        let facts = when.map(|w| self.defined_by(w)).unwrap_or_default();
        let depth = self.defined.borrow().len();
        self.defined.borrow_mut().extend(facts);
        let result = compile();
        self.defined.borrow_mut().truncate(depth);
        result
    }

    fn defined_by(&self, when: &CompiledText) -> Vec<String> {
        fn walk(compiler: &ExprCompiler<'_>, expr: &Expr<'_>, out: &mut Vec<String>) {
            match expr {
                Expr::Test(test) if test.name == "defined" && test.args.is_empty() => {
                    if let Ok(Ex::Opt(a) | Ex::OptMap(a)) = compiler.expr(&test.expr) {
                        out.push(a);
                    }
                }
                Expr::BinOp(op) if matches!(op.op, ast::BinOpKind::ScAnd) => {
                    walk(compiler, &op.left, out);
                    walk(compiler, &op.right, out);
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        if let Ok(Stmt::Template(root)) = parse(&when.source)
            && let [Stmt::EmitExpr(emit)] = root.children.as_slice()
        {
            walk(&ExprCompiler { cx: self, source: &when.source }, &emit.expr, &mut out);
        }
        out
    }

    /// A text's output when it is the same for every pod the policy handles: pre-rendered with
    /// the defaults, unless it reads values a pod may override.
    fn constant<'c>(&self, text: &'c CompiledText) -> Option<&'c str> {
        text.constant_output().filter(|_| self.overrides.is_empty() || !text.reads_values)
    }

    /// When the pod's annotations for this template are ones the policy can follow: its overrides
    /// valid, none of its pod choices made.
    fn admissible(&self) -> String {
        let mut terms: Vec<String> = self.overrides.values().map(|o| o.valid.clone()).collect();
        let choices = self.template.pod_choices;
        for (allowed, suffix) in [
            (choices.app_containers, crate::injection::render::APP_CONTAINERS_CHOICE),
            (choices.sidecar_mode, crate::injection::render::SIDECAR_MODE_CHOICE),
        ] {
            if allowed {
                let key = format!("{}{}.{suffix}", names::PREFIX, self.template.name);
                terms.push(format!("!({} in object.metadata.?annotations.orValue({{}}))", lit(&key)));
            }
        }
        terms.retain(|t| t != "true");
        if terms.is_empty() { "true".to_owned() } else { terms.join(" && ") }
    }
}

// ---------------------------------------------------------------------------------------------
// Expressions: MiniJinja AST to CEL.

/// What a (sub)expression is, as far as the subset knows.
#[derive(Debug, Clone)]
enum Ex {
    /// Known when the policy is compiled.
    Const(Value),
    /// A CEL string.
    Str(String),
    /// A CEL `optional(string)`: may be undefined.
    Opt(String),
    /// A CEL map of strings.
    Map(String),
    /// A CEL `optional(map)`.
    OptMap(String),
    /// A CEL bool.
    Bool(String),
    /// `values` (its overridable members are CEL, the others constants).
    Values,
    /// `pod`, `pod.metadata`, `namespace`.
    Pod,
    PodMetadata,
    Namespace,
}

struct ExprCompiler<'t> {
    cx: &'t Cx<'t>,
    source: &'t str,
}

impl ExprCompiler<'_> {
    fn outside(&self, what: impl std::fmt::Display) -> String {
        format!("{:?}: {what}", self.source)
    }

    fn expr(&self, expr: &Expr<'_>) -> Result<Ex, String> {
        Ok(match expr {
            Expr::Var(var) => match var.id {
                "pod" => Ex::Pod,
                "namespace" => Ex::Namespace,
                "values" => Ex::Values,
                "template" => Ex::Const(json!({"name": &*self.cx.template.name})),
                other => return Err(self.outside(format!("`{other}` is not in the policy subset"))),
            },
            Expr::Const(c) => Ex::Const(serde_json::to_value(&c.value).map_err(|e| self.outside(e))?),
            Expr::Map(map) if map.keys.is_empty() => Ex::Const(json!({})),
            Expr::GetAttr(get) => self.member(self.expr(&get.expr)?, get.name)?,
            Expr::GetItem(get) => match self.expr(&get.subscript_expr)? {
                Ex::Const(Value::String(key)) => self.member(self.expr(&get.expr)?, &key)?,
                _ => return Err(self.outside("only constant string subscripts are in the policy subset")),
            },
            Expr::Filter(filter) if filter.name == "default" => {
                let base = self.expr(filter.expr.as_ref().ok_or_else(|| self.outside("default without a value"))?)?;
                let [ast::CallArg::Pos(arg)] = filter.args.as_slice() else {
                    return Err(self.outside("default(...) takes one argument in the policy subset"));
                };
                let arg = self.expr(arg)?;
                match (base, arg) {
                    (Ex::Opt(a), Ex::Opt(b)) => Ex::Opt(format!("{a}.or({b})")),
                    (Ex::Opt(a), b) => Ex::Str(format!("{a}.orValue({})", self.string(b)?)),
                    (Ex::OptMap(a), Ex::Const(Value::Object(m))) if m.is_empty() => {
                        Ex::Map(format!("{a}.orValue({{}})"))
                    }
                    (Ex::OptMap(a), Ex::Map(b)) => Ex::Map(format!("{a}.orValue({b})")),
                    (defined @ (Ex::Str(_) | Ex::Map(_) | Ex::Const(_) | Ex::Bool(_)), _) => defined,
                    _ => return Err(self.outside("this default(...) is not in the policy subset")),
                }
            }
            Expr::Filter(filter) => {
                return Err(self.outside(format!("filter `{}` is not in the policy subset", filter.name)));
            }
            Expr::Test(test) if matches!(test.name, "defined" | "undefined") && test.args.is_empty() => {
                let defined = match self.expr(&test.expr)? {
                    Ex::Opt(a) | Ex::OptMap(a) => format!("{a}.hasValue()"),
                    _ => "true".to_owned(),
                };
                Ex::Bool(if test.name == "defined" { defined } else { format!("!{defined}") })
            }
            Expr::UnaryOp(op) if matches!(op.op, ast::UnaryOpKind::Not) => {
                Ex::Bool(format!("!({})", self.truthy(self.expr(&op.expr)?)))
            }
            Expr::BinOp(op) => match op.op {
                ast::BinOpKind::Concat => {
                    let (l, r) = (self.expr(&op.left)?, self.expr(&op.right)?);
                    Ex::Str(format!("{} + {}", self.string(l)?, self.string(r)?))
                }
                ast::BinOpKind::ScAnd | ast::BinOpKind::ScOr => {
                    let (l, r) = (self.truthy(self.expr(&op.left)?), self.truthy(self.expr(&op.right)?));
                    let cel_op = if matches!(op.op, ast::BinOpKind::ScAnd) { "&&" } else { "||" };
                    Ex::Bool(format!("({l} {cel_op} {r})"))
                }
                _ => return Err(self.outside("this operator is not in the policy subset")),
            },
            _ => return Err(self.outside("this kind of expression is not in the policy subset")),
        })
    }

    /// `base.name` / `base["name"]`.
    fn member(&self, base: Ex, name: &str) -> Result<Ex, String> {
        Ok(match (base, name) {
            (Ex::Values, name) => match self.cx.overrides.get(name) {
                Some(o) => o.ex.clone(),
                None => Ex::Const(
                    self.cx
                        .template
                        .values
                        .get(name)
                        .cloned()
                        .ok_or_else(|| self.outside(format!("`values.{name}` is not defined")))?,
                ),
            },
            (Ex::Const(value), _) => {
                Ex::Const(value.get(name).cloned().ok_or_else(|| self.outside(format!("`{name}` is not defined")))?)
            }
            (Ex::Pod, "metadata") => Ex::PodMetadata,
            (Ex::PodMetadata, "name" | "generateName" | "namespace") => Ex::Opt(format!("object.metadata.?{name}")),
            (Ex::PodMetadata, "labels" | "annotations") => Ex::OptMap(format!("object.metadata.?{name}")),
            (Ex::Namespace, "name") => Ex::Str("request.namespace".to_owned()),
            (Ex::Namespace, "labels") => Ex::Map("variables.namespaceLabels".to_owned()),
            (Ex::Namespace, "annotations") => Ex::Map("variables.namespaceAnnotations".to_owned()),
            (Ex::Map(m) | Ex::OptMap(m), key) => Ex::Opt(format!("{m}[?{}]", lit(key))),
            (Ex::Pod | Ex::PodMetadata, other) => {
                return Err(self.outside(format!("the pod's `{other}` is not in the policy subset")));
            }
            (_, other) => return Err(self.outside(format!("`.{other}` is not in the policy subset"))),
        })
    }

    /// As MiniJinja prints it.
    fn string(&self, ex: Ex) -> Result<String, String> {
        match ex {
            Ex::Str(s) => Ok(s),
            Ex::Bool(b) => Ok(format!("string({b})")),
            Ex::Const(Value::String(s)) => Ok(lit(&s)),
            Ex::Const(v @ (Value::Bool(_) | Value::Number(_))) if !v.is_f64() => Ok(lit(&v.to_string())),
            Ex::Opt(a) if self.cx.defined.borrow().contains(&a) => Ok(format!("{a}.value()")),
            Ex::Opt(_) | Ex::OptMap(_) => Err(self.outside(
                "a value that may be undefined needs `| default(...)` (or a `when: ... is defined` on its item) in the policy subset",
            )),
            _ => Err(self.outside("only strings, integers and booleans print in the policy subset")),
        }
    }

    /// MiniJinja's truthiness, for `when:` (an undefined value is false).
    fn truthy(&self, ex: Ex) -> String {
        match ex {
            Ex::Bool(b) => b,
            Ex::Str(s) => format!("({s} != \"\")"),
            Ex::Opt(o) => format!("({o}.orValue(\"\") != \"\")"),
            Ex::Map(m) => format!("(size({m}) > 0)"),
            Ex::OptMap(m) => format!("(size({m}.orValue({{}})) > 0)"),
            Ex::Const(v) => {
                let truthy = match &v {
                    Value::Null => false,
                    Value::Bool(b) => *b,
                    Value::Number(n) => n.as_f64() != Some(0.0),
                    Value::String(s) => !s.is_empty(),
                    Value::Array(a) => !a.is_empty(),
                    Value::Object(o) => !o.is_empty(),
                };
                truthy.to_string()
            }
            Ex::Pod | Ex::PodMetadata | Ex::Namespace | Ex::Values => "true".to_owned(),
        }
    }
}

fn parse(source: &str) -> Result<ast::Stmt<'_>, String> {
    minijinja::machinery::parse(source, "<template>", Default::default()).map_err(|e| format!("{source:?}: {e}"))
}

/// A string scalar with expressions, as a CEL string.
fn text_cel(cx: &Cx<'_>, text: &CompiledText) -> Result<String, String> {
    if let Some(constant) = cx.constant(text) {
        return Ok(lit(constant));
    }
    let compiler = ExprCompiler { cx, source: &text.source };
    let Stmt::Template(root) = parse(&text.source)? else { unreachable!("parse returns a template") };
    let mut parts = Vec::new();
    for child in &root.children {
        parts.push(match child {
            Stmt::EmitRaw(raw) => lit(raw.raw),
            Stmt::EmitExpr(emit) => compiler.string(compiler.expr(&emit.expr)?)?,
            _ => return Err(compiler.outside("statements ({% ... %}) are not in the policy subset")),
        });
    }
    Ok(if parts.is_empty() { lit("") } else { parts.join(" + ") })
}

/// A `when:` condition: `None` when always true, the CEL bool otherwise; `Err` for an item that
/// is never there (a constant false) is not needed: it is `Some("false")`.
fn when_cel(cx: &Cx<'_>, when: Option<&CompiledText>) -> Result<Option<String>, String> {
    let Some(when) = when else { return Ok(None) };
    if let Some(constant) = cx.constant(when) {
        return Ok((constant != "true").then(|| "false".to_owned()));
    }
    let compiler = ExprCompiler { cx, source: &when.source };
    let Stmt::Template(root) = parse(&when.source)? else { unreachable!("parse returns a template") };
    match root.children.as_slice() {
        [Stmt::EmitExpr(emit)] => Ok(Some(compiler.truthy(compiler.expr(&emit.expr)?))),
        _ => Err(compiler.outside("a when: condition must be one expression")),
    }
}

// ---------------------------------------------------------------------------------------------
// Pieces: the template's compiled tree to CEL values.

/// A value known when compiling, or CEL text.
#[derive(Debug, Clone)]
enum Val {
    Const(Value),
    Cel(String),
}

impl Val {
    fn cel(&self) -> String {
        match self {
            Val::Const(v) => json_lit(v),
            Val::Cel(c) => c.clone(),
        }
    }
}

fn piece_val(cx: &Cx<'_>, piece: &Piece) -> Result<Val, String> {
    Ok(match piece {
        Piece::Literal(v) => Val::Const(v.clone()),
        Piece::Text(text) => match cx.constant(text) {
            Some(c) => Val::Const(Value::String(c.to_owned())),
            None => Val::Cel(text_cel(cx, text)?),
        },
        Piece::ValueRef { path, .. } => match path.as_slice() {
            [name] if cx.overrides.contains_key(name) => Val::Cel(cx.overrides[name].typed.clone()),
            _ => Val::Const(
                crate::templates::expression::lookup_path(&cx.template.values, path)
                    .cloned()
                    .ok_or_else(|| format!("values.{} is not defined", path.join(".")))?,
            ),
        },
        Piece::Seq(items) => seq_val(cx, items)?,
        Piece::Map(entries) => {
            map_val(entries.iter().map(|(k, p)| Ok((k.clone(), piece_val(cx, p)?))).collect::<Result<_, String>>()?)
        }
    })
}

fn seq_val(cx: &Cx<'_>, items: &[SeqItem]) -> Result<Val, String> {
    let mut constant = Vec::new();
    let mut parts: Vec<String> = Vec::new();
    let mut all_constant = true;
    for item in items {
        let when = when_cel(cx, item.when.as_ref())?;
        if when.as_deref() == Some("false") {
            continue;
        }
        let value = cx.guarded(item.when.as_ref(), || piece_val(cx, &item.piece))?;
        match (&when, &value) {
            (None, Val::Const(v)) if all_constant => constant.push(v.clone()),
            _ => {
                if all_constant {
                    parts.extend(constant.drain(..).map(|v| format!("[dyn({})]", json_lit(&v))));
                    all_constant = false;
                }
                let one = format!("[dyn({})]", value.cel());
                parts.push(match when {
                    None => one,
                    Some(cond) => format!("({cond} ? {one} : [])"),
                });
            }
        }
    }
    Ok(if all_constant { Val::Const(Value::Array(constant)) } else { Val::Cel(format!("({})", parts.join(" + "))) })
}

fn map_val(entries: Vec<(String, Val)>) -> Val {
    if entries.iter().all(|(_, v)| matches!(v, Val::Const(_))) {
        return Val::Const(Value::Object(
            entries.into_iter().map(|(k, v)| (k, if let Val::Const(v) = v { v } else { unreachable!() })).collect(),
        ));
    }
    Val::Cel(format!(
        "{{{}}}",
        entries.iter().map(|(k, v)| format!("{}: dyn({})", lit(k), v.cel())).collect::<Vec<_>>().join(", ")
    ))
}

// ---------------------------------------------------------------------------------------------
// Templates to plans.

/// One item a template adds, with what identifies it.
#[derive(Debug, Clone)]
struct Item {
    kind: ItemKind,
    key: String,
    when: Option<String>,
    value: String,
}

#[derive(Debug, Clone)]
struct Plan {
    /// Per kind of spec list, the template's items that something of the template refers to (the
    /// volumes it mounts; all of them when a reference is an expression).
    referenced: PerPodList<Vec<String>>,
    name: String,
    hash: String,
    selected: String,
    /// When the pod's annotations for this template let the policy inject it (see `Cx::admissible`).
    admissible: String,
    enforced: bool,
    /// The entries of each kind of map (`kinds::MAPS`).
    maps: PerMap<Vec<(String, Val)>>,
    /// The template's init containers, then its sidecars, each with where it goes.
    containers: Vec<(Placement, Item)>,
    /// The items of each kind of spec list (`kinds::POD_LISTS`; none of a kind the policy mode
    /// does not add, see `compile_template`).
    pod_lists: PerPodList<Vec<Item>>,
    /// The items of each app-container list (`kinds::APP_LISTS`).
    app: PerAppList<Vec<Item>>,
    targets: AppTargets,
}

/// Each map of the pod (`kinds::MAPS`) in CEL.
const MAP_CEL_OF_POD: PerMap<&str> = ["variables.podLabels", "object.metadata.?annotations.orValue({})"];

/// The identity of an app-container list's item in CEL (`x` the pod's item), per description of
/// `kinds::APP_LISTS`: what `AppListKind::identity` computes, written for the API server.
const APP_LIST_CEL_IDENTITY: PerAppList<&str> = [
    "x.name",
    "((has(x.configMapRef) && x.configMapRef.?name.orValue(\"\") != \"\" && !(has(x.secretRef) && x.secretRef.?name.orValue(\"\") != \"\")) ? \"configMap/\" + x.configMapRef.name : ((has(x.secretRef) && x.secretRef.?name.orValue(\"\") != \"\" && !(has(x.configMapRef) && x.configMapRef.?name.orValue(\"\") != \"\")) ? \"secret/\" + x.secretRef.name : \"\")) + (x.?prefix.orValue(\"\") != \"\" ? \"+\" + x.prefix : \"\")",
    "x.mountPath",
];

fn compile_template(template: &Template, native_sidecars: bool, selected: &str) -> Result<Plan, String> {
    let spec = &template.inject;
    let name = &*template.name;
    if template.audit {
        return Err("enforced: audit reports what enforcement would refuse, which only the webhook sees".to_owned());
    }
    if let Some(kind) = POD_LISTS.iter().find(|k| !k.in_policy && !spec.pod_lists[k.index].is_empty()) {
        return Err(format!("it adds {} ({}), which only the webhook adds", kind.field, kind.section()));
    }
    // A merged entry depends on what the app container has (its env and envFrom): the webhook's.
    if spec.app_lists[ENV.index].iter().any(|item| item.merge.is_some()) {
        return Err("an appContainers.env item merges into the app's own variable (merge:)".to_owned());
    }
    // The form of such a volume is chosen per pod from the nodes it can run on: the webhook's.
    if spec.pod_lists.iter().flatten().any(|item| item.fallback.is_some()) {
        return Err("an image volume declares a fallback (fallback:), and which of the two a pod gets is decided from the nodes it can run on".to_owned());
    }
    let overrides = template
        .overridable
        .iter()
        .map(|o| Ok((o.name.clone(), Override::of(template, o)?)))
        .collect::<Result<_, String>>()?;
    let cx = Cx { template, overrides, defined: Default::default() };
    let cx = &cx;
    let string_map = |entries: &[(String, Piece)]| -> Result<Vec<(String, Val)>, String> {
        entries
            .iter()
            .map(|(k, p)| {
                let v = match piece_val(cx, p)? {
                    Val::Const(Value::String(s)) => Val::Const(Value::String(s)),
                    Val::Const(Value::Null) => Val::Const(Value::String(String::new())),
                    Val::Const(v @ (Value::Bool(_) | Value::Number(_))) => Val::Const(Value::String(v.to_string())),
                    Val::Const(_) => return Err(format!("{k} must render to a string")),
                    // `{{ values.x }}` of an overridable integer or boolean: printed, as the
                    // webhook prints a label's or annotation's value.
                    Val::Cel(_) if matches!(p, Piece::ValueRef { path, .. } if path.len() == 1) => {
                        let Piece::ValueRef { path, .. } = p else { unreachable!("matched above") };
                        let compiler = ExprCompiler { cx, source: k };
                        Val::Cel(compiler.string(cx.overrides[&path[0]].ex.clone())?)
                    }
                    cel @ Val::Cel(_) => cel,
                };
                Ok((k.clone(), v))
            })
            .collect()
    };
    // Each item with its identity and its value as CEL (containers get `restartPolicy` and the
    // token mount on top, see `container_value`).
    let items = |list: &[SeqItem], kind: ItemKind, container: Option<Placement>| -> Result<Vec<Item>, String> {
        let mut out = Vec::new();
        for item in list {
            let when = when_cel(cx, item.when.as_ref())?;
            if when.as_deref() == Some("false") {
                continue;
            }
            if container.is_some() && item.position.is_some() {
                return Err("a container's position is not in the policy subset (the policy puts init containers before the pod's own and sidecars after the app's)".to_owned());
            }
            let value = match container {
                Some(placement) => container_value(cx, item, placement == Placement::NativeSidecar)?,
                None => cx.guarded(item.when.as_ref(), || piece_val(cx, &item.piece))?.cel(),
            };
            let key = item_key(&item.piece, cx, kind).ok_or_else(|| {
                format!(
                    "a {} whose name depends on the pod or an override is not in the policy subset",
                    kind_name(kind)
                )
            })?;
            out.push(Item { kind, key, when, value });
        }
        Ok(out)
    };
    let native = crate::model::native::is_native(template.sidecar_mode, native_sidecars);
    // The webhook-only reasons are found in this order: spec lists, maps, containers, app lists.
    let mut pod_lists = PerPodList::<Vec<Item>>::default();
    for (kind, out) in POD_LISTS.iter().zip(&mut pod_lists) {
        *out = items(&spec.pod_lists[kind.index], kind.kind, None)?;
    }
    let referenced = POD_LISTS.each_ref().map(|kind| {
        let identities = pod_lists[kind.index].iter().map(|item| item.key.clone());
        match kind.referenced_by.is_empty() {
            true => Vec::new(),
            false => match referenced_identities(kind, spec) {
                Some(names) => identities.filter(|identity| names.contains(identity)).collect(),
                None => identities.collect(),
            },
        }
    });
    let mut maps = PerMap::<Vec<(String, Val)>>::default();
    for (entries, compiled) in spec.maps.iter().zip(&mut maps) {
        *compiled = string_map(entries)?;
    }
    let mut containers = Vec::new();
    for (list, placement) in
        [(&spec.init_containers, Placement::Init), (&spec.sidecars, Placement::of_sidecars(native))]
    {
        let placed = items(list, placement.item_kind(), Some(placement))?;
        containers.extend(placed.into_iter().map(|item| (placement, item)));
    }
    let mut app = PerAppList::<Vec<Item>>::default();
    for (kind, out) in APP_LISTS.iter().zip(&mut app) {
        *out = items(&spec.app_lists[kind.index], kind.kind, None)?;
    }
    Ok(Plan {
        referenced,
        name: name.to_owned(),
        hash: template.hash.clone(),
        selected: format!("({selected})"),
        admissible: cx.admissible(),
        enforced: template.enforced,
        maps,
        containers,
        pod_lists,
        app,
        targets: spec.targets.clone(),
    })
}

fn kind_name(kind: ItemKind) -> String {
    serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// The identity of an item, when it is the same for every pod.
fn item_key(piece: &Piece, cx: &Cx<'_>, kind: ItemKind) -> Option<String> {
    let identity = match kind.place() {
        Place::AppList(list) => list.identity,
        Place::PodList(list) => Identity::Field(list.key),
        _ => Identity::Field("name"),
    };
    match (piece, identity) {
        (Piece::Map(entries), Identity::Field(field)) => {
            match piece_val(cx, &entries.iter().find(|(k, _)| k == field)?.1).ok()? {
                Val::Const(Value::String(s)) => Some(s),
                _ => None,
            }
        }
        _ => match piece_val(cx, piece).ok()? {
            Val::Const(v) => match identity {
                Identity::Field(field) => v.get(field)?.as_str().map(str::to_owned),
                Identity::Derived(derive) => derive(&v),
            },
            Val::Cel(_) => None,
        },
    }
}

/// A container as CEL, with `restartPolicy: Always` (and the default `resizePolicy` unless the
/// template gives one, as `native::make_native` writes them) for a native sidecar and the service-account
/// token mount of `inject` (`variables.tokenMounts`) unless the template mounts that path itself.
fn container_value(cx: &Cx<'_>, item: &SeqItem, native: bool) -> Result<String, String> {
    cx.guarded(item.when.as_ref(), || container_fields(cx, &item.piece, native))
}

fn container_fields(cx: &Cx<'_>, piece: &Piece, native: bool) -> Result<String, String> {
    let entries: Vec<(String, Val)> = match piece {
        Piece::Map(entries) => {
            entries.iter().map(|(k, p)| Ok((k.clone(), piece_val(cx, p)?))).collect::<Result<_, String>>()?
        }
        Piece::Literal(Value::Object(map)) => map.iter().map(|(k, v)| (k.clone(), Val::Const(v.clone()))).collect(),
        _ => return Err("a container that is not a mapping is not in the policy subset".to_owned()),
    };
    let mut fields: Vec<(String, Val)> = Vec::new();
    let mut mounts_token_path = false;
    let mut mounts = None;
    for (k, v) in entries {
        if k == "volumeMounts" {
            if let Val::Const(Value::Array(list)) = &v {
                mounts_token_path =
                    list.iter().any(|m| m.get("mountPath").and_then(Value::as_str) == Some(SERVICE_ACCOUNT_TOKEN_PATH));
            }
            mounts = Some(v);
            continue;
        }
        if k == "restartPolicy" && native {
            continue;
        }
        fields.push((k, v));
    }
    if native {
        fields.push(("restartPolicy".to_owned(), Val::Const(json!(crate::model::native::RESTART_ALWAYS))));
        if !fields.iter().any(|(k, _)| k == "resizePolicy") {
            fields.push(("resizePolicy".to_owned(), Val::Const(crate::model::native::default_resize_policy())));
        }
    }
    let mounts = match (mounts, mounts_token_path) {
        (Some(v), true) => Some(v),
        (Some(v), false) => Some(Val::Cel(format!("({} + variables.tokenMounts)", v.cel()))),
        (None, _) => Some(Val::Cel("variables.tokenMounts".to_owned())),
    };
    fields.extend(mounts.map(|m| ("volumeMounts".to_owned(), m)));
    Ok(map_val(fields).cel())
}

// ---------------------------------------------------------------------------------------------
// The program: variables and the patch.

struct Program {
    variables: Vec<Value>,
    patch: String,
}

/// What holds a name at admission: the pod, or (by index into the flags) an earlier item.
#[derive(Default)]
struct Claims<'p> {
    /// (key, flag variable, template) of items added so far, per name space.
    earlier: BTreeMap<&'static str, Vec<(String, String, &'p str)>>,
}

impl<'p> Claims<'p> {
    /// The flags of earlier items with this key, and the owner text (CEL) for a skip given
    /// `pod_has`.
    fn earlier(&self, space: &'static str, key: &str) -> Vec<(&str, &'p str)> {
        self.earlier
            .get(space)
            .into_iter()
            .flatten()
            .filter(|(k, _, _)| k == key)
            .map(|(_, f, t)| (f.as_str(), *t))
            .collect()
    }
    fn add(&mut self, space: &'static str, key: &str, flag: String, template: &'p str) {
        self.earlier.entry(space).or_default().push((key.to_owned(), flag, template));
    }
}

/// The owner of a skipped item: the pod when it has the name, else the first earlier template.
fn owner_cel(pod_has: &str, earlier: &[(String, &str)]) -> String {
    let mut owner = lit("pod");
    for (flag, template) in earlier.iter().rev() {
        owner = format!("({flag} ? {} : {owner})", lit(&format!("template:{template}")));
    }
    format!("({pod_has} ? {} : {owner})", lit("pod"))
}

/// A skipped item's status entry (the `Skipped` field order: template, kind, name, container,
/// owner) as CEL; `container` is CEL (a container's name, put in unescaped: one that is not a DNS
/// label — the only way to break the JSON — makes the API server's validation, which runs after the
/// policy, refuse the pod, so such a status is never stored).
fn skip_json(template: &str, kind: ItemKind, name: &str, container: Option<&str>, owner: &str) -> String {
    let json = |s: &str| serde_json::to_string(s).expect("strings serialize");
    let head = format!("{{\"template\":{},\"kind\":\"{}\",\"name\":{}", json(template), kind_name(kind), json(name));
    let tail = format!("{} + {owner} + {}", lit(",\"owner\":\""), lit("\"}"));
    match container {
        Some(container) => {
            format!("{} + {container} + {}", lit(&format!("{head},\"container\":\"")), lit("\"") + " + " + &tail)
        }
        None => format!("{} + {tail}", lit(&head)),
    }
}

/// `prefix + text + suffix`, or `""` when `text` (CEL) is empty. (CEL in admission policies has
/// no `cel.bind`; a one-element list binds the value instead.)
fn wrap_nonempty(text: &str, prefix: &str, suffix: &str) -> String {
    format!("[{text}].filter(w, w != \"\").map(w, {} + w + {}).join(\"\")", lit(prefix), lit(suffix))
}

/// `,"field":[...]` from conditional JSON strings, or nothing when none holds.
fn list_part(field: &str, entries: &[(String, String)]) -> String {
    let list = entries.iter().map(|(cond, json)| format!("({cond} ? {json} : \"\")")).collect::<Vec<_>>().join(", ");
    wrap_nonempty(&format!("[{list}].filter(x, x != \"\").join(\",\")"), &format!(",\"{field}\":["), "]")
}

fn patch_op(path: &str, value: &str) -> String {
    format!("JSONPatch{{op: \"add\", path: {path}, value: {value}}}")
}

fn when_and(when: &Option<String>) -> String {
    when.as_ref().map(|w| format!(" && {w}")).unwrap_or_default()
}

fn targets_cel(targets: &AppTargets) -> String {
    let names = |list: &[String]| scalars_lit(list.iter().map(|n| Value::String(n.clone())));
    let mut terms = Vec::new();
    if let Some(only) = &targets.only {
        terms.push(format!("c.name in {}", names(only)));
    }
    if !targets.except.is_empty() {
        terms.push(format!("!(c.name in {})", names(&targets.except)));
    }
    if terms.is_empty() { "true".to_owned() } else { format!("({})", terms.join(" && ")) }
}

impl Program {
    /// The policy's variables and its patch for the compiled `plans`, in the engine's order; a pod
    /// that selects a template of `leave_to_webhook` (their selections, CEL) is the webhook's.
    fn new(plans: &[Plan], leave_to_webhook: &[String]) -> Program {
        let mut program = ProgramBuilder::new(plans);
        for i in 0..plans.len() {
            program.add_metadata(i);
            program.add_containers(i);
            program.add_pod_lists(i);
            program.add_app_items(i);
        }
        let any_skip = any(program.skip_any_by_plan.iter().flatten().cloned());
        program.vars.push(("anySkip".into(), any_skip));
        let handled = program.handled(leave_to_webhook);
        program.vars.push(("handled".into(), handled));
        let status = program.status();
        program.vars.push(("status".into(), status));
        let variables =
            program.vars.iter().map(|(name, expression)| json!({"name": name, "expression": expression})).collect();
        Program { variables, patch: program.patch() }
    }
}

/// The variables every policy starts with: the pod's and namespace's maps and names that the
/// items' conditions read, and the service-account token mount containers get.
fn pod_variables() -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = vec![
        ("podLabels".into(), "object.metadata.?labels.orValue({})".into()),
        ("namespaceLabels".into(), "namespaceObject.metadata.?labels.orValue({})".into()),
        ("namespaceAnnotations".into(), "namespaceObject.metadata.?annotations.orValue({})".into()),
        ("containerNames".into(), "object.spec.containers.map(c, c.name)".into()),
        ("allContainers".into(), "object.spec.containers + object.spec.?initContainers.orValue([])".into()),
    ];
    // The identities of the pod's items of each kind of spec list the policy adds.
    for kind in POD_LISTS.iter().filter(|kind| kind.in_policy) {
        let key = match kind.key_required {
            true => format!("x.{}", kind.key),
            false => format!("x.?{}.orValue(\"\")", kind.key),
        };
        vars.push((pod_list_keys(kind), format!("object.spec.?{}.orValue([]).map(x, {key})", kind.field)));
    }
    vars.extend([
        (
            "tokenVolumes".into(),
            format!("variables.{}.filter(n, n.startsWith(\"kube-api-access-\"))", pod_list_keys(VOLUMES)),
        ),
        // `plan::service_account_token_mount`: the mount the ServiceAccount plugin gave
        // every container, when it gave it to all and is allowed to.
        (
            "tokenMounts".into(),
            format!(
                "(object.spec.?automountServiceAccountToken.orValue(true) && size(variables.tokenVolumes) > 0 \
                 && variables.allContainers.all(c, c.?volumeMounts.orValue([]).exists(m, m.mountPath == {p})) \
                 && variables.allContainers.exists(c, c.?volumeMounts.orValue([]).exists(m, m.name == variables.tokenVolumes[0] \
                 && m.?readOnly.orValue(false) && m.mountPath == {p} && !has(m.subPath) && !has(m.subPathExpr) \
                 && !has(m.mountPropagation) && !has(m.recursiveReadOnly)))) \
                 ? [{{\"name\": dyn(variables.tokenVolumes[0]), \"readOnly\": dyn(true), \"mountPath\": dyn({p})}}] : []",
                p = lit(SERVICE_ACCOUNT_TOKEN_PATH)
            ),
        ),
    ]);
    vars
}

/// The variable holding the identities of the pod's items of a kind of spec list
/// (`volumesKeys`).
fn pod_list_keys(kind: &PodListKind) -> String {
    format!("{}Keys", kind.field)
}

/// An item whose key is the same for every pod (a map entry, container, volume or pull secret),
/// as `ProgramBuilder::static_item` flags it.
struct StaticItem<'a> {
    /// The name space its key is unique in (`containers`, `volumes`, a map's field, ...).
    space: &'static str,
    kind: ItemKind,
    key: &'a str,
    when: &'a Option<String>,
    /// Whether the pod has an item with the key (CEL).
    pod_has: String,
    /// Whether a skip gets a status entry (a pull secret's does not).
    report_skip: bool,
}

/// `Program::new`'s work in progress: the variables so far, and what the plans' items add to the
/// patch and to the status, gathered plan by plan in the engine's order.
#[derive(Default)]
struct ProgramBuilder<'p> {
    plans: &'p [Plan],
    /// `variables.s<i>`: whether plan `i`'s template is selected.
    selected: Vec<String>,
    /// The policy's variables (name, CEL), in order.
    vars: Vec<(String, String)>,
    /// Flags of the items with static identities: added or not.
    claims: Claims<'p>,
    flag_count: usize,
    /// Per metadata map (labels, annotations): the operations, and the keys added (for the
    /// status) with the flags that add them.
    metadata_ops: [Vec<String>; 2],
    metadata_status: [BTreeMap<String, Vec<String>>; 2],
    /// Per list of containers (`kinds::CONTAINER_LISTS`): (flag, value) of the containers added
    /// there, and (flag, name as JSON text) for its status list.
    container_ops: [Vec<(String, String)>; CONTAINER_LISTS.len()],
    container_status: [Vec<(String, String)>; CONTAINER_LISTS.len()],
    /// (flag, name as JSON text) of the native sidecars, for their status list.
    native_status: Vec<(String, String)>,
    /// Per kind of spec list (`kinds::POD_LISTS`): (flag, value) of the items added, and (flag,
    /// identity as JSON text) for its status list.
    pod_list_ops: PerPodList<Vec<(String, String)>>,
    pod_list_status: PerPodList<Vec<(String, String)>>,
    /// Status entries of skipped items (CEL strings, empty when not skipped), in the engine's
    /// order: per template, its own items, then its app-container items.
    skips: Vec<String>,
    /// Per plan, the conditions under which one of its items is skipped.
    skip_any_by_plan: Vec<Vec<String>>,
    /// The conditions under which a referenced item (a mounted volume) is displaced (see
    /// `add_displacement`).
    displacements: Vec<String>,
    /// Per app-container list (`kinds::APP_LISTS`): the operations, and (added(c) CEL, key JSON).
    app_ops: [Vec<String>; 3],
    app_added: [Vec<(String, String)>; 3],
}

impl<'p> ProgramBuilder<'p> {
    /// The common variables and each plan's selection (`s<i>`), nothing gathered yet.
    fn new(plans: &'p [Plan]) -> Self {
        let mut vars = pod_variables();
        let selected: Vec<String> = (0..plans.len()).map(|i| format!("variables.s{i}")).collect();
        for (i, plan) in plans.iter().enumerate() {
            vars.push((format!("s{i}"), plan.selected.clone()));
        }
        ProgramBuilder { plans, selected, vars, skip_any_by_plan: vec![Vec::new(); plans.len()], ..Default::default() }
    }

    /// A new flag variable (`a<n>`) with this CEL, as the expression that reads it.
    fn flag(&mut self, cel: String) -> String {
        let name = format!("a{}", self.flag_count);
        self.flag_count += 1;
        self.vars.push((name.clone(), cel));
        format!("variables.{name}")
    }

    /// The flag of a static item of plan `i`: added when its template is selected, its `when:`
    /// holds and neither the pod nor an earlier item has the key; a skip is recorded if reported.
    fn static_item(&mut self, i: usize, item: StaticItem<'_>) -> String {
        let plans = self.plans;
        let (s, t) = (self.selected[i].clone(), plans[i].name.as_str());
        let StaticItem { space, kind, key, when, pod_has, report_skip } = item;
        let earlier = self.claims.earlier(space, key);
        let earlier: Vec<(String, &str)> = earlier.into_iter().map(|(f, t)| (f.to_owned(), t)).collect();
        let taken = any(earlier.iter().map(|(f, _)| f.clone()));
        let added = self.flag(format!("{s}{} && !{pod_has} && !{taken}", when_and(when)));
        self.claims.add(space, key, added.clone(), t);
        if report_skip {
            let cond = format!("({s}{} && !{added})", when_and(when));
            self.skips
                .push(format!("({cond} ? {} : \"\")", skip_json(t, kind, key, None, &owner_cel(&pod_has, &earlier))));
            self.skip_any_by_plan[i].push(cond);
        }
        added
    }

    /// Plan `i`'s labels and annotations: the operations that add them, and who adds each key.
    fn add_metadata(&mut self, i: usize) {
        let plan = &self.plans[i];
        // Labels, then annotations, each in key order (the rendered maps are sorted); the
        // injector's own key is always taken.
        for (kind, pod_map) in MAPS.iter().zip(MAP_CEL_OF_POD) {
            let (index, field, own_key) = (kind.index, kind.field, kind.own_key);
            let mut entries = plan.maps[index].clone();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (key, value) in &entries {
                let pod_has = match key.as_str() {
                    k if k == own_key => "true".to_owned(),
                    _ => format!("({} in {pod_map})", lit(key)),
                };
                let item = StaticItem { space: field, kind: kind.kind, key, when: &None, pod_has, report_skip: true };
                let added = self.static_item(i, item);
                self.metadata_ops[index].push(format!(
                    "({added} ? [{}] : [])",
                    patch_op(&lit(&format!("/metadata/{field}/{}", pointer(key))), &value.cel())
                ));
                self.metadata_status[index].entry(key.clone()).or_default().push(added);
            }
        }
    }

    /// Plan `i`'s init containers and sidecars: their operations and status entries.
    fn add_containers(&mut self, i: usize) {
        let plans = self.plans;
        for (placement, item) in &plans[i].containers {
            let pod_has = format!("({} in variables.allContainers.map(c, c.name))", lit(&item.key));
            let (key, when) = (&item.key, &item.when);
            let added = self.static_item(
                i,
                StaticItem { space: "containers", kind: item.kind, key, when, pod_has, report_skip: true },
            );
            let (list, name_json) = (placement.list().index, json_text_lit(&item.key));
            if *placement == Placement::NativeSidecar {
                self.native_status.push((added.clone(), name_json.clone()));
            }
            self.container_ops[list].push((added.clone(), item.value.clone()));
            self.container_status[list].push((added, name_json));
        }
    }

    /// Plan `i`'s items of each kind of spec list: their operations and status entries, and when
    /// a referenced item (a mounted volume) is displaced (`displacements`).
    fn add_pod_lists(&mut self, i: usize) {
        let plans = self.plans;
        for kind in &POD_LISTS {
            for item in &plans[i].pod_lists[kind.index] {
                let pod_has = format!("({} in variables.{})", lit(&item.key), pod_list_keys(kind));
                let (key, when) = (&item.key, &item.when);
                let report_skip = kind.when_held == WhenHeld::Skip;
                let static_item =
                    StaticItem { space: kind.field, kind: kind.kind, key, when, pod_has: pod_has.clone(), report_skip };
                let added = self.static_item(i, static_item);
                if plans[i].referenced[kind.index].contains(&item.key) {
                    self.add_displacement(kind, i, item, pod_has);
                }
                self.pod_list_ops[kind.index].push((added.clone(), item.value.clone()));
                self.pod_list_status[kind.index].push((added, json_text_lit(&item.key)));
            }
        }
    }

    /// When plan `i`'s referenced `item` of `kind` (a mounted volume) is displaced: an item skipped
    /// for another of its identity displaces what refers to it (`inject`), the webhook's to
    /// decide, when the pod has one (`pod_has`), or an earlier template one that is not the same.
    fn add_displacement(&mut self, kind: &PodListKind, i: usize, item: &Item, pod_has: String) {
        let selected = &self.selected;
        let differing_earlier = self.plans[..i].iter().enumerate().flat_map(|(j, earlier)| {
            earlier.pod_lists[kind.index]
                .iter()
                .filter(|v| v.key == item.key && v.value != item.value)
                .map(move |v| format!("({}{})", selected[j], when_and(&v.when)))
        });
        let displaced = any(std::iter::once(pod_has).chain(differing_earlier));
        self.displacements.push(format!("({}{} && {displaced})", self.selected[i], when_and(&item.when)));
    }

    /// Plan `i`'s app-container items: the operations on each targeted app container's lists, what
    /// they add for the status, and the status entries of those skipped.
    fn add_app_items(&mut self, i: usize) {
        let plans = self.plans;
        let (plan, s, t) = (&plans[i], &self.selected[i], plans[i].name.as_str());
        // App containers: per container, so inline over `c`.
        let includes = targets_cel(&plan.targets);
        let mut this_plan_app_skips = Vec::new();
        for (list, pod_key) in APP_LISTS.iter().zip(APP_LIST_CEL_IDENTITY) {
            let (list_index, field, kind) = (list.index, list.field, &list.kind);
            for item in &plan.app[list_index] {
                let pod_has = format!("c.?{field}.orValue([]).exists(x, {pod_key} == {})", lit(&item.key));
                let earlier_plans: Vec<(String, &str)> = app_claims(plans, i, list_index, &item.key)
                    .into_iter()
                    .map(|(j, when)| {
                        (
                            format!("({}{} && {})", self.selected[j], when_and(&when), targets_cel(&plans[j].targets)),
                            plans[j].name.as_str(),
                        )
                    })
                    .collect();
                let taken = any(earlier_plans.iter().map(|(c, _)| c.clone()));
                let here = format!("{s}{} && {includes}", when_and(&item.when));
                let added = format!("({here} && !{pod_has} && !{taken})");
                self.app_ops[list_index].push(format!(
                    "object.spec.containers.filter(c, {added}).map(c, {})",
                    patch_op(
                        &format!(
                            "\"/spec/containers/\" + string(variables.containerNames.indexOf(c.name)) + \"/{field}/-\""
                        ),
                        &item.value
                    )
                ));
                self.app_added[list_index].push((added.clone(), json_text_lit(&item.key)));
                let skip = format!("({here} && !{added})");
                let json = skip_json(t, *kind, &item.key, Some("c.name"), &owner_cel(&pod_has, &earlier_plans));
                this_plan_app_skips.push(format!("({skip} ? {json} : \"\")"));
                self.skip_any_by_plan[i].push(format!("object.spec.containers.exists(c, {skip})"));
            }
        }
        if !this_plan_app_skips.is_empty() {
            self.skips.push(format!(
                "object.spec.containers.map(c, [{}].filter(x, x != \"\").join(\",\")).filter(x, x != \"\").join(\",\")",
                this_plan_app_skips.join(", ")
            ));
        }
    }

    /// When the policy injects the pod (`variables.handled`): a template is selected and nothing
    /// of the pod is the webhook's to decide.
    fn handled(&self, leave_to_webhook: &[String]) -> String {
        let enforced_conflicts = self
            .plans
            .iter()
            .enumerate()
            .filter(|(_, p)| p.enforced)
            .map(|(i, _)| any(self.skip_any_by_plan[i].iter().cloned()));
        let inadmissible = self
            .plans
            .iter()
            .enumerate()
            .filter(|(_, p)| p.admissible != "true")
            .map(|(i, p)| format!("({} && !({}))", self.selected[i], p.admissible));
        // Namespace defaults (`sidecar-injector.io/<template>.<value>` on the namespace) are the
        // webhook's to apply, like the pod's overrides it cannot follow.
        let namespace_defaults = format!(
            "variables.namespaceAnnotations.exists(k, k.matches({}))",
            lit(&format!("^{}[a-z0-9-]+[.]", names::PREFIX.replace('.', "[.]")))
        );
        format!(
            "{} && !{namespace_defaults} && !{} && !{} && !{} && !{} && !object.spec.?resources.hasValue()",
            any(self.selected.iter().cloned()),
            any(leave_to_webhook.iter().map(|c| format!("({c})"))),
            any(enforced_conflicts),
            any(inadmissible),
            any(self.displacements.iter().cloned()),
        )
    }

    /// The status annotation, byte for byte what `InjectionStatus::to_annotation` writes.
    fn status(&self) -> String {
        let templates = self
            .plans
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let json = serde_json::to_string(&crate::model::status::TemplateRef {
                    name: p.name.clone(),
                    hash: p.hash.clone(),
                })
                .expect("serializes");
                (self.selected[i].clone(), lit(&json))
            })
            .collect::<Vec<_>>();
        let templates_list =
            templates.iter().map(|(c, j)| format!("({c} ? {j} : \"\")")).collect::<Vec<_>>().join(", ");
        let keyed = |m: &BTreeMap<String, Vec<String>>| -> Vec<(String, String)> {
            m.iter().map(|(k, flags)| (any(flags.iter().cloned()), json_text_lit(k))).collect()
        };
        let skipped_list = self.skips.join(", ");
        [format!("\"{{\\\"templates\\\":[\" + [{templates_list}].filter(x, x != \"\").join(\",\") + \"]\"")]
            .into_iter()
            .chain(CONTAINER_LISTS.iter().map(|list| list_part(list.field, &self.container_status[list.index])))
            .chain([list_part("nativeSidecars", &self.native_status)])
            .chain(
                POD_LISTS
                    .iter()
                    .filter(|kind| kind.in_policy)
                    .map(|kind| list_part(kind.field, &self.pod_list_status[kind.index])),
            )
            .chain(MAPS.iter().map(|kind| list_part(kind.field, &keyed(&self.metadata_status[kind.index]))))
            .chain([
                self.app_containers_status(),
                wrap_nonempty(&format!("[{skipped_list}].filter(x, x != \"\").join(\",\")"), ",\"skipped\":[", "]"),
                "\"}\"".to_owned(),
            ])
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// The status's `appContainers` part: per app container, the keys of each list added to it.
    fn app_containers_status(&self) -> String {
        let app_part = |list_index: usize, field: &str| {
            let entries = self.app_added[list_index]
                .iter()
                .map(|(c, j)| format!("({c} ? {j} : \"\")"))
                .collect::<Vec<_>>()
                .join(", ");
            wrap_nonempty(&format!("[{entries}].filter(x, x != \"\").join(\",\")"), &format!("\"{field}\":["), "]")
        };
        // Sorted by container name as the status's map is: `"<name>":` strings sort the same way,
        // since `"` sorts before every character of a container name.
        let parts = APP_LISTS.iter().map(|kind| app_part(kind.index, kind.field)).collect::<Vec<_>>();
        let per_container = format!("[{}].filter(x, x != \"\").join(\",\")", parts.join(", "));
        wrap_nonempty(
            &format!(
                "object.spec.containers.map(c, [{per_container}].filter(p, p != \"\").map(p, \"\\\"\" + c.name + \"\\\":{{\" + p + \"}}\").join(\"\")).filter(x, x != \"\").sort().join(\",\")"
            ),
            ",\"appContainers\":{",
            "}",
        )
    }

    /// The patch, in the order `injection::plan` writes it, for the pods the policy handles.
    fn patch(self) -> String {
        let mut ops: Vec<String> = Vec::new();
        ops.push(format!("(has(object.metadata.labels) ? [] : [{}])", patch_op("\"/metadata/labels\"", "{}")));
        let [label_ops, annotation_ops] = self.metadata_ops;
        ops.extend(label_ops);
        ops.push(format!(
            "[{}]",
            patch_op(
                &lit(&format!("/metadata/labels/{}", pointer(names::INJECTED_LABEL))),
                "variables.anySkip ? \"partial\" : \"true\""
            )
        ));
        ops.push(format!(
            "(has(object.metadata.annotations) ? [] : [{}])",
            patch_op("\"/metadata/annotations\"", "{}")
        ));
        ops.extend(annotation_ops);
        ops.push(format!(
            "[{}]",
            patch_op(&lit(&format!("/metadata/annotations/{}", pointer(names::STATUS_ANNOTATION))), "variables.status")
        ));
        push_list_ops(&mut ops, INIT_CONTAINERS.field, &self.container_ops[INIT_CONTAINERS.index], true);
        for kind in &APP_LISTS {
            let (list_index, field) = (kind.index, kind.field);
            if self.app_added[list_index].is_empty() {
                continue;
            }
            let any_added = any(self.app_added[list_index].iter().map(|(a, _)| a.clone()));
            ops.push(format!(
                "object.spec.containers.filter(c, !has(c.{field}) && {any_added}).map(c, {})",
                patch_op(
                    &format!("\"/spec/containers/\" + string(variables.containerNames.indexOf(c.name)) + \"/{field}\""),
                    "[]"
                )
            ));
            ops.extend(self.app_ops[list_index].iter().cloned());
        }
        // The app containers stay, so the list of containers is there and nothing goes in front.
        let container_path = lit(&format!("/spec/{}/-", CONTAINERS.field));
        ops.extend(
            self.container_ops[CONTAINERS.index]
                .iter()
                .map(|(added, value)| format!("({added} ? [{}] : [])", patch_op(&container_path, value))),
        );
        for (kind, items) in POD_LISTS.iter().zip(&self.pod_list_ops) {
            push_list_ops(&mut ops, kind.field, items, false);
        }
        format!("variables.handled ? ({}) : []", ops.join("\n + "))
    }
}

/// The operations adding items (flag, value) to the pod's list `spec.<field>`: the list itself
/// when the pod has none and an item is added, then each item, at the front (`front`) or at the
/// end.
fn push_list_ops(ops: &mut Vec<String>, field: &str, items: &[(String, String)], front: bool) {
    if items.is_empty() {
        return;
    }
    let any_added = any(items.iter().map(|(f, _)| f.clone()));
    let path = format!("/spec/{field}");
    ops.push(format!("(!has(object.spec.{field}) && {any_added} ? [{}] : [])", patch_op(&lit(&path), "[]")));
    if front {
        // Inserted at the front in reverse order, so they end up in order before the pod's own.
        for (added, value) in items.iter().rev() {
            ops.push(format!("({added} ? [{}] : [])", patch_op(&lit(&format!("{path}/0")), value)));
        }
    } else {
        for (added, value) in items {
            ops.push(format!("({added} ? [{}] : [])", patch_op(&lit(&format!("{path}/-")), value)));
        }
    }
}

/// The earlier templates (index, `when`) that add an app-list item with this key.
fn app_claims(plans: &[Plan], before: usize, list_index: usize, key: &str) -> Vec<(usize, Option<String>)> {
    plans[..before]
        .iter()
        .enumerate()
        .flat_map(|(j, p)| {
            p.app[list_index].iter().filter(|item| item.key == key).map(move |item| (j, item.when.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::template::Template;

    fn template(inject: &str) -> Template {
        let source = format!(
            "default: true\nvalues: {{image: agent:1, port: 4317}}\noverridable: [image, port]\ninject:\n{inject}"
        );
        Template::load("agent", &source).unwrap_or_else(|e| panic!("{e}"))
    }

    const SIDECAR: &str = "  sidecars:\n    - name: agent\n      image: \"{{ values.image }}\"\n      resources: {requests: {cpu: 1m, memory: 1Mi}, limits: {cpu: 1m, memory: 1Mi}}\n";

    #[test]
    fn the_subset_compiles_and_everything_else_names_what_keeps_it_out() {
        // (case, extra inject text, None = compiles / Some(fragment of the reason))
        let cases: Vec<(&str, String, Option<&str>)> = vec![
            ("values and literals", String::new(), None),
            (
                "pod name with defaults, namespace, concatenation",
                // An annotation: a generateName ends with `-`, which no label value may.
                "  annotations:\n    example.com/tag: \"{{ namespace.name ~ '.' ~ (pod.metadata.name | default(pod.metadata.generateName | default('pod'))) }}\"\n".into(),
                None,
            ),
            (
                "label lookups with a default, a when on is defined",
                "  appContainers:\n    env:\n      - name: TEAM\n        value: \"{{ namespace.labels['team'] | default('none') }}\"\n        when: \"{{ pod.metadata.labels is defined and not (pod.metadata.annotations is defined) }}\"\n".into(),
                None,
            ),
            (
                "a lookup printed under its own `is defined`",
                "  appContainers:\n    env:\n      - name: OWNER\n        value: \"{{ (pod.metadata.labels | default({}))['owner'] }}\"\n        when: \"{{ (pod.metadata.labels | default({}))['owner'] is defined }}\"\n".into(),
                None,
            ),
            (
                "a lookup printed under another label's `is defined`",
                "  appContainers:\n    env:\n      - name: OWNER\n        value: \"{{ (pod.metadata.labels | default({}))['owner'] }}\"\n        when: \"{{ (pod.metadata.labels | default({}))['team'] is defined }}\"\n".into(),
                Some("needs `| default(...)`"),
            ),
            (
                // An annotation: `agent:1` is no label value.
                "an overridable string in an annotation",
                "  annotations:\n    example.com/image: \"{{ values.image }}\"\n".into(),
                None,
            ),
            ("the pod's spec", "  labels:\n    sa: \"{{ pod.spec.serviceAccountName | default('x') }}\"\n".into(), Some("the pod's `spec`")),
            ("a filter", "  labels:\n    n: \"{{ namespace.name | upper }}\"\n".into(), Some("filter `upper`")),
            ("workload", "  labels:\n    w: \"{{ workload.name }}\"\n".into(), Some("`workload`")),
            (
                "a statement",
                "  labels:\n    s: \"{% if namespace.name %}a{% endif %}\"\n".into(),
                Some("statements"),
            ),
            (
                "an env var that merges",
                "  appContainers:\n    env:\n      - {name: J, value: x, merge: {append: \" \"}}\n".into(),
                Some("merges into the app's own variable"),
            ),
            (
                "a name from the pod",
                "  volumes:\n    - name: \"{{ namespace.name }}\"\n      emptyDir: {}\n".into(),
                Some("volume whose name depends on the pod"),
            ),
        ];
        for (case, extra, expected) in cases {
            let t = template(&format!("{SIDECAR}{extra}"));
            let reason = webhook_only_reason(&t, true);
            match (expected, &reason) {
                (None, None) => {}
                (Some(fragment), Some(reason)) if reason.contains(fragment) => {}
                _ => panic!("{case}: expected {expected:?}, got {reason:?}"),
            }
        }
    }

    #[test]
    fn overrides_the_policy_cannot_follow_leave_the_pod_to_the_webhook() {
        let t = template(SIDECAR);
        let cx = Cx {
            template: &t,
            overrides: t.overridable.iter().map(|o| (o.name.clone(), Override::of(&t, o).unwrap())).collect(),
            defined: Default::default(),
        };
        // A string override is followed (absent or any text: `image` has no pattern); an integer
        // one never (no `int(string)` in admission CEL), so any `port` annotation hands over.
        assert_eq!(cx.overrides["image"].valid, "true");
        assert!(cx.overrides["port"].valid.contains("(false)") || cx.overrides["port"].valid.contains("false"));
        assert!(cx.admissible().contains("sidecar-injector.io/agent.port"), "{}", cx.admissible());
        // A fractional number cannot be overridden through the policy at all.
        let fractional = Template::load(
            "agent",
            &format!("default: true\nvalues: {{image: agent:1, ratio: 0.5}}\noverridable: [ratio]\ninject:\n{SIDECAR}"),
        )
        .unwrap();
        assert!(webhook_only_reason(&fractional, true).is_some_and(|r| r.contains("ratio")));
    }

    #[test]
    fn a_pod_whose_items_collide_with_an_enforced_template_is_left_to_the_webhook() {
        let handled = |enforced: bool| {
            let source = format!("default: true\nenforced: {enforced}\nvalues: {{image: agent:1}}\ninject:\n{SIDECAR}");
            let (set, errors) = TemplateSet::load([crate::TemplateSource { name: "agent".into(), text: source }]);
            assert!(errors.is_empty(), "{errors:?}");
            let policy = compile(&set, true, &[]).policy;
            let variables = policy["spec"]["variables"].as_array().unwrap().clone();
            let handled = variables.iter().find(|v| v["name"] == "handled").unwrap();
            handled["expression"].as_str().unwrap().to_owned()
        };
        // The sidecar's flag is a0: skipped (the pod has a container of that name) hands over.
        assert!(handled(true).contains("!(((variables.s0 && !variables.a0)))"), "{}", handled(true));
        assert!(!handled(false).contains("variables.a0"), "{}", handled(false));
    }

    #[test]
    fn the_policy_binds_like_the_webhook_and_records_the_engine_status() {
        let (set, errors) = TemplateSet::load(crate::templates::template::embedded_sources());
        assert!(errors.is_empty(), "{errors:?}");
        let compiled = compile(&set, true, &["sidecar-injector".to_owned()]);
        assert_eq!(compiled.compiled, vec!["log-shipper"]);
        let binding = compiled.binding["spec"]["matchResources"].to_string();
        for fragment in [
            r#""values":["enabled"]"#,
            r#""values":["kube-system","kube-public","kube-node-lease","sidecar-injector"]"#,
            r#""operator":"NotIn","values":["disabled"]"#,
        ] {
            assert!(binding.contains(fragment), "{fragment} in {binding}");
        }
        let spec = compiled.policy["spec"].to_string();
        let hash = &set.get("log-shipper").unwrap().hash;
        // The status names the template as `TemplateRef` serializes it, name first.
        assert!(
            spec.contains(&format!(r#"{{\\\"name\\\":\\\"log-shipper\\\",\\\"hash\\\":\\\"{hash}\\\"}}"#)),
            "{spec}"
        );
        // Pods with a status or a templates list are the webhook's.
        assert!(spec.contains(r#"\"sidecar-injector.io/templates\" in object.metadata.annotations"#), "{spec}");
        // Classic sidecars when the cluster has no native ones: no restartPolicy written.
        let classic = compile(&set, false, &[]).policy["spec"].to_string();
        assert!(spec.contains("restartPolicy") && !classic.contains("restartPolicy"));
    }
}
