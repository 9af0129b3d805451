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

use serde_json::{Value, json};

use crate::emit::scope::{self, Pods};

mod cel;
mod expressions;
mod program;

use crate::model::kinds::{APP_LISTS, ENV, POD_LISTS, PerAppList, PerMap, PerPodList, Placement, PodListKind};
use crate::model::status::ItemKind;
use crate::names;
use crate::templates::set::TemplateSet;
use crate::templates::template::{Piece, SeqItem, Template};
pub use cel::json_lit;
use cel::*;
use expressions::*;
use program::*;

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
                // A pod's pins choose kept versions, which only the webhook has (its namespace's
                // pins: `variables.handled`; match conditions cannot read the namespace).
                {"name": "no-pins", "expression": format!(
                    "!has(object.metadata.annotations) || !({} in object.metadata.annotations)",
                    lit(names::PINS_ANNOTATION))},
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

// ---------------------------------------------------------------------------------------------
// A template's compile context: its overridable values as CEL.

// ---------------------------------------------------------------------------------------------
// Expressions: MiniJinja AST to CEL.

// ---------------------------------------------------------------------------------------------
// Pieces: the template's compiled tree to CEL values.

// ---------------------------------------------------------------------------------------------
// Templates to plans.

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
    // Which version a pod gets rests on its workload's bucket, its pins and a halt kept in a
    // ConfigMap of the injector's: the webhook's.
    if template.rollout.is_some() {
        return Err("a new version rolls out (rollout:), and which version a pod gets depends on its workload, its pins and the rollout's halt, which only the webhook reads".to_owned());
    }
    // Sized values are computed from the app containers' quantities, which CEL cannot round.
    if spec.init_containers.iter().chain(&spec.sidecars).any(|item| item.sizing.is_some()) {
        return Err(
            "a container is sized from the app containers' resources (sizing:), which only the webhook computes"
                .to_owned(),
        );
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

// ---------------------------------------------------------------------------------------------
// The program: variables and the patch.

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
        let (set, errors) = TemplateSet::load(crate::templates::set::embedded_sources());
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
