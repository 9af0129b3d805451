//! Env merging through the whole engine: what the patch does to each form the app's variable can
//! take, and that re-injection, removal, idempotence and `/validate` all see exactly the entry the
//! injection added.

use serde_json::{Value, json};

use crate::claims::strip::strip_injection;
use crate::review::validate::{Verdict, validate_pod};
use crate::test_support::{apply, engine, opted_in, request};
use crate::*;

use crate::model::status;

fn agent(jar: &str) -> String {
    format!(
        r#"
default: true
inject:
  appContainers:
    env:
      - name: JAVA_TOOL_OPTIONS
        value: "-javaagent:{jar}"
        merge: {{append: " "}}
"#
    )
}

const PYTHON: &str = r#"
default: true
inject:
  appContainers:
    env:
      - {name: PYTHONPATH, value: /otel, merge: {prepend: ":"}}
"#;

/// The container's `env` and `envFrom` in each form the app's variable can take.
fn forms() -> Vec<(&'static str, Value)> {
    vec![
        (
            "literal",
            json!({"env": [{"name": "JAVA_TOOL_OPTIONS", "value": "-Xmx1g"}, {"name": "PYTHONPATH", "value": "/app"}]}),
        ),
        (
            "valueFrom",
            json!({"env": [{"name": "JAVA_TOOL_OPTIONS", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
        ),
        ("envFrom", json!({"envFrom": [{"configMapRef": {"name": "app-env"}}]})),
        ("nothing visible", json!({"env": [{"name": "OTHER", "value": "1"}]})),
        ("no env at all", json!({})),
    ]
}

fn pod(container: &Value) -> Value {
    let mut app = json!({"name": "app", "image": "app:1"});
    for (key, value) in container.as_object().unwrap() {
        app[key] = value.clone();
    }
    json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": {"containers": [app]}})
}

fn decide(engine: &Engine, pod: &Value) -> Outcome {
    engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome
}

fn injected(engine: &Engine, pod: &Value) -> Value {
    match decide(engine, pod) {
        Outcome::Inject(injection) => apply(pod, &injection.patch),
        other => panic!("expected an injection, got {other:?}"),
    }
}

fn env_of(pod: &Value) -> Vec<Value> {
    pod["spec"]["containers"][0]["env"].as_array().cloned().unwrap_or_default()
}

/// The value the kubelet gives the container: `envFrom` first (here `from_env_from`), then each
/// entry in order, `$(NAME)` expanded from what is defined so far, a later entry of a name winning.
fn effective(pod: &Value, name: &str, from_env_from: Option<&str>) -> Option<String> {
    let mut defined: std::collections::BTreeMap<String, String> = Default::default();
    if let Some(value) = from_env_from {
        defined.insert(name.to_owned(), value.to_owned());
    }
    for entry in env_of(pod) {
        let value = match entry.get("value").and_then(Value::as_str) {
            Some(text) => defined.iter().fold(text.to_owned(), |v, (k, d)| v.replace(&format!("$({k})"), d)),
            None => "<valueFrom>".to_owned(),
        };
        defined.insert(entry["name"].as_str().unwrap().to_owned(), value);
    }
    defined.remove(name)
}

#[test]
fn each_form_of_the_app_value_gets_the_fragment_added_and_keeps_its_own_entry() {
    let engine = engine(&[("java", &agent("/a.jar")), ("python", PYTHON)]);
    // (form, the container's JAVA_TOOL_OPTIONS, PYTHONPATH; envFrom supplies "FROM-CM")
    let expected = [
        ("literal", "-Xmx1g -javaagent:/a.jar", "/otel:/app"),
        ("valueFrom", "<valueFrom> -javaagent:/a.jar", "/otel"),
        ("envFrom", "FROM-CM -javaagent:/a.jar", "/otel:FROM-CM"),
        ("nothing visible", "-javaagent:/a.jar", "/otel"),
        ("no env at all", "-javaagent:/a.jar", "/otel"),
    ];
    for ((form, container), (_, java, python)) in forms().into_iter().zip(expected) {
        let original = pod(&container);
        let out = injected(&engine, &original);
        let env_from = (form == "envFrom").then_some("FROM-CM");
        assert_eq!(effective(&out, "JAVA_TOOL_OPTIONS", env_from).as_deref(), Some(java), "{form}");
        assert_eq!(effective(&out, "PYTHONPATH", env_from).as_deref(), Some(python), "{form}");
        // The author's entries are all still there, in order, first.
        let before = env_of(&original);
        assert_eq!(env_of(&out)[..before.len()], before[..], "{form}");
        // Injecting again changes nothing, and stripping gives back exactly the author's pod.
        assert!(matches!(decide(&engine, &out), Outcome::UpToDate(_)), "{form}");
        let status =
            status::InjectionStatus::parse(out["metadata"]["annotations"][names::STATUS_ANNOTATION].as_str().unwrap())
                .unwrap();
        let stripped = strip_injection(&out, &status);
        assert_eq!(env_entries(&stripped["spec"]["containers"][0]["env"]), env_entries(&json!(before)), "{form}");
    }
}

fn env_entries(list: &Value) -> Vec<Value> {
    list.as_array().cloned().unwrap_or_default()
}

#[test]
fn re_injection_after_a_template_change_swaps_the_fragment_and_removal_gives_back_the_authors_value() {
    let v1 = engine(&[("java", &agent("/v1.jar"))]);
    // Each version replaces the one before in the running set, which remembers it.
    let edit = |from: &Engine, text: &str| {
        let (set, errors) = from
            .templates
            .update([TemplateSource { name: "java".into(), text: text.into() }], &crate::templates::set::InProcess);
        assert!(errors.is_empty(), "{errors:?}");
        Engine::new(set, from.excluded_namespaces.clone())
    };
    let v2 = edit(&v1, &agent("/v2.jar"));
    let without_env = edit(&v2, "default: true\ninject:\n  labels: {agent: none}\n");
    for (form, container) in forms() {
        let original = pod(&container);
        let with_v1 = injected(&v1, &original);
        let with_v2 = injected(&v2, &with_v1);
        assert_eq!(with_v2, injected(&v2, &original), "{form}: re-injection equals a fresh injection");
        let fragments = env_of(&with_v2).iter().filter(|e| e.to_string().contains(".jar")).count();
        assert_eq!(fragments, 1, "{form}: exactly one fragment, the new one: {:?}", env_of(&with_v2));
        let removed = injected(&without_env, &with_v2);
        assert_eq!(env_of(&removed), env_of(&original), "{form}: removal gives back exactly the author's env");
    }
}

/// The CI issue's case: the old fragment holds the new one (an agent's options shortened, `=:`
/// to `=`). The entry being replaced is the injection's, not the author's value, so the new
/// fragment is added, whatever form the app's value has.
#[test]
fn a_fragment_shortened_by_an_edit_is_still_merged_on_re_injection() {
    let merging = |name: &str, fragment: &str, how: &str| {
        format!(
            "default: true\ninject:\n  appContainers:\n    env:\n      - {{name: {name}, value: {fragment:?}, merge: {{{how}}}}}\n"
        )
    };
    // (variable, how it merges, old fragment, new fragment)
    let edits = [
        ("PATH", "prepend: \":\"", "=:", "="),
        ("JAVA_TOOL_OPTIONS", "append: \" \"", "-javaagent:/a.jar -Dx=1", "-javaagent:/a.jar"),
    ];
    for (name, how, old, new) in edits {
        let v1 = engine(&[("agent", &merging(name, old, how))]);
        let (set, errors) = v1.templates.update(
            [TemplateSource { name: "agent".into(), text: merging(name, new, how) }],
            &crate::templates::set::InProcess,
        );
        assert!(errors.is_empty(), "{errors:?}");
        let v2 = Engine::new(set, v1.excluded_namespaces.clone());
        for (form, container) in forms() {
            let original = pod(&container);
            let fresh = injected(&v2, &original);
            let reinjected = injected(&v2, &injected(&v1, &original));
            assert_eq!(env_of(&reinjected), env_of(&fresh), "{name} {form}: {old:?} -> {new:?}");
            assert!(
                env_of(&fresh).iter().any(|e| e["value"].as_str().is_some_and(|v| v.contains(new))),
                "{name} {form}"
            );
        }
    }
}

#[test]
fn two_templates_merging_into_one_variable_chain_in_order() {
    let engine = engine(&[("a", &agent("/a.jar")), ("b", &agent("/b.jar"))]);
    let out = injected(&engine, &pod(&forms()[0].1));
    assert_eq!(
        effective(&out, "JAVA_TOOL_OPTIONS", None).as_deref(),
        Some("-Xmx1g -javaagent:/a.jar -javaagent:/b.jar")
    );
    assert!(matches!(decide(&engine, &out), Outcome::UpToDate(_)));
}

#[test]
fn a_fragment_the_app_value_already_holds_is_not_added_again() {
    let engine = engine(&[("java", &agent("/a.jar"))]);
    let original = pod(&json!({"env": [{"name": "JAVA_TOOL_OPTIONS", "value": "-Xmx1g -javaagent:/a.jar"}]}));
    let Outcome::Inject(injection) = decide(&engine, &original) else { panic!("expected an injection") };
    assert_eq!(env_of(&apply(&original, &injection.patch)), env_of(&original));
    assert_eq!(injection.status.skipped[0].kind, status::ItemKind::EnvMerge);
}

#[test]
fn validate_refuses_a_pod_whose_merged_entry_a_later_mutator_dropped_or_changed() {
    let engine = engine(&[("java", &agent("/a.jar"))]);
    let out = injected(&engine, &pod(&forms()[0].1));
    let verdict = |pod: Value| validate_pod(&engine, &request(pod, opted_in("shop", &[])));
    assert_eq!(verdict(out.clone()), Verdict::Allowed(vec![]));
    // (change by a later mutator)
    let changes: [fn(&mut Vec<Value>); 2] =
        [|env| drop(env.pop()), |env| env[2]["value"] = json!("$(JAVA_TOOL_OPTIONS)")];
    for change in changes {
        let mut mutated = out.clone();
        let mut env = env_of(&mutated);
        change(&mut env);
        mutated["spec"]["containers"][0]["env"] = json!(env);
        match verdict(mutated) {
            Verdict::Denied(message) => assert!(
                message.contains(
                    "merged into env var \"JAVA_TOOL_OPTIONS\" of container \"app\" was removed after injection"
                ),
                "{message}"
            ),
            other => panic!("expected a denial, got {other:?}"),
        }
    }
}

/// A container may set a name twice (the API server only warns) and the kubelet runs with the
/// last: whether the agent is loaded already is decided on that value, never on the first entry.
#[test]
fn the_last_entry_of_a_name_decides_whether_the_agent_is_loaded_already() {
    let agent_entry = json!({"name": "JAVA_TOOL_OPTIONS", "value": "-javaagent:/a.jar"});
    let xmx = json!({"name": "JAVA_TOOL_OPTIONS", "value": "-Xmx1g"});
    let extends = json!({"name": "JAVA_TOOL_OPTIONS", "value": "$(JAVA_TOOL_OPTIONS) -Xmx1g"});
    // (the author's env, what the container runs with, whether the merge is skipped)
    let cases = [
        (json!([agent_entry, xmx]), "-Xmx1g -javaagent:/a.jar", false),
        (json!([xmx, agent_entry]), "-javaagent:/a.jar", true),
        (json!([agent_entry, extends]), "-javaagent:/a.jar -Xmx1g", true),
    ];
    for enforced in [false, true] {
        let text = agent("/a.jar").replace("default: true", &format!("default: true\nenforced: {enforced}"));
        let engine = engine(&[("java", &text)]);
        for (env, runs_with, skipped) in &cases {
            let original = pod(&json!({ "env": env }));
            let Outcome::Inject(injection) = decide(&engine, &original) else { panic!("{env}: expected an injection") };
            let out = apply(&original, &injection.patch);
            assert_eq!(
                effective(&out, "JAVA_TOOL_OPTIONS", None).as_deref(),
                Some(*runs_with),
                "{env} enforced {enforced}"
            );
            let skips: Vec<_> = injection.status.skipped.iter().map(|s| s.kind).collect();
            assert_eq!(skips == [status::ItemKind::EnvMerge], *skipped, "{env} enforced {enforced}: {skips:?}");
            assert!(matches!(decide(&engine, &out), Outcome::UpToDate(_)), "{env}: injecting again adds nothing");
        }
    }
}

/// An enforced template's plain env var: the pod's entry of that name stands only when the
/// value the container runs with is exactly the template's.
#[test]
fn an_enforced_env_var_counts_only_as_the_value_the_container_runs_with() {
    let text =
        "default: true\nenforced: true\ninject:\n  appContainers:\n    env:\n      - {name: AUDIT, value: \"on\"}\n";
    let engine = engine(&[("audit", text)]);
    let on = json!({"name": "AUDIT", "value": "on"});
    let off = json!({"name": "AUDIT", "value": "off"});
    let extended = json!({"name": "AUDIT", "value": "$(AUDIT)-but-off"});
    // (the author's env, the refusal's words, or None: admitted with the pod's entry standing)
    let cases = [
        (
            json!([on, off]),
            Some("the pod's env var \"AUDIT\" of container \"app\" is not the template's (value is \"off\""),
        ),
        (json!([off, on]), None),
        (json!([on, extended]), Some("is extended by a later entry of its name (\"$(AUDIT)-but-off\")")),
        (json!([on]), None),
    ];
    for (env, refusal) in cases {
        let original = pod(&json!({ "env": env }));
        match (decide(&engine, &original), refusal) {
            (Outcome::Denied(denial), Some(words)) => assert!(denial.to_string().contains(words), "{env}: {denial}"),
            (Outcome::Inject(injection), None) => {
                let out = apply(&original, &injection.patch);
                assert_eq!(effective(&out, "AUDIT", None).as_deref(), Some("on"), "{env}");
            }
            (other, _) => panic!("{env}: {other:?}"),
        }
    }
}

/// A later mutator that appends an entry of a merged variable's name takes the agent away
/// without touching the merged entry: `/validate` refuses it, and an entry that only extends
/// the value is fine.
#[test]
fn validate_refuses_a_merged_entry_overridden_by_a_later_one() {
    let engine = engine(&[("java", &agent("/a.jar"))]);
    let out = injected(&engine, &pod(&forms()[0].1));
    let verdict = |pod: Value| validate_pod(&engine, &request(pod, opted_in("shop", &[])));
    let appended = |value: &str| {
        let mut mutated = out.clone();
        let mut env = env_of(&mutated);
        env.push(json!({"name": "JAVA_TOOL_OPTIONS", "value": value}));
        mutated["spec"]["containers"][0]["env"] = json!(env);
        mutated
    };
    match verdict(appended("-Xmx2g")) {
        Verdict::Denied(message) => assert!(
            message.contains("was overridden after injection by a later entry of \"JAVA_TOOL_OPTIONS\""),
            "{message}"
        ),
        other => panic!("expected a denial, got {other:?}"),
    }
    assert_eq!(verdict(appended("$(JAVA_TOOL_OPTIONS) -Dmore")), Verdict::Allowed(vec![]));
}

/// A copy of an injected pod (its status claiming the enforced env var) that appends an entry
/// extending it: the claimed entry is there, exactly, but the container would run with another
/// value, so it is not the injector's own and an enforced template refuses the pod; `/validate`
/// refuses such an entry appended by a later mutator.
#[test]
fn an_injected_enforced_env_var_extended_by_a_copy_is_refused() {
    let text =
        "default: true\nenforced: true\ninject:\n  appContainers:\n    env:\n      - {name: AUDIT, value: \"on\"}\n";
    let engine = engine(&[("audit", text)]);
    let out = injected(&engine, &pod(&json!({"env": [{"name": "OTHER", "value": "1"}]})));
    assert!(matches!(decide(&engine, &out), Outcome::UpToDate(_)));
    for appended in ["$(AUDIT)-but-off", "$$(AUDIT)"] {
        let mut copy = out.clone();
        copy["spec"]["containers"][0]["env"].as_array_mut().unwrap().push(json!({"name": "AUDIT", "value": appended}));
        match decide(&engine, &copy) {
            Outcome::Denied(denial) => assert!(denial.to_string().contains("AUDIT"), "{appended}: {denial}"),
            other => panic!("{appended}: expected a refusal, got {other:?}"),
        }
        let verdict = validate_pod(&engine, &request(copy, opted_in("shop", &[])));
        assert!(matches!(verdict, Verdict::Denied(_)), "{appended}: {verdict:?}");
    }
}
