//! Env values as Kubernetes reads them, and the vocabulary of a template's merged entry: the
//! pieces of a value under the kubelet's `$(VAR)` expansion ([`Pieces`]), whether an entry builds on
//! the earlier entry of its name ([`extends_earlier`]), and how a template's entry merges with the
//! app's variable of its name ([`EnvMerge`], written `merge:` in a template; what merging does to a
//! pod is `injection::env_merge`).

use serde_json::Value;

/// Where the template's fragment goes relative to the app's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// `<app value><separator><fragment>`.
    Append,
    /// `<fragment><separator><app value>`.
    Prepend,
}

/// How a template's env var merges with a same-name variable of the app container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvMerge {
    /// Where the fragment goes.
    pub position: Position,
    /// Between the app's value and the fragment (`" "` for option lists, `":"` for paths).
    pub separator: String,
}

impl EnvMerge {
    /// The env entry that adds `fragment` to the app's variable `name`.
    pub fn entry(&self, name: &str, fragment: &str) -> Value {
        let reference = format!("$({name})");
        let value = match self.position {
            Position::Append => format!("{reference}{}{fragment}", self.separator),
            Position::Prepend => format!("{fragment}{}{reference}", self.separator),
        };
        serde_json::json!({"name": name, "value": value})
    }

    /// How it reads in messages: `append " "`.
    pub fn describe(&self) -> String {
        let position = match self.position {
            Position::Append => "append",
            Position::Prepend => "prepend",
        };
        format!("{position} with separator {:?}", self.separator)
    }
}

pub(crate) fn refers_to_itself(name: &str, value: &str) -> bool {
    Pieces(value).any(|piece| piece == Piece::Reference(name))
}

/// A piece of an env value as Kubernetes' `$(VAR)` expansion reads it (the kubelet's
/// `expansion.Expand`): `$$` is a literal `$` (so `$$(J)` is text, no reference), an unclosed `$(`
/// and a `$` before anything else are text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece<'v> {
    /// Text as it stands.
    Text(&'v str),
    /// `$(NAME)`: the name.
    Reference(&'v str),
}

/// The pieces of a value, in order, without allocating.
pub(crate) struct Pieces<'v>(pub(crate) &'v str);

impl<'v> Iterator for Pieces<'v> {
    type Item = Piece<'v>;

    fn next(&mut self) -> Option<Piece<'v>> {
        let rest = self.0;
        match rest.find('$') {
            _ if rest.is_empty() => None,
            None => {
                self.0 = "";
                Some(Piece::Text(rest))
            }
            Some(at) if at > 0 => {
                self.0 = &rest[at..];
                Some(Piece::Text(&rest[..at]))
            }
            Some(_) => {
                let after = &rest[1..];
                if let Some(escaped) = after.strip_prefix('$') {
                    self.0 = escaped;
                    return Some(Piece::Text("$"));
                }
                match after.strip_prefix('(').and_then(|r| r.find(')').map(|close| (r, close))) {
                    Some((reference, close)) => {
                        self.0 = &reference[close + 1..];
                        Some(Piece::Reference(&reference[..close]))
                    }
                    None => {
                        self.0 = after;
                        Some(Piece::Text("$"))
                    }
                }
            }
        }
    }
}

/// Whether an env entry builds on the value its name had before it (`$(NAME)` in its own value, as
/// every merged entry does) rather than replacing it.
pub fn extends_earlier(entry: &Value) -> bool {
    match (entry.get("name").and_then(Value::as_str), entry.get("value").and_then(Value::as_str)) {
        (Some(name), Some(value)) => refers_to_itself(name, value),
        _ => false,
    }
}
