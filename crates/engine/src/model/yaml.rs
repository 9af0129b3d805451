//! YAML for templates (manifests, which follow kubectl's rules, are `crate::manifest`).
//!
//! Templates go through `serde-saphyr` (already in the tree through kube's kubeconfig loader):
//! YAML 1.2 scalars (`on` stays a string), bounded parsing (its budget caps events, nodes, depth and
//! alias expansion, so a billion-laughs document fails instead of eating memory), duplicate keys
//! refused, and errors that carry a line and column. Templates keep the line of every node
//! ([`SourceNode`]) so a render error deep inside a sidecar can still name its line.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_saphyr::{DuplicateKeyPolicy, Options, Spanned};

/// A YAML syntax or structure error with its position in the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    /// 1-based line, when known.
    pub line: Option<u64>,
    /// 1-based column, when known.
    pub column: Option<u64>,
    /// What is wrong, without the position.
    pub message: String,
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => {
                write!(f, "line {line} column {column}: {}", self.message)
            }
            (Some(line), None) => write!(f, "line {line}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for YamlError {}

impl From<serde_saphyr::Error> for YamlError {
    fn from(err: serde_saphyr::Error) -> Self {
        let location = err.location().filter(|l| l.line() > 0);
        let text = err.without_snippet().to_string();
        YamlError {
            line: location.map(|l| l.line()),
            column: location.map(|l| l.column()),
            message: strip_position(&text).replace(", set DuplicateKeyPolicy in Options if acceptable", ""),
        }
    }
}

/// serde-saphyr puts the position into its message ("error: line L column C: msg" or "msg at line
/// L, column C"); the position is carried separately, so keep only the message.
fn strip_position(text: &str) -> String {
    let text = text.trim_start_matches("error: ");
    let text = match text.split_once(": ") {
        Some((head, rest)) if head.starts_with("line ") => rest,
        _ => text,
    };
    let text = match text.rsplit_once(" at line ") {
        Some((message, position)) if position.bytes().all(|b| b.is_ascii_digit() || b", column".contains(&b)) => {
            message
        }
        _ => text,
    };
    text.to_owned()
}

/// Template parsing options: YAML 1.2's `true`/`false` only, so a key `n:` or a value `on` stays a
/// string; duplicate keys refused.
fn options() -> Options {
    let mut options = Options::default();
    options.duplicate_keys = DuplicateKeyPolicy::Error;
    options.with_snippet = false;
    options.strict_booleans = true;
    options
}

/// A YAML node that remembers the line it started on. Templates are parsed into this tree so
/// that errors found while compiling or rendering a scalar point at its line.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceNode {
    /// 1-based line of the node in the template source.
    pub line: u64,
    /// The node itself.
    pub value: SourceValue,
}

/// The value of a [`SourceNode`]: YAML's data model as JSON sees it (keys are strings).
#[derive(Debug, Clone, PartialEq)]
pub enum SourceValue {
    /// `~`, `null` or an empty value.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer or float.
    Number(serde_json::Number),
    /// A string scalar (may contain template expressions).
    String(String),
    /// A sequence.
    Seq(Vec<SourceNode>),
    /// A mapping, in source order.
    Map(Vec<MapEntry>),
}

/// One `key: value` of a mapping, with the key's own line (the value of a block mapping starts on
/// the next line, and an error about the key should point at the key).
#[derive(Debug, Clone, PartialEq)]
pub struct MapEntry {
    /// The key (scalars written as strings).
    pub key: String,
    /// 1-based line of the key.
    pub key_line: u64,
    /// The value.
    pub value: SourceNode,
}

impl SourceNode {
    /// Parses one YAML document into a line-annotated tree.
    pub fn parse(text: &str) -> Result<SourceNode, YamlError> {
        // A template is one ConfigMap key (a ConfigMap holds at most 1 MiB): a budget of that size
        // refuses alias bombs and deep nesting in microseconds instead of expanding them.
        let mut options = options();
        let mut budget = serde_saphyr::Budget::default();
        budget.max_reader_input_bytes = Some(1024 * 1024);
        budget.max_events = 100_000;
        budget.max_nodes = 50_000;
        budget.max_aliases = 100;
        budget.max_anchors = 100;
        budget.max_depth = 32;
        budget.max_documents = 1;
        budget.max_total_scalar_bytes = 1024 * 1024;
        options.budget = Some(budget);
        Ok(serde_saphyr::from_str_with_options(text, options)?)
    }

    /// The same data without lines, as JSON.
    pub fn to_json(&self) -> Value {
        match &self.value {
            SourceValue::Null => Value::Null,
            SourceValue::Bool(b) => Value::Bool(*b),
            SourceValue::Number(n) => Value::Number(n.clone()),
            SourceValue::String(s) => Value::String(s.clone()),
            SourceValue::Seq(items) => Value::Array(items.iter().map(SourceNode::to_json).collect()),
            SourceValue::Map(entries) => {
                Value::Object(entries.iter().map(|e| (e.key.clone(), e.value.to_json())).collect())
            }
        }
    }

    /// The YAML type name of this node, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self.value {
            SourceValue::Null => "null",
            SourceValue::Bool(_) => "a boolean",
            SourceValue::Number(_) => "a number",
            SourceValue::String(_) => "a string",
            SourceValue::Seq(_) => "a list",
            SourceValue::Map(_) => "a mapping",
        }
    }
}

impl<'de> Deserialize<'de> for SourceNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<SourceValue>::deserialize(deserializer)?;
        Ok(SourceNode { line: spanned.referenced.line(), value: spanned.value })
    }
}

impl<'de> Deserialize<'de> for SourceValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SourceValueVisitor)
    }
}

struct SourceValueVisitor;

impl<'de> Visitor<'de> for SourceValueVisitor {
    type Value = SourceValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<SourceValue, E> {
        Ok(SourceValue::Null)
    }
    fn visit_none<E>(self) -> Result<SourceValue, E> {
        Ok(SourceValue::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<SourceValue, D::Error> {
        SourceValue::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<SourceValue, E> {
        Ok(SourceValue::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<SourceValue, E> {
        Ok(SourceValue::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<SourceValue, E> {
        Ok(SourceValue::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<SourceValue, E> {
        serde_json::Number::from_f64(v)
            .map(SourceValue::Number)
            .ok_or_else(|| E::custom(format!("{v} is not a finite number")))
    }
    fn visit_str<E>(self, v: &str) -> Result<SourceValue, E> {
        Ok(SourceValue::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<SourceValue, E> {
        Ok(SourceValue::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SourceValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(SourceValue::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SourceValue, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = map.next_entry::<Spanned<MapKey>, SourceNode>()? {
            entries.push(MapEntry { key: key.value.0, key_line: key.referenced.line(), value });
        }
        Ok(SourceValue::Map(entries))
    }
}

/// Mapping keys as JSON sees them: scalars written as strings (`8080: x` has key `"8080"`).
struct MapKey(String);

impl<'de> Deserialize<'de> for MapKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = MapKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar mapping key")
            }
            fn visit_str<E>(self, v: &str) -> Result<MapKey, E> {
                Ok(MapKey(v.to_owned()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<MapKey, E> {
                Ok(MapKey(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<MapKey, E> {
                Ok(MapKey(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<MapKey, E> {
                Ok(MapKey(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<MapKey, E> {
                Ok(MapKey(v.to_string()))
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn source_nodes_carry_the_line_of_every_scalar() {
        let node = SourceNode::parse("a: 1\nb:\n  - x: \"{{ y }}\"\n    z: true\n  - 3.5\n").unwrap();
        let SourceValue::Map(top) = &node.value else { panic!("not a map") };
        assert_eq!((top[1].key.as_str(), top[1].key_line, top[1].value.line), ("b", 2, 3));
        let SourceValue::Seq(items) = &top[1].value.value else { panic!("not a seq") };
        let SourceValue::Map(item) = &items[0].value else { panic!("not a map") };
        assert_eq!((item[0].key.as_str(), item[0].value.line), ("x", 3));
        assert_eq!((item[1].key.as_str(), item[1].key_line), ("z", 4));
        assert_eq!(items[1].line, 5);
        assert_eq!(node.to_json(), json!({"a": 1, "b": [{"x": "{{ y }}", "z": true}, 3.5]}));
        let yaml_1_1 = SourceNode::parse("n: on\ny: yes\nt: true\n").unwrap().to_json();
        assert_eq!(yaml_1_1, json!({"n": "on", "y": "yes", "t": true}), "templates use YAML 1.2 booleans");
    }

    #[test]
    fn errors_name_line_column_and_problem() {
        let err = SourceNode::parse("a: 1\na: 2\n").unwrap_err();
        assert_eq!((err.line, err.column), (Some(2), Some(1)));
        assert_eq!(err.message, "duplicate mapping key: a");
        assert_eq!(err.to_string(), "line 2 column 1: duplicate mapping key: a");

        let err = SourceNode::parse("a: [1\n").unwrap_err();
        assert_eq!(err.line, Some(1));
        assert!(err.message.contains("unclosed bracket"), "{err}");
    }

    #[test]
    fn alias_bombs_are_refused_by_the_budget() {
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(SourceNode::parse(&bomb).is_err());
    }
}
