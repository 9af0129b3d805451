//! The validating checks: a pod after every mutator has run, and template ConfigMaps.
//!
//! For a pod in scope the checks are, in order:
//! 1. it carries a readable status annotation (else the injection did not happen);
//! 2. every container and init container the status names exists, and every native sidecar still
//!    has `restartPolicy: Always`;
//! 3. when the status names the templates and hashes this replica serves, the injection is
//!    recomputed from the pod minus what the status says was injected, and every field the
//!    templates set must still hold its value. Fields added by other mutators (defaults, extra env,
//!    extra mounts) are fine; changed or removed ones are not.
//!
//! A status naming other template hashes is allowed with a warning: during a template rollout the
//! mutating call may have reached a replica whose cache is a second ahead of this one, and a
//! validating check must not turn that race into a refused pod.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::claims::strip::strip_injection;
use crate::drift::in_place;
use crate::injection::env_merge;
use crate::model::compare::{first_difference, without_resources};
use crate::model::kinds::{APP_LISTS, CONTAINER_LISTS, INIT_CONTAINERS, POD_LISTS};
use crate::model::status::{InjectionStatus, TemplateRef};
use crate::review::updates;
use crate::templates::set::{PreCheck, TemplateSet, TemplateSource};
use crate::templates::template::{Template, TemplateError};
use crate::{Engine, Outcome, PodRequest, injection::select, names, pod};

/// The verdict of a validating check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed, possibly with warnings for the user.
    Allowed(Vec<String>),
    /// Denied with a message naming what is wrong.
    Denied(String),
}

/// Message when an in-scope pod has no status annotation; the ValidatingAdmissionPolicy in
/// `deploy/` uses the same words.
pub const NOT_INJECTED_MESSAGE: &str = "sidecar injection did not happen: is the sidecar-injector running? (the namespace is opted in with sidecar-injector.io/inject=enabled and the pod has no sidecar-injector.io/status annotation)";

/// Checks a pod as stored after all mutations.
pub fn validate_pod(engine: &Engine, request: &PodRequest) -> Verdict {
    let pod = &*request.pod;
    let (labels, annotations) = match (pod::string_map(pod, "labels"), pod::string_map(pod, "annotations")) {
        (Ok(l), Ok(a)) => (l, a),
        (Err(e), _) | (_, Err(e)) => return Verdict::Denied(format!("the pod is malformed: {e}")),
    };
    let Ok(choice) =
        select::select(&engine.templates, &labels, &annotations, &request.namespace, &engine.excluded_namespaces)
    else {
        return Verdict::Allowed(Vec::new());
    };
    let Some(text) = annotations.get(names::STATUS_ANNOTATION) else {
        return Verdict::Denied(NOT_INJECTED_MESSAGE.to_owned());
    };
    let status = match InjectionStatus::parse(text) {
        Ok(status) => status,
        Err(e) => {
            return Verdict::Denied(format!("the {} annotation is not valid: {e}", names::STATUS_ANNOTATION));
        }
    };
    if let Err(message) = check_named_items(pod, &status) {
        return Verdict::Denied(message);
    }
    // The versions this pod gets (a rollout under way, or a pin, may decide another than the one
    // in service): what its injection is compared with.
    let mut choice = choice;
    let selected = match engine.versions_for(request, &annotations, &mut choice) {
        Ok(selected) => selected,
        // The mutating webhook refuses such a pod; this replica not knowing a version another
        // one knew (it has not read the kept ConfigMap yet) is a race, not a reason to refuse.
        Err(denial) => {
            return Verdict::Allowed(vec![format!("{denial}; its sidecars were not compared with the templates")]);
        }
    };
    let current: Vec<TemplateRef> =
        selected.iter().map(|t| TemplateRef { name: t.name.to_string(), hash: t.hash.clone() }).collect();
    if !status.is_current(current.iter().map(|t| (t.name.as_str(), t.hash.as_str()))) {
        return Verdict::Allowed(vec![format!(
            "the pod was injected with templates [{}] but this injector now serves [{}]; its sidecars were not compared with the templates",
            describe_refs(&status.templates),
            describe_refs(&current)
        )]);
    }
    match compare_with_templates(engine, request, &status) {
        Ok(()) => Verdict::Allowed(Vec::new()),
        Err(message) => Verdict::Denied(message),
    }
}

/// What a pod UPDATE's check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateVerdict {
    /// Allowed (with warnings) or denied.
    pub verdict: Verdict,
    /// `enforced: audit` templates whose containers the update resized below what they set, which
    /// `enforced: true` would refuse (each also a warning).
    pub audited: Vec<String>,
}

impl From<Verdict> for UpdateVerdict {
    fn from(verdict: Verdict) -> Self {
        UpdateVerdict { verdict, audited: Vec::new() }
    }
}

/// Checks a pod UPDATE (`old` → `request.pod`), the in-place resizes of `pods/resize` included:
/// what an injection added changes only by a new injection, which happens at CREATE, or by the
/// one update that brings a stale pod to the template versions in service (`drift::in_place`:
/// images and the status annotation, exactly as computed here). Otherwise the status annotation
/// and the `injected` label stay as written (a pod that rewrote them would mislead `drift` and
/// every later check), the image of every container the status names as injected, or that an
/// enforced template requires, stays (images are the one container field a pod UPDATE may
/// change), an enforced template's containers are not resized below what it sets (`resize`), and
/// no ephemeral container the update adds targets one of them (`enforce::ephemeral_targets`).
pub fn validate_pod_update(engine: &Engine, old: &Value, request: &PodRequest) -> UpdateVerdict {
    let new = &*request.pod;
    let advice = "an injection changes only when the pod is created again (delete it, or restart its workload with `sidecar-injector drift --restart`), or by an update to the template versions in service that changes only images (`sidecar-injector drift --in-place`)";
    let old_status =
        old.get("metadata").and_then(|m| m.get("annotations")).and_then(|a| a.get(names::STATUS_ANNOTATION));
    let Some(status) = old_status.and_then(Value::as_str).and_then(|s| InjectionStatus::parse(s).ok()) else {
        return match unchanged_injection(old, new, None, advice) {
            Ok(()) => Verdict::Allowed(Vec::new()),
            Err(denied) => Verdict::Denied(denied),
        }
        .into();
    };
    if let Err(denied) = unchanged_injection(old, new, Some((engine, &status)), advice) {
        // The one update of what was injected there is: to the versions in service, images only.
        let old_request = PodRequest { pod: Arc::new(old.clone()), ..request.clone() };
        match in_place::in_place_update(engine, &old_request) {
            Ok(update) if is_exactly(engine, &update, &status, old, new) => {}
            Ok(update) => {
                return Verdict::Denied(format!(
                    "{denied} (the one update to the versions in service is {}, with their status annotation)",
                    update.describe()
                ))
                .into();
            }
            Err(reason) => {
                return Verdict::Denied(format!(
                    "{denied} (no update to the versions in service is possible: {reason})"
                ))
                .into();
            }
        }
    }
    let checks = [
        (
            updates::shortfalls(engine, request, old, &status),
            "; resize within what the template sets (the operator changes the template to lower it)",
        ),
        (updates::ephemeral_targets(request, old, &status, engine), ""),
    ];
    let (mut warnings, mut audited) = (Vec::new(), Vec::new());
    for (breaches, advice) in checks {
        let (audit, refused): (Vec<_>, Vec<_>) = breaches.into_iter().partition(|s| s.audit);
        if let Some(first) = refused.first() {
            let messages = refused.iter().map(|s| s.message.as_str()).collect::<Vec<_>>().join("; ");
            return Verdict::Denied(format!(
                "template {} is enforced for this pod: {messages}{advice}",
                first.template
            ))
            .into();
        }
        warnings.extend(audit.iter().map(|s| {
            format!(
                "template {} is enforced: audit; with enforced: true it would refuse this update: {}",
                s.template, s.message
            )
        }));
        audited.extend(audit.into_iter().map(|s| s.template));
    }
    audited.dedup();
    UpdateVerdict { verdict: Verdict::Allowed(warnings), audited }
}

/// `Err` naming the first change `new` makes to what the injection wrote: the status annotation,
/// the `injected` label, the image of a container the status names as injected or that an
/// enforced template requires (when `claim` gives the status and the engine).
fn unchanged_injection(
    old: &Value,
    new: &Value,
    claim: Option<(&Engine, &InjectionStatus)>,
    advice: &str,
) -> Result<(), String> {
    let metadata = |pod: &Value, field: &str, key: &str| {
        pod.get("metadata")
            .and_then(|m| m.get(field))
            .and_then(|m| m.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    for (field, key) in [("annotations", names::STATUS_ANNOTATION), ("labels", names::INJECTED_LABEL)] {
        let (before, after) = (metadata(old, field, key), metadata(new, field, key));
        if before != after {
            let show = |v: &Option<String>| v.as_ref().map_or("absent".to_owned(), |v| format!("{v:?}"));
            return Err(format!(
                "the {} {key} cannot be changed by an update ({} before, {} after): {advice}",
                &field[..field.len() - 1],
                show(&before),
                show(&after)
            ));
        }
    }
    let Some((engine, status)) = claim else { return Ok(()) };
    for name in guarded_containers(engine, status) {
        let (before, after) = (image(old, name), image(new, name));
        if before != after {
            return Err(format!(
                "the image of injected container {name:?} cannot be changed by an update ({} before, {} after): {advice}",
                before.unwrap_or("none"),
                after.unwrap_or("none")
            ));
        }
    }
    Ok(())
}

/// The containers whose image only the injection sets: those the status names as injected, and
/// the pod's own copies of an enforced template's (skipped as conflicts).
fn guarded_containers<'s>(engine: &Engine, status: &'s InjectionStatus) -> Vec<&'s String> {
    let enforced: Vec<&Template> = engine.templates.iter().filter(|t| t.enforced).map(|t| &**t).collect();
    updates::guarded_names(status, &enforced).collect()
}

fn image<'p>(pod: &'p Value, name: &str) -> Option<&'p str> {
    pod::container(pod, name).and_then(|c| c.get("image")).and_then(Value::as_str)
}

/// Whether `old` → `new` is exactly `update` in what the injection wrote: the status annotation
/// it gives, and every guarded container's image its own or the update's.
fn is_exactly(
    engine: &Engine,
    update: &in_place::InPlaceUpdate,
    status: &InjectionStatus,
    old: &Value,
    new: &Value,
) -> bool {
    let status_after = new
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(names::STATUS_ANNOTATION))
        .and_then(Value::as_str);
    let label = |pod: &Value| {
        pod.get("metadata").and_then(|m| m.get("labels")).and_then(|l| l.get(names::INJECTED_LABEL)).cloned()
    };
    status_after == Some(update.status.as_str())
        && label(old) == label(new)
        && guarded_containers(engine, status).into_iter().all(|name| {
            let expected = update.images.iter().find(|c| c.container == *name).map(|c| c.to.as_str());
            image(new, name) == expected.or(image(old, name))
        })
}

fn describe_refs(refs: &[TemplateRef]) -> String {
    refs.iter().map(|r| format!("{}@{}", r.name, r.hash)).collect::<Vec<_>>().join(", ")
}

fn check_named_items(pod: &Value, status: &InjectionStatus) -> Result<(), String> {
    for list in &CONTAINER_LISTS {
        let containers = pod::list(pod, list.field).map_err(|e| e.to_string())?;
        if let Some(name) = (list.claimed)(status).iter().find(|name| find_by(containers, "name", name).is_none()) {
            return Err(format!("injected {} {name:?} was removed from the pod after injection", list.noun));
        }
    }
    let init = pod::list(pod, INIT_CONTAINERS.field).map_err(|e| e.to_string())?;
    for name in &status.native_sidecars {
        let sidecar = find_by(init, "name", name);
        if !sidecar.is_some_and(crate::model::native::is_native_sidecar) {
            let policy = sidecar.and_then(|c| c.get("restartPolicy")).and_then(Value::as_str);
            return Err(format!(
                "native sidecar {name:?} lost restartPolicy: Always after injection (it is {}), so it would block the pod's start",
                policy.map_or("unset".to_owned(), |p| format!("{p:?}"))
            ));
        }
    }
    Ok(())
}

/// Recomputes the injection for the pod without its injected parts and checks every field the
/// templates set.
fn compare_with_templates(engine: &Engine, request: &PodRequest, status: &InjectionStatus) -> Result<(), String> {
    let mut base = strip_injection(&request.pod, status);
    // Image volumes are recomputed in the forms they were given, not as the nodes would choose
    // now: the pod keeps a claim of the current versions that names nothing but those forms.
    let fallbacks = status.templates.iter().filter_map(|t| engine.templates.get(&t.name));
    if fallbacks.into_iter().any(|t| t.has_volume_fallbacks())
        && let Some(annotations) = base.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut)
    {
        let forms = InjectionStatus {
            templates: status.templates.clone(),
            image_volumes: status.image_volumes.clone(),
            ..InjectionStatus::default()
        };
        annotations.insert(names::STATUS_ANNOTATION.to_owned(), Value::String(forms.to_annotation()));
    }
    let base_request = PodRequest { pod: Arc::new(base), ..request.clone() };
    // Fields the templates compute from pod data may differ now (the API server fills
    // metadata.name from generateName after the mutating call): those are not compared.
    let outcome = engine.evaluate_masked(&base_request).outcome;
    // The engine keeps no reference to the pod once it has decided: the stripped pod is taken
    // back rather than copied (a whole-pod copy per check, on every pod create).
    let original = Arc::try_unwrap(base_request.pod).unwrap_or_else(|shared| (*shared).clone());
    let injection = match outcome {
        Outcome::Inject(injection) => injection,
        // An enforced template's item was replaced after injection (or never injected under a
        // forged status): the author cannot have that either way.
        Outcome::Denied(denial @ (crate::Denial::Enforced { .. } | crate::Denial::NamespaceUnavailable { .. })) => {
            let text = denial.to_string();
            return Err(text.strip_prefix("sidecar-injector: ").unwrap_or(&text).to_owned());
        }
        // The templates fail for this pod now; the mutating call would have refused it, so there is
        // nothing trustworthy to compare against.
        _ => return Ok(()),
    };
    let mut expected = original;
    json_patch::patch(&mut expected, &injection.patch)
        .map_err(|e| format!("internal error recomputing the injection: {e}"))?;
    let actual = &*request.pod;
    // (what, list, key, names, whether resized in place: a container's resources are not compared)
    let containers = CONTAINER_LISTS.iter().map(|k| (k.noun, k.field, "name", (k.claimed)(&injection.status), true));
    let pod_lists =
        POD_LISTS.iter().map(|k| (k.kind.describe(), k.field, k.key, (k.claimed)(&injection.status), false));
    for (kind, list, key, names, resizable) in containers.into_iter().chain(pod_lists) {
        let (expected_items, actual_items) =
            (pod::list(&expected, list).ok().flatten(), pod::list(actual, list).ok().flatten());
        for name in names {
            let what = || format!("injected {kind} {name:?}");
            let want = find_by(expected_items, key, name);
            let want = want.map(|w| if resizable { Cow::Owned(without_resources(w)) } else { Cow::Borrowed(w) });
            compare(what, want.as_deref(), find_by(actual_items, key, name))?;
        }
    }
    let expected_containers = pod::list(&expected, "containers").ok().flatten();
    let actual_containers = pod::list(actual, "containers").ok().flatten();
    // Only the app containers that existed when the pod was injected: a container a later mutator
    // added looks like an app container to the recomputation, but never got our env or mounts.
    let injected_containers =
        injection.status.app_containers.iter().filter(|(c, _)| status.app_containers.contains_key(*c));
    for (container, additions) in injected_containers {
        let (Some(want), Some(have)) =
            (find_by(expected_containers, "name", container), find_by(actual_containers, "name", container))
        else {
            continue;
        };
        for kind in &APP_LISTS {
            for identity in (kind.claimed)(additions) {
                let what = || format!("{} {identity:?} injected into container {container:?}", kind.kind.describe());
                // The item the container runs with: a later one of the identity replaces ours.
                let in_effect = |c| list_of(c, kind.field).and_then(|l| Some((l, kind.in_effect(l, identity)?)));
                compare(what, in_effect(want).map(|(_, (_, i))| i), in_effect(have).map(|(_, (_, i))| i))?;
                // Nor may a later entry the injection did not write extend it (`$(NAME)-off`).
                let extension =
                    |c| in_effect(c).and_then(|(l, (i, _))| env_merge::extension_after(l, i, &additions.env_merges));
                if let (None, Some(extension)) = (extension(want), extension(have)) {
                    return Err(format!(
                        "{} was changed after injection: a later entry extends it ({extension})",
                        what()
                    ));
                }
            }
        }
        for key in &additions.env_merges {
            let (name, value) = env_merge::split_key(key);
            let what = || format!("the entry {value:?} merged into env var {name:?} of container {container:?}");
            let merged = |c| list_of(c, "env").and_then(|l| env_merge::merged_in_effect(l, key)).map(|(_, e)| e);
            let last = |c| list_of(c, "env")?.iter().rev().find(|e| env_merge::key(e).as_ref() == Some(key));
            match (merged(want), merged(have)) {
                (Some(_), None) if last(have).is_some() => {
                    return Err(format!("{} was overridden after injection by a later entry of {name:?}", what()));
                }
                (want, have) => compare(what, want, have)?,
            }
        }
    }
    Ok(())
}

/// An injected item as the templates make it, against the pod's: changed, removed, or fine.
fn compare(what: impl Fn() -> String, want: Option<&Value>, have: Option<&Value>) -> Result<(), String> {
    match (want, have) {
        (Some(want), Some(have)) => match first_difference(want, have) {
            Some(diff) => Err(format!("{} was changed after injection: {diff}", what())),
            None => Ok(()),
        },
        (Some(_), None) => Err(format!("{} was removed after injection", what())),
        _ => Ok(()),
    }
}

/// A container's list field (`env`, `volumeMounts`).
fn list_of<'c>(container: &'c Value, field: &str) -> Option<&'c Vec<Value>> {
    container.get(field).and_then(Value::as_array)
}

/// The item of a list whose `key` is `value`.
fn find_by<'p>(items: Option<&'p Vec<Value>>, key: &str, value: &str) -> Option<&'p Value> {
    items?.iter().find(|item| item.get(key).and_then(Value::as_str) == Some(value))
}

/// Checks the data of a template ConfigMap: every `<name>.yaml` key must pass `precheck` and load.
/// Returns warnings for keys that are not templates, or every template error.
pub fn validate_template_data(
    data: &BTreeMap<String, String>,
    precheck: &dyn PreCheck,
) -> Result<Vec<String>, Vec<TemplateError>> {
    let (sources, mut warnings) = template_sources(data);
    let (set, errors) = TemplateSet::default().update(sources, precheck);
    warnings.extend(set.iter().flat_map(|t| t.warnings.iter().cloned()));
    if errors.is_empty() { Ok(warnings) } else { Err(errors) }
}

/// The templates in a ConfigMap's data (`<name>.yaml` keys), and warnings for the other keys.
pub fn template_sources(data: &BTreeMap<String, String>) -> (Vec<TemplateSource>, Vec<String>) {
    let mut sources = Vec::new();
    let mut warnings = Vec::new();
    for (key, text) in data {
        match key.strip_suffix(".yaml") {
            Some(name) => sources.push(TemplateSource { name: name.to_owned(), text: text.clone() }),
            None => warnings.push(format!("key {key:?} is ignored: only keys named <template>.yaml hold templates")),
        }
    }
    (sources, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{apply, engine, opted_in, request};
    use serde_json::json;

    const TEMPLATE: &str = r#"
default: true
inject:
  sidecars:
    - name: proxy
      image: envoy:1
      args: [--port, "15001"]
      resources: {requests: {cpu: "1000m", memory: 64Mi}}
      env:
        - {name: MODE, value: sidecar}
  initContainers:
    - {name: init, image: init:1}
  volumes:
    - {name: cfg, emptyDir: {}}
  appContainers:
    env:
      - {name: PROXY, value: "on"}
"#;

    fn injected() -> (Engine, Value) {
        let engine = engine(&[("proxy", TEMPLATE)]);
        let pod = json!({"metadata": {"name": "p", "labels": {"app": "a"}}, "spec": {"containers": [{"name": "app", "image": "app"}]}});
        let Outcome::Inject(injection) = engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome else {
            panic!()
        };
        let out = apply(&pod, &injection.patch);
        (engine, out)
    }

    fn verdict(engine: &Engine, pod: Value) -> Verdict {
        validate_pod(engine, &request(pod, opted_in("shop", &[])))
    }

    #[test]
    fn intact_injections_and_other_mutators_additions_are_allowed() {
        let (engine, pod) = injected();
        assert_eq!(verdict(&engine, pod.clone()), Verdict::Allowed(vec![]));

        // What the API server and other mutators add is fine: defaults, extra env, canonical quantities.
        let mut defaulted = pod.clone();
        let proxy = &mut defaulted["spec"]["initContainers"][1];
        proxy["imagePullPolicy"] = json!("IfNotPresent");
        proxy["terminationMessagePath"] = json!("/dev/termination-log");
        proxy["env"].as_array_mut().unwrap().push(json!({"name": "OTHER", "value": "x"}));
        proxy["resources"]["requests"]["cpu"] = json!("1");
        defaulted["spec"]["containers"][0]["env"].as_array_mut().unwrap().push(json!({"name": "Z", "value": "z"}));
        defaulted["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "other", "image": "o"}));
        assert_eq!(verdict(&engine, defaulted), Verdict::Allowed(vec![]));
    }

    #[test]
    fn altered_injections_are_denied_with_what_changed() {
        let (engine, pod) = injected();
        type Mutation = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(&str, Mutation, &str)> = vec![
            (
                "no status",
                Box::new(|p| {
                    drop(p["metadata"]["annotations"].as_object_mut().unwrap().remove(names::STATUS_ANNOTATION))
                }),
                NOT_INJECTED_MESSAGE,
            ),
            (
                "unreadable status",
                Box::new(|p| p["metadata"]["annotations"][names::STATUS_ANNOTATION] = json!("{")),
                "annotation is not valid",
            ),
            (
                "sidecar removed",
                Box::new(|p| drop(p["spec"]["initContainers"].as_array_mut().unwrap().remove(1))),
                "injected init container \"proxy\" was removed",
            ),
            (
                "native sidecar lost restartPolicy",
                Box::new(|p| drop(p["spec"]["initContainers"][1].as_object_mut().unwrap().remove("restartPolicy"))),
                "native sidecar \"proxy\" lost restartPolicy: Always after injection (it is unset)",
            ),
            (
                "image changed",
                Box::new(|p| p["spec"]["initContainers"][1]["image"] = json!("evil:1")),
                "injected init container \"proxy\" was changed after injection: image is \"evil:1\", the template sets \"envoy:1\"",
            ),
            (
                "args changed",
                Box::new(|p| p["spec"]["initContainers"][1]["args"][1] = json!("80")),
                "args is [\"--port\",\"80\"], the template sets [\"--port\",\"15001\"]",
            ),
            (
                "sidecar env changed",
                Box::new(|p| p["spec"]["initContainers"][1]["env"][0]["value"] = json!("x")),
                "env[0].value is \"x\"",
            ),
            (
                "resize policy changed",
                Box::new(|p| {
                    p["spec"]["initContainers"][1]["resizePolicy"][0]["restartPolicy"] = json!("RestartContainer")
                }),
                "resizePolicy[0].restartPolicy is \"RestartContainer\", the template sets \"NotRequired\"",
            ),
            (
                "volume changed",
                Box::new(|p| p["spec"]["volumes"][0] = json!({"name": "cfg", "hostPath": {"path": "/"}})),
                "injected volume \"cfg\" was changed after injection: emptyDir was removed",
            ),
            (
                "app env removed",
                Box::new(|p| p["spec"]["containers"][0]["env"].as_array_mut().unwrap().clear()),
                "env var \"PROXY\" injected into container \"app\" was removed",
            ),
            (
                "app env changed",
                Box::new(|p| p["spec"]["containers"][0]["env"][0]["value"] = json!("off")),
                "env var \"PROXY\" injected into container \"app\" was changed after injection: value is \"off\"",
            ),
            (
                // The kubelet runs with the last entry of a name.
                "app env overridden by a later entry",
                Box::new(|p| {
                    p["spec"]["containers"][0]["env"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "PROXY", "value": "off"}))
                }),
                "env var \"PROXY\" injected into container \"app\" was changed after injection: value is \"off\"",
            ),
        ];
        for (case, mutate, expected) in cases {
            let mut altered = pod.clone();
            mutate(&mut altered);
            match verdict(&engine, altered) {
                Verdict::Denied(message) => assert!(message.contains(expected), "{case}: {message}"),
                other => panic!("{case}: expected a denial, got {other:?}"),
            }
        }
        // A sidecar resized in place is not altered: a resize is not a template change.
        let mut resized = pod.clone();
        resized["spec"]["initContainers"][1]["resources"]["requests"]["cpu"] = json!("2");
        assert_eq!(verdict(&engine, resized), Verdict::Allowed(vec![]));
    }

    #[test]
    fn pods_out_of_scope_or_injected_by_other_template_versions_are_allowed() {
        let (engine, pod) = injected();
        let mut opted_out = pod.clone();
        opted_out["metadata"]["labels"]["sidecar-injector.io/inject"] = json!("disabled");
        opted_out["metadata"]["annotations"].as_object_mut().unwrap().clear();
        assert_eq!(verdict(&engine, opted_out), Verdict::Allowed(vec![]));

        let newer = crate::test_support::engine(&[("proxy", &TEMPLATE.replace("envoy:1", "envoy:2"))]);
        let mut altered = pod.clone();
        altered["spec"]["initContainers"][1]["image"] = json!("anything");
        match validate_pod(&newer, &request(altered, opted_in("shop", &[]))) {
            Verdict::Allowed(warnings) => assert!(warnings[0].contains("were not compared"), "{warnings:?}"),
            other => panic!("{other:?}"),
        }
    }

    /// Found by the load benchmark: a pod created with generateName has no name at the mutating
    /// call, and the API server fills it in before the validating call, so a template that reads
    /// `pod.metadata.name` renders differently the second time. That must not refuse the pod.
    #[test]
    fn fields_rendered_from_pod_data_are_not_compared() {
        let engine = engine(&[(
            "named",
            "default: true\ninject:\n  sidecars:\n    - name: agent\n      image: agent:1\n      args: [\"--node={{ workload.name }}\", --fixed]\n",
        )]);
        let submitted = json!({"metadata": {"generateName": "web-7d9f-"}, "spec": {"containers": [{"name": "app", "image": "app"}]}});
        let Outcome::Inject(injection) = engine.evaluate(&request(submitted.clone(), opted_in("shop", &[]))).outcome
        else {
            panic!()
        };
        let mut stored = apply(&submitted, &injection.patch);
        assert_eq!(stored["spec"]["initContainers"][0]["args"][0], "--node=web-7d9f");
        stored["metadata"]["name"] = json!("web-7d9f-x2k8p");
        assert_eq!(verdict(&engine, stored.clone()), Verdict::Allowed(vec![]));

        let mut tampered = stored.clone();
        tampered["spec"]["initContainers"][0]["args"][1] = json!("--evil");
        let Verdict::Denied(message) = verdict(&engine, tampered) else { panic!("not denied") };
        assert!(
            message
                .ends_with(r#"args is ["--node=web-7d9f","--evil"], the template sets ["<from the pod>","--fixed"]"#),
            "{message}"
        );
        let mut tampered = stored;
        tampered["spec"]["initContainers"][0]["image"] = json!("evil:1");
        assert!(matches!(verdict(&engine, tampered), Verdict::Denied(m) if m.contains("image is \"evil:1\"")));
    }

    #[test]
    fn template_configmaps_are_checked() {
        let good: BTreeMap<String, String> =
            [("a.yaml".to_owned(), TEMPLATE.to_owned()), ("README".to_owned(), "x".to_owned())].into();
        let warnings = validate_template_data(&good, &crate::templates::set::InProcess).unwrap();
        assert_eq!(warnings[0], "key \"README\" is ignored: only keys named <template>.yaml hold templates");
        assert!(warnings[1..].iter().all(|w| w.contains("sets no") && w.contains("ResourceQuota")), "{warnings:?}");
        let bad: BTreeMap<String, String> = [
            ("a.yaml".to_owned(), "inject:\n  sidecars:\n    - image: x\n".to_owned()),
            ("B.yaml".to_owned(), TEMPLATE.to_owned()),
        ]
        .into();
        let errors = validate_template_data(&bad, &crate::templates::set::InProcess).unwrap_err();
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].starts_with("template \"B\": invalid template name"), "{messages:?}");
        assert_eq!(messages[1], "template \"a\" line 3: an item of inject.sidecars has no name");
    }
}
