//! Whether a rendered item is what Kubernetes accepts in its place: read as its k8s-openapi type,
//! a value of the wrong type is an error naming the field path, and a field the type does not have
//! is found too (k8s-openapi ignores unknown fields, as the API server drops them), the way
//! `kubectl`'s strict field validation finds it. No other module of the engine is needed here, so
//! the load check and the item kinds' descriptions both use it.

use serde_json::Value;

/// The Kubernetes version whose types the load check reads rendered items as (the k8s-openapi
/// feature this crate is built with). A field newer than this is unknown to the check: a template
/// lists it in `uncheckedFields` (docs/templates.md).
pub const CHECKED_KUBERNETES_VERSION: &str = "1.37";

/// What a check of one rendered item finds: a value of the wrong type (`Err`, with its field
/// path), a field the type does not have (`Ok(Some(path))`), or nothing.
pub type Checked = Result<Option<String>, String>;

/// [`conforms`] for a pod `Volume`. The item kinds' table (`kinds`) names these plain functions
/// rather than `conforms::<T>`: a generic function named in a table that another crate reads is
/// instantiated again in that crate, and the binary carried a second copy of `Volume`'s
/// deserializer (half a megabyte) until they were plain.
pub fn volume(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::Volume>(item)
}

/// [`conforms`] for a `LocalObjectReference` (an image pull secret); see [`volume`].
pub fn local_object_reference(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::LocalObjectReference>(item)
}

/// [`conforms`] for a pod `HostAlias`; see [`volume`].
pub fn host_alias(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::HostAlias>(item)
}

/// [`conforms`] for an `EnvVar`; see [`volume`].
pub fn env_var(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::EnvVar>(item)
}

/// [`conforms`] for an `EnvFromSource`; see [`volume`].
pub fn env_from_source(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::EnvFromSource>(item)
}

/// [`conforms`] for a `VolumeMount`; see [`volume`].
pub fn volume_mount(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::VolumeMount>(item)
}

/// Reads `item` as a `T`: an error names the field path of a value of the wrong type; `Ok(Some)`
/// names the first field `T` does not have, as `ports[1].protocl` (k8s-openapi ignores unknown
/// fields; `serde_ignored` reports each one it skips, so no type needs to be written back).
pub fn conforms<T: serde::de::DeserializeOwned>(item: &Value) -> Checked {
    let mut unknown = None;
    let mut note = |path: serde_ignored::Path<'_>| {
        unknown.get_or_insert_with(|| field_path(&path));
    };
    let reader = serde_ignored::Deserializer::new(item, &mut note);
    serde_path_to_error::deserialize::<_, T>(reader).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." { inner } else { format!("{path}: {inner}") }
    })?;
    Ok(unknown)
}

/// A path as Kubernetes writes field paths: `resources.limitz`, `ports[1].protocl`.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            parent if parent.is_empty() => key.clone(),
            parent => format!("{parent}.{key}"),
        },
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => field_path(parent),
    }
}
