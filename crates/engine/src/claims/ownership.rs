//! Which items of a pod are provably the injector's own.
//!
//! The status annotation (`sidecar-injector.io/status`) travels with the pod: `kubectl get -o yaml`
//! copies it, charts copy annotations, and anyone who can create a pod can write it by hand. So it is
//! a *claim*, never a licence: the engine believes an item is its own only when it can check it.
//!
//! The proof chosen is re-rendering: an item named by the claim is the injector's own when the
//! template version the claim names (same name, same content hash, still in service) renders, for
//! this pod without the claimed items, exactly that item. Nothing in the pod can forge this, since
//! the engine computes the expected item itself, and no key has to be shared between replicas and
//! the offline CLI (an HMAC over the status would need one, and would still say nothing about
//! whether the item was edited since). The price: items from a template version that is no longer
//! in service cannot be proven, so they are kept as the pod's own (and a warning says so).
//!
//! Two strengths of match, for two uses:
//! - **present**: the pod's item holds every field the template sets (other mutators may have added
//!   fields, as `/validate` allows), a container's `resources` apart (resized in place since, which
//!   is not a template change). Enough to call a pod *up to date*, which removes nothing.
//! - **owned**: the pod's item is exactly the rendering, apart from what the API server adds by
//!   itself (field defaults, the service-account token mount) and the native-sidecar
//!   `restartPolicy`. Required before an item may be *removed* or replaced, so that nothing the
//!   author added to an item is ever lost.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::Value;

use crate::injection::env_merge;
use crate::injection::render::RenderedTemplate;
use crate::model::compare::{first_difference, first_difference_but_resources, is_implied, without_resources};
use crate::model::kinds::{APP_LISTS, AppListKind, CONTAINER_LISTS, ENV, MAPS, POD_LISTS, Placement, PodListKind};
use crate::model::status::{AppContainerAdditions, InjectionStatus, ItemKind};
use crate::names::SERVICE_ACCOUNT_TOKEN_PATH;

/// What the claim says, checked against the pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ownership {
    /// Claimed items that exactly match their template: safe to remove or replace.
    pub owned: InjectionStatus,
    /// Claimed items present with every field their template sets (a superset of `owned`).
    pub present: InjectionStatus,
    /// Whether every claimed item is present.
    pub all_present: bool,
    /// Claimed items that are in the pod, come from a claimed template version in service, and
    /// no longer hold what it sets (another webhook or the pod's author changed them), each as a
    /// sentence naming the item and the change.
    pub altered: Vec<String>,
    /// Why claimed items are not treated as the injector's own, one sentence each.
    pub doubts: Vec<String>,
    /// Claimed containers that are exactly their template's but for their `resources` (resized in
    /// place since): present, not owned. The engine replaces one only with its resources carried
    /// over (`Engine::carry_resized`).
    pub resized: Vec<ResizedContainer>,
}

/// A claimed container resized in place since its injection.
#[derive(Debug, Clone, PartialEq)]
pub struct ResizedContainer {
    /// Its name.
    pub name: String,
    /// Where the claim says it was put.
    pub placement: Placement,
    /// Its `resources` in the pod (`None`: it has none).
    pub resources: Option<Value>,
}

/// When a claim is checked, which decides what the absence of an item that is removed after
/// admission by design (`PodListKind::removed_after_admission`: a lifted scheduling gate) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// At the pod's admission (its creation): nothing can have been removed yet, so an absent
    /// item was never there (a copied or forged claim) and is a doubt like any other.
    Admission,
    /// On a running pod (`drift --in-place`, an update): an absent item of such a kind was removed
    /// as designed; it stays the injection's, neither a doubt nor missing.
    Running,
}

/// Checks every item `claim` names against the pod and the claimed templates' renderings (one per
/// claimed template, `None` when its version is not known or does not render for this pod), at
/// `moment`.
pub fn assess<'p>(
    pod: &'p Value,
    claim: &InjectionStatus,
    renderings: &[Option<&RenderedTemplate>],
    moment: Moment,
) -> Ownership {
    let mut owned = InjectionStatus { templates: claim.templates.clone(), ..InjectionStatus::default() };
    let mut present = owned.clone();
    let mut judged = Judge { claim, doubts: Vec::new(), altered: Vec::new(), all_present: true };
    let spec_list = |field: &str| pod.get("spec").and_then(|s| s.get(field)).and_then(Value::as_array);
    let find = |items: Option<&'p Vec<Value>>, key: &str, name: &str| find_in(items?, key, name);

    // The claimed containers as their templates render them, which a claimed pod-level padding is
    // proven against.
    let mut rendered_containers = BTreeMap::new();
    let mut resized = Vec::new();
    for list in &CONTAINER_LISTS {
        for name in (list.claimed)(claim) {
            let placement = Placement::of_claim(list, claim, name);
            let expected = renderings.iter().flatten().find_map(|r| r.placed_container(placement, name));
            if let Some(expected) = expected.as_ref().filter(|_| claim.pod_resources.is_some()) {
                rendered_containers.insert(name.as_str(), expected.clone());
            }
            let actual = find(spec_list(list.field), "name", name);
            let found = judged.judge(list.kind, name, None, expected.map(|e| Resizable(Cow::Owned(e))), actual);
            if found == Match::Resized {
                resized.push(ResizedContainer {
                    name: name.clone(),
                    placement,
                    resources: actual.and_then(|c| c.get("resources")).cloned(),
                });
            }
            found.record(name, (list.claimed_mut)(&mut present), (list.claimed_mut)(&mut owned));
            if placement == Placement::NativeSidecar {
                found.record(name, &mut present.native_sidecars, &mut owned.native_sidecars);
            }
        }
    }
    for kind in &POD_LISTS {
        let pod_items = spec_list(kind.field);
        assess_pod_list(kind, (claim, pod_items, renderings, moment), &mut judged, (&mut present, &mut owned));
    }
    let metadata = |section: &str| pod.get("metadata").and_then(|m| m.get(section)).and_then(Value::as_object);
    for kind in &MAPS {
        for key in (kind.claimed)(claim) {
            // The injector's own key is never a claimed item: it is always rewritten.
            if MAPS.iter().any(|k| k.own_key == key) {
                continue;
            }
            let expected =
                renderings.iter().flatten().find_map(|r| r.map(kind).get(key).map(|v| Value::String(v.clone())));
            let found = judged.judge(
                kind.kind,
                key,
                None,
                expected.map(|e| Fixed(Cow::Owned(e))),
                metadata(kind.field).and_then(|m| m.get(key)),
            );
            found.record(key, (kind.claimed_mut)(&mut present), (kind.claimed_mut)(&mut owned));
        }
    }
    assess_app_containers(claim, spec_list("containers"), renderings, &mut judged, (&mut present, &mut owned));
    if let Some(claimed) = &claim.pod_resources {
        // The padding of pod-level resources: proven when it is exactly what the injected
        // containers present account for as their templates render them (not as resized since).
        let injected = |name: &str| {
            let present = present.init_containers.iter().chain(&present.containers).any(|n| n == name);
            present.then(|| rendered_containers.get(name)).flatten()
        };
        match crate::injection::pod_resources::proves(pod, claimed, &injected) {
            true => {
                // Taken back only with the containers it accounts for: a resized one kept as the
                // pod's own keeps its share of the padding too.
                let all_owned = |present: &[String], owned: &[String]| present.iter().all(|n| owned.contains(n));
                if all_owned(&present.init_containers, &owned.init_containers)
                    && all_owned(&present.containers, &owned.containers)
                {
                    owned.pod_resources = Some(claimed.clone());
                }
                present.pod_resources = Some(claimed.clone());
            }
            false => {
                judged.all_present = false;
                judged.doubts.push(format!(
                    "the claimed padding of spec.resources ({}) is not what the injected containers in the pod account for; the pod's values are kept as they are",
                    claimed.describe()
                ));
            }
        }
    }
    let Judge { all_present, altered, doubts, .. } = judged;
    Ownership { owned, present, all_present, altered, doubts, resized }
}

/// Judges the claimed additions to each app container (its list items and env merges) against the
/// pod's containers (`containers`).
fn assess_app_containers(
    claim: &InjectionStatus,
    containers: Option<&Vec<Value>>,
    renderings: &[Option<&RenderedTemplate>],
    judged: &mut Judge<'_>,
    (present, owned): (&mut InjectionStatus, &mut InjectionStatus),
) {
    for (container, additions) in &claim.app_containers {
        let actual = containers.and_then(|containers| find_in(containers, "name", container));
        let list = |field: &str| actual.and_then(|c| c.get(field)).and_then(Value::as_array);
        let (mut here, mut mine) = (AppContainerAdditions::default(), AppContainerAdditions::default());
        for kind in &APP_LISTS {
            for identity in (kind.claimed)(additions) {
                let expected = renderings.iter().flatten().find_map(|r| kind.find(r.app_list(kind), identity));
                let in_effect = list(kind.field).and_then(|items| Some((items, kind.in_effect(items, identity)?)));
                let actual = in_effect.map(|(_, (_, item))| item);
                let mut found = judged.judge(
                    kind.kind,
                    identity,
                    Some(container),
                    expected.map(|e| Fixed(Cow::Borrowed(e))),
                    actual,
                );
                if found == Match::Exact
                    && in_effect.is_some_and(|(items, (i, _))| authored_too(kind, items, i, additions))
                {
                    found = Match::Present;
                }
                found.record(identity, (kind.claimed_mut)(&mut here), (kind.claimed_mut)(&mut mine));
            }
        }
        for key in &additions.env_merges {
            // Proven when a claimed template renders a merging env var whose entry is exactly
            // this one; the pod's entry is found by its whole value, as there may be several of
            // the name.
            let (name, _) = env_merge::split_key(key);
            let expected = renderings.iter().flatten().find_map(|r| {
                let item = ENV.find(r.app_list(ENV), name)?;
                let entry = r.env_merges.get(name)?.entry(name, item.get("value")?.as_str()?);
                (env_merge::key(&entry).as_ref() == Some(key)).then_some(entry)
            });
            // And it must be in effect: a later entry of the name that replaces it leaves the
            // container without the fragment, whatever the entry says.
            let actual = list("env").and_then(|l| env_merge::merged_in_effect(l, key)).map(|(_, entry)| entry);
            let found =
                judged.judge(ItemKind::EnvMerge, key, Some(container), expected.map(|e| Fixed(Cow::Owned(e))), actual);
            found.record(key, &mut here.env_merges, &mut mine.env_merges);
        }
        for (status, additions) in [(&mut *present, here), (&mut *owned, mine)] {
            if !additions.is_empty() {
                status.app_containers.insert(container.clone(), additions);
            }
        }
    }
}

/// Judges the claimed items of one kind of spec list against the pod's (`pod_items`).
fn assess_pod_list(
    kind: &PodListKind,
    (claim, pod_items, renderings, moment): (
        &InjectionStatus,
        Option<&Vec<Value>>,
        &[Option<&RenderedTemplate>],
        Moment,
    ),
    judged: &mut Judge<'_>,
    (present, owned): (&mut InjectionStatus, &mut InjectionStatus),
) {
    for identity in (kind.claimed)(claim) {
        let expected = renderings.iter().flatten().find_map(|r| kind.find(r.pod_list(kind), identity));
        let actual = pod_items.and_then(|items| kind.find(items, identity));
        if actual.is_none() && kind.removed_after_admission && moment == Moment::Running {
            // Removed as designed: still the injection's (and not added again).
            (kind.claimed_mut)(present).push(identity.clone());
            (kind.claimed_mut)(owned).push(identity.clone());
            continue;
        }
        let found = judged.judge(kind.kind, identity, None, expected.map(|e| Fixed(Cow::Borrowed(e))), actual);
        found.record(identity, (kind.claimed_mut)(present), (kind.claimed_mut)(owned));
        // Its form too, where the claimed version renders it as the image volume claimed.
        if kind.may_fall_back && renderings.iter().flatten().any(|r| r.image_volumes.iter().any(|v| v == identity)) {
            found.record(identity, &mut present.image_volumes, &mut owned.image_volumes);
        }
    }
}

/// Judges claimed items one by one, collecting why any is not the injector's own.
struct Judge<'c> {
    claim: &'c InjectionStatus,
    doubts: Vec<String>,
    altered: Vec<String>,
    all_present: bool,
}

impl Judge<'_> {
    /// How well the pod's item (`actual`) matches what a claimed template renders (`expected`).
    fn judge(
        &mut self,
        kind: ItemKind,
        name: &str,
        container: Option<&str>,
        expected: Option<Expected<'_>>,
        actual: Option<&Value>,
    ) -> Match {
        // Written out only for a doubt: most items hold.
        let what = || match container {
            Some(c) => format!("{} {name:?} of container {c:?}", kind.describe()),
            None => format!("{} {name:?}", kind.describe()),
        };
        match (expected, actual) {
            (_, None) => {
                self.all_present = false;
                self.doubts.push(format!("the status claims {} was injected, but the pod does not have it", what()));
                Match::None
            }
            (None, Some(_)) => {
                self.all_present = false;
                self.doubts.push(format!(
                "the status claims {} was injected, but no template version in service renders it (claimed: {}); it is kept as the pod's own",
                what(),
                describe_claim(self.claim)
            ));
                Match::None
            }
            (Some(expected), Some(actual)) => {
                let resizable = matches!(expected, Resizable(_));
                let (Resizable(expected) | Fixed(expected)) = expected;
                // A container's resources change by in-place resizes (`kubectl patch --subresource
                // resize`, vertical autoscalers), which are not template changes: they are not
                // compared for presence. Replacing or removing the container still needs them to
                // be the template's, since they may be the author's under a copied claim.
                let differs = match resizable {
                    true => first_difference_but_resources(&expected, actual),
                    false => first_difference(&expected, actual),
                };
                if let Some(difference) = differs {
                    let what = what();
                    self.all_present = false;
                    self.altered.push(format!("{what} was changed after injection: {difference}"));
                    self.doubts.push(format!(
                        "{what} is not what its template renders ({difference}); it is kept as the pod's own"
                    ));
                    return Match::None;
                }
                if exact(&expected, actual) {
                    Match::Exact
                } else if resizable && exact(&without_resources(&expected), &without_resources(actual)) {
                    Match::Resized
                } else {
                    self.doubts.push(format!(
                        "{} holds fields its template does not set; it is kept as the pod's own and not replaced",
                        what()
                    ));
                    Match::Present
                }
            }
        }
    }
}

/// What a claimed template renders for an item, and whether its resources may have been resized
/// in place since (a container's may).
enum Expected<'r> {
    Resizable(Cow<'r, Value>),
    Fixed(Cow<'r, Value>),
}
use Expected::{Fixed, Resizable};

/// How well a claimed item matches its template.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Match {
    /// Absent, not rendered by any claimed template version, or changed.
    None,
    /// Holds every field the template sets, and more.
    Present,
    /// Exactly the rendering but for its `resources` (a container resized in place): present,
    /// not owned (see [`Ownership::resized`]).
    Resized,
    /// Exactly the rendering.
    Exact,
}

impl Match {
    fn record(self, name: &str, present: &mut Vec<String>, owned: &mut Vec<String>) {
        if self != Match::None {
            present.push(name.to_owned());
        }
        if self == Match::Exact {
            owned.push(name.to_owned());
        }
    }
}

fn describe_claim(claim: &InjectionStatus) -> String {
    claim.templates.iter().map(|t| format!("{}@{}", t.name, t.hash)).collect::<Vec<_>>().join(", ")
}

/// Whether the pod's own hand is in its env entry at `index` of `items`: another entry of the name
/// that defines a value (an injection adds a plain env var only where the container has none, so
/// that one is the author's, and which of the two is ours cannot be told), or one that extends it
/// (`$(NAME)-off` after it, or in it: the container runs with another value than the injected
/// one). Such an entry is present, never the injector's own as it stands. Only env entries do this.
fn authored_too(kind: &AppListKind, items: &[Value], index: usize, additions: &AppContainerAdditions) -> bool {
    let name = items[index].get("name");
    let defines_too =
        |(i, entry): (usize, &Value)| i != index && entry.get("name") == name && !(kind.extends_earlier)(entry);
    kind.kind == ItemKind::Env
        && ((kind.extends_earlier)(&items[index])
            || items.iter().enumerate().any(defines_too)
            || env_merge::extension_after(items, index, &additions.env_merges).is_some())
}

fn find_in<'a>(items: &'a [Value], key: &str, name: &str) -> Option<&'a Value> {
    items.iter().find(|item| item.get(key).and_then(Value::as_str) == Some(name))
}

/// Whether every item `other` lists is listed in `status` too, in the same place (same kind, same
/// container), and every skip it records is recorded here.
pub fn includes_items_of(status: &InjectionStatus, other: &InjectionStatus) -> bool {
    let all = |mine: &[String], theirs: &[String]| theirs.iter().all(|n| mine.contains(n));
    all(&status.containers, &other.containers)
        && all(&status.init_containers, &other.init_containers)
        && all(&status.native_sidecars, &other.native_sidecars)
        && all(&status.image_volumes, &other.image_volumes)
        && POD_LISTS.iter().all(|k| all((k.claimed)(status), (k.claimed)(other)))
        && MAPS.iter().all(|k| all((k.claimed)(status), (k.claimed)(other)))
        && other.app_containers.iter().all(|(name, theirs)| {
            status.app_containers.get(name).is_some_and(|mine| {
                APP_LISTS.iter().all(|k| all((k.claimed)(mine), (k.claimed)(theirs)))
                    && all(&mine.env_merges, &theirs.env_merges)
            })
        })
        && other.skipped.iter().all(|s| status.skipped.contains(s))
        && status.templates == other.templates
}

/// Whether every claimed item was proven to be the injector's own.
pub fn owns_everything(ownership: &Ownership, claim: &InjectionStatus) -> bool {
    owns_all(&ownership.owned, claim)
}

/// Whether `owned` names every item `claim` names.
pub fn owns_all(owned: &InjectionStatus, claim: &InjectionStatus) -> bool {
    let count = |s: &InjectionStatus| {
        s.containers.len()
            + s.init_containers.len()
            + POD_LISTS.iter().map(|kind| (kind.claimed)(s).len()).sum::<usize>()
            + MAPS.iter().map(|kind| (kind.claimed)(s).iter().filter(|k| *k != kind.own_key).count()).sum::<usize>()
            + s.app_containers.values().map(AppContainerAdditions::len).sum::<usize>()
    };
    count(owned) == count(claim)
}

/// Whether `actual` is `expected` exactly, apart from what the API server adds by itself.
pub fn exact(expected: &Value, actual: &Value) -> bool {
    exact_in(expected, actual, Context::Item)
}

#[derive(Clone, Copy, PartialEq)]
enum Context {
    Item,
    Resources,
    VolumeMounts,
}

fn exact_in(expected: &Value, actual: &Value, context: Context) -> bool {
    match (expected, actual) {
        (Value::Object(want), Value::Object(have)) => {
            let child = |key: &str| match (context, key) {
                (Context::Resources, _) | (_, "resources") => Context::Resources,
                (_, "volumeMounts") => Context::VolumeMounts,
                _ => Context::Item,
            };
            want.iter().all(|(key, w)| match have.get(key) {
                Some(h) => exact_in(w, h, child(key)),
                None => is_implied(key, w),
            }) && have.iter().all(|(key, h)| want.contains_key(key) || is_api_default(key, h, have))
        }
        (Value::Array(want), Value::Array(have)) => {
            let have: Vec<&Value> = match context {
                // The token mount the ServiceAccount plugin adds to every container that lacks one.
                Context::VolumeMounts if !want.iter().any(is_token_mount_path) => {
                    have.iter().filter(|m| !is_plugin_token_mount(m)).collect()
                }
                _ => have.iter().collect(),
            };
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| exact_in(w, h, Context::Item))
        }
        (Value::Number(w), Value::Number(h)) => w.as_f64() == h.as_f64(),
        (w, h) if context == Context::Resources && !w.is_object() && !w.is_array() => {
            w == h || crate::quantity::equal(w, h)
        }
        (w, h) => w == h,
    }
}

fn is_token_mount_path(mount: &Value) -> bool {
    mount.get("mountPath").and_then(Value::as_str) == Some(SERVICE_ACCOUNT_TOKEN_PATH)
}

fn is_plugin_token_mount(mount: &Value) -> bool {
    is_token_mount_path(mount)
        && mount.get("readOnly") == Some(&Value::Bool(true))
        && mount.get("name").and_then(Value::as_str).is_some_and(|n| n.starts_with("kube-api-access-"))
        && mount.as_object().is_some_and(|m| m.len() == 3)
}

/// Whether `key: value` is a default the API server fills into containers, probes, ports, env and
/// volumes when the field is absent (see Kubernetes' `SetDefaults_*` for core/v1). `parent` is the
/// object holding the field: the image decides the default pull policy.
fn is_api_default(key: &str, value: &Value, parent: &serde_json::Map<String, Value>) -> bool {
    let is = |s: &str| value.as_str() == Some(s);
    let number = |n: i64| value.as_i64() == Some(n);
    match key {
        "terminationMessagePath" => is("/dev/termination-log"),
        "terminationMessagePolicy" => is("File"),
        "imagePullPolicy" => {
            let image = parent.get("image").and_then(Value::as_str).unwrap_or_default();
            let tag = image.rsplit_once('/').map_or(image, |(_, last)| last);
            let latest = !image.contains('@') && tag.split_once(':').is_none_or(|(_, t)| t == "latest");
            is(if latest { "Always" } else { "IfNotPresent" })
        }
        "protocol" => is("TCP"),
        "apiVersion" => parent.contains_key("fieldPath") && is("v1"),
        "timeoutSeconds" | "successThreshold" => number(1),
        "periodSeconds" => number(10),
        "failureThreshold" => number(3),
        "scheme" => is("HTTP"),
        "defaultMode" => number(420),
        "type" => parent.contains_key("path") && is(""),
        "resources" => value.as_object().is_some_and(|m| m.is_empty()),
        // The ServiceAccount plugin's token mount, on a container without mounts of its own.
        "volumeMounts" => value.as_array().is_some_and(|m| !m.is_empty() && m.iter().all(is_plugin_token_mount)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exact_allows_only_what_the_api_server_adds() {
        let rendered = json!({"name": "logs", "image": "fluent-bit:3", "ports": [{"containerPort": 2020}],
            "resources": {"limits": {"cpu": "1"}}, "volumeMounts": [{"name": "v", "mountPath": "/v"}]});
        let defaulted = json!({"name": "logs", "image": "fluent-bit:3", "ports": [{"containerPort": 2020, "protocol": "TCP"}],
            "resources": {"limits": {"cpu": "1000m"}}, "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
            "volumeMounts": [{"name": "v", "mountPath": "/v"},
                {"name": "kube-api-access-abcde", "readOnly": true, "mountPath": SERVICE_ACCOUNT_TOKEN_PATH}]});
        assert!(exact(&rendered, &defaulted));
        // (case, change to the defaulted item)
        type Change = fn(&mut Value);
        let cases: [(&str, Change); 6] = [
            ("image changed", |c| c["image"] = json!("evil/not-fluent-bit")),
            ("env added by the author", |c| c["env"] = json!([{"name": "X", "value": "1"}])),
            ("pull policy not the default for a pinned tag", |c| c["imagePullPolicy"] = json!("Always")),
            ("a protocol other than the default", |c| c["ports"][0]["protocol"] = json!("UDP")),
            ("another mount at an extra index", |c| {
                c["volumeMounts"].as_array_mut().unwrap().push(json!({"name": "w", "mountPath": "/w"}))
            }),
            ("a field removed", |c| c.as_object_mut().unwrap().remove("ports").map(drop).unwrap()),
        ];
        for (case, change) in cases {
            let mut actual = defaulted.clone();
            change(&mut actual);
            assert!(!exact(&rendered, &actual), "{case}");
        }
        // A container without mounts of its own gets the plugin's token mount, and only that.
        let unmounted = json!({"name": "x", "image": "x:1"});
        let token = json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": SERVICE_ACCOUNT_TOKEN_PATH});
        assert!(exact(&unmounted, &json!({"name": "x", "image": "x:1", "volumeMounts": [token]})));
        assert!(!exact(
            &unmounted,
            &json!({"name": "x", "image": "x:1", "volumeMounts": [token, {"name": "v", "mountPath": "/v"}]})
        ));
        let latest = json!({"name": "x", "image": "busybox"});
        assert!(exact(&latest, &json!({"name": "x", "image": "busybox", "imagePullPolicy": "Always"})));
        assert!(!exact(&latest, &json!({"name": "x", "image": "busybox", "imagePullPolicy": "IfNotPresent"})));
    }
}
