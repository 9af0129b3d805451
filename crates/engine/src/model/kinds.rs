//! One description per kind of item a template adds to a list of the pod's spec (`spec.volumes`,
//! `spec.imagePullSecrets`, `spec.hostAliases`): where the kind lives in a template and in the
//! pod, what identifies an item, its list in the status annotation, its Kubernetes type for the
//! load check, and whether the policy mode can add it.
//!
//! The steps iterate over [`POD_LISTS`] instead of naming these kinds: the template compiler and
//! the renderer keep one list per description, `injection::plan` claims, adds and removes by it,
//! `ownership` proves claims by it, `validate` strips and checks by it, `enforce` compares
//! conflicts by it, `load` checks conformance by it, `explain` lists by it and the properties
//! generate items from it. A new kind of spec list is one entry here and its status list (with an
//! [`ItemKind`]) in `status`: a step cannot forget it, because no step names it.
//!
//! The lists a template adds to in each app container it targets (`env`, `envFrom`,
//! `volumeMounts`) are described the same way in [`APP_LISTS`]: the steps iterate over them per
//! app container. Merged env entries (`env_merge`) are env vars with a second identity and keep
//! code of their own beside [`ENV`].
//!
//! The pod's maps a template adds to (labels and annotations) are described in [`MAPS`]: each
//! holds one key of the injector's own besides the items.
//!
//! Containers are described in [`CONTAINER_LISTS`] (the pod's two lists of them, with the status
//! list of each) and [`Placement`] (where a template's container goes: its init containers first,
//! its sidecars where the sidecar mode puts them). They differ from the lists above in two ways
//! that keep them apart: containers and init containers share one name space, and a sidecar's
//! list is decided per pod (native or classic).

use std::borrow::Cow;

use serde_json::{Value, json};

use crate::model::api_limits;
use crate::model::status::{AppContainerAdditions, InjectionStatus, ItemKind, Skipped};

/// A kind of item kept in a list of the pod's spec and identified by one string field.
#[derive(Debug)]
pub struct PodListKind {
    /// The kind, as the status annotation's skips and messages name it.
    pub kind: ItemKind,
    /// Its position in [`POD_LISTS`] (and in every per-kind array of lists).
    pub index: usize,
    /// The list's field, in the pod (`spec.<field>`) and in a template (`inject.<field>`).
    pub field: &'static str,
    /// What a list of them is called in messages (`image pull secrets`).
    pub plural: &'static str,
    /// The field of an item that identifies it (`name`, `ip`).
    pub key: &'static str,
    /// What the API server requires of an identity (`api_limits`): what keeps one from being
    /// valid, as the API server says it.
    pub identity_problem: fn(&str) -> Option<String>,
    /// Whether Kubernetes requires every item of the pod's list to carry the key (a pod whose
    /// item lacks it is malformed); otherwise such an item has the empty identity.
    pub key_required: bool,
    /// What happens to a template's item whose identity the pod (or an earlier template) already
    /// has.
    pub when_held: WhenHeld,
    /// The status annotation's list of the identities added.
    pub claimed: fn(&InjectionStatus) -> &Vec<String>,
    /// The same list, to fill.
    pub claimed_mut: fn(&mut InjectionStatus) -> &mut Vec<String>,
    /// Reads a rendered item as its Kubernetes type (see `conformance::conforms`): a wrong type is an
    /// error, `Some(path)` a field the type does not have.
    pub conforms: fn(&Value) -> crate::model::conformance::Checked,
    /// Whether the policy mode (`compile-policies`) adds this kind; otherwise a template with such
    /// items is left to the webhook, saying why.
    pub in_policy: bool,
    /// A well-formed item as a template adds it, with an identity made from a name, for the
    /// properties: every kind is generated the day it is described. The identity is the name, or
    /// (where the API server takes no such name, as a host alias's IP) one made from it; the same
    /// name always makes the same identity.
    pub sample: fn(&str) -> Value,
    /// An item of the same identity as a pod's author might write it: another definition than
    /// [`PodListKind::sample`]'s where the kind has more than its identity (so that the pod's item
    /// and the template's conflict in the properties).
    pub authored: fn(&str) -> Value,
    /// The fields of containers whose entries refer to an item of this kind by its identity (a
    /// volume is named by `volumeMounts[].name` and `volumeDevices[].name`). Whatever of a
    /// template refers to one of its items that the pod (or an earlier template) holds with
    /// another definition would bind to the holder's, so it is skipped with it, naming the item
    /// ([`PodListKind::skip_owner`]). The planner, ownership, enforcement and the policy compiler
    /// read this instead of naming a kind.
    pub referenced_by: &'static [Reference],
    /// How a skip says what a container does with an item of this kind (`mounts` a volume).
    pub referred_verb: &'static str,
    /// Whether an item may declare `fallback:` (an image volume: the form it takes where the
    /// nodes cannot mount one, recorded in the status's `imageVolumes`).
    pub may_fall_back: bool,
    /// Whether someone else removes an item after admission by design (a scheduling gate, which
    /// its controller lifts when the pod may be scheduled). On a running pod such an item's
    /// absence is not a doubt and not drift, and nothing puts it back (the API server refuses a
    /// gate added by an update); at admission an absent one was never there, and is added.
    pub removed_after_admission: bool,
}

/// A list of a container's whose entries refer to items of a pod list by their identity.
#[derive(Debug)]
pub struct Reference {
    /// The list's path in a container (`volumeMounts`; `resources`, `claims`).
    pub list: &'static [&'static str],
    /// The field of an entry that holds the identity it refers to.
    pub key: &'static str,
}

/// What happens to a template's item whose identity is already held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenHeld {
    /// The holder's item stands and the skip is recorded (the template applied with conflicts).
    Skip,
    /// The identity is all there is to the item (a pull secret's name): it is already there, so
    /// nothing is added and nothing is reported.
    AlreadyThere,
}

/// How many kinds of spec lists there are.
pub const POD_LIST_COUNT: usize = 5;

/// One value per kind of spec list, in the order of [`POD_LISTS`].
pub type PerPodList<T> = [T; POD_LIST_COUNT];

/// Pod volumes (`spec.volumes`), identified by name.
pub const VOLUMES: &PodListKind = &POD_LISTS[0];
/// Pull secrets (`spec.imagePullSecrets`), identified by name.
pub const IMAGE_PULL_SECRETS: &PodListKind = &POD_LISTS[1];
/// Host aliases (`spec.hostAliases`, lines of the pod's `/etc/hosts`), identified by IP.
pub const HOST_ALIASES: &PodListKind = &POD_LISTS[2];
/// Resource claims (`spec.resourceClaims`: Dynamic Resource Allocation), identified by name and
/// referred to by containers' `resources.claims`.
pub const RESOURCE_CLAIMS: &PodListKind = &POD_LISTS[3];
/// Scheduling gates (`spec.schedulingGates`), identified by name and lifted by their controller.
pub const SCHEDULING_GATES: &PodListKind = &POD_LISTS[4];

/// Every kind of spec list, in patch order.
pub const POD_LISTS: PerPodList<PodListKind> = [
    PodListKind {
        kind: ItemKind::Volume,
        index: 0,
        field: "volumes",
        plural: "volumes",
        key: "name",
        identity_problem: api_limits::dns_label_problem,
        key_required: true,
        when_held: WhenHeld::Skip,
        claimed: |s| &s.volumes,
        claimed_mut: |s| &mut s.volumes,
        conforms: crate::model::conformance::volume,
        in_policy: true,
        sample: |name| json!({"name": name, "emptyDir": {}}),
        authored: |name| json!({"name": name, "hostPath": {"path": "/"}}),
        referenced_by: &[
            Reference { list: &["volumeMounts"], key: "name" },
            Reference { list: &["volumeDevices"], key: "name" },
        ],
        referred_verb: "mounts",
        may_fall_back: true,
        removed_after_admission: false,
    },
    PodListKind {
        kind: ItemKind::ImagePullSecret,
        index: 1,
        field: "imagePullSecrets",
        plural: "image pull secrets",
        key: "name",
        identity_problem: api_limits::no_problem,
        key_required: false,
        when_held: WhenHeld::AlreadyThere,
        claimed: |s| &s.image_pull_secrets,
        claimed_mut: |s| &mut s.image_pull_secrets,
        conforms: crate::model::conformance::local_object_reference,
        in_policy: true,
        sample: |name| json!({"name": name}),
        authored: |name| json!({"name": name}),
        referenced_by: &[],
        referred_verb: "",
        may_fall_back: false,
        removed_after_admission: false,
    },
    PodListKind {
        kind: ItemKind::HostAlias,
        index: 2,
        field: "hostAliases",
        plural: "host aliases",
        key: "ip",
        identity_problem: api_limits::ip_problem,
        key_required: true,
        when_held: WhenHeld::Skip,
        claimed: |s| &s.host_aliases,
        claimed_mut: |s| &mut s.host_aliases,
        conforms: crate::model::conformance::host_alias,
        // A MutatingAdmissionPolicy could append them, but the pod's own entry for an IP must
        // win, which needs the webhook's claim bookkeeping.
        in_policy: false,
        sample: |name| json!({"ip": sample_ip(name), "hostnames": ["collector.observability.internal"]}),
        authored: |name| json!({"ip": sample_ip(name), "hostnames": ["db.example.internal", "db"]}),
        referenced_by: &[],
        referred_verb: "",
        may_fall_back: false,
        removed_after_admission: false,
    },
    PodListKind {
        kind: ItemKind::ResourceClaim,
        index: 3,
        field: "resourceClaims",
        plural: "resource claims",
        key: "name",
        identity_problem: api_limits::dns_label_problem,
        key_required: true,
        when_held: WhenHeld::Skip,
        claimed: |s| &s.resource_claims,
        claimed_mut: |s| &mut s.resource_claims,
        conforms: crate::model::conformance::pod_resource_claim,
        // Left to the webhook until the policy mode's comparison on the API server covers it.
        in_policy: false,
        sample: |name| json!({"name": name, "resourceClaimTemplateName": "device-template"}),
        authored: |name| json!({"name": name, "resourceClaimName": "shared-device"}),
        referenced_by: &[Reference { list: &["resources", "claims"], key: "name" }],
        referred_verb: "uses",
        may_fall_back: false,
        removed_after_admission: false,
    },
    PodListKind {
        kind: ItemKind::SchedulingGate,
        index: 4,
        field: "schedulingGates",
        plural: "scheduling gates",
        key: "name",
        identity_problem: api_limits::qualified_name_problem,
        key_required: true,
        when_held: WhenHeld::AlreadyThere,
        claimed: |s| &s.scheduling_gates,
        claimed_mut: |s| &mut s.scheduling_gates,
        conforms: crate::model::conformance::pod_scheduling_gate,
        // A policy could add one, but its removal by design needs the webhook's claim checks.
        in_policy: false,
        sample: |name| json!({"name": name}),
        authored: |name| json!({"name": name}),
        referenced_by: &[],
        referred_verb: "",
        may_fall_back: false,
        removed_after_admission: true,
    },
];

/// The IP address a sample host alias made from `name` has: `name` when it is one, else a
/// unique-local IPv6 address spelling its bytes (one per name of up to 14 bytes), so that samples
/// made from the same name collide and the API server takes every one.
fn sample_ip(name: &str) -> String {
    if api_limits::ip_problem(name).is_none() {
        return name.to_owned();
    }
    let hex: String = name.bytes().take(14).map(|b| format!("{b:02x}")).collect();
    let groups: Vec<&str> = hex.as_bytes().chunks(4).map(|group| std::str::from_utf8(group).expect("hex")).collect();
    format!("fd00::{}", groups.join(":"))
}

/// A kind of item a template adds to each app container it targets: the container's list
/// `<field>`, from the template's `inject.appContainers.<field>`.
#[derive(Debug)]
pub struct AppListKind {
    /// The kind, as the status annotation's skips and messages name it.
    pub kind: ItemKind,
    /// Its position in [`APP_LISTS`] (and in every per-kind array of app lists).
    pub index: usize,
    /// The list's field, in a container and under a template's `inject.appContainers`.
    pub field: &'static str,
    /// The fields a template's item must have (checked when the template is compiled); the first
    /// one, if any, must render to a non-empty string.
    pub required: &'static [&'static str],
    /// What identifies an item (see [`AppListKind::identity`]).
    pub identity: Identity,
    /// The status annotation's list of the identities added to one container.
    pub claimed: fn(&AppContainerAdditions) -> &Vec<String>,
    /// The same list, to fill.
    pub claimed_mut: fn(&mut AppContainerAdditions) -> &mut Vec<String>,
    /// Reads a rendered item as its Kubernetes type (see `conformance::conforms`).
    pub conforms: fn(&Value) -> crate::model::conformance::Checked,
    /// What the load check says of a rendered item without an identity, for a kind whose
    /// identity is not a required field.
    pub unidentified: &'static str,
    /// What `explain` calls the items added to a container (`env`, `mounts`).
    pub plural: &'static str,
    /// A well-formed item of this identity as a template adds it, for the properties (a mount
    /// names the volume `injected`, which the properties point at a volume of the template).
    pub sample: fn(&str) -> Value,
    /// An item of the same identity as a pod's author might write it, with another definition
    /// than [`AppListKind::sample`]'s (so that the pod's item and the template's conflict).
    pub authored: fn(&str) -> Value,
    /// Whether a pod's item builds on the earlier item of its identity rather than replacing it
    /// (an env entry that refers to its own name; see [`AppListKind::in_effect`]).
    pub extends_earlier: fn(&Value) -> bool,
}

/// How many kinds of app-container lists there are.
pub const APP_LIST_COUNT: usize = 3;

/// One value per kind of app-container list, in the order of [`APP_LISTS`].
pub type PerAppList<T> = [T; APP_LIST_COUNT];

/// Env vars (`env`), identified by name.
pub const ENV: &AppListKind = &APP_LISTS[0];
/// `envFrom` sources, identified by what they reference (`compare::env_from_key`).
pub const ENV_FROM: &AppListKind = &APP_LISTS[1];
/// Volume mounts (`volumeMounts`), identified by mount path.
pub const VOLUME_MOUNTS: &AppListKind = &APP_LISTS[2];

/// Every kind of app-container list, in status and patch order.
pub const APP_LISTS: PerAppList<AppListKind> = [
    AppListKind {
        kind: ItemKind::Env,
        index: 0,
        field: "env",
        required: &["name"],
        identity: Identity::Field("name"),
        claimed: |a| &a.env,
        claimed_mut: |a| &mut a.env,
        conforms: crate::model::conformance::env_var,
        unidentified: ".name must render to a non-empty string",
        plural: "env",
        sample: |name| json!({"name": name, "value": "injected"}),
        authored: |name| json!({"name": name, "value": "the author's"}),
        extends_earlier: crate::model::env::extends_earlier,
    },
    AppListKind {
        kind: ItemKind::EnvFrom,
        index: 1,
        field: "envFrom",
        required: &[],
        identity: Identity::Derived(crate::model::compare::env_from_key),
        claimed: |a| &a.env_from,
        claimed_mut: |a| &mut a.env_from,
        conforms: crate::model::conformance::env_from_source,
        unidentified: " needs exactly one of configMapRef or secretRef, with a non-empty name",
        plural: "envFrom",
        sample: |name| json!({"configMapRef": {"name": name}}),
        authored: |name| json!({"configMapRef": {"name": name, "optional": true}}),
        extends_earlier: |_| false,
    },
    AppListKind {
        kind: ItemKind::VolumeMount,
        index: 2,
        field: "volumeMounts",
        required: &["name", "mountPath"],
        identity: Identity::Field("mountPath"),
        claimed: |a| &a.volume_mounts,
        claimed_mut: |a| &mut a.volume_mounts,
        conforms: crate::model::conformance::volume_mount,
        unidentified: ".name must render to a non-empty string",
        plural: "mounts",
        sample: |path| json!({"name": "injected", "mountPath": format!("/{path}")}),
        authored: |path| json!({"name": "own", "mountPath": format!("/{path}"), "readOnly": true}),
        extends_earlier: |_| false,
    },
];

/// What identifies an item of an app-container list.
#[derive(Debug, Clone, Copy)]
pub enum Identity {
    /// One string field of the item (`name`, `mountPath`).
    Field(&'static str),
    /// Derived from several fields (an `envFrom` source's `configMap/<name>+<prefix>`); `None`
    /// when the item has none.
    Derived(fn(&Value) -> Option<String>),
}

impl AppListKind {
    /// The identity of an item (`None` when it has none, which the load check refuses): borrowed
    /// when it is a field, so claiming allocates nothing for those kinds.
    pub fn identity<'v>(&self, item: &'v Value) -> Option<Cow<'v, str>> {
        match self.identity {
            Identity::Field(field) => item.get(field).and_then(Value::as_str).map(Cow::Borrowed),
            Identity::Derived(derive) => derive(item).map(Cow::Owned),
        }
    }

    /// The item of `items` with this identity (a template's list, where identities are unique).
    pub fn find<'v>(&self, items: &'v [Value], identity: &str) -> Option<&'v Value> {
        items.iter().find(|item| self.identity(item).as_deref() == Some(identity))
    }

    /// The item of a pod container's list with this identity that the container runs with, and
    /// its index. The API server accepts a name twice (it only warns), and the kubelet reads
    /// the **last**: a later env entry of a name replaces an earlier one, a later `envFrom`
    /// source's key wins. An env entry that merely extends the value before it (`$(NAME)` in its
    /// own value, as a merged entry) defines nothing of its own, so the entry in effect is the
    /// last one that does not (or the last, when all do). Every step that reads the pod's item
    /// of an identity (proofs of claims, removals, enforcement, `/validate`) reads this one.
    pub fn in_effect<'v>(&self, items: &'v [Value], identity: &str) -> Option<(usize, &'v Value)> {
        let mut same =
            items.iter().enumerate().rev().filter(|(_, item)| self.identity(item).as_deref() == Some(identity));
        let last = same.clone().next();
        same.find(|(_, item)| !(self.extends_earlier)(item)).or(last)
    }

    /// The section of a template that holds these items (`inject.appContainers.env`).
    pub fn section(&self) -> String {
        format!("inject.appContainers.{}", self.field)
    }
}

/// A map of the pod's metadata a template adds keys to (`metadata.<field>`, from the template's
/// `inject.<field>`).
#[derive(Debug)]
pub struct MapKind {
    /// The kind, as the status annotation's skips and messages name it.
    pub kind: ItemKind,
    /// Its position in [`MAPS`] (and in every per-kind array of maps).
    pub index: usize,
    /// The map's field, in the pod's metadata, in a template's `inject` and in the status.
    pub field: &'static str,
    /// The section of a template that holds these items, for messages (`inject.labels`; a
    /// constant, as rendering names it for every pod).
    pub section: &'static str,
    /// The injector's own key in this map: never a template's item nor a claimed one, always
    /// rewritten to say what the injection did.
    pub own_key: &'static str,
    /// The value of [`MapKind::own_key`] for an injection (`None`: the key is removed).
    pub own_value: fn(&InjectionStatus) -> Option<String>,
    /// What the API server requires of a value (`api_limits`), as it says it.
    pub value_problem: fn(&str) -> Option<String>,
    /// The API server's limit on the map's total size (keys and values, bytes), if it has one.
    pub total_size_limit: Option<usize>,
    /// The status annotation's list of the keys added.
    pub claimed: fn(&InjectionStatus) -> &Vec<String>,
    /// The same list, to fill.
    pub claimed_mut: fn(&mut InjectionStatus) -> &mut Vec<String>,
}

/// How many kinds of maps there are.
pub const MAP_COUNT: usize = 2;

/// One value per kind of map, in the order of [`MAPS`].
pub type PerMap<T> = [T; MAP_COUNT];

/// Pod labels.
pub const LABELS: &MapKind = &MAPS[0];
/// Pod annotations.
pub const ANNOTATIONS: &MapKind = &MAPS[1];

/// Every kind of map, in patch order.
pub const MAPS: PerMap<MapKind> = [
    MapKind {
        kind: ItemKind::Label,
        index: 0,
        field: "labels",
        section: "inject.labels",
        own_key: crate::names::INJECTED_LABEL,
        own_value: |status| status.injected_label().map(str::to_owned),
        value_problem: api_limits::label_value_problem,
        total_size_limit: None,
        claimed: |s| &s.labels,
        claimed_mut: |s| &mut s.labels,
    },
    MapKind {
        kind: ItemKind::Annotation,
        index: 1,
        field: "annotations",
        section: "inject.annotations",
        own_key: crate::names::STATUS_ANNOTATION,
        own_value: |status| Some(status.to_annotation()),
        value_problem: api_limits::no_problem,
        total_size_limit: Some(api_limits::TOTAL_ANNOTATION_SIZE),
        claimed: |s| &s.annotations,
        claimed_mut: |s| &mut s.annotations,
    },
];

/// One of the pod's lists of containers the injector adds to.
#[derive(Debug)]
pub struct ContainerListKind {
    /// What the claims of an injected container there are judged as (a native sidecar is an
    /// init container here).
    pub kind: ItemKind,
    /// Its position in [`CONTAINER_LISTS`].
    pub index: usize,
    /// The list's field in the pod (`spec.<field>`).
    pub field: &'static str,
    /// What an injected container there is called in messages (`init container`).
    pub noun: &'static str,
    /// What the API server requires of a container's name (`api_limits`), as it says it.
    pub identity_problem: fn(&str) -> Option<String>,
    /// Whether the list goes whole when the injection's containers were all it held (the app
    /// containers always stay in `containers`).
    pub may_empty: bool,
    /// The status annotation's list of the containers injected there.
    pub claimed: fn(&InjectionStatus) -> &Vec<String>,
    /// The same list, to fill.
    pub claimed_mut: fn(&mut InjectionStatus) -> &mut Vec<String>,
}

/// The pod's init containers (`spec.initContainers`): a template's init containers, and its
/// sidecars when they are native.
pub const INIT_CONTAINERS: &ContainerListKind = &CONTAINER_LISTS[1];
/// The pod's containers (`spec.containers`): a template's classic sidecars, after the app's.
pub const CONTAINERS: &ContainerListKind = &CONTAINER_LISTS[0];

/// The pod's lists of containers, in the status annotation's order.
pub const CONTAINER_LISTS: [ContainerListKind; 2] = [
    ContainerListKind {
        kind: ItemKind::Sidecar,
        index: 0,
        field: "containers",
        noun: "sidecar container",
        identity_problem: api_limits::dns_label_problem,
        may_empty: false,
        claimed: |s| &s.containers,
        claimed_mut: |s| &mut s.containers,
    },
    ContainerListKind {
        kind: ItemKind::InitContainer,
        index: 1,
        field: "initContainers",
        noun: "init container",
        identity_problem: api_limits::dns_label_problem,
        may_empty: true,
        claimed: |s| &s.init_containers,
        claimed_mut: |s| &mut s.init_containers,
    },
];

/// Where a template's container goes in the pod: the one decision between its template list, its
/// pod list and its status lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A template's init container, among the pod's init containers (before the pod's own).
    Init,
    /// A template's sidecar as a native sidecar: an init container with `restartPolicy: Always`.
    NativeSidecar,
    /// A template's sidecar as a classic container, after the pod's containers.
    Sidecar,
}

impl Placement {
    /// Every placement, in the order `explain` lists them.
    pub const ALL: [Placement; 3] = [Placement::NativeSidecar, Placement::Init, Placement::Sidecar];

    /// What the containers put here are called in lists (`init containers`).
    pub fn plural(self) -> &'static str {
        match self {
            Placement::Init => "init containers",
            Placement::NativeSidecar => "sidecars (native, in initContainers)",
            Placement::Sidecar => "sidecar containers",
        }
    }

    /// The names of the containers `status` records as put here.
    pub fn claimed(self, status: &InjectionStatus) -> impl Iterator<Item = &str> {
        let list = self.list();
        (list.claimed)(status)
            .iter()
            .map(String::as_str)
            .filter(move |name| Placement::of_claim(list, status, name) == self)
    }

    /// Where a template's sidecars go: native or classic.
    pub fn of_sidecars(native: bool) -> Placement {
        match native {
            true => Placement::NativeSidecar,
            false => Placement::Sidecar,
        }
    }

    /// Where a container the status names in `list` was put.
    pub fn of_claim(list: &ContainerListKind, status: &InjectionStatus, name: &str) -> Placement {
        match list.index == CONTAINERS.index {
            true => Placement::Sidecar,
            false if status.native_sidecars.iter().any(|n| n == name) => Placement::NativeSidecar,
            false => Placement::Init,
        }
    }

    /// The kind, as the status's skips name it.
    pub fn item_kind(self) -> ItemKind {
        match self {
            Placement::Init => ItemKind::InitContainer,
            Placement::NativeSidecar | Placement::Sidecar => ItemKind::Sidecar,
        }
    }

    /// The pod's list it goes into.
    pub fn list(self) -> &'static ContainerListKind {
        match self {
            Placement::Init | Placement::NativeSidecar => INIT_CONTAINERS,
            Placement::Sidecar => CONTAINERS,
        }
    }

    /// Shapes a rendered container for where it goes: a native sidecar restarts always, the
    /// others go as rendered.
    pub fn shape(self, container: &mut Value) {
        if self == Placement::NativeSidecar {
            crate::model::native::make_native(container);
        }
    }

    /// Records a container put here in the status's lists.
    pub fn record(self, status: &mut InjectionStatus, name: &str) {
        (self.list().claimed_mut)(status).push(name.to_owned());
        if self == Placement::NativeSidecar {
            status.native_sidecars.push(name.to_owned());
        }
    }
}

/// Where a template's init container or classic sidecar goes in its list (`position:`): an init
/// container by default before the pod's own, a classic sidecar after the app's. A native
/// sidecar always goes before the pod's init containers, which may need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerPosition {
    /// At the front of the list.
    First,
    /// At the end of the list.
    Last,
}

impl ContainerPosition {
    /// Reads the template key's value.
    pub fn parse(text: &str) -> Option<ContainerPosition> {
        match text {
            "first" => Some(ContainerPosition::First),
            "last" => Some(ContainerPosition::Last),
            _ => None,
        }
    }
}

/// The description of a spec-list kind, if `kind` is one.
pub fn pod_list_of(kind: ItemKind) -> Option<&'static PodListKind> {
    POD_LISTS.iter().find(|k| k.kind == kind)
}

/// Where an item of a kind lives: in a spec list (described in [`POD_LISTS`]) or in a place with
/// code of its own. Steps that handle every kind match on this, so the spec-list kinds are one arm
/// and a new one needs no arm at all.
#[derive(Debug, Clone, Copy)]
pub enum Place {
    /// An item of a spec list.
    PodList(&'static PodListKind),
    /// A key of a pod's metadata map.
    Map(&'static MapKind),
    /// An init container.
    InitContainer,
    /// A sidecar (a container, or a native sidecar among the init containers).
    Sidecar,
    /// An item of an app container's list.
    AppList(&'static AppListKind),
    /// An entry merged into an app container's own env var.
    EnvMerge,
}

impl ItemKind {
    /// Where items of this kind live.
    pub fn place(self) -> Place {
        match self {
            ItemKind::Label => Place::Map(LABELS),
            ItemKind::Annotation => Place::Map(ANNOTATIONS),
            ItemKind::InitContainer => Place::InitContainer,
            ItemKind::Sidecar => Place::Sidecar,
            ItemKind::Env => Place::AppList(ENV),
            ItemKind::EnvFrom => Place::AppList(ENV_FROM),
            ItemKind::VolumeMount => Place::AppList(VOLUME_MOUNTS),
            ItemKind::EnvMerge => Place::EnvMerge,
            ItemKind::Volume => Place::PodList(VOLUMES),
            ItemKind::ImagePullSecret => Place::PodList(IMAGE_PULL_SECRETS),
            ItemKind::HostAlias => Place::PodList(HOST_ALIASES),
            ItemKind::ResourceClaim => Place::PodList(RESOURCE_CLAIMS),
            ItemKind::SchedulingGate => Place::PodList(SCHEDULING_GATES),
        }
    }
}

impl PodListKind {
    /// The identity of an item (`None` when it lacks the key).
    pub fn identity<'v>(&self, item: &'v Value) -> Option<&'v str> {
        item.get(self.key).and_then(Value::as_str)
    }

    /// The item of `items` with this identity.
    pub fn find<'v>(&self, items: &'v [Value], identity: &str) -> Option<&'v Value> {
        items.iter().find(|item| self.identity(item) == Some(identity))
    }

    /// The section of a template that holds these items, for messages (`inject.volumes`).
    pub fn section(&self) -> String {
        format!("inject.{}", self.field)
    }

    /// The identities of this kind that `container` refers to ([`PodListKind::referenced_by`]).
    pub fn referred_to_by<'c>(&self, container: &'c Value) -> impl Iterator<Item = &'c str> + use<'c> {
        let references: &'static [Reference] = self.referenced_by;
        references.iter().flat_map(move |reference| {
            let list = reference.list.iter().try_fold(container, |at, field| at.get(field)).and_then(Value::as_array);
            list.into_iter().flatten().filter_map(|entry| entry.get(reference.key).and_then(Value::as_str))
        })
    }

    /// The identity of this kind an item of an app container's list refers to, when that list's
    /// entries are references (a `volumeMounts` entry names a volume).
    pub fn referred_to_by_item<'v>(&self, list: &AppListKind, item: &'v Value) -> Option<&'v str> {
        let reference = self.referenced_by.iter().find(|r| r.list == [list.field])?;
        item.get(reference.key).and_then(Value::as_str)
    }

    /// The owner a skip records for an item that refers to this kind's item `identity`, skipped
    /// for another of its identity: `volume:<name>` (the kind as the status names it).
    pub fn skip_owner(&self, identity: &str) -> String {
        format!("{}:{identity}", self.kind.key())
    }
}

/// The kind and identity a skip's owner names when the item was skipped because it refers to an
/// item of its template that was skipped (see [`PodListKind::skip_owner`]).
pub fn displaced_by(owner: &str) -> Option<(&'static PodListKind, &str)> {
    POD_LISTS.iter().filter(|kind| !kind.referenced_by.is_empty()).find_map(|kind| {
        let identity = owner.strip_prefix(kind.kind.key())?.strip_prefix(':')?;
        Some((kind, identity))
    })
}

// Here rather than beside `Skipped`: a skip for a displaced item is worded by its kind.
impl Skipped {
    /// The skip in words, as `explain` and the Events say it: `skipped sidecar "logs" in
    /// container web from template logs: the pod already has one`.
    pub fn describe(&self) -> String {
        let container = self.container.as_ref().map(|c| format!(" in container {c}")).unwrap_or_default();
        let owner = match (self.owner.as_str(), displaced_by(&self.owner)) {
            ("pod", _) => "the pod already has one".to_owned(),
            (_, Some((kind, identity))) => {
                let (verb, noun) = (kind.referred_verb, kind.kind.describe());
                format!(
                    "it {verb} the template's {noun} {identity:?}, which was skipped: that name is another {noun} in this pod"
                )
            }
            (other, None) => format!("{other} already added one"),
        };
        format!("skipped {} {:?}{container} from template {}: {owner}", self.kind.describe(), self.name, self.template)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_keyed_as_the_status_writes_it_and_a_displacement_reads_back() {
        let every = [
            ItemKind::Label,
            ItemKind::Annotation,
            ItemKind::InitContainer,
            ItemKind::Sidecar,
            ItemKind::Volume,
            ItemKind::Env,
            ItemKind::VolumeMount,
            ItemKind::EnvFrom,
            ItemKind::ImagePullSecret,
            ItemKind::EnvMerge,
            ItemKind::HostAlias,
            ItemKind::ResourceClaim,
            ItemKind::SchedulingGate,
        ];
        for kind in every {
            assert_eq!(serde_json::to_value(kind).unwrap(), Value::String(kind.key().to_owned()));
        }
        for kind in POD_LISTS.iter().filter(|k| !k.referenced_by.is_empty()) {
            let owner = kind.skip_owner("data");
            assert_eq!(displaced_by(&owner).map(|(k, id)| (k.index, id)), Some((kind.index, "data")), "{owner}");
            assert!(!kind.referred_verb.is_empty(), "{}", kind.field);
        }
        assert!(displaced_by("pod").is_none());
        assert_eq!(displaced_by("template:volume:x").map(|(k, _)| k.index), None);
        // What a container refers to, through every reference of the description.
        let container = json!({"volumeMounts": [{"name": "a", "mountPath": "/a"}], "volumeDevices": [{"name": "b", "devicePath": "/dev/b"}]});
        assert_eq!(VOLUMES.referred_to_by(&container).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(VOLUMES.referred_to_by_item(VOLUME_MOUNTS, &json!({"name": "a", "mountPath": "/a"})), Some("a"));
        assert_eq!(VOLUMES.referred_to_by_item(ENV, &json!({"name": "a", "value": "x"})), None);
    }

    #[test]
    fn each_placement_records_in_its_list_and_is_found_there_again() {
        for (index, list) in CONTAINER_LISTS.iter().enumerate() {
            assert_eq!(list.index, index, "{}", list.field);
        }
        for placement in [Placement::Init, Placement::NativeSidecar, Placement::Sidecar] {
            let mut status = InjectionStatus::default();
            placement.record(&mut status, "x");
            let list = placement.list();
            assert_eq!((list.claimed)(&status), &vec!["x".to_owned()], "{placement:?}");
            assert_eq!(Placement::of_claim(list, &status, "x"), placement);
            let others = CONTAINER_LISTS.iter().filter(|other| other.index != list.index);
            assert!(others.into_iter().all(|other| (other.claimed)(&status).is_empty()), "{placement:?}");
        }
        // Each name the status records is claimed by exactly one placement.
        let mut status = InjectionStatus::default();
        for (placement, name) in Placement::ALL.iter().zip(["a", "b", "c"]) {
            placement.record(&mut status, name);
        }
        let claimed = Placement::ALL.map(|p| p.claimed(&status).collect::<Vec<_>>());
        assert_eq!(claimed, [vec!["a"], vec!["b"], vec!["c"]]);
        assert_eq!(Placement::of_sidecars(true).list().field, "initContainers");
        assert_eq!(Placement::of_sidecars(false).list().field, "containers");
    }

    #[test]
    fn every_description_is_where_its_index_says_and_its_status_list_is_its_own() {
        let mut status = InjectionStatus::default();
        for (index, kind) in POD_LISTS.iter().enumerate() {
            assert_eq!(kind.index, index, "{}", kind.field);
            assert_eq!(pod_list_of(kind.kind).map(|k| k.index), Some(index));
            assert!(matches!(kind.kind.place(), Place::PodList(k) if k.index == index), "{}", kind.field);
            (kind.claimed_mut)(&mut status).push(kind.field.to_owned());
        }
        // Each kind writes its own status list, under its own key.
        let json = serde_json::to_value(&status).unwrap();
        for kind in &POD_LISTS {
            assert_eq!((kind.claimed)(&status), &vec![kind.field.to_owned()]);
            assert_eq!(json[kind.field], json!([kind.field]), "the status key of {} is its spec field", kind.field);
        }
    }

    #[test]
    fn every_sample_conforms_and_carries_an_identity_the_api_server_takes() {
        for kind in &POD_LISTS {
            for sample in [(kind.sample)("10.1.2.3"), (kind.authored)("10.1.2.3")] {
                assert_eq!((kind.conforms)(&sample), Ok(vec![]), "{}", kind.field);
                assert_eq!(kind.identity(&sample), Some("10.1.2.3"));
            }
            // Made from a name, a sample's identity is one the API server takes, the same for the
            // template's and the author's item, and different for another name.
            let identity = |make: fn(&str) -> Value, name: &str| kind.identity(&make(name)).map(str::to_owned);
            let proxy = identity(kind.sample, "proxy").expect("an identity");
            assert_eq!((kind.identity_problem)(&proxy), None, "{}: {proxy}", kind.field);
            assert_eq!(identity(kind.authored, "proxy").as_deref(), Some(proxy.as_str()));
            assert_ne!(identity(kind.sample, "prox").as_deref(), Some(proxy.as_str()));
        }
    }

    #[test]
    fn every_app_list_is_where_its_index_says_and_counts_in_its_container_additions() {
        for (index, kind) in APP_LISTS.iter().enumerate() {
            assert_eq!(kind.index, index, "{}", kind.field);
            assert!(matches!(kind.kind.place(), Place::AppList(k) if k.index == index), "{}", kind.field);
            // A status list of its own, which the additions' emptiness and count see (they are
            // written in `status`, which cannot name these descriptions).
            let mut additions = AppContainerAdditions::default();
            (kind.claimed_mut)(&mut additions).push(kind.field.to_owned());
            assert!(!additions.is_empty() && additions.len() == 1, "{}", kind.field);
            let others = APP_LISTS.iter().filter(|k| k.index != index);
            assert!(others.map(|k| (k.claimed)(&additions)).all(Vec::is_empty), "{}", kind.field);
            let json = serde_json::to_value(&additions).unwrap();
            assert_eq!(json[kind.field], json!([kind.field]), "the status key of {} is its field", kind.field);
        }
    }

    #[test]
    fn every_app_list_sample_conforms_and_is_identified() {
        for kind in &APP_LISTS {
            let (sample, authored) = ((kind.sample)("agent"), (kind.authored)("agent"));
            assert_ne!(sample, authored, "{}: the author's item is another definition", kind.field);
            let identity = kind.identity(&sample).expect("a sample has an identity").into_owned();
            for item in [&sample, &authored] {
                assert_eq!((kind.conforms)(item), Ok(vec![]), "{}", kind.field);
                assert_eq!(kind.identity(item).as_deref(), Some(identity.as_str()), "{}", kind.field);
                assert_eq!(kind.find(std::slice::from_ref(item), &identity), Some(item), "{}", kind.field);
                for field in kind.required {
                    assert!(item.get(field).is_some(), "{} item lacks {field}", kind.field);
                }
            }
        }
    }

    #[test]
    fn every_map_is_where_its_index_says_and_its_status_list_is_its_own() {
        let mut status = InjectionStatus::default();
        for (index, kind) in MAPS.iter().enumerate() {
            assert_eq!(kind.index, index, "{}", kind.field);
            assert!(matches!(kind.kind.place(), Place::Map(k) if k.index == index), "{}", kind.field);
            (kind.claimed_mut)(&mut status).push(kind.field.to_owned());
            assert_eq!(kind.section, format!("inject.{}", kind.field));
        }
        let json = serde_json::to_value(&status).unwrap();
        for kind in &MAPS {
            assert_eq!(json[kind.field], json!([kind.field]), "the status key of {} is its field", kind.field);
        }
    }
}
