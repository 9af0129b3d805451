//! Reading watched objects without allocating what the injector does not keep.
//!
//! The injector watches every Node and every Pod of the cluster, and keeps a few fields of each.
//! Decoding them as `k8s_openapi` types (or `PartialObjectMeta`) builds every field first: the
//! managed fields alone are kilobytes of nested JSON per object, rewritten by every kubelet status
//! update, and a page of a paged list is decoded whole, so at 1,000 pods a page the decoded
//! managed fields were tens of MiB of transient memory that the allocator kept. The types here
//! read an object's metadata keeping only its name, namespace, labels, resource version and the
//! annotations a kind names ([`KeptAnnotations`]); every other field is skipped by serde without
//! being allocated.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// The annotation keys an object's lean metadata keeps; the others are skipped while reading.
pub trait KeptAnnotations {
    /// The keys kept.
    const KEYS: &'static [&'static str];
}

/// Keeps no annotation.
pub struct NoAnnotations;

impl KeptAnnotations for NoAnnotations {
    const KEYS: &'static [&'static str] = &[];
}

/// Reads an object's `metadata` keeping only its name, namespace, labels, resource version and the
/// annotations `A` names (for `#[serde(deserialize_with = "lean_metadata::<_, A>")]`).
pub fn lean_metadata<'de, D: Deserializer<'de>, A: KeptAnnotations>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let lean = LeanMetadata::<A>::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: lean.name,
        namespace: lean.namespace,
        labels: lean.labels,
        annotations: lean.annotations.0,
        resource_version: lean.resource_version,
        ..ObjectMeta::default()
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", bound = "")]
struct LeanMetadata<A: KeptAnnotations> {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Kept<A>,
    #[serde(default)]
    resource_version: Option<String>,
}

/// The kept annotations (`None` when the object has none of them).
struct Kept<A>(Option<BTreeMap<String, String>>, PhantomData<A>);

impl<A> Default for Kept<A> {
    fn default() -> Self {
        Kept(None, PhantomData)
    }
}

impl<'de, A: KeptAnnotations> Deserialize<'de> for Kept<A> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_option(KeptVisitor(PhantomData))
    }
}

struct KeptVisitor<A>(PhantomData<A>);

impl<'de, A: KeptAnnotations> Visitor<'de> for KeptVisitor<A> {
    type Value = Kept<A>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a map of annotations")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Kept::default())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Kept::default())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut kept = BTreeMap::new();
        while let Some(key) = map.next_key_seed(KeptKey::<A>(PhantomData))? {
            match key {
                Some(key) => drop(kept.insert(key, map.next_value::<String>()?)),
                None => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(Kept((!kept.is_empty()).then_some(kept), PhantomData))
    }
}

/// Reads an annotation's key as the owned key when `A` keeps it, `None` otherwise: a skipped
/// annotation's key is compared where the input holds it (or, when it has escapes, in the
/// parser's reused scratch buffer) and never allocated.
struct KeptKey<A>(PhantomData<A>);

impl<'de, A: KeptAnnotations> DeserializeSeed<'de> for KeptKey<A> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, A: KeptAnnotations> Visitor<'de> for KeptKey<A> {
    type Value = Option<String>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an annotation key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(A::KEYS.contains(&key).then(|| key.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    struct Two;
    impl KeptAnnotations for Two {
        const KEYS: &'static [&'static str] = &["a", "b"];
    }

    #[derive(Deserialize)]
    struct Object {
        #[serde(deserialize_with = "lean_metadata::<_, Two>")]
        metadata: ObjectMeta,
    }

    #[test]
    fn keeps_the_named_fields_and_annotations_only() {
        // From text, as a watch or a list is read (keys borrowed from the input), and from a value.
        let text = json!({"metadata": {
            "name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
            "labels": {"app": "shop"},
            "annotations": {"a": "1", "c": "3", "b": "2", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:metadata": {}}}],
            "ownerReferences": [{"kind": "ReplicaSet", "name": "r", "uid": "x", "apiVersion": "apps/v1"}],
        }})
        .to_string();
        let expected = ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            resource_version: Some("7".into()),
            labels: Some([("app".into(), "shop".into())].into()),
            annotations: Some([("a".into(), "1".into()), ("b".into(), "2".into())].into()),
            ..ObjectMeta::default()
        };
        let from_text: Object = serde_json::from_str(&text).unwrap();
        assert_eq!(from_text.metadata, expected);
        let from_value: Object = serde_json::from_value(serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(from_value.metadata, expected);
    }

    #[test]
    fn no_kept_annotation_reads_as_none() {
        for annotations in [json!(null), json!({}), json!({"c": "3"})] {
            let object: Object = serde_json::from_value(json!({"metadata": {"annotations": annotations}})).unwrap();
            assert_eq!(object.metadata.annotations, None, "{annotations}");
        }
        for text in [
            r#"{"metadata": {}}"#,
            r#"{"metadata": {"annotations": null}}"#,
            r#"{"metadata": {"annotations": {"c": "3"}}}"#,
        ] {
            let object: Object = serde_json::from_str(text).unwrap();
            assert_eq!(object.metadata, ObjectMeta::default(), "{text}");
        }
    }

    #[test]
    fn escaped_keys_and_bad_values_are_handled() {
        // An escaped key is unescaped before it is compared.
        let object: Object = serde_json::from_str(r#"{"metadata": {"annotations": {"\u0061": "1"}}}"#).unwrap();
        assert_eq!(object.metadata.annotations, Some([("a".into(), "1".into())].into()));
        // A kept annotation must be a string; a skipped one may be anything the JSON holds.
        assert!(serde_json::from_str::<Object>(r#"{"metadata": {"annotations": {"a": 1}}}"#).is_err());
        assert!(serde_json::from_str::<Object>(r#"{"metadata": {"annotations": {"c": [1]}}}"#).is_ok());
        assert!(serde_json::from_str::<Object>(r#"{"metadata": {"annotations": []}}"#).is_err());
    }
}
