//! Enforced templates (`enforced: true`): sidecars a pod's author cannot skip, swap or fake.
//!
//! Selection (`select`) already gives an enforced template to every pod its selectors match in an
//! opted-in namespace, whatever the pod's opt-out label or templates annotation say. This module
//! owns the two checks that make the mandate hold:
//! - at admission, [`conflicts`]: "the pod's item wins" does not apply to an enforced template. A
//!   same-name item the pod (or a template injected before it) already has is accepted only when
//!   it is exactly the template's; anything else refuses the pod with what to do;
//! - without the injector, [`Requirements`]: what an in-tree ValidatingAdmissionPolicy can check
//!   on its own (item names, and the image, command and args that are the same for every pod), as
//!   the data of a params ConfigMap the injector keeps current. The policy reads the containers
//!   themselves, never the status annotation, so a hand-written status satisfies nothing.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::checks::resize;
use crate::emit::scope;
use crate::injection::env_merge;
use crate::injection::render::RenderedTemplate;
use crate::model::compare::first_difference;
use crate::model::kinds::{
    APP_LISTS, ENV, ENV_FROM, HOST_ALIASES, MAPS, POD_LISTS, Place, Placement, VOLUME_MOUNTS, VOLUMES, displaced_by,
};
use crate::model::status::{InjectionStatus, ItemKind};
use crate::templates::template::{AppTargets, Piece, SeqItem, Template};
use crate::{claims::ownership, names};

/// The conflicts of one enforced template with what the pod already has, one sentence each.
/// `pod` is the pod as the injection leaves it (so an item the patch removes never stands for
/// the template's), `status` what the injection records, `rendered` the template rendered for
/// this pod; `native` whether its sidecars are native; `enforced` whether a template (by name) is
/// enforced. Where the pod has an item of a name twice, the one compared is the one the kubelet
/// runs with (`AppListKind::in_effect`).
pub fn conflicts(
    pod: &Value,
    status: &InjectionStatus,
    rendered: &RenderedTemplate,
    native: bool,
    enforced: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let spec_list = |field: &str| pod.get("spec").and_then(|s| s.get(field)).and_then(Value::as_array);
    let container = |name: &str| {
        [spec_list("containers"), spec_list("initContainers")]
            .into_iter()
            .flatten()
            .flatten()
            .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
    };
    let metadata = |field: &str, key: &str| {
        pod.get("metadata").and_then(|m| m.get(field)).and_then(|m| m.get(key)).and_then(Value::as_str)
    };
    let mut found = Vec::new();
    for skip in status.skipped.iter().filter(|s| s.template == rendered.name) {
        let what = match &skip.container {
            Some(c) => format!("{} {:?} of container {c:?}", skip.kind.describe(), skip.name),
            None => format!("{} {:?}", skip.kind.describe(), skip.name),
        };
        if let Some(other) = skip.owner.strip_prefix("template:") {
            found.push(format!("{what} is also added by template {other}, which comes first"));
            continue;
        }
        if let Some((kind, identity)) = displaced_by(&skip.owner) {
            let (verb, noun) = (kind.referred_verb, kind.kind.describe());
            found.push(format!(
                "{what} {verb} {noun} {identity:?}, and the pod's {noun} of that name is not the template's"
            ));
            continue;
        }
        let (expected, actual) = match skip.kind.place() {
            Place::PodList(kind) => (
                kind.find(rendered.pod_list(kind), &skip.name).cloned(),
                spec_list(kind.field).and_then(|items| kind.find(items, &skip.name)).cloned(),
            ),
            Place::Map(kind) => (
                rendered.map(kind).get(&skip.name).map(|v| Value::from(v.as_str())),
                metadata(kind.field, &skip.name).map(Value::from),
            ),
            Place::InitContainer => {
                (rendered.placed_container(Placement::Init, &skip.name), container(&skip.name).cloned())
            }
            Place::Sidecar => {
                let placement = Placement::of_sidecars(native);
                (rendered.placed_container(placement, &skip.name), container(&skip.name).cloned())
            }
            Place::AppList(kind) => {
                let app = skip.container.as_deref().and_then(container);
                let items = app.and_then(|c| c.get(kind.field)).and_then(Value::as_array);
                let in_effect = items.and_then(|items| Some((items, kind.in_effect(items, &skip.name)?)));
                // The entry in effect may still be extended by a later one of its name (`$(NAME)
                // more`) that no template of this injection added: the container then runs with
                // another value than the template's.
                let merged = skip.container.as_ref().and_then(|c| status.app_containers.get(c));
                let merged = merged.map(|a| a.env_merges.as_slice()).unwrap_or_default();
                let extension = in_effect.and_then(|(items, (index, _))| match kind.kind == ItemKind::Env {
                    true => env_merge::extension_after(items, index, merged),
                    false => None,
                });
                if let Some(extension) = extension {
                    let value = extension.get("value").and_then(Value::as_str).unwrap_or_default();
                    found.push(format!(
                        "the pod's {what} is extended by a later entry of its name ({value:?}), so the container does not run with the template's value"
                    ));
                    continue;
                }
                (kind.find(rendered.app_list(kind), &skip.name).cloned(), in_effect.map(|(_, (_, item))| item.clone()))
            }
            // Skipped only when the pod already has exactly this entry (its key is its value).
            Place::EnvMerge => continue,
        };
        let (Some(expected), Some(actual)) = (expected, actual) else {
            found.push(format!("the pod's {what} takes the place of the template's"));
            continue;
        };
        if let Some(difference) = first_difference(&expected, &actual) {
            found.push(format!("the pod's {what} is not the template's ({difference})"));
        } else if !ownership::exact(&expected, &actual) {
            found.push(format!("the pod's {what} holds fields the template does not set"));
        } else if let Some(before) = runs_late(pod, status, skip, rendered, native, enforced) {
            found.push(format!(
                "the pod's {what} is the template's, but it runs after the pod's own init container {before:?}, where the template's runs before the pod's own"
            ));
        }
    }
    found
}

/// The host names of an enforced template's host aliases that another entry of the pod's
/// `hostAliases` maps to another IP, one sentence each. Host aliases are identified by IP, so such
/// an entry is no conflict for the merge, but the kubelet writes every entry to `/etc/hosts`, where
/// the first line that names a host wins: the pod's (written before the injected ones) would send
/// the agent's traffic elsewhere. (A pod's DNS settings, `dnsPolicy: None` included, do not: the
/// resolver reads `/etc/hosts` first.)
pub fn shadowed_host_names(pod: &Value, rendered: &RenderedTemplate) -> Vec<String> {
    let field = HOST_ALIASES.field;
    let in_pod = pod.get("spec").and_then(|s| s.get(field)).and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let names = |alias: &Value| -> Vec<String> {
        let hostnames = alias.get("hostnames").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        hostnames.iter().filter_map(Value::as_str).map(str::to_owned).collect()
    };
    let rendered_aliases = rendered.pod_list(HOST_ALIASES);
    // The template's own lines are the template's business (it may map a name to two IPs).
    let own_ips: Vec<&str> = rendered_aliases.iter().filter_map(|a| a.get("ip").and_then(Value::as_str)).collect();
    let mut found = Vec::new();
    for alias in rendered_aliases {
        let ip = alias.get("ip").and_then(Value::as_str).unwrap_or_default();
        for hostname in names(alias) {
            let other = in_pod.iter().find(|a| {
                let theirs = a.get("ip").and_then(Value::as_str).unwrap_or_default();
                !own_ips.contains(&theirs) && names(a).iter().any(|n| n.eq_ignore_ascii_case(&hostname))
            });
            if let Some(other) = other {
                let theirs = other.get("ip").and_then(Value::as_str).unwrap_or_default();
                found.push(format!(
                    "the pod's host alias {theirs} maps host name {hostname:?}, which the template maps to {ip}: /etc/hosts would name it twice, and the first line wins"
                ));
            }
        }
    }
    found
}

/// The mounts of an app container that an enforced template mounts something above, one sentence
/// each: a mount at a deeper path (`/var/audit/libaudit.so`, a subPath or not) hides that part of
/// the template's (`/var/audit`) from the app, which then reads the pod's file instead. `pod` is
/// the pod as the injection leaves it; the app containers are those the template targets that
/// no template added.
pub fn shadowed_mounts(pod: &Value, status: &InjectionStatus, rendered: &RenderedTemplate) -> Vec<String> {
    let mounts = rendered.app_list(VOLUME_MOUNTS);
    if mounts.is_empty() {
        return Vec::new();
    }
    let path =
        |mount: &Value| mount.get("mountPath").and_then(Value::as_str).map(|p| p.trim_end_matches('/').to_owned());
    let mut found = Vec::new();
    for (name, container) in targeted_app_containers(pod, status, rendered) {
        let own = container.get(VOLUME_MOUNTS.field).and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        for top in mounts.iter().filter_map(path) {
            let below = own
                .iter()
                .filter_map(|m| Some((path(m)?, m)))
                .find(|(p, _)| p.strip_prefix(top.as_str()).is_some_and(|rest| rest.starts_with('/')));
            if let Some((deeper, mount)) = below {
                let volume = mount.get("name").and_then(Value::as_str).unwrap_or_default();
                found.push(format!(
                    "the pod's mount of volume {volume:?} at {deeper:?} in container {name:?} hides part of the template's mount at {top:?}"
                ));
            }
        }
    }
    found
}

/// The app containers of `pod` (as the injection leaves it) that `rendered` targets and no
/// template added (`status`), with their names.
fn targeted_app_containers<'a>(
    pod: &'a Value,
    status: &'a InjectionStatus,
    rendered: &'a RenderedTemplate,
) -> impl Iterator<Item = (&'a str, &'a Value)> {
    let containers = pod.get("spec").and_then(|s| s.get("containers")).and_then(Value::as_array);
    containers.into_iter().flatten().filter_map(move |container| {
        let name = container.get("name").and_then(Value::as_str)?;
        let app = !status.containers.iter().any(|c| c == name) && rendered.targets.includes(name);
        app.then_some((name, container))
    })
}

/// The env entries of an app container that replace a key an enforced template's `envFrom`
/// source provides (its `keys:`), one sentence each: Kubernetes gives an `env` entry precedence
/// over every `envFrom` source, so `LD_PRELOAD=""` would neutralise the template's. `pod` is the
/// pod as the injection leaves it; the app containers are those the template targets that no
/// template added; the template's own `env` items are its business.
pub fn replaced_env_from_keys(pod: &Value, status: &InjectionStatus, rendered: &RenderedTemplate) -> Vec<String> {
    if rendered.env_from_keys.is_empty() {
        return Vec::new();
    }
    let own: Vec<&str> = rendered.app_list(ENV).iter().filter_map(|e| e.get("name").and_then(Value::as_str)).collect();
    let mut found = Vec::new();
    for (name, container) in targeted_app_containers(pod, status, rendered) {
        let env = container.get(ENV.field).and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        let mut named: Vec<&str> = env.iter().filter_map(|e| e.get("name").and_then(Value::as_str)).collect();
        named.sort_unstable();
        named.dedup();
        for variable in named.into_iter().filter(|n| !own.contains(n)) {
            if let Some(source) = rendered.env_from_keys.get(variable) {
                found.push(format!(
                    "the env var {variable:?} of container {name:?} replaces the one the template's envFrom source {source} provides (an env entry wins over envFrom): remove it"
                ));
            }
        }
    }
    found
}

/// Why the pod cannot have `template`, which needs a process namespace of its containers' own
/// (`ownProcessNamespace: true`), when it shares one among its containers: the app could then
/// see, signal or stop the template's (a stopped agent is not restarted).
pub fn shared_process_namespace(pod: &Value, template: &Template) -> Option<String> {
    let shared = pod.pointer("/spec/shareProcessNamespace").and_then(Value::as_bool) == Some(true);
    (template.own_process_namespace && shared).then(|| {
        "the pod shares one process namespace among its containers (shareProcessNamespace: true), so its app could signal or stop the template's containers, which need their own: remove shareProcessNamespace from the pod".to_owned()
    })
}

/// Where a pod's exact copy of an enforced template's init container or native sidecar (`skip`)
/// stands: the template's runs before the pod's own init containers (a traffic-redirect init
/// container, an agent an app's init container may need), and a copy the pod put after one of its
/// own would let that one run first. The first init container before the copy that neither this
/// injection added nor is an exact copy of an enforced template's item (checked in its turn), if
/// any. `None` for an init container the template puts last (`position: last`) and for classic
/// sidecars, which start with the app whatever their place.
fn runs_late(
    pod: &Value,
    status: &InjectionStatus,
    skip: &crate::model::status::Skipped,
    rendered: &RenderedTemplate,
    native: bool,
    enforced: &dyn Fn(&str) -> bool,
) -> Option<String> {
    let runs_first = match skip.kind.place() {
        Place::InitContainer => {
            rendered.positions.get(&skip.name) != Some(&crate::model::kinds::ContainerPosition::Last)
        }
        Place::Sidecar => native,
        _ => false,
    };
    if !runs_first {
        return None;
    }
    let inits = pod.get("spec").and_then(|s| s.get("initContainers")).and_then(Value::as_array)?;
    let names: Vec<&str> = inits.iter().filter_map(|c| c.get("name").and_then(Value::as_str)).collect();
    let at = names.iter().position(|n| *n == skip.name)?;
    let injected = |name: &str| status.init_containers.iter().chain(&status.native_sidecars).any(|n| n == name);
    let enforced_copy = |name: &str| {
        status.skipped.iter().any(|s| {
            s.name == name
                && s.owner == "pod"
                && matches!(s.kind.place(), Place::InitContainer | Place::Sidecar)
                && enforced(&s.template)
        })
    };
    names[..at].iter().find(|n| !injected(n) && !enforced_copy(n)).map(|n| (*n).to_owned())
}

/// The items of an enforced template that a status annotation claims as injected and that are in
/// the pod with every field the template sets, but with more (`present`, not `owned`; see
/// `ownership`). For other templates such an item counts as injected, since later mutating
/// webhooks may add fields; for an enforced one it would let whoever writes the status add fields
/// (an env var that turns the agent off) to the mandated sidecar, so it is a conflict.
pub fn inexact_items(present: &InjectionStatus, owned: &InjectionStatus, rendered: &RenderedTemplate) -> Vec<String> {
    let inexact = |name: &str, present: &[String], owned: &[String]| {
        present.iter().any(|n| n == name) && !owned.iter().any(|n| n == name)
    };
    let name = |item: &Value| item.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let mut found = Vec::new();
    let mut report = |kind: &str, item: String, container: Option<&str>| {
        let of = container.map(|c| format!(" of container {c:?}")).unwrap_or_default();
        found.push(format!(
            "the pod's {kind} {item:?}{of} holds fields the template does not set (its status annotation claims it was injected)"
        ));
    };
    let containers: Vec<String> = present.containers.iter().chain(&present.init_containers).cloned().collect();
    let owned_containers: Vec<String> = owned.containers.iter().chain(&owned.init_containers).cloned().collect();
    for (kind, items) in [("init container", &rendered.init_containers), ("sidecar", &rendered.sidecars)] {
        for item in items.iter().map(name).filter(|n| inexact(n, &containers, &owned_containers)) {
            report(kind, item, None);
        }
    }
    for kind in &POD_LISTS {
        let (present, owned) = ((kind.claimed)(present), (kind.claimed)(owned));
        for item in
            rendered.pod_list(kind).iter().filter_map(|i| kind.identity(i)).filter(|n| inexact(n, present, owned))
        {
            report(kind.kind.describe(), item.to_owned(), None);
        }
    }
    for kind in &MAPS {
        let (present, owned) = ((kind.claimed)(present), (kind.claimed)(owned));
        for key in rendered.map(kind).keys().filter(|k| inexact(k, present, owned)) {
            report(kind.kind.describe(), key.clone(), None);
        }
    }
    for (container, here) in &present.app_containers {
        let mine = owned.app_containers.get(container).cloned().unwrap_or_default();
        for kind in &APP_LISTS {
            let (here, mine) = ((kind.claimed)(here), (kind.claimed)(&mine));
            for item in rendered.app_list(kind).iter().filter_map(|i| kind.identity(i)) {
                if inexact(&item, here, mine) {
                    report(kind.kind.describe(), item.into_owned(), Some(container));
                }
            }
        }
    }
    found
}

/// What the enforcement policy requires of a pod a template is enforced for, when the injector
/// cannot be asked: the items whose presence does not depend on the pod, and the fields of its
/// containers that are the same for every pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    /// The template.
    pub template: String,
    /// Its content hash (for people reading the params; the policy does not compare it).
    pub hash: String,
    /// Classic sidecars, required in `spec.containers`.
    pub containers: Vec<RequiredContainer>,
    /// Init containers and native sidecars, required in `spec.initContainers`.
    pub init_containers: Vec<RequiredContainer>,
    /// Required in `spec.volumes`.
    pub volumes: Vec<String>,
    /// `ownProcessNamespace: true`: the pod may not share its process namespace.
    pub own_process_namespace: bool,
    /// The host names its host aliases map, each with its IP (those the same for every pod): no
    /// other alias of the pod may map one of them.
    pub host_names: Vec<(String, String)>,
    /// The pod label keys its `podSelector` reads: an update may not change them, so a pod can
    /// neither leave the template's guard (then change an injected image unchecked) nor join it
    /// without the template's items.
    pub selector_labels: Vec<String>,
    /// The env vars its `envFrom` sources' `keys:` name (prefix included, those the same for every
    /// pod): no `env` entry of an app container it targets may set one.
    pub env_from_keys: Vec<String>,
    /// The mount paths of its `appContainers.volumeMounts` (those the same for every pod, without a
    /// trailing `/`): no other mount of an app container it targets may lie below one.
    pub mount_paths: Vec<String>,
    /// The app containers it targets (`appContainers.containers` / `excludeContainers`).
    pub app_targets: AppTargets,
    /// Items the policy cannot check, with why (for `check-templates`).
    pub unchecked: Vec<String>,
}

/// A container the policy requires, with the fields it compares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequiredContainer {
    /// Its name.
    pub name: String,
    /// A native sidecar: must keep `restartPolicy: Always`.
    pub native: bool,
    /// It runs before the pod's own init containers (a native sidecar, or an init container the
    /// template does not put last): the policy refuses a pod whose copy runs after one of them.
    pub runs_first: bool,
    /// The image, when the same for every pod.
    pub image: Option<String>,
    /// The command, when the same for every pod (an empty list: the pod must not set one).
    pub command: Option<Vec<String>>,
    /// The args, likewise.
    pub args: Option<Vec<String>>,
    /// What a resize may not go below (`resize::floor_of`, the entries the policy can compare),
    /// when the same for every pod.
    pub resource_floor: Option<Vec<(&'static str, String, String)>>,
}

/// Separates list elements in the params (see [`Requirements::params_data`]).
pub const LIST_SEPARATOR: char = '\u{1f}';

impl Requirements {
    /// What every version in `versions` requires (the first is the one in service): while a
    /// rollout or a pin keeps other versions of a template in service
    /// (`TemplateSet::versions_in_service`), the policy must admit a pod of any of them, so it
    /// checks what they share, and says what it leaves to the webhook.
    pub fn common(versions: &[&Template], native_sidecars: bool) -> Requirements {
        let mut all = versions.iter().map(|t| Requirements::of(t, native_sidecars));
        let Some(mut common) = all.next() else { return Requirements::default() };
        for other in all {
            common.intersect(other);
        }
        common
    }

    /// Keeps only what `other` requires too.
    fn intersect(&mut self, other: Requirements) {
        let differs =
            |field: &str| format!("{field}: the versions in service differ, so the policy leaves it to the webhook");
        let mut unchecked = Vec::new();
        let pairs = [(&mut self.containers, &other.containers), (&mut self.init_containers, &other.init_containers)];
        for (mine, theirs) in pairs {
            mine.retain_mut(|container| {
                let Some(their) = theirs.iter().find(|c| c.name == container.name) else {
                    unchecked.push(differs(&format!("container {:?}", container.name)));
                    return false;
                };
                container.native &= their.native;
                container.runs_first &= their.runs_first;
                for (field, same) in [
                    ("image", container.image == their.image),
                    ("command", container.command == their.command),
                    ("args", container.args == their.args),
                    ("resources", container.resource_floor == their.resource_floor),
                ] {
                    if !same {
                        unchecked.push(differs(&format!("container {:?} {field}", container.name)));
                        match field {
                            "image" => container.image = None,
                            "command" => container.command = None,
                            "args" => container.args = None,
                            _ => container.resource_floor = None,
                        }
                    }
                }
                true
            });
        }
        self.volumes.retain(|v| other.volumes.contains(v));
        self.own_process_namespace &= other.own_process_namespace;
        self.host_names.retain(|h| other.host_names.contains(h));
        self.selector_labels.retain(|l| other.selector_labels.contains(l));
        if self.app_targets == other.app_targets {
            self.env_from_keys.retain(|k| other.env_from_keys.contains(k));
            self.mount_paths.retain(|p| other.mount_paths.contains(p));
        } else {
            unchecked.push(differs("the app containers it targets (and their envFrom keys and mounts)"));
            self.env_from_keys.clear();
            self.mount_paths.clear();
        }
        for item in other.unchecked.into_iter().chain(unchecked) {
            if !self.unchecked.contains(&item) {
                self.unchecked.push(item);
            }
        }
    }

    /// What `template` requires of every pod it is enforced for, on a cluster whose nodes run
    /// native sidecars or not (`native_sidecars`; the template's sidecar mode decides, as for an
    /// injection).
    pub fn of(template: &Template, native_sidecars: bool) -> Requirements {
        let native = crate::model::native::is_native(template.sidecar_mode, native_sidecars);
        let mut requirements = Requirements {
            template: template.name.to_string(),
            hash: template.hash.clone(),
            own_process_namespace: template.own_process_namespace,
            selector_labels: template.pod_selector.iter().flat_map(|s| s.label_keys()).map(str::to_owned).collect(),
            app_targets: template.inject.targets.clone(),
            ..Requirements::default()
        };
        requirements.add_env_from_keys(template);
        requirements.add_mount_paths(template);
        let spec = &template.inject;
        let lists: [(&[SeqItem], &str, bool); 3] = [
            (&spec.init_containers, "init container", false),
            (&spec.sidecars, "sidecar", native),
            (&spec.pod_lists[VOLUMES.index], "volume", false),
        ];
        for (items, kind, native_sidecar) in lists {
            for (index, item) in items.iter().enumerate() {
                let fields = match fixed_item(template, item) {
                    Ok(fields) => fields,
                    Err(why) => {
                        requirements.unchecked.push(format!("{kind} #{} {why}", index + 1));
                        continue;
                    }
                };
                let Some(Some(Value::String(name))) = fields.get("name").cloned() else {
                    requirements.unchecked.push(format!("{kind} #{}: its name depends on the pod", index + 1));
                    continue;
                };
                if kind == "volume" {
                    if item.fallback.is_some() {
                        requirements.unchecked.push(format!(
                            "volume {name:?}: it is an image volume or its fallback (an emptyDir and the init container that fills it) depending on the nodes, so the policy requires the volume by name only"
                        ));
                    }
                    requirements.volumes.push(name);
                    continue;
                }
                let strings = |field: &str| -> Option<Vec<String>> {
                    match fields.get(field) {
                        None => Some(Vec::new()),
                        Some(Some(Value::Array(items))) => items
                            .iter()
                            .map(|i| i.as_str().filter(|s| !s.contains(LIST_SEPARATOR)).map(str::to_owned))
                            .collect(),
                        Some(_) => None,
                    }
                };
                let resource_floor = match fields.get("resources") {
                    // Sized from the app's containers: not the same for every pod.
                    _ if item.sizing.is_some() => None,
                    None => Some(Vec::new()),
                    Some(Some(resources)) => {
                        // `requests.cpu=50m` in the params: names and quantities hold neither a
                        // space nor '=', and `quantity()` fails the whole check on one it cannot
                        // read.
                        let (readable, unreadable): (Vec<_>, Vec<_>) =
                            resize::floor_of(Some(resources)).into_iter().partition(|(_, resource, quantity)| {
                                !resource.contains([' ', '=']) && resize::parses(quantity)
                            });
                        for (field, resource, quantity) in unreadable {
                            requirements.unchecked.push(format!(
                                "{kind} {name:?}: resources.{field}.{resource} is {quantity:?}, not a quantity the policy can compare"
                            ));
                        }
                        Some(readable)
                    }
                    Some(None) => None,
                };
                let container = RequiredContainer {
                    image: match fields.get("image") {
                        Some(Some(Value::String(image))) => Some(image.clone()),
                        _ => None,
                    },
                    command: strings("command"),
                    args: strings("args"),
                    resource_floor,
                    native: native_sidecar,
                    runs_first: native_sidecar
                        || (kind == "init container"
                            && item.position != Some(crate::model::kinds::ContainerPosition::Last)),
                    name,
                };
                for (field, fixed) in [
                    ("image", container.image.is_some()),
                    ("command", container.command.is_some()),
                    ("args", container.args.is_some()),
                    ("resources", container.resource_floor.is_some()),
                ] {
                    if !fixed {
                        requirements.unchecked.push(format!(
                            "{kind} {:?}: {field} is not the same for every pod (it reads the pod, the namespace or an overridable value), so the policy does not compare it",
                            container.name
                        ));
                    }
                }
                match kind {
                    "sidecar" if !native => requirements.containers.push(container),
                    _ => requirements.init_containers.push(container),
                }
            }
        }
        for (index, item) in spec.pod_lists[HOST_ALIASES.index].iter().enumerate() {
            let fixed = fixed_item(template, item).ok().and_then(|fields| {
                let ip = fields.get("ip").cloned().flatten()?;
                let Some(Value::Array(names)) = fields.get("hostnames").cloned().flatten() else { return None };
                let names: Option<Vec<String>> =
                    names.iter().map(|n| n.as_str().map(str::to_ascii_lowercase)).collect();
                Some((ip.as_str()?.to_owned(), names?))
            });
            match fixed {
                Some((ip, names)) => requirements.host_names.extend(names.into_iter().map(|n| (n, ip.clone()))),
                None => requirements.unchecked.push(format!(
                    "host alias #{}: its IP or host names are not the same for every pod, so the policy does not check that the pod maps them elsewhere",
                    index + 1
                )),
            }
        }
        requirements
    }

    /// The env vars of the template's `envFrom` keys that are the same for every pod, less those
    /// its own `env` items set; the rest goes to `unchecked`.
    fn add_env_from_keys(&mut self, template: &Template) {
        let sources = template.inject.app_lists[ENV_FROM.index].iter().enumerate().filter(|(_, s)| !s.keys.is_empty());
        let own: Vec<String> = template.inject.app_lists[ENV.index]
            .iter()
            .filter_map(|item| match fixed_item(template, item).ok()?.get("name") {
                Some(Some(Value::String(name))) => Some(name.clone()),
                _ => None,
            })
            .collect();
        for (index, source) in sources {
            let what = format!("envFrom source #{} (keys {})", index + 1, source.keys.join(", "));
            if template.pod_choices.app_containers {
                self.unchecked.push(format!("{what}: the pod chooses the app containers that get it"));
                continue;
            }
            let prefix = match fixed_item(template, source).map(|fields| fields.get("prefix").cloned()) {
                Ok(None) => String::new(),
                Ok(Some(Some(Value::String(prefix)))) if !prefix.contains(' ') => prefix,
                Ok(_) => {
                    self.unchecked.push(format!("{what}: its prefix is not the same for every pod"));
                    continue;
                }
                Err(why) => {
                    self.unchecked.push(format!("{what} {why}"));
                    continue;
                }
            };
            for key in &source.keys {
                let name = format!("{prefix}{key}");
                if !own.contains(&name) && !self.env_from_keys.contains(&name) {
                    self.env_from_keys.push(name);
                }
            }
        }
    }

    /// The paths of the template's app-container mounts that are the same for every pod; the rest
    /// goes to `unchecked`.
    fn add_mount_paths(&mut self, template: &Template) {
        for (index, mount) in template.inject.app_lists[VOLUME_MOUNTS.index].iter().enumerate() {
            let what = format!("app-container mount #{}", index + 1);
            if template.pod_choices.app_containers {
                self.unchecked.push(format!("{what}: the pod chooses the app containers that get it"));
                continue;
            }
            match fixed_item(template, mount).map(|fields| fields.get("mountPath").cloned()) {
                Ok(Some(Some(Value::String(path)))) if !path.contains(' ') => {
                    let path = path.trim_end_matches('/').to_owned();
                    if !path.is_empty() && !self.mount_paths.contains(&path) {
                        self.mount_paths.push(path);
                    }
                }
                Ok(_) => self.unchecked.push(format!("{what}: its mountPath is not the same for every pod")),
                Err(why) => self.unchecked.push(format!("{what} {why}")),
            }
        }
    }

    /// The params ConfigMap data the enforcement policy in `deploy/` reads. CEL cannot parse JSON,
    /// so every value is a flat string: names separated by spaces (DNS labels never hold one),
    /// list fields as each element preceded by [`LIST_SEPARATOR`] (a control character refused in
    /// the template's own lists, so the encoding is one-to-one).
    pub fn params_data(&self) -> BTreeMap<String, String> {
        let names = |items: &[RequiredContainer]| items.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(" ");
        let mut data = BTreeMap::from([
            ("template".to_owned(), self.template.clone()),
            ("hash".to_owned(), self.hash.clone()),
            ("containers".to_owned(), names(&self.containers)),
            ("initContainers".to_owned(), names(&self.init_containers)),
            (
                "nativeSidecars".to_owned(),
                self.init_containers.iter().filter(|c| c.native).map(|c| c.name.as_str()).collect::<Vec<_>>().join(" "),
            ),
            ("volumes".to_owned(), self.volumes.join(" ")),
            ("ownProcessNamespace".to_owned(), self.own_process_namespace.to_string()),
            ("selectorLabels".to_owned(), self.selector_labels.join(" ")),
            ("envFromKeys".to_owned(), self.env_from_keys.join(" ")),
            ("mountPaths".to_owned(), self.mount_paths.join(" ")),
            ("appContainersExcept".to_owned(), self.app_targets.except.join(" ")),
            (
                "hostNames".to_owned(),
                self.host_names.iter().map(|(name, ip)| format!("{name}={ip}")).collect::<Vec<_>>().join(" "),
            ),
            (
                "runFirst".to_owned(),
                self.init_containers
                    .iter()
                    .filter(|c| c.runs_first)
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        ]);
        if let Some(only) = &self.app_targets.only {
            data.insert("appContainersOnly".to_owned(), only.join(" "));
        }
        let encode = |list: &[String]| list.iter().map(|e| format!("{LIST_SEPARATOR}{e}")).collect::<String>();
        for container in self.containers.iter().chain(&self.init_containers) {
            if let Some(image) = &container.image {
                data.insert(format!("image.{}", container.name), image.clone());
            }
            if let Some(command) = &container.command {
                data.insert(format!("command.{}", container.name), encode(command));
            }
            if let Some(args) = &container.args {
                data.insert(format!("args.{}", container.name), encode(args));
            }
            if let Some(floor) = container.resource_floor.as_ref().filter(|f| !f.is_empty()) {
                let entries = floor.iter().map(|(field, resource, quantity)| format!("{field}.{resource}={quantity}"));
                data.insert(format!("resources.{}", container.name), entries.collect::<Vec<_>>().join(" "));
            }
        }
        data
    }
}

/// The objects the injector keeps in the cluster for one enforced template: the params ConfigMap
/// (in `own_namespace`) and the binding of the enforcement policy to the pods the template is
/// enforced for (`versions`: the template in service first, then the other versions a pod may
/// have: see [`Requirements::common`]). Both are plain JSON for server-side apply. For an `enforced: audit` template the
/// binding warns the client and writes the audit log instead of refusing (`Warn`, `Audit`).
/// `may_precede` ([`may_precede`]) lets the policy check where the template's init containers
/// and native sidecars run (`runFirst`); `None` leaves that to the webhook.
pub fn policy_objects(
    versions: &[&Template],
    native: bool,
    own_namespace: &str,
    may_precede: Option<&[String]>,
) -> (Value, Value) {
    let template = versions[0];
    let name = format!("{}{}", names::ENFORCED_OBJECT_PREFIX, template.name);
    let labels = json!({ names::ENFORCED_TEMPLATE_LABEL: &*template.name });
    let mut data = Requirements::common(versions, native).params_data();
    if let Some(names) = may_precede {
        data.insert("mayPrecede".to_owned(), names.join(" "));
    }
    let params = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": own_namespace, "labels": labels},
        "data": data,
    });
    // The namespaces the webhook serves (opted in, not excluded), narrowed by the template's own
    // namespaceSelector; the pods its podSelector matches, opted out or not.
    let mut namespace_expressions = scope::namespace_expressions(&[own_namespace]);
    let mut namespace_selector = json!({});
    if let Some(selector) = &template.namespace_selector {
        let own = serde_json::to_value(&selector.label_selector).unwrap_or_default();
        if let Some(labels) = own.get("matchLabels") {
            namespace_selector["matchLabels"] = labels.clone();
        }
        if let Some(Value::Array(expressions)) = own.get("matchExpressions") {
            namespace_expressions.splice(0..0, expressions.iter().cloned());
        }
    }
    namespace_selector["matchExpressions"] = Value::Array(namespace_expressions);
    let object_selector = template
        .pod_selector
        .as_ref()
        .map_or_else(|| json!({}), |s| serde_json::to_value(&s.label_selector).unwrap_or_default());
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "policyName": names::ENFORCEMENT_POLICY,
            "validationActions": if template.audit { json!(["Warn", "Audit"]) } else { json!(["Deny"]) },
            "paramRef": {"name": name, "namespace": own_namespace, "parameterNotFoundAction": "Deny"},
            "matchResources": {"namespaceSelector": namespace_selector, "objectSelector": object_selector},
        },
    });
    (params, binding)
}

/// The init containers that may run before an enforced template's (`runFirst`) without the policy
/// refusing the pod: every init container, sidecar (native ones are init containers) and image
/// volume fallback's init container that some template in service may inject, by name. The policy
/// cannot tell which templates a pod got (its status is the pod's word), so a pod's own init
/// container named like one of these passes it (the webhook, which knows, refuses it). `None`
/// when some template names such a container after the pod: then the policy cannot tell a
/// template's from the pod's, and leaves positions to the webhook.
pub fn may_precede(templates: &crate::templates::set::TemplateSet) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for template in templates.iter() {
        let spec = &template.inject;
        let fallbacks = spec.pod_lists.iter().flatten().filter_map(|v| v.fallback.as_ref());
        let pieces = spec.init_containers.iter().chain(&spec.sidecars).map(|item| &item.piece);
        for piece in pieces.chain(fallbacks.map(|f| &f.init_container)) {
            let name = match piece {
                Piece::Map(entries) => {
                    entries.iter().find(|(k, _)| k == "name").and_then(|(_, p)| fixed_value(template, p))
                }
                Piece::Literal(Value::Object(map)) => map.get("name").cloned(),
                _ => None,
            };
            let Some(Value::String(name)) = name else { return None };
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names.sort();
    Some(names)
}

/// The fields of an item that are the same for every pod (`None` for a field that is not), or
/// why the item itself may or may not be there depending on the pod.
fn fixed_item(template: &Template, item: &SeqItem) -> Result<BTreeMap<String, Option<Value>>, String> {
    if let Some(when) = &item.when {
        match fixed_text(template, when) {
            Some(output) if output == "true" => {}
            Some(_) => return Err("is never added (its when: is always false)".to_owned()),
            None => return Err("is added only for some pods (its when: depends on the pod)".to_owned()),
        }
    }
    match &item.piece {
        Piece::Map(entries) => {
            Ok(entries.iter().map(|(key, piece)| (key.clone(), fixed_value(template, piece))).collect())
        }
        Piece::Literal(Value::Object(map)) => Ok(map.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect()),
        _ => Err("is not a mapping".to_owned()),
    }
}

/// A piece's value when it is the same for every pod.
fn fixed_value(template: &Template, piece: &Piece) -> Option<Value> {
    match piece {
        Piece::Literal(value) => Some(value.clone()),
        Piece::Text(text) => fixed_text(template, text).map(Value::String),
        Piece::ValueRef { path, .. } => {
            let overridable = template.overridable.iter().any(|o| Some(&o.name) == path.first());
            match overridable {
                true => None,
                false => crate::templates::expression::lookup_path(&template.values, path).cloned(),
            }
        }
        Piece::Seq(items) => items
            .iter()
            .map(|item| match &item.when {
                Some(_) => None,
                None => fixed_value(template, &item.piece),
            })
            .collect::<Option<Vec<_>>>()
            .map(Value::Array),
        Piece::Map(entries) => entries
            .iter()
            .map(|(k, p)| fixed_value(template, p).map(|v| (k.clone(), v)))
            .collect::<Option<serde_json::Map<_, _>>>()
            .map(Value::Object),
    }
}

/// The output of an expression string that reads neither the pod nor the namespace nor a value a
/// pod may override.
fn fixed_text(template: &Template, text: &crate::templates::expression::CompiledText) -> Option<String> {
    let may_be_overridden = text.reads_values && !template.overridable.is_empty();
    match may_be_overridden {
        true => None,
        false => text.constant_output().map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::WarningCode;
    use crate::review::validate::{Verdict, validate_pod, validate_pod_update};
    use crate::test_support::{apply, engine, opted_in, request};
    use crate::{Denial, Engine, Outcome, names};

    /// An enforced audit agent for pods labelled `app`, plus an ordinary default template.
    const AUDIT: &str = r#"
enforced: true
sidecarMode: native
podSelector: {matchExpressions: [{key: app, operator: Exists}]}
values: {image: "audit:1.0", level: info}
overridable: [level]
inject:
  labels: {audit.example.com/agent: "on"}
  sidecars:
    - name: audit
      image: "{{ values.image }}"
      args: ["--level={{ values.level }}"]
      command: [/audit]
  volumes:
    - {name: audit-spool, emptyDir: {}}
"#;
    const LOGS: &str =
        "default: true\nsidecarMode: container\ninject:\n  sidecars:\n    - {name: logs, image: fluent-bit}\n";
    const DEBUG: &str = "inject:\n  sidecars:\n    - {name: audit, image: busybox}\n";

    fn audit_engine() -> Engine {
        engine(&[("logs", LOGS), ("audit", AUDIT), ("debug", DEBUG)])
    }

    fn pod(labels: Value, annotations: Value, init: Value) -> Value {
        json!({
            "metadata": {"generateName": "web-", "namespace": "shop", "labels": labels, "annotations": annotations},
            "spec": {"initContainers": init, "containers": [{"name": "web", "image": "nginx"}]}
        })
    }

    fn evaluate(engine: &Engine, pod: &Value) -> Outcome {
        engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome
    }

    fn injected_names(pod: &Value) -> Vec<String> {
        ["initContainers", "containers"]
            .iter()
            .filter_map(|l| pod["spec"][l].as_array())
            .flatten()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_pod_cannot_skip_an_enforced_template() {
        let engine = audit_engine();
        let app = json!({"app": "web"});
        let opted_out = json!({"app": "web", names::INJECT_LABEL: names::INJECT_DISABLED});
        let none_named = json!({names::TEMPLATES_ANNOTATION: " , "});
        // (case, labels, annotations, containers the pod ends with)
        let cases: Vec<(&str, Value, Value, Vec<&str>)> = vec![
            ("defaults", app.clone(), json!({}), vec!["audit", "web", "logs"]),
            ("annotation naming no template", app.clone(), none_named.clone(), vec!["audit", "web"]),
            ("opt-out label", opted_out.clone(), json!({}), vec!["audit", "web"]),
            ("opt-out label and annotation", opted_out, none_named, vec!["audit", "web"]),
            ("its selector does not match", json!({}), json!({}), vec!["web", "logs"]),
        ];
        for (case, labels, annotations, expected) in cases {
            let pod = pod(labels, annotations, json!([]));
            let Outcome::Inject(injection) = evaluate(&engine, &pod) else { panic!("{case}: not injected") };
            let injected = apply(&pod, &injection.patch);
            assert_eq!(injected_names(&injected), expected, "{case}");
            assert_eq!(injected["metadata"]["labels"][names::INJECTED_LABEL], "true", "{case}");
        }
    }

    #[test]
    fn a_look_alike_item_is_refused_with_what_to_do() {
        let engine = audit_engine();
        let app = json!({"app": "web"});
        let evil = json!([{"name": "audit", "image": "evil/not-audit", "command": ["/audit"], "args": ["--level=info"],
                           "restartPolicy": "Always"}]);
        let Outcome::Denied(denial) = evaluate(&engine, &pod(app.clone(), json!({}), evil)) else { panic!("allowed") };
        let message = denial.to_string();
        assert!(matches!(&denial, Denial::Enforced { template, .. } if template == "audit"), "{message}");
        for part in [
            "template audit is enforced for this pod",
            "the pod's sidecar \"audit\" is not the template's",
            "evil/not-audit",
            "Remove these items from the pod",
            "podSelector and namespaceSelector",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
        // The same with the pod's own label of the template's name and another value.
        let label = json!({"app": "web", "audit.example.com/agent": "off"});
        let Outcome::Denied(denial) = evaluate(&engine, &pod(label, json!({}), json!([]))) else { panic!("allowed") };
        assert!(denial.to_string().contains("the pod's label \"audit.example.com/agent\" is not the template's"));
        // A template the pod names that brings an item of the same name comes first, and loses.
        let named = json!({names::TEMPLATES_ANNOTATION: "debug"});
        let Outcome::Denied(denial) = evaluate(&engine, &pod(app.clone(), named, json!([]))) else { panic!("allowed") };
        assert!(denial.to_string().contains("sidecar \"audit\" is also added by template debug"), "{denial}");
        // A copy with extra fields is not the template's either.
        let extra = json!([{"name": "audit", "image": "audit:1.0", "command": ["/audit"], "args": ["--level=info"],
                            "restartPolicy": "Always", "securityContext": {"privileged": true}}]);
        let Outcome::Denied(denial) = evaluate(&engine, &pod(app, json!({}), extra)) else { panic!("allowed") };
        assert!(denial.to_string().contains("holds fields the template does not set"), "{denial}");
    }

    #[test]
    fn an_exact_copy_stands_and_is_reported_as_the_pods_own() {
        let engine = audit_engine();
        let exact = json!([{"name": "audit", "image": "audit:1.0", "command": ["/audit"], "args": ["--level=info"],
                            "restartPolicy": "Always", "imagePullPolicy": "IfNotPresent"}]);
        let pod = pod(json!({"app": "web"}), json!({}), exact);
        let Outcome::Inject(injection) = evaluate(&engine, &pod) else { panic!("not injected") };
        assert!(!injection.status.init_containers.contains(&"audit".to_owned()), "never reported as injected");
        assert_eq!(injection.status.conflicted_templates(), vec!["audit"]);
        let injected = apply(&pod, &injection.patch);
        assert_eq!(injected["metadata"]["labels"][names::INJECTED_LABEL], names::INJECTED_PARTIAL);
        // Admitted again: up to date, not refused, nothing added twice.
        assert!(matches!(evaluate(&engine, &injected), Outcome::UpToDate(_)));
    }

    #[test]
    fn an_exact_copy_the_pod_runs_after_its_own_init_container_is_refused() {
        let audit = audit_engine();
        let copy = json!({"name": "audit", "image": "audit:1.0", "command": ["/audit"], "args": ["--level=info"],
                          "restartPolicy": "Always", "imagePullPolicy": "IfNotPresent"});
        let own = own_init();
        let late = pod(json!({"app": "web"}), json!({}), json!([own.clone(), copy.clone()]));
        let Outcome::Denied(denial) = evaluate(&audit, &late) else { panic!("allowed") };
        let message = denial.to_string();
        assert!(
            message.contains("the pod's sidecar \"audit\" is the template's, but it runs after the pod's own init container \"redirect\""),
            "{message}"
        );
        // In its place (before the pod's own) it stands.
        let first = pod(json!({"app": "web"}), json!({}), json!([copy, own]));
        assert!(matches!(evaluate(&audit, &first), Outcome::Inject(_)));
        // An enforced init container a template puts last may stand anywhere.
        let last = "enforced: true\ninject:\n  initContainers:\n    - {name: warm, image: \"w:1\", position: last}\n";
        let last_engine = engine(&[("last", last)]);
        let copy = json!({"name": "warm", "image": "w:1"});
        for order in [json!([own_init(), copy.clone()]), json!([copy, own_init()])] {
            let pod = pod(json!({}), json!({}), order);
            assert!(matches!(evaluate(&last_engine, &pod), Outcome::Inject(_)), "{pod}");
        }
    }

    #[test]
    fn a_pod_alias_for_an_enforced_host_name_is_refused() {
        let collector =
            "inject:\n  hostAliases:\n    - {ip: 10.96.40.10, hostnames: [collector.internal, backup.internal]}\n";
        let enforced = engine(&[("collector", &format!("enforced: true\n{collector}"))]);
        let with_aliases = |aliases: Value| {
            let mut pod = pod(json!({}), json!({}), json!([]));
            pod["spec"]["hostAliases"] = aliases;
            pod
        };
        let shadow = with_aliases(json!([{"ip": "127.0.0.1", "hostnames": ["other", "Collector.Internal"]}]));
        let Outcome::Denied(denial) = evaluate(&enforced, &shadow) else { panic!("allowed") };
        assert!(
            denial.to_string().contains("the pod's host alias 127.0.0.1 maps host name \"collector.internal\", which the template maps to 10.96.40.10"),
            "{denial}"
        );
        // Other names, or the template's own line, stand.
        for aliases in [
            json!([{"ip": "127.0.0.1", "hostnames": ["other"]}]),
            json!([{"ip": "10.96.40.10", "hostnames": ["collector.internal", "backup.internal"]}]),
        ] {
            assert!(matches!(evaluate(&enforced, &with_aliases(aliases.clone())), Outcome::Inject(_)), "{aliases}");
        }
        // A template that maps a name to two IPs itself is its own business.
        let twice = "enforced: true\ninject:\n  hostAliases:\n    - {ip: 10.96.40.10, hostnames: [c]}\n    - {ip: 10.96.40.11, hostnames: [c]}\n";
        assert!(matches!(evaluate(&engine(&[("twice", twice)]), &with_aliases(json!([]))), Outcome::Inject(_)));
        // A template that is not enforced: the pod's line stands (the pod's items win).
        let plain = engine(&[("collector", &format!("default: true\n{collector}"))]);
        assert!(matches!(evaluate(&plain, &shadow), Outcome::Inject(_)));
    }

    #[test]
    fn a_pod_mount_below_an_enforced_mount_is_refused() {
        let audit = "enforced: true\ninject:\n  volumes:\n    - {name: audit-lib, emptyDir: {}}\n  appContainers:\n    volumeMounts:\n      - {name: audit-lib, mountPath: /var/audit/}\n";
        let engine = engine(&[("audit", audit)]);
        let with_mounts = |mounts: Value| {
            let mut pod = pod(json!({}), json!({}), json!([]));
            pod["spec"]["containers"][0]["volumeMounts"] = mounts;
            pod["spec"]["volumes"] = json!([{"name": "mine", "emptyDir": {}}]);
            pod
        };
        let hiding =
            with_mounts(json!([{"name": "mine", "mountPath": "/var/audit/libaudit.so", "subPath": "fake.so"}]));
        let Outcome::Denied(denial) = evaluate(&engine, &hiding) else { panic!("allowed") };
        assert!(
            denial.to_string().contains("the pod's mount of volume \"mine\" at \"/var/audit/libaudit.so\" in container \"web\" hides part of the template's mount at \"/var/audit\""),
            "{denial}"
        );
        // Beside it, or above it (the template's then hides the pod's), it stands.
        for mounts in
            [json!([{"name": "mine", "mountPath": "/var/audit-other"}]), json!([{"name": "mine", "mountPath": "/var"}])]
        {
            assert!(matches!(evaluate(&engine, &with_mounts(mounts.clone())), Outcome::Inject(_)), "{mounts}");
        }
        // The policy alone: the path, without its trailing `/`; one that reads the pod is not compared.
        let data = Requirements::of(engine.templates.get("audit").unwrap(), true).params_data();
        assert_eq!(data["mountPaths"], "/var/audit");
        let read = engine_with(&audit.replace("mountPath: /var/audit/", "mountPath: \"/{{ namespace.name }}\""));
        let requirements = Requirements::of(read.templates.get("t").unwrap(), true);
        assert!(requirements.mount_paths.is_empty(), "{requirements:?}");
        assert!(requirements.unchecked.iter().any(|u| u.contains("mountPath is not the same for every pod")));
    }

    #[test]
    fn an_env_entry_over_a_key_of_an_enforced_env_from_source_is_refused() {
        let preload = "enforced: true\ninject:\n  appContainers:\n    envFrom:\n      - {configMapRef: {name: agent-env}, keys: [LD_PRELOAD]}\n      - {secretRef: {name: agent-token}, prefix: AGENT_, keys: [TOKEN, tls.crt]}\n";
        let engine = engine(&[("preload", preload)]);
        let with_env = |env: Value| {
            let mut pod = pod(json!({}), json!({}), json!([]));
            pod["spec"]["containers"][0]["env"] = env;
            pod
        };
        for (name, source) in [("LD_PRELOAD", "configMap/agent-env"), ("AGENT_TOKEN", "secret/agent-token+AGENT_")] {
            let Outcome::Denied(denial) = evaluate(&engine, &with_env(json!([{"name": name, "value": ""}]))) else {
                panic!("{name}: allowed")
            };
            let expected = format!(
                "the env var {name:?} of container \"web\" replaces the one the template's envFrom source {source} provides"
            );
            assert!(denial.to_string().contains(&expected), "{denial}");
        }
        // Other names, and a key without its prefix, are the pod's business; the `keys:` are not
        // part of the injected source.
        let other = with_env(json!([{"name": "TOKEN", "value": "x"}, {"name": "PATH", "value": "/bin"}]));
        let Outcome::Inject(injection) = evaluate(&engine, &other) else { panic!("refused") };
        let patch = serde_json::to_string(&injection.patch).unwrap();
        assert!(patch.contains("agent-env") && !patch.contains("keys"), "{patch}");
        // `/validate`: a later mutator that sets the key after the injection is refused too.
        let mut stored = apply(&other, &injection.patch);
        let validate = |pod: &Value| validate_pod(&engine, &request(pod.clone(), opted_in("shop", &[])));
        assert!(matches!(validate(&stored), Verdict::Allowed(_)));
        stored["spec"]["containers"][0]["env"].as_array_mut().unwrap().push(json!({"name": "LD_PRELOAD", "value": ""}));
        let Verdict::Denied(message) = validate(&stored) else { panic!("allowed") };
        assert!(
            message.contains("replaces the one the template's envFrom source configMap/agent-env provides"),
            "{message}"
        );
        // A container the template does not target may set the name.
        let except = preload.replace("  appContainers:\n", "  appContainers:\n    excludeContainers: [web]\n");
        let engine = engine_with(&except);
        assert!(matches!(
            evaluate(&engine, &with_env(json!([{"name": "LD_PRELOAD", "value": ""}]))),
            Outcome::Inject(_)
        ));
        // The policy alone: the env vars, the containers it targets.
        let data = Requirements::of(engine.templates.get("t").unwrap(), true).params_data();
        assert_eq!(data["envFromKeys"], "LD_PRELOAD AGENT_TOKEN AGENT_tls.crt");
        assert_eq!((data["appContainersExcept"].as_str(), data.get("appContainersOnly")), ("web", None));
        let chosen = engine_with(&format!("podChoices: [appContainers]\n{preload}"));
        let requirements = Requirements::of(chosen.templates.get("t").unwrap(), true);
        assert!(requirements.env_from_keys.is_empty(), "{requirements:?}");
        assert!(requirements.unchecked[0].contains("the pod chooses the app containers"), "{requirements:?}");
        // Only an enforced template can say it, with literal keys.
        let err =
            crate::templates::template::Template::load("t", &preload.replace("enforced: true\n", "default: true\n"))
                .unwrap_err();
        assert!(err.message.contains("keys: on an envFrom source is for an enforced template"), "{err}");
        assert_eq!(err.line, Some(5));
        for (keys, message) in [
            ("[]", "the list is empty"),
            ("LD_PRELOAD", "keys must be a list"),
            ("['{{ values.k }}']", "is not a ConfigMap or Secret key"),
            ("[a b]", "is not a ConfigMap or Secret key"),
        ] {
            let text = preload.replace("[LD_PRELOAD]", keys);
            let err = crate::templates::template::Template::load("t", &text).unwrap_err();
            assert!(err.message.contains(message), "{keys}: {err}");
        }
    }

    #[test]
    fn a_pod_sharing_its_process_namespace_is_refused_where_the_template_needs_its_own() {
        let own = "enforced: true\nownProcessNamespace: true\ninject:\n  sidecars:\n    - {name: agent, image: a}\n";
        let engine = engine(&[("agent", own)]);
        let mut shared = pod(json!({}), json!({}), json!([]));
        shared["spec"]["shareProcessNamespace"] = json!(true);
        let Outcome::Denied(denial) = evaluate(&engine, &shared) else { panic!("allowed") };
        assert!(denial.to_string().contains("shareProcessNamespace: true"), "{denial}");
        shared["spec"]["shareProcessNamespace"] = json!(false);
        assert!(matches!(evaluate(&engine, &shared), Outcome::Inject(_)));
        // Without the key, sharing is the pod's choice.
        let plain = engine_with("enforced: true\ninject:\n  sidecars:\n    - {name: agent, image: a}\n");
        shared["spec"]["shareProcessNamespace"] = json!(true);
        assert!(matches!(evaluate(&plain, &shared), Outcome::Inject(_)));
        // The policy alone: a param.
        let data = Requirements::of(engine.templates.get("agent").unwrap(), true).params_data();
        assert_eq!(data["ownProcessNamespace"], "true");
        assert_eq!(
            Requirements::of(plain.templates.get("t").unwrap(), true).params_data()["ownProcessNamespace"],
            "false"
        );
        // Only an enforced template can ask for it.
        let err = crate::templates::template::Template::load("t", &own.replace("enforced: true\n", "default: true\n"))
            .unwrap_err();
        assert!(err.message.contains("ownProcessNamespace: true is a requirement of an enforced template"), "{err}");
        assert_eq!(err.line, Some(2));
    }

    fn own_init() -> Value {
        json!({"name": "redirect", "image": "iptables"})
    }

    #[test]
    fn a_forged_status_cannot_add_fields_to_an_enforced_sidecar() {
        let engine = audit_engine();
        let pod = pod(json!({"app": "web"}), json!({}), json!([]));
        let Outcome::Inject(injection) = evaluate(&engine, &pod) else { panic!("not injected") };
        let injected = apply(&pod, &injection.patch);
        assert!(matches!(evaluate(&engine, &injected), Outcome::UpToDate(_)), "re-admission of its own injection");
        // The same pod, its status intact, the audit sidecar told to stand down.
        let mut forged = injected.clone();
        forged["spec"]["initContainers"][0]["env"] = json!([{"name": "AUDIT_DISABLED", "value": "true"}]);
        let Outcome::Denied(denial) = evaluate(&engine, &forged) else { panic!("allowed") };
        let message = denial.to_string();
        assert!(
            message.contains("template audit is enforced")
                && message.contains("the pod's sidecar \"audit\" holds fields the template does not set"),
            "{message}"
        );
    }

    #[test]
    fn a_forged_status_gets_the_enforced_sidecar_anyway() {
        let engine = audit_engine();
        let audit = engine.templates.get("audit").unwrap();
        let logs = engine.templates.get("logs").unwrap();
        let forged = json!({"templates": [{"name": "logs", "hash": logs.hash}, {"name": "audit", "hash": audit.hash}],
                            "initContainers": ["audit"], "nativeSidecars": ["audit"], "containers": ["logs"]});
        let pod = pod(json!({"app": "web"}), json!({names::STATUS_ANNOTATION: forged.to_string()}), json!([]));
        let Outcome::Inject(injection) = evaluate(&engine, &pod) else { panic!("not injected") };
        assert_eq!(injected_names(&apply(&pod, &injection.patch)), vec!["audit", "web", "logs"]);
    }

    #[test]
    fn validate_refuses_what_a_later_mutator_swapped_in() {
        let engine = audit_engine();
        let pod = pod(json!({"app": "web", names::INJECT_LABEL: names::INJECT_DISABLED}), json!({}), json!([]));
        let Outcome::Inject(injection) = evaluate(&engine, &pod) else { panic!("not injected") };
        let mut stored = apply(&pod, &injection.patch);
        let validate = |pod: &Value| validate_pod(&engine, &request(pod.clone(), opted_in("shop", &[])));
        assert_eq!(validate(&stored), Verdict::Allowed(Vec::new()), "opted out, enforced, injected");
        stored["spec"]["initContainers"][0]["image"] = json!("evil");
        let Verdict::Denied(message) = validate(&stored) else { panic!("allowed") };
        assert!(message.contains("\"audit\"") && message.contains("evil"), "{message}");
        // Not injected at all (the injector was down; the opt-out label kept the general policy away).
        let Verdict::Denied(message) = validate(&pod) else { panic!("allowed") };
        assert!(message.contains("sidecar injection did not happen"), "{message}");
    }

    #[test]
    fn an_update_cannot_change_what_was_injected() {
        let engine = audit_engine();
        let pod = pod(json!({"app": "web"}), json!({}), json!([]));
        let Outcome::Inject(injection) = evaluate(&engine, &pod) else { panic!("not injected") };
        let stored = apply(&pod, &injection.patch);
        let update = |change: &dyn Fn(&mut Value)| {
            let mut new = stored.clone();
            change(&mut new);
            validate_pod_update(&engine, &stored, &request(new, opted_in("shop", &[]))).verdict
        };
        let allowed = Verdict::Allowed(Vec::new());
        assert_eq!(update(&|p| p["metadata"]["labels"]["team"] = json!("a")), allowed, "an unrelated label");
        assert_eq!(update(&|p| p["spec"]["containers"][0]["image"] = json!("nginx:2")), allowed, "the app's image");
        let denied = |verdict: Verdict, part: &str| match verdict {
            Verdict::Denied(message) => assert!(message.contains(part), "{part:?} not in {message}"),
            Verdict::Allowed(_) => panic!("allowed: {part}"),
        };
        denied(
            update(&|p| p["spec"]["initContainers"][0]["image"] = json!("evil")),
            "image of injected container \"audit\"",
        );
        denied(
            update(&|p| p["spec"]["containers"][1]["image"] = json!("evil")),
            "image of injected container \"logs\"",
        );
        denied(
            update(&|p| p["metadata"]["annotations"][names::STATUS_ANNOTATION] = json!("{\"templates\":[]}")),
            "annotation sidecar-injector.io/status cannot be changed",
        );
        denied(
            update(&|p| {
                p["metadata"]["labels"].as_object_mut().unwrap().remove(names::INJECTED_LABEL);
            }),
            "label sidecar-injector.io/injected cannot be changed",
        );
        // An exact copy the pod brought for an enforced template is guarded too.
        let exact = json!([{"name": "audit", "image": "audit:1.0", "command": ["/audit"], "args": ["--level=info"],
                            "restartPolicy": "Always"}]);
        let own = self::pod(json!({"app": "web"}), json!({}), exact);
        let Outcome::Inject(injection) = evaluate(&engine, &own) else { panic!("not injected") };
        let stored = apply(&own, &injection.patch);
        let mut new = stored.clone();
        new["spec"]["initContainers"][0]["image"] = json!("evil");
        let verdict = validate_pod_update(&engine, &stored, &request(new, opted_in("shop", &[]))).verdict;
        assert!(matches!(verdict, Verdict::Denied(_)));
    }

    #[test]
    fn an_ephemeral_container_may_not_target_an_enforced_container() {
        let engine = audit_engine();
        let debug = |name: &str, target: Option<&str>| {
            let mut container = json!({"name": name, "image": "busybox", "command": ["sh"]});
            if let Some(target) = target {
                container["targetContainerName"] = json!(target);
            }
            container
        };
        let check = |stored: &Value, ephemeral: Vec<Value>| {
            let mut new = stored.clone();
            new["spec"]["ephemeralContainers"] = Value::Array(ephemeral);
            validate_pod_update(&engine, stored, &request(new, opted_in("shop", &[]))).verdict
        };
        // Injected, and the pod's own exact copy that stood in for the template's.
        let exact = json!([{"name": "audit", "image": "audit:1.0", "command": ["/audit"], "args": ["--level=info"],
                            "restartPolicy": "Always"}]);
        for (case, init) in [("injected", json!([])), ("the pod's exact copy", exact)] {
            let pod = pod(json!({"app": "web"}), json!({}), init);
            let Outcome::Inject(injection) = evaluate(&engine, &pod) else { panic!("{case}: not injected") };
            let stored = apply(&pod, &injection.patch);
            let Verdict::Denied(message) = check(&stored, vec![debug("peek", Some("audit"))]) else {
                panic!("{case}: targeting the enforced agent allowed")
            };
            assert!(
                message.contains(
                    "template audit is enforced for this pod: ephemeral container \"peek\" targets \"audit\""
                ),
                "{case}: {message}"
            );
            // The app's container, another template's sidecar, no target: the pod's business.
            for target in [Some("web"), Some("logs"), None] {
                assert_eq!(
                    check(&stored, vec![debug("peek", target)]),
                    Verdict::Allowed(Vec::new()),
                    "{case}: {target:?}"
                );
            }
            // Only what the update adds: one already in the pod (from before the template was
            // enforced) does not block the next.
            let mut earlier = stored.clone();
            earlier["spec"]["ephemeralContainers"] = json!([debug("old", Some("audit"))]);
            let verdict = check(&earlier, vec![debug("old", Some("audit")), debug("peek", Some("web"))]);
            assert_eq!(verdict, Verdict::Allowed(Vec::new()), "{case}: an earlier one");
        }
        // The same template as `enforced: audit`: allowed, with what `enforced: true` would refuse.
        let audit_only = AUDIT.replace("enforced: true", "enforced: audit\ndefault: true");
        let engine = crate::test_support::engine(&[("logs", LOGS), ("audit", audit_only.as_str())]);
        let pod = pod(json!({"app": "web"}), json!({}), json!([]));
        let Outcome::Inject(injection) = evaluate(&engine, &pod) else { panic!("not injected") };
        let stored = apply(&pod, &injection.patch);
        let mut new = stored.clone();
        new["spec"]["ephemeralContainers"] = json!([debug("peek", Some("audit"))]);
        let checked = validate_pod_update(&engine, &stored, &request(new, opted_in("shop", &[])));
        let Verdict::Allowed(warnings) = checked.verdict else { panic!("audit refused") };
        assert!(
            warnings.iter().any(|w| w.contains("would refuse this update: ephemeral container \"peek\"")),
            "{warnings:?}"
        );
        assert_eq!(checked.audited, ["audit"]);
    }

    #[test]
    fn the_policy_params_hold_what_is_the_same_for_every_pod() {
        let engine = audit_engine();
        let requirements = Requirements::of(engine.templates.get("audit").unwrap(), true);
        let data = requirements.params_data();
        let sep = LIST_SEPARATOR;
        assert_eq!(data["template"], "audit");
        assert_eq!(data["initContainers"], "audit");
        assert_eq!(data["nativeSidecars"], "audit");
        assert_eq!(data["containers"], "");
        assert_eq!(data["volumes"], "audit-spool");
        assert_eq!(data["selectorLabels"], "app", "the podSelector's keys");
        assert_eq!(data["image.audit"], "audit:1.0");
        assert_eq!(data["command.audit"], format!("{sep}/audit"));
        assert!(!data.contains_key("args.audit"), "args read an overridable value");
        assert_eq!(
            requirements.unchecked,
            vec![
                "sidecar \"audit\": args is not the same for every pod (it reads the pod, the namespace or an overridable value), so the policy does not compare it"
            ]
        );
        let classic = Requirements::of(engine.templates.get("audit").unwrap(), false).params_data();
        assert_eq!((classic["containers"].as_str(), classic["initContainers"].as_str()), ("audit", ""));
        // Where its native sidecar runs: before the pod's own init containers, after only what
        // some template adds (every template's init containers and sidecars, by name).
        assert_eq!((data["runFirst"].as_str(), classic["runFirst"].as_str()), ("audit", ""));
        assert_eq!(may_precede(&engine.templates), Some(vec!["audit".to_owned(), "logs".to_owned()]));
        let (params, _) =
            policy_objects(&[engine.templates.get("audit").unwrap()], true, "ns", Some(&["a".into(), "b".into()]));
        assert_eq!(params["data"]["mayPrecede"], "a b");
        let aliases = "enforced: true\ninject:\n  hostAliases:\n    - {ip: 10.0.0.1, hostnames: [A.internal, b]}\n    - {ip: 10.0.0.2, hostnames: [\"{{ namespace.name }}.c\"]}\n";
        let requirements = Requirements::of(engine_with(aliases).templates.get("t").unwrap(), true);
        assert_eq!(requirements.params_data()["hostNames"], "a.internal=10.0.0.1 b=10.0.0.1");
        assert_eq!(requirements.unchecked.len(), 1, "{:?}", requirements.unchecked);
        let last = "enforced: true\ninject:\n  initContainers:\n    - {name: warm, image: w, position: last}\n    - {name: first, image: f}\n";
        assert_eq!(
            Requirements::of(engine_with(last).templates.get("t").unwrap(), true).params_data()["runFirst"],
            "first"
        );

        let per_pod = r#"
enforced: true
inject:
  sidecars:
    - name: "agent-{{ namespace.name }}"
      image: agent
    - name: tagger
      image: "tagger:{{ namespace.name }}"
      when: "{{ pod.metadata.labels is defined }}"
    - name: fixed
      image: fixed
      when: "{{ true }}"
"#;
        let engine = engine_with(per_pod);
        let requirements = Requirements::of(engine.templates.get("t").unwrap(), true);
        assert_eq!(requirements.init_containers.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), vec!["fixed"]);
        assert_eq!(requirements.init_containers[0].args, Some(vec![]), "no args: the pod must not add any");
        assert_eq!(requirements.unchecked.len(), 2, "{:?}", requirements.unchecked);
        assert_eq!(
            may_precede(&engine.templates),
            None,
            "a name read from the namespace: positions left to the webhook"
        );
    }

    #[test]
    fn audit_mode_reports_what_enforcement_would_refuse_and_refuses_nothing() {
        let audited = AUDIT.replace("enforced: true", "enforced: audit\ndefault: true");
        let engine = engine(&[("logs", LOGS), ("audit", &audited), ("debug", DEBUG)]);
        let decide = |pod: &Value| engine.evaluate(&request(pod.clone(), opted_in("shop", &[])));
        let app = json!({"app": "web"});
        // A look-alike: admitted, the pod's own item standing, with the refusal it would get.
        let evil_again = || {
            json!([{"name": "audit", "image": "evil/not-audit", "command": ["/audit"], "args": ["--level=info"],
                    "restartPolicy": "Always"}])
        };
        let decision = decide(&pod(app.clone(), json!({}), evil_again()));
        let Outcome::Inject(injection) = &decision.outcome else { panic!("{:?}", decision.outcome) };
        assert!(injection.status.skipped.iter().any(|s| s.template == "audit" && s.name == "audit"));
        assert_eq!(decision.audited, ["audit"]);
        let warning = decision.warnings.iter().find(|w| w.code == WarningCode::EnforcementAudit).expect("a warning");
        assert!(
            warning.message.contains("would refuse this pod") && warning.message.contains("evil/not-audit"),
            "{warning}"
        );
        // The drift report lists the admitted pod under the audit.
        let stored = apply(&pod(app.clone(), json!({}), evil_again()), &injection.patch);
        let metadata = |field: &str| -> std::collections::BTreeMap<String, String> {
            serde_json::from_value(stored["metadata"][field].clone()).unwrap()
        };
        let drift =
            crate::drift::classify(&engine, &metadata("labels"), &metadata("annotations"), &opted_in("shop", &[]));
        assert_eq!(drift, crate::drift::PodDrift::EnforcementAudit { templates: vec!["audit".into()] });
        // An opted-out pod: not injected, reported as one enforcement would inject into.
        let opted_out = json!({"app": "web", names::INJECT_LABEL: names::INJECT_DISABLED});
        let decision = decide(&pod(opted_out, json!({}), json!([])));
        assert!(matches!(decision.outcome, Outcome::OutOfScope(_) | Outcome::Inject(_)), "{:?}", decision.outcome);
        assert_eq!(decision.audited, ["audit"]);
        assert!(
            decision
                .warnings
                .iter()
                .any(|w| w.code == WarningCode::EnforcementAudit
                    && w.message.contains("would be injected into this pod")),
            "{:?}",
            decision.warnings
        );
        // A pod the template fits: nothing to report.
        let decision = decide(&pod(app, json!({}), json!([])));
        assert!(matches!(decision.outcome, Outcome::Inject(_)));
        assert!(decision.audited.is_empty() && decision.warnings.is_empty(), "{:?}", decision.warnings);
        // The policy binding warns and audits instead of denying.
        let (_, binding) = policy_objects(&[engine.templates.get("audit").unwrap()], true, "sidecar-injector", None);
        assert_eq!(binding["spec"]["validationActions"], json!(["Warn", "Audit"]));
        let (_, binding) =
            policy_objects(&[audit_engine().templates.get("audit").unwrap()], true, "sidecar-injector", None);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    }

    fn engine_with(template: &str) -> Engine {
        engine(&[("t", template)])
    }
}
