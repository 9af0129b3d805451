//! MiniJinja to CEL: a template's expressions, values and overrides (`Cx`, `ExprCompiler`), and
//! its pieces (`Val`: items, containers) as CEL values, within the subset the module above names;
//! anything else is the reason the template is left to the webhook.

use std::collections::BTreeMap;

use minijinja::machinery::ast::{self, Expr, Stmt};
use serde_json::{Value, json};

use super::cel::*;
use crate::model::kinds::{Identity, Place};
use crate::model::status::ItemKind;
use crate::names;
use crate::names::SERVICE_ACCOUNT_TOKEN_PATH;
use crate::templates::expression::CompiledText;
use crate::templates::template::{Piece, SeqItem, Template};

/// One overridable value: the pod's annotation if valid, else the default (`render::effective_values`).
#[derive(Debug, Clone)]
pub(super) struct Override {
    /// The value in expressions.
    pub(super) ex: Ex,
    /// The value with its type, for `{{ values.x }}` scalars.
    pub(super) typed: String,
    /// Whether the annotation is absent or valid (an invalid one makes the webhook refuse the
    /// pod, so the policy leaves such a pod to it).
    pub(super) valid: String,
}

impl Override {
    pub(super) fn of(template: &Template, o: &crate::templates::template::Overridable) -> Result<Override, String> {
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
pub(super) struct Cx<'t> {
    pub(super) template: &'t Template,
    pub(super) overrides: BTreeMap<String, Override>,
    /// Optional values (CEL) the `when:` of the item being compiled proves defined: its value may
    /// print them, since CEL's `?:` evaluates the item only when the condition holds.
    pub(super) defined: std::cell::RefCell<Vec<String>>,
}

impl Cx<'_> {
    /// Compiles an item with what its `when:` proves defined (`x is defined`, joined by `and`).
    pub(super) fn guarded<T>(
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

    pub(super) fn defined_by(&self, when: &CompiledText) -> Vec<String> {
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
    pub(super) fn constant<'c>(&self, text: &'c CompiledText) -> Option<&'c str> {
        text.constant_output().filter(|_| self.overrides.is_empty() || !text.reads_values)
    }

    /// When the pod's annotations for this template are ones the policy can follow: its overrides
    /// valid, none of its pod choices made.
    pub(super) fn admissible(&self) -> String {
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

/// What a (sub)expression is, as far as the subset knows.
#[derive(Debug, Clone)]
pub(super) enum Ex {
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

pub(super) struct ExprCompiler<'t> {
    pub(super) cx: &'t Cx<'t>,
    pub(super) source: &'t str,
}

impl ExprCompiler<'_> {
    pub(super) fn outside(&self, what: impl std::fmt::Display) -> String {
        format!("{:?}: {what}", self.source)
    }

    pub(super) fn expr(&self, expr: &Expr<'_>) -> Result<Ex, String> {
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
    pub(super) fn member(&self, base: Ex, name: &str) -> Result<Ex, String> {
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
    pub(super) fn string(&self, ex: Ex) -> Result<String, String> {
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
    pub(super) fn truthy(&self, ex: Ex) -> String {
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

pub(super) fn parse(source: &str) -> Result<ast::Stmt<'_>, String> {
    minijinja::machinery::parse(source, "<template>", Default::default()).map_err(|e| format!("{source:?}: {e}"))
}

/// A string scalar with expressions, as a CEL string.
pub(super) fn text_cel(cx: &Cx<'_>, text: &CompiledText) -> Result<String, String> {
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
pub(super) fn when_cel(cx: &Cx<'_>, when: Option<&CompiledText>) -> Result<Option<String>, String> {
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

/// A value known when compiling, or CEL text.
#[derive(Debug, Clone)]
pub(super) enum Val {
    Const(Value),
    Cel(String),
}

impl Val {
    pub(super) fn cel(&self) -> String {
        match self {
            Val::Const(v) => json_lit(v),
            Val::Cel(c) => c.clone(),
        }
    }
}

pub(super) fn piece_val(cx: &Cx<'_>, piece: &Piece) -> Result<Val, String> {
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

pub(super) fn seq_val(cx: &Cx<'_>, items: &[SeqItem]) -> Result<Val, String> {
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

pub(super) fn map_val(entries: Vec<(String, Val)>) -> Val {
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

/// The identity of an item, when it is the same for every pod.
pub(super) fn item_key(piece: &Piece, cx: &Cx<'_>, kind: ItemKind) -> Option<String> {
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
pub(super) fn container_value(cx: &Cx<'_>, item: &SeqItem, native: bool) -> Result<String, String> {
    cx.guarded(item.when.as_ref(), || container_fields(cx, &item.piece, native))
}

pub(super) fn container_fields(cx: &Cx<'_>, piece: &Piece, native: bool) -> Result<String, String> {
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
