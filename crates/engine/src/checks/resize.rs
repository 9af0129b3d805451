//! The floor an enforced template's container sets: what a resize of it may not go below
//! (`review::updates` refuses such a resize; `enforce::Requirements` gives the policy the entries
//! it can compare).

use serde_json::Value;

use crate::quantity;

/// The resource fields a template's floor covers, as a container's `resources` names them.
pub const FLOOR_FIELDS: [&str; 2] = ["requests", "limits"];

/// The floor a rendered container's `resources` set: each `requests` and `limits` entry with its
/// quantity.
pub fn floor_of(resources: Option<&Value>) -> Vec<(&'static str, String, String)> {
    let mut floor = Vec::new();
    for field in FLOOR_FIELDS {
        let entries = resources.and_then(|r| r.get(field)).and_then(Value::as_object);
        for (resource, quantity) in entries.into_iter().flatten() {
            floor.push((field, resource.clone(), quantity_text(quantity)));
        }
    }
    floor
}

/// Whether `quantity` is one Kubernetes reads (the enforcement policy's `quantity()` fails on
/// anything else).
pub fn parses(text: &str) -> bool {
    quantity::parse(text).is_some()
}

/// A quantity as text: the API server accepts `cpu: 1` as well as `cpu: "1"` (`quantity::text`);
/// anything else as its JSON.
pub(crate) fn quantity_text(value: &Value) -> String {
    quantity::text(value).map_or_else(|| value.to_string(), |text| text.into_owned())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn the_floor_is_the_templates_requests_and_limits() {
        let resources = json!({"requests": {"cpu": "50m", "memory": 32}, "limits": {"memory": "64Mi"}, "claims": []});
        assert_eq!(
            super::floor_of(Some(&resources)),
            vec![
                ("requests", "cpu".to_owned(), "50m".to_owned()),
                ("requests", "memory".to_owned(), "32".to_owned()),
                ("limits", "memory".to_owned(), "64Mi".to_owned())
            ]
        );
        assert!(super::floor_of(None).is_empty());
    }
}
