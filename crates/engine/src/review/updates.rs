//! Updates to a running pod that an enforced template forbids: in-place resizes of what it
//! injected (KEP-1287: `pods/resize`), and ephemeral containers that target it.
//!
//! A pod's author may resize any container in place, the injected ones included; for a template
//! the operator enforces, that would let the author starve a mandated sidecar (`cpu: 1m`) while
//! the pod keeps its "injected" status. So a resize may raise what an enforced template's
//! containers request or are limited to, never take it below what the template sets for this pod.
//! Only containers whose resources the update changes are checked, so an unrelated update never
//! fails on an earlier state; other containers, and templates that are not enforced, are the
//! pod's business (an `enforced: audit` template reports what `enforced: true` would refuse).
//!
//! The enforcement policy does the same without the injector for the resources that are equal for
//! every pod (`enforce::Requirements`), and this check for all of them. An ephemeral container
//! that targets an injected container ([`ephemeral_targets`]) joins its process namespace.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use crate::checks::resize::{floor_of, quantity_text};
use crate::claims::strip::strip_injection;
use crate::injection::image_volumes::VolumeForms::Recorded;
use crate::injection::render::{self, RenderedTemplate, Subject};
use crate::model::kinds::CONTAINER_LISTS;
use crate::model::status::{InjectionStatus, ItemKind};
use crate::templates::template::Template;
use crate::{Engine, PodRequest, pod, quantity, workload};

/// What an update does that an enforced (or audit) template forbids: one of its containers
/// resized below what it sets, or targeted by an ephemeral container (`enforce::ephemeral_targets`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    /// The template.
    pub template: String,
    /// `enforced: audit`: reported, not refused.
    pub audit: bool,
    /// What breaks what, one sentence.
    pub message: String,
}

/// The shortfalls of `request`'s pod (after an update) against the enforced templates `status`
/// names, in the containers whose resources changed from `old`.
pub fn shortfalls(engine: &Engine, request: &PodRequest, old: &Value, status: &InjectionStatus) -> Vec<Breach> {
    let new = &*request.pod;
    let enforced = enforced_templates(engine, status);
    // The containers the injection added, and the pod's own exact copies that stood in for an
    // enforced template's (recorded as skipped): the author may not starve those either.
    let resized: BTreeSet<&str> = guarded_names(status, &enforced)
        .map(String::as_str)
        .filter(|name| resources(new, name) != resources(old, name))
        .collect();
    if enforced.is_empty() || resized.is_empty() {
        return Vec::new();
    }
    let mut found = Vec::new();
    for (template, rendered) in render_as_authored(request, status, &enforced) {
        let shortfall = |message| Breach { template: template.name.to_string(), audit: !template.enforced, message };
        let rendered = match rendered {
            Ok(rendered) => rendered,
            Err(e) => {
                found.push(shortfall(format!(
                    "the template does not render for the pod, so the resize cannot be checked: {e}"
                )));
                continue;
            }
        };
        for container in rendered.init_containers.iter().chain(&rendered.sidecars) {
            let Some(name) = container.get("name").and_then(Value::as_str).filter(|n| resized.contains(n)) else {
                continue;
            };
            for (field, resource, floor) in floor_of(container.get("resources")) {
                let now = resources(new, name).and_then(|r| r.get(field)).and_then(|m| m.get(&resource));
                let now_text = now.map(quantity_text);
                let (Some(floor_nanos), now_nanos) = (quantity::parse(&floor), now.and_then(quantity::of)) else {
                    continue;
                };
                // A value sized from the app moves with it: an app resized up in place since the
                // injection raises the size for the pod now, and a resize that does not lower
                // the agent's value is no shortfall (the floor holds only against lowering it).
                let sized = rendered.sized_fields.iter().any(|(c, f, r)| c == name && *f == field && *r == resource);
                let was = resources(old, name).and_then(|r| r.get(field)).and_then(|m| m.get(&resource));
                let raised = now_nanos.zip(was.and_then(quantity::of)).is_some_and(|(now, was)| now >= was);
                if now_nanos.is_none_or(|n| n < floor_nanos) && !(sized && raised) {
                    found.push(shortfall(format!(
                        "container {name:?}'s resources.{field}.{resource} is {} after the resize, below the {floor} template {} sets",
                        now_text.unwrap_or_else(|| "unset".to_owned()),
                        template.name
                    )));
                }
            }
        }
    }
    found
}

/// The enforced (or audit) templates that `status` names: the version it names where the set has
/// it (two versions serve while a rollout is under way), else the one in service.
pub fn enforced_templates<'e>(engine: &'e Engine, status: &InjectionStatus) -> Vec<&'e Template> {
    status
        .templates
        .iter()
        .filter_map(|t| engine.templates.version(&t.name, &t.hash).or_else(|| engine.templates.get(&t.name)))
        .map(|t| &**t)
        .filter(|t| t.enforced || t.audit)
        .collect()
}

/// The containers an enforced template's guard may cover: every one the injection added (any
/// template's: rendering tells whose), and the pod's own exact copies that stood in for one of
/// `enforced` (recorded as skipped).
pub fn guarded_names<'s>(status: &'s InjectionStatus, enforced: &[&Template]) -> impl Iterator<Item = &'s String> {
    let copies = status.skipped.iter().filter(|s| {
        matches!(s.kind, ItemKind::Sidecar | ItemKind::InitContainer) && enforced.iter().any(|t| *t.name == *s.template)
    });
    CONTAINER_LISTS.iter().flat_map(|l| (l.claimed)(status)).chain(copies.map(|s| &s.name))
}

/// Each of `templates` rendered for `request`'s pod as its author wrote it (the injection
/// stripped), as at its creation.
pub fn render_as_authored<'t>(
    request: &PodRequest,
    status: &InjectionStatus,
    templates: &[&'t Template],
) -> Vec<(&'t Template, Result<RenderedTemplate, String>)> {
    let authored = Arc::new(strip_injection(&request.pod, status));
    let annotations = pod::string_map(&authored, "annotations").unwrap_or_default();
    let owner = request.workload.clone().unwrap_or_else(|| workload::Workload::of_pod(&authored));
    templates
        .iter()
        .map(|template| {
            let subject = Subject::new(authored.clone(), &owner);
            let recorded = Recorded(&status.image_volumes);
            let rendered = render::render(template, &subject, &annotations, &request.namespace, recorded);
            (*template, rendered.map_err(|e| e.to_string()))
        })
        .collect()
}

/// The ephemeral containers an update adds (`pods/ephemeralcontainers`: `kubectl debug
/// --target`) that target a container an enforced (or audit) template `status` names injected,
/// or the pod's exact copy that stood in for one: an ephemeral container with a target joins that
/// container's process namespace, where it can read the agent's memory, signal or stop it (a
/// stopped container of a running pod is restarted only by its restart policy, and a debugger can
/// keep it stopped). One breach per such ephemeral container. Ephemeral containers already in
/// the pod were checked when they were added (they can be neither changed nor removed).
pub fn ephemeral_targets(request: &PodRequest, old: &Value, status: &InjectionStatus, engine: &Engine) -> Vec<Breach> {
    let ephemeral = |pod: &Value| -> Vec<(String, Option<String>)> {
        let list = pod.pointer("/spec/ephemeralContainers").and_then(Value::as_array);
        list.into_iter()
            .flatten()
            .map(|c| {
                let text = |field: &str| c.get(field).and_then(Value::as_str).map(str::to_owned);
                (text("name").unwrap_or_default(), text("targetContainerName"))
            })
            .collect()
    };
    let before: Vec<String> = ephemeral(old).into_iter().map(|(name, _)| name).collect();
    let enforced = enforced_templates(engine, status);
    let guarded: Vec<&String> = guarded_names(status, &enforced).collect();
    let added: Vec<(String, String)> = ephemeral(&request.pod)
        .into_iter()
        .filter(|(name, _)| !before.contains(name))
        .filter_map(|(name, target)| Some((name, target.filter(|t| guarded.contains(&t))?)))
        .collect();
    if added.is_empty() {
        return Vec::new();
    }
    let mut found = Vec::new();
    for (template, rendered) in render_as_authored(request, status, &enforced) {
        // A template that no longer renders for the pod keeps every guarded container.
        let owns = |target: &str| match &rendered {
            Ok(rendered) => rendered
                .init_containers
                .iter()
                .chain(&rendered.sidecars)
                .any(|c| c.get("name").and_then(Value::as_str) == Some(target)),
            Err(_) => true,
        };
        for (name, target) in added.iter().filter(|(_, target)| owns(target)) {
            found.push(Breach {
                template: template.name.to_string(),
                audit: !template.enforced,
                message: format!(
                    "ephemeral container {name:?} targets {target:?}, the template's container (it would share its processes, and could stop it): target the app's container, or debug a copy of the pod"
                ),
            });
        }
    }
    found
}

/// The `resources` of the container (or init container) `name`.
fn resources<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod::container(pod, name).and_then(|c| c.get("resources"))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::review::validate::{Verdict, validate_pod_update};
    use crate::test_support::{apply, engine, opted_in, request};
    use crate::{Engine, Outcome};

    /// An enforced agent with a floor (a native sidecar), an audit one and an ordinary one
    /// (classic sidecars), all for every pod.
    const ENFORCED: &str = r#"
enforced: true
sidecarMode: native
podSelector: {}
inject:
  sidecars:
    - name: agent
      image: agent:1
      resources: {requests: {cpu: 50m, memory: 32Mi}, limits: {memory: 64Mi}}
"#;
    const AUDIT: &str = r#"
default: true
enforced: audit
sidecarMode: container
podSelector: {}
inject:
  sidecars:
    - {name: auditor, image: auditor:1, resources: {requests: {cpu: "0.1"}}}
"#;
    const PLAIN: &str = r#"
default: true
sidecarMode: container
inject:
  sidecars:
    - {name: logs, image: logs:1, resources: {requests: {cpu: 20m}}}
"#;

    fn stored(engine: &Engine) -> Value {
        let pod = json!({
            "metadata": {"generateName": "web-", "namespace": "shop"},
            "spec": {"containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "200m"}}}]}
        });
        let decision = engine.evaluate(&request(pod.clone(), opted_in("shop", &[])));
        let Outcome::Inject(injection) = decision.outcome else { panic!("not injected: {:?}", decision.outcome) };
        apply(&pod, &injection.patch)
    }

    /// Sets `spec.<list>[name=<container>].resources.<path>` (a `null` value removes it).
    fn resize(pod: &Value, container: &str, path: &[&str], value: Value) -> Value {
        let mut pod = pod.clone();
        for list in ["containers", "initContainers"] {
            for item in pod["spec"][list].as_array_mut().into_iter().flatten() {
                if item["name"] == container {
                    let mut at = &mut item["resources"];
                    for key in &path[..path.len() - 1] {
                        at = &mut at[*key];
                    }
                    match value {
                        Value::Null => drop(at.as_object_mut().unwrap().remove(path[path.len() - 1])),
                        ref value => at[path[path.len() - 1]] = value.clone(),
                    }
                }
            }
        }
        pod
    }

    #[test]
    fn an_enforced_sidecar_is_not_resized_below_its_template() {
        let engine = engine(&[("enforced", ENFORCED), ("audit", AUDIT), ("plain", PLAIN)]);
        let stored = stored(&engine);
        let mut below_floor = resize(&stored, "agent", &["requests", "cpu"], json!("10m"));
        below_floor["metadata"]["labels"] = json!({"team": "a"});
        // (case, new pod, Some(refusal fragment) or None, audited templates)
        let cases: Vec<(&str, Value, Option<&str>, &[&str])> = vec![
            (
                "enforced cpu request below",
                resize(&stored, "agent", &["requests", "cpu"], json!("10m")),
                Some(
                    "container \"agent\"'s resources.requests.cpu is 10m after the resize, below the 50m template enforced sets",
                ),
                &[],
            ),
            (
                "enforced memory limit removed",
                resize(&stored, "agent", &["limits", "memory"], Value::Null),
                Some("resources.limits.memory is unset after the resize, below the 64Mi"),
                &[],
            ),
            (
                "enforced as a number below",
                resize(&stored, "agent", &["requests", "cpu"], json!(0.01)),
                Some("requests.cpu is 0.01 after"),
                &[],
            ),
            ("enforced raised", resize(&stored, "agent", &["requests", "cpu"], json!("500m")), None, &[]),
            ("enforced as a number above", resize(&stored, "agent", &["requests", "cpu"], json!(1)), None, &[]),
            (
                "enforced memory in other units",
                resize(&stored, "agent", &["requests", "memory"], json!("33554432")),
                None,
                &[],
            ),
            ("the app's container", resize(&stored, "web", &["requests", "cpu"], json!("1m")), None, &[]),
            ("an ordinary template's sidecar", resize(&stored, "logs", &["requests", "cpu"], json!("1m")), None, &[]),
            (
                "an audit template's sidecar",
                resize(&stored, "auditor", &["requests", "cpu"], json!("1m")),
                None,
                &["audit"],
            ),
        ];
        for (case, new, refusal, audited) in cases {
            let checked = validate_pod_update(&engine, &stored, &request(new, opted_in("shop", &[])));
            match (refusal, &checked.verdict) {
                (Some(fragment), Verdict::Denied(message)) => {
                    assert!(message.contains(fragment), "{case}: {message}");
                    assert!(message.contains("template enforced is enforced for this pod"), "{case}: {message}");
                }
                (None, Verdict::Allowed(warnings)) => {
                    assert_eq!(warnings.len(), audited.len(), "{case}: {warnings:?}");
                    if let Some(warning) = warnings.first() {
                        assert!(warning.contains("enforced: audit") && warning.contains("\"auditor\""), "{warning}");
                    }
                }
                (expected, verdict) => panic!("{case}: expected {expected:?}, got {verdict:?}"),
            }
            assert_eq!(checked.audited, audited, "{case}");
        }
        // The pod's own exact copy of the enforced sidecar stood in for it: guarded the same way.
        let exact = json!({"name": "agent", "image": "agent:1", "restartPolicy": "Always",
                           "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}});
        let mut own = stored.clone();
        own["spec"]["initContainers"] = json!([exact]);
        own["metadata"]["annotations"].as_object_mut().unwrap().clear();
        own["metadata"]["labels"].as_object_mut().unwrap().clear();
        own["spec"]["containers"] = json!([stored["spec"]["containers"][0]]);
        let decision = engine.evaluate(&request(own.clone(), opted_in("shop", &[])));
        let Outcome::Inject(injection) = decision.outcome else { panic!("not injected: {:?}", decision.outcome) };
        assert!(injection.status.skipped.iter().any(|s| s.name == "agent"), "{:?}", injection.status);
        let own = apply(&own, &injection.patch);
        let starved = resize(&own, "agent", &["requests", "cpu"], json!("1m"));
        let checked = validate_pod_update(&engine, &own, &request(starved, opted_in("shop", &[])));
        assert!(
            matches!(&checked.verdict, Verdict::Denied(m) if m.contains("\"agent\"'s resources.requests.cpu is 1m")),
            "{checked:?}"
        );

        // Only what the update resizes is checked: an earlier shortfall does not block a label.
        let mut relabelled = below_floor.clone();
        relabelled["metadata"]["labels"] = json!({"team": "b"});
        let checked = validate_pod_update(&engine, &below_floor, &request(relabelled, opted_in("shop", &[])));
        assert_eq!(checked.verdict, Verdict::Allowed(Vec::new()));
    }

    /// An enforced agent sized from the app: its floor is the value sized for the pod.
    #[test]
    fn an_enforced_sized_sidecar_is_not_resized_below_its_size_for_the_pod() {
        let sized = ENFORCED.replace(
            "      resources: {requests: {cpu: 50m, memory: 32Mi}, limits: {memory: 64Mi}}\n",
            "      sizing: {requests: {cpu: {from: sum, fraction: 0.5}}}\n",
        );
        let engine = engine(&[("enforced", &sized)]);
        let stored = stored(&engine);
        let agent = stored["spec"]["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "agent").unwrap();
        assert_eq!(agent["resources"], json!({"requests": {"cpu": "100m"}}), "half the app's 200m");
        // (new cpu request, refused)
        for (cpu, refused) in [("50m", true), ("100m", false), ("150m", false)] {
            let new = resize(&stored, "agent", &["requests", "cpu"], json!(cpu));
            let checked = validate_pod_update(&engine, &stored, &request(new, opted_in("shop", &[])));
            match (&checked.verdict, refused) {
                (Verdict::Denied(message), true) => assert!(
                    message.contains(
                        "resources.requests.cpu is 50m after the resize, below the 100m template enforced sets"
                    ),
                    "{message}"
                ),
                (Verdict::Allowed(_), false) => {}
                (verdict, _) => panic!("{cpu}: {verdict:?}"),
            }
        }
        // The app resized up in place (the size for the pod now is 1 CPU): the agent may still
        // be resized up below that, not down.
        let grown = resize(&stored, "web", &["requests", "cpu"], json!("2"));
        for (cpu, refused) in [("150m", false), ("50m", true)] {
            let new = resize(&grown, "agent", &["requests", "cpu"], json!(cpu));
            let checked = validate_pod_update(&engine, &grown, &request(new, opted_in("shop", &[])));
            assert_eq!(matches!(checked.verdict, Verdict::Denied(_)), refused, "{cpu}: {:?}", checked.verdict);
        }
        // The enforcement policy compares no floor for it (it is not the same for every pod).
        let template = crate::templates::template::Template::load("enforced", &sized).unwrap();
        let requirements = crate::checks::enforce::Requirements::of(&template, true);
        assert!(
            requirements.unchecked.iter().any(|u| u.contains("\"agent\": resources is not the same for every pod")),
            "{:?}",
            requirements.unchecked
        );
    }

    #[test]
    fn the_policy_gets_the_floor_that_is_the_same_for_every_pod() {
        // What the enforcement policy checks without the injector: the floor equal for every pod.
        let engine = engine(&[("enforced", ENFORCED)]);
        let template = engine.templates.get("enforced").unwrap();
        let data = crate::checks::enforce::Requirements::of(template, true).params_data();
        assert_eq!(data["resources.agent"], "requests.cpu=50m requests.memory=32Mi limits.memory=64Mi");
        assert_eq!((data["initContainers"].as_str(), data["containers"].as_str()), ("agent", ""));
        // A classic sidecar stays one on a cluster that runs native ones (its mode decides).
        let classic = ENFORCED.replace("sidecarMode: native", "sidecarMode: container");
        let engine = self::engine(&[("enforced", &classic)]);
        let data =
            crate::checks::enforce::Requirements::of(engine.templates.get("enforced").unwrap(), true).params_data();
        assert_eq!((data["initContainers"].as_str(), data["containers"].as_str()), ("", "agent"));
        let overridable = ENFORCED
            .replace("podSelector: {}", "podSelector: {}\nvalues: {cpu: 50m}\noverridable: [cpu]")
            .replace("cpu: 50m, memory", "cpu: \"{{ values.cpu }}\", memory");
        let engine = self::engine(&[("enforced", &overridable)]);
        let requirements = crate::checks::enforce::Requirements::of(engine.templates.get("enforced").unwrap(), true);
        assert!(!requirements.params_data().contains_key("resources.agent"));
        assert!(
            requirements.unchecked.iter().any(|u| u.contains("\"agent\": resources is not the same for every pod")),
            "{:?}",
            requirements.unchecked
        );
        // A quantity nobody could read (the policy's `quantity()` included) never loads.
        let unreadable = ENFORCED.replace("limits: {memory: 64Mi}", "limits: {memory: 64Mi, example.com/gpu: lots}");
        let (_, errors) =
            crate::TemplateSet::load([crate::TemplateSource { name: "enforced".into(), text: unreadable }]);
        assert!(
            errors.iter().any(|e| e.message.contains("resources.limits.example.com/gpu: \"lots\" is not a quantity")),
            "{errors:?}"
        );
    }
}
