//! Manifests (the YAML that `inject` and `explain` read and write), exactly as kubectl reads them.
//!
//! kubectl reads YAML through `sigs.k8s.io/yaml`: go-yaml v2 resolves plain scalars by YAML 1.1
//! rules and the result is converted to JSON. Users write manifests for kubectl, so the injector
//! must read them the same way, or `defaultMode: 0400` (256 for kubectl) silently becomes 400
//! (0620, a group-writable Secret). Rules reproduced here, checked against kubectl's own reader by
//! `tests/kubectl_yaml.rs`:
//! - plain scalars: `~`, `null`, `Null`, `NULL` and empty are null; `y`, `Y`, `yes`, `on`, `true`
//!   (and their capitalised and upper-case forms) are booleans, likewise `n`/`no`/`off`/`false`;
//!   integers as Go's `strconv.ParseInt(s, 0, 64)` reads them after removing `_` (`0400` octal,
//!   `0o17`, `0x1F`, `0b101`, `+12`, `1_000`), then unsigned 64-bit, then floats of the form
//!   `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?` (so `08` is the number 8); anything else,
//!   timestamps and `tRUE` included, is a string. `.inf` and `.nan` cannot be JSON: refused.
//! - quoted and block scalars are strings unless tagged (`!!int "12"`); `!!str` forces a string.
//! - mapping keys become strings (`1: a` has key `"1"`, `y: a` has key `"true"`); a null key is
//!   refused; a duplicate key: the last one wins; merge keys (`<<`) merge in place, later keys win.
//! - a float whose value is whole is written as an integer (Go's JSON encoder does the same).
//! - `!!binary` scalars are decoded from base64 to text, as go-yaml decodes them into a string.
//! - the stream as `k8s.io/apimachinery`'s `YAMLOrJSONDecoder` reads it: input whose first
//!   non-space character is `{` is JSON values one after another (if the first or second is not
//!   JSON, the rest is read as YAML from there, as kubectl falls back); YAML is split into
//!   documents on `---` lines only (anything but a comment after `---` is an error), and of each
//!   only the first YAML document is read (after a `...` end marker, the rest is ignored).
//! - an implicit key of a flow mapping stays on one line (go-yaml refuses `{a // note\n b: 1}`).
//! - inside `[...]` and `{...}` a plain scalar keeps a `:` that is followed by `,` `]` `}` `[` or
//!   `{` (`[--listen-addr=::]`, `[1.2.3.4, 001:db8::]`, `{k: v:}` hold strings that end in `:`),
//!   where YAML 1.2 ends the scalar and reads the `:` as a key's indicator; and a plain scalar
//!   there cannot start with `:` (go-yaml refuses `[::1]`: it must be quoted).
//!
//! Templates are not read here: they keep YAML 1.2's stricter rules (`crate::model::yaml`).
//!
//! The writer emits block YAML that both kubectl's reader and YAML 1.2 readers read back as the
//! same JSON: a string is written plain only when no YAML version could read it as anything else,
//! as a literal block when it is multi-line text with nothing a block scalar cannot carry, and
//! double-quoted (with escapes for every character that is not plainly printable) otherwise.
//!
//! Reading is bounded ([`LIMITS`]): the input size, documents, nodes (aliases count each time they
//! are expanded, so an alias bomb stops early) and nesting depth.

use std::collections::HashMap;
use std::fmt::Write as _;

use granit_parser::{Event, Parser, ScalarStyle, ScanError, Span, StructureStyle};
use serde_json::{Map, Number, Value};

use crate::model::yaml::YamlError;

/// How much one manifest stream may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of input.
    pub bytes: usize,
    /// Documents in the stream.
    pub documents: usize,
    /// YAML nodes (scalars, lists, maps) in the stream, aliases counted at every use: the hard cap.
    pub nodes: usize,
    /// YAML nodes per byte of input, aliases counted at every use. Without aliases a stream has
    /// fewer nodes than bytes (every node takes at least a character and a separator), so this
    /// leaves room for anchors as manifests use them while a few bytes of aliases (a "billion
    /// laughs") cannot expand into millions of nodes before the hard cap stops them.
    pub nodes_per_byte: usize,
    /// Nesting depth of lists and maps.
    pub depth: usize,
}

/// The limits of `inject` and `explain`: far above real inputs (a `List` of 3,000 pods is ~2.3 MB
/// and ~200,000 nodes, 0.09 per byte), low enough that a hostile file cannot take gigabytes of
/// memory (an alias bomb of 1 KB stops at 16,000 nodes, about a megabyte).
pub const LIMITS: Limits =
    Limits { bytes: 256 * 1024 * 1024, documents: 100_000, nodes: 10_000_000, nodes_per_byte: 16, depth: 256 };

/// Reads a stream of YAML (or JSON) documents as kubectl does; empty documents are dropped.
pub fn read(text: &str) -> Result<Vec<Value>, YamlError> {
    read_with(text, LIMITS)
}

/// [`read`] with other limits.
pub fn read_with(text: &str, limits: Limits) -> Result<Vec<Value>, YamlError> {
    if text.len() > limits.bytes {
        return Err(YamlError {
            line: None,
            column: None,
            message: format!(
                "the input is {} bytes, more than the limit of {} bytes: split it into several files",
                text.len(),
                limits.bytes
            ),
        });
    }
    let mut documents = Vec::new();
    let (mut yaml, mut json_error) = (text, None);
    if is_json_stream(text) {
        match read_json_stream(text, limits, &mut documents) {
            JsonStream::Read => return Ok(documents),
            JsonStream::Refused(error) => return Err(error),
            JsonStream::YamlFrom(offset, error) => (yaml, json_error) = (&text[offset..], Some(error)),
        }
    }
    let lines_before = text[..text.len() - yaml.len()].matches('\n').count();
    let node_budget = limits.nodes.min(limits.nodes_per_byte.saturating_mul(text.len()));
    let read_before = documents.len();
    match read_yaml(yaml, lines_before, limits, node_budget, &mut documents) {
        Ok(()) => Ok(documents),
        // Neither JSON nor YAML: kubectl reports the JSON error.
        Err(error) => Err(json_error.filter(|_| documents.len() == read_before).unwrap_or(error)),
    }
}

/// Reads the YAML documents of `text`, which follows `lines_before` lines of the input, into
/// `documents`.
fn read_yaml(
    text: &str,
    lines_before: usize,
    limits: Limits,
    node_budget: usize,
    documents: &mut Vec<Value>,
) -> Result<(), YamlError> {
    let mut options = granit_parser::Options::default();
    options.set_emit_comments(false);
    let mut nodes = 0;
    for (index, (chunk, first_line)) in split_documents(text, lines_before)?.into_iter().enumerate() {
        let kept_colons = keep_scalar_colons(chunk);
        let (chunk, colon_stand_in) = match &kept_colons {
            Some((text, stand_in)) => (text.as_str(), Some(*stand_in)),
            None => (chunk, None),
        };
        let parser = Parser::new_from_str_with_options(chunk, options.clone());
        let lines_before = first_line - 1;
        let document = index + 1;
        let mut reader = Reader {
            parser,
            text: chunk,
            colon_stand_in,
            limits,
            node_budget,
            nodes,
            document,
            lines_before,
            flow_depth: 0,
            anchors: HashMap::new(),
        };
        if document > limits.documents {
            let message = format!("more than {} documents: split the input into several files", limits.documents);
            return Err(reader.error(Span::default(), message));
        }
        if let Some(value) = reader.first_document()?.filter(|value| !value.is_null()) {
            documents.push(value);
        }
        nodes = reader.nodes;
    }
    Ok(())
}

/// The documents of a YAML stream as kubectl's reader splits it (`k8s.io/apimachinery`'s
/// `YAMLReader`): the text between separator lines, each with the number of the line it starts
/// on in the input (`text` follows `lines_before` lines of it). A separator line starts with `---` followed by nothing but spaces or a comment; any other
/// line that starts with `---` is an error, as it is for kubectl. Nothing else ends a document:
/// each is then read as go-yaml reads one, its first YAML document only (after a `...` end marker,
/// the rest is ignored).
fn split_documents(text: &str, lines_before: usize) -> Result<Vec<(&str, usize)>, YamlError> {
    let mut documents = Vec::new();
    let (mut start, mut start_line, mut offset) = (0, lines_before + 1, 0);
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let index = index + lines_before;
        if let Some(rest) = line.strip_prefix("---") {
            let rest = rest.trim();
            if !rest.is_empty() && !rest.starts_with('#') {
                return Err(YamlError {
                    line: Some(index as u64 + 1),
                    column: Some(4),
                    message: format!(
                        "document {}: invalid YAML document separator: {rest} (kubectl takes only spaces or a comment after ---)",
                        documents.len() + 1
                    ),
                });
            }
            if offset > start {
                documents.push((&text[start..offset], start_line));
            }
            (start, start_line) = (offset + line.len(), index + 2);
        }
        offset += line.len();
    }
    if text.len() > start {
        documents.push((&text[start..], start_line));
    }
    Ok(documents)
}

/// Whether kubectl reads `text` as a stream of JSON values: when its first 4,096 bytes, after
/// white space, start with `{` (`YAMLOrJSONDecoder`'s guess).
fn is_json_stream(text: &str) -> bool {
    let head = &text.as_bytes()[..text.len().min(4096)];
    String::from_utf8_lossy(head).trim_start().starts_with('{')
}

/// How a stream that starts with `{` reads (see [`read_json_stream`]).
enum JsonStream {
    /// As JSON values to its end.
    Read,
    /// Not as JSON, after more than one JSON value.
    Refused(YamlError),
    /// As YAML from this offset on, after at most one JSON value; the JSON error is what kubectl
    /// reports if the YAML cannot be read either.
    YamlFrom(usize, YamlError),
}

/// A stream that starts with `{`, as kubectl's `YAMLOrJSONDecoder` reads it into `documents`:
/// JSON values one after another (no comments, no trailing commas; `null`s dropped). A value that
/// is not JSON ends it: after more than one value that is an error, otherwise the rest of the
/// stream is read as YAML, from the start of that value with the white space up to the end of its
/// line skipped (`{"a": 1,}` is YAML's).
fn read_json_stream(text: &str, limits: Limits, documents: &mut Vec<Value>) -> JsonStream {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    for document in 1.. {
        let offset = values.byte_offset();
        let error = match values.next() {
            None => return JsonStream::Read,
            Some(Ok(_)) if document > limits.documents => {
                let message = format!("more than {} documents: split the input into several files", limits.documents);
                return JsonStream::Refused(YamlError { line: None, column: None, message });
            }
            Some(Ok(value)) => {
                if !value.is_null() {
                    documents.push(value);
                }
                continue;
            }
            Some(Err(error)) => error,
        };
        let message = error.to_string();
        let message = message.rsplit_once(" at line ").map_or(message.as_str(), |(m, _)| m);
        let error = YamlError {
            line: Some(error.line() as u64),
            column: Some(error.column() as u64),
            message: format!(
                "document {document}: {message} (input that starts with {{ is read as JSON, as kubectl reads it)"
            ),
        };
        if document > 2 {
            return JsonStream::Refused(error);
        }
        let rest = &text[offset..];
        let mut skipped = 0;
        for c in rest.chars().take_while(|c| c.is_whitespace()) {
            skipped += c.len_utf8();
            if c == '\n' {
                break;
            }
        }
        return JsonStream::YamlFrom(offset + skipped, error);
    }
    unreachable!("the loop returns")
}

/// The characters after a `:` that go-yaml keeps in a plain scalar where YAML 1.2 does not.
const KEPT_COLON_FOLLOWERS: &[u8] = b",]}[{";

/// go-yaml (kubectl's reader) keeps a `:` that is followed by one of [`KEPT_COLON_FOLLOWERS`] in
/// the plain scalar it ends, also inside `[...]` and `{...}`, where a YAML 1.2 parser ends the
/// scalar and reads the `:` as a key's indicator. Each such colon is replaced by a character the
/// text does not hold (the stand-in, returned too), which the parser reads as scalar content and
/// the reader turns back into `:` in every scalar (so replacing one inside quotes, a block scalar
/// or a comment changes nothing). A char for a char: lines and columns stay where they were.
/// `None` when no colon needs it (the usual case, found in one pass).
///
/// A colon is kept when the character before it on its line, spaces and tabs skipped, can be part
/// of a plain scalar (go-yaml reads `[a :]` as `"a :"`): not a flow indicator and not a quote,
/// after which the colon is an indicator for both readers (`["a":]`).
fn keep_scalar_colons(text: &str) -> Option<(String, char)> {
    let bytes = text.as_bytes();
    bytes.windows(2).position(|pair| pair[0] == b':' && KEPT_COLON_FOLLOWERS.contains(&pair[1]))?;
    // A private-use character absent from the text (one pass, whatever the text holds).
    let private = '\u{E000}'..='\u{F8FF}';
    let mut present = vec![false; private.clone().count()];
    for c in text.chars().filter(|c| private.contains(c)) {
        present[(c as u32 - 0xE000) as usize] = true;
    }
    let stand_in = char::from_u32(0xE000 + present.iter().position(|p| !p)? as u32)?;
    let mut out = String::with_capacity(text.len() + 16);
    let mut before: Option<char> = None;
    for (at, c) in text.char_indices() {
        let followed_by_indicator = bytes.get(at + 1).is_some_and(|b| KEPT_COLON_FOLLOWERS.contains(b));
        let after_scalar_content = before.is_some_and(|b| !matches!(b, ',' | '[' | ']' | '{' | '}' | '"' | '\''));
        match c {
            ':' if followed_by_indicator && after_scalar_content => out.push(stand_in),
            _ => out.push(c),
        }
        match c {
            '\n' | '\r' => before = None,
            ' ' | '\t' => {}
            c => before = Some(c),
        }
    }
    Some((out, stand_in))
}

struct Reader<'a> {
    parser: Parser<'a, granit_parser::StrInput<'a>>,
    /// The text the parser reads (this document's).
    text: &'a str,
    /// What stands for a colon go-yaml keeps in a scalar (see [`keep_scalar_colons`]).
    colon_stand_in: Option<char>,
    /// How many `[...]` and `{...}` the node being read is in.
    flow_depth: usize,
    limits: Limits,
    /// The nodes this input may have: [`Limits::nodes_per_byte`] of its size, at most
    /// [`Limits::nodes`].
    node_budget: usize,
    nodes: usize,
    document: usize,
    /// The lines of the stream before this document's (the parser counts from its start).
    lines_before: usize,
    anchors: HashMap<usize, (Value, usize)>,
}

impl<'a> Reader<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Span), YamlError> {
        match self.parser.next_event() {
            Some(Ok(pair)) => Ok(pair),
            Some(Err(e)) => Err(scan_error(&e, self.document, self.lines_before)),
            None => Ok((Event::StreamEnd, Span::default())),
        }
    }

    fn error(&self, span: Span, message: String) -> YamlError {
        let document = if self.document > 0 { format!("document {}: ", self.document) } else { String::new() };
        YamlError {
            line: Some((span.start.line() + self.lines_before) as u64),
            column: Some(span.start.col() as u64 + 1),
            message: format!("{document}{message}"),
        }
    }

    /// Whether the key that starts at `span` follows a `?` indicator (an explicit key may span
    /// lines).
    fn is_explicit_key(&self, span: Span) -> bool {
        let line = self.text.lines().nth(span.start.line().saturating_sub(1)).unwrap_or_default();
        let before: String = line.chars().take(span.start.col()).collect();
        before.trim_end().ends_with('?')
    }

    /// The first YAML document of the text, as go-yaml reads one: what follows it is not read.
    fn first_document(&mut self) -> Result<Option<Value>, YamlError> {
        loop {
            let (event, _) = self.next()?;
            match event {
                Event::StreamEnd => return Ok(None),
                Event::DocumentStart(..) => {
                    let (event, span) = self.next()?;
                    return match event {
                        Event::DocumentEnd => Ok(None),
                        event => self.node(event, span, 0).map(Some),
                    };
                }
                _ => {}
            }
        }
    }

    fn count(&mut self, span: Span, nodes: usize) -> Result<(), YamlError> {
        self.nodes += nodes;
        if self.nodes > self.node_budget {
            let message = match self.node_budget == self.limits.nodes {
                true => format!(
                    "more than {} YAML nodes in the input (aliases count each time they are used): split it into several files",
                    self.limits.nodes
                ),
                false => format!(
                    "more than {} YAML nodes in an input of {} bytes (aliases count each time they are used; at most {} nodes per byte of input): expand the aliases or split the input",
                    self.node_budget,
                    self.node_budget / self.limits.nodes_per_byte,
                    self.limits.nodes_per_byte
                ),
            };
            return Err(self.error(span, message));
        }
        Ok(())
    }

    /// Reads the node that `event` starts, as JSON.
    fn node(&mut self, event: Event<'a>, span: Span, depth: usize) -> Result<Value, YamlError> {
        if depth > self.limits.depth {
            return Err(self.error(span, format!("nested more than {} levels deep", self.limits.depth)));
        }
        let (value, anchor, size) = match event {
            Event::Alias(id) => {
                let Some((value, size)) = self.anchors.get(&id).cloned() else {
                    return Err(self.error(span, "an alias refers to an unknown anchor".into()));
                };
                self.count(span, size)?;
                return Ok(value);
            }
            Event::Scalar(mut text, style, anchor, tag) => {
                self.count(span, 1)?;
                if let Some(stand_in) = self.colon_stand_in.filter(|c| text.contains(*c)) {
                    text = text.replace(stand_in, ":").into();
                }
                if style == ScalarStyle::Plain && self.flow_depth > 0 && text.starts_with(':') {
                    let message = format!(
                        "did not find expected node content: inside [...] or {{...}} kubectl reads a `:` that starts {text:?} as a key's indicator; quote the value"
                    );
                    return Err(self.error(span, message));
                }
                // go-yaml's scanner ends a plain scalar at `?` inside a flow collection (and reads
                // one that starts with it as an explicit key): kubectl refuses all but the last.
                if style == ScalarStyle::Plain && self.flow_depth > 0 && text.contains('?') {
                    let message = format!(
                        "did not find expected ',' or ']': inside [...] or {{...}} kubectl reads the `?` of {text:?} as an indicator; quote the value"
                    );
                    return Err(self.error(span, message));
                }
                let tag = tag.map(|t| format!("{}{}", t.handle(), t.suffix()));
                let value = resolve(&text, style, tag.as_deref()).map_err(|m| self.error(span, m))?;
                (value, anchor, 1)
            }
            Event::SequenceStart(style, anchor, _) => {
                self.count(span, 1)?;
                let before = self.nodes;
                let mut items = Vec::new();
                let flow = usize::from(style == StructureStyle::Flow);
                self.flow_depth += flow;
                loop {
                    let (event, span) = self.next()?;
                    if matches!(event, Event::SequenceEnd) {
                        break;
                    }
                    items.push(self.node(event, span, depth + 1)?);
                }
                self.flow_depth -= flow;
                (Value::Array(items), anchor, 1 + self.nodes - before)
            }
            Event::MappingStart(style, anchor, _) => {
                self.count(span, 1)?;
                let before = self.nodes;
                let mut map = Map::new();
                let flow = usize::from(style == StructureStyle::Flow);
                self.flow_depth += flow;
                loop {
                    let (event, key_span) = self.next()?;
                    if matches!(event, Event::MappingEnd) {
                        break;
                    }
                    // go-yaml keeps an implicit key to one line, as YAML says; the parser here lets
                    // one of a flow mapping run on (`{a // comment\n "b": 1}` read as one key).
                    let multi_line = key_span.start.line() != key_span.end.line();
                    let scalar = matches!(event, Event::Scalar(..));
                    if style == StructureStyle::Flow && multi_line && scalar && !self.is_explicit_key(key_span) {
                        let message = "did not find expected ',' or '}': a key in {...} must fit on one line (JSON has no // comments)";
                        return Err(self.error(key_span, message.into()));
                    }
                    let is_merge = matches!(&event, Event::Scalar(text, ScalarStyle::Plain, _, None) if text == "<<");
                    let key = self.node(event, key_span, depth + 1)?;
                    let (event, span) = self.next()?;
                    let value = self.node(event, span, depth + 1)?;
                    if is_merge {
                        merge(&mut map, value).map_err(|m| self.error(key_span, m))?;
                    } else {
                        let key = key_string(&key).map_err(|m| self.error(key_span, m))?;
                        map.insert(key, value);
                    }
                }
                self.flow_depth -= flow;
                (Value::Object(map), anchor, 1 + self.nodes - before)
            }
            _ => return Err(self.error(span, "unexpected YAML event".into())),
        };
        if anchor != 0 {
            self.anchors.insert(anchor, (value.clone(), size));
        }
        Ok(value)
    }
}

fn scan_error(error: &ScanError, document: usize, lines_before: usize) -> YamlError {
    let marker = error.marker();
    let document = if document > 0 { format!("document {document}: ") } else { String::new() };
    YamlError {
        line: Some((marker.line() + lines_before) as u64),
        column: Some(marker.col() as u64 + 1),
        message: format!("{document}{}", error.info()),
    }
}

/// `<<: {...}` or `<<: [{...}, {...}]`: go-yaml applies a list of maps last to first, so the first
/// wins, and the merge overwrites keys that came before it.
fn merge(map: &mut Map<String, Value>, value: Value) -> Result<(), String> {
    let merge_one = |map: &mut Map<String, Value>, value: Value| match value {
        Value::Object(from) => {
            map.extend(from);
            Ok(())
        }
        _ => Err("a merge key (<<) needs a map or a list of maps".to_owned()),
    };
    match value {
        Value::Array(items) => items.into_iter().rev().try_for_each(|item| merge_one(map, item)),
        other => merge_one(map, other),
    }
}

/// A mapping key as `sigs.k8s.io/yaml` turns it into a JSON key.
fn key_string(key: &Value) -> Result<String, String> {
    match key {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) if n.is_i64() => Ok(n.to_string()),
        // go-yaml decodes it as uint64, which sigs.k8s.io/yaml does not turn into a key.
        Value::Number(n) if n.is_u64() => {
            Err(format!("the mapping key {n} is beyond a signed 64-bit integer (quote it)"))
        }
        Value::Number(n) => Ok(go_format_float32_g(n.as_f64().unwrap_or_default())),
        Value::Null => Err("a mapping key is null, which JSON cannot have (quote it: \"null\": ...)".to_owned()),
        _ => Err("a mapping key is a list or a map, which JSON cannot have".to_owned()),
    }
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 32)`, for float mapping keys.
fn go_format_float32_g(value: f64) -> String {
    let single = value as f32;
    if single.is_infinite() {
        return if single > 0.0 { ".inf" } else { "-.inf" }.to_owned();
    }
    let scientific = format!("{single:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..6).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        format!("{single}")
    }
}

/// A scalar as go-yaml v2 decodes it into an untyped value, then as JSON.
fn resolve(text: &str, style: ScalarStyle, tag: Option<&str>) -> Result<Value, String> {
    let tag = tag.map(|t| t.strip_prefix("tag:yaml.org,2002:").map_or(t.to_owned(), |s| format!("!!{s}")));
    let tag = tag.as_deref();
    let implicit = match (style, tag) {
        (_, Some("!!str" | "!")) => return Ok(Value::String(text.to_owned())),
        (ScalarStyle::Plain, None) => resolve_plain(text),
        (_, None) => Resolved::Str,
        (_, Some("!!int" | "!!float" | "!!bool" | "!!null")) => resolve_plain(text),
        (_, Some("!!binary")) => return binary(text),
        // go-yaml keeps scalars with other tags as strings.
        (_, Some(_)) => return Ok(Value::String(text.to_owned())),
    };
    let value = match (implicit, tag) {
        (Resolved::Float(f), _) if !f.is_finite() => {
            return Err(format!("{text} is not a finite number, which JSON (and so Kubernetes) cannot hold"));
        }
        (Resolved::Int(i), Some("!!float")) => float_json(i as f64),
        (Resolved::Uint(u), Some("!!float")) => float_json(u as f64),
        (Resolved::Null, None | Some("!!null")) => Value::Null,
        (Resolved::Bool(b), None | Some("!!bool")) => Value::Bool(b),
        (Resolved::Int(i), None | Some("!!int")) => Value::from(i),
        (Resolved::Uint(u), None | Some("!!int")) => Value::from(u),
        (Resolved::Float(f), None | Some("!!float")) => float_json(f),
        (Resolved::Str, None) => Value::String(text.to_owned()),
        (_, Some(tag)) => return Err(format!("cannot read {text:?} as {tag}")),
    };
    Ok(value)
}

/// A `!!binary` scalar as go-yaml decodes it into a string: standard base64 (line breaks
/// ignored, as Go's decoder ignores them), the bytes as text (what is not UTF-8 becomes U+FFFD, as
/// Go's JSON encoder writes it).
fn binary(text: &str) -> Result<Value, String> {
    use base64::Engine as _;
    let encoded: String = text.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "!!binary value contains invalid base64 data".to_owned())?;
    Ok(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
}

/// A float as Go's JSON encoder writes it: whole values as integers.
fn float_json(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9.0e18 {
        Value::from(f as i64)
    } else {
        Number::from_f64(f).map_or(Value::Null, Value::Number)
    }
}

enum Resolved {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str,
}

/// go-yaml v2's `resolve` for a plain scalar with no tag.
fn resolve_plain(text: &str) -> Resolved {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => {
            return Resolved::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => {
            return Resolved::Bool(false);
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return Resolved::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        _ => {}
    }
    match text.as_bytes()[0] {
        b'.' => match is_yaml_float(text) {
            true => text.parse().map_or(Resolved::Str, Resolved::Float),
            false => Resolved::Str,
        },
        b'0'..=b'9' | b'+' | b'-' => {
            let plain = text.replace('_', "");
            if let Some(i) = go_parse_int(&plain) {
                Resolved::Int(i)
            } else if let Some(u) = go_parse_uint(&plain) {
                Resolved::Uint(u)
            } else if is_yaml_float(&plain) {
                plain.parse().map_or(Resolved::Str, Resolved::Float)
            } else {
                Resolved::Str
            }
        }
        _ => Resolved::Str,
    }
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`, go-yaml's float syntax.
fn is_yaml_float(text: &str) -> bool {
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", fraction)) => !fraction.is_empty() && digits(fraction) == fraction.len(),
        Some((whole, fraction)) => digits(whole) == whole.len() && digits(fraction) == fraction.len(),
        None => !mantissa.is_empty() && digits(mantissa) == mantissa.len(),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && digits(e) == e.len()
    });
    mantissa_ok && exponent_ok
}

/// Go's `strconv.ParseInt(s, 0, 64)`: sign, then `0x`, `0o`, `0b` or a leading `0` for octal.
fn go_parse_int(text: &str) -> Option<i64> {
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = go_parse_uint(rest)? as i128;
    let value = if negative { -magnitude } else { magnitude };
    i64::try_from(value).ok()
}

/// Go's `strconv.ParseUint(s, 0, 64)` (no sign).
fn go_parse_uint(text: &str) -> Option<u64> {
    let lower = text.get(..2).map(str::to_ascii_lowercase);
    let (radix, digits) = match lower.as_deref() {
        Some("0x") => (16, &text[2..]),
        Some("0o") => (8, &text[2..]),
        Some("0b") => (2, &text[2..]),
        _ if text.len() > 1 && text.starts_with('0') => (8, &text[1..]),
        _ => (10, text),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// Writes documents as a YAML stream, `---` between them.
pub fn write(documents: &[Value]) -> String {
    let mut out = String::new();
    for (index, document) in documents.iter().enumerate() {
        if index > 0 {
            out.push_str("---\n");
        }
        match document {
            Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0),
            Value::Array(items) if !items.is_empty() => write_list(&mut out, items, 0),
            other => {
                write_scalar(&mut out, other, 0);
                out.push('\n');
            }
        }
    }
    out
}

fn indent(out: &mut String, width: usize) {
    out.extend(std::iter::repeat_n(' ', width));
}

fn write_map(out: &mut String, map: &Map<String, Value>, width: usize) {
    for (index, (key, value)) in map.iter().enumerate() {
        // The first key of a list item goes on the item's line.
        if index > 0 || !out.ends_with("- ") {
            indent(out, width);
        }
        write_string(out, key, width, true);
        out.push(':');
        write_nested(out, value, width, width + 2);
    }
}

fn write_list(out: &mut String, items: &[Value], width: usize) {
    for item in items {
        indent(out, width);
        out.push_str("- ");
        match item {
            Value::Object(map) if !map.is_empty() => write_map(out, map, width + 2),
            Value::Array(inner) if !inner.is_empty() => {
                out.pop();
                out.push('\n');
                write_list(out, inner, width + 2);
            }
            scalar => {
                write_scalar(out, scalar, width + 2);
                out.push('\n');
            }
        }
    }
}

/// The value after `key:`; maps nest two deeper, lists stay at the key's width (as kubectl writes).
fn write_nested(out: &mut String, value: &Value, key_width: usize, width: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_map(out, map, width);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_list(out, items, key_width);
        }
        scalar => {
            out.push(' ');
            write_scalar(out, scalar, width);
            out.push('\n');
        }
    }
}

fn write_scalar(out: &mut String, value: &Value, width: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(out, s, width, false),
        Value::Object(_) => out.push_str("{}"),
        Value::Array(_) => out.push_str("[]"),
    }
}

fn write_string(out: &mut String, text: &str, width: usize, key: bool) {
    if is_plain_safe(text) {
        out.push_str(text);
    } else if !key && is_literal_safe(text) {
        let trailing = text.len() - text.trim_end_matches('\n').len();
        out.push_str(match trailing {
            0 => "|-",
            1 => "|",
            _ => "|+",
        });
        out.push('\n');
        let body = text.strip_suffix('\n').unwrap_or(text);
        for line in body.split('\n') {
            if !line.is_empty() {
                indent(out, width);
                out.push_str(line);
            }
            out.push('\n');
        }
        // The caller ends the line.
        out.pop();
    } else {
        write_double_quoted(out, text);
    }
}

/// Whether a string written plain reads back as the same string under YAML 1.1 (kubectl) and 1.2:
/// starts with a letter, `/` or `--`/`-letter`, holds only unremarkable characters, and is no
/// keyword of either version.
fn is_plain_safe(text: &str) -> bool {
    let bytes = text.as_bytes();
    let Some(&first) = bytes.first() else { return false };
    // A quantity (`64Mi`, `250m`): digits, then a unit that no YAML version reads as part of a
    // number (no exponent `e`, no `0x`-style prefix).
    let unit = bytes.iter().position(|b| !b.is_ascii_digit()).unwrap_or(bytes.len());
    let quantity = unit > 0
        && unit < bytes.len()
        && (first != b'0' || unit > 1)
        && !matches!(bytes[unit], b'e' | b'E')
        && bytes[unit..].iter().all(u8::is_ascii_alphabetic);
    let first_ok = quantity
        || first.is_ascii_alphabetic()
        || first == b'/'
        || (first == b'-' && bytes.get(1).is_some_and(|b| *b == b'-' || b.is_ascii_alphabetic()));
    let body_ok = bytes.iter().enumerate().all(|(i, &b)| match b {
        b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' | b'/' | b'-' | b'=' | b'@' | b'+' | b'*' | b',' => true,
        // `: ` and a trailing `:` would start a mapping.
        b':' => bytes.get(i + 1).is_some_and(|n| *n != b' '),
        b' ' => i + 1 < bytes.len() && bytes[i + 1] != b' ',
        _ => false,
    });
    let keyword = matches!(
        text.to_ascii_lowercase().as_str(),
        "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null"
    );
    first_ok && body_ok && !keyword
}

/// Whether a multi-line string can be a literal block scalar: printable text, a first line that
/// does not start with white space (the block's indentation is taken from it), no line that
/// starts with a tab or is only spaces.
fn is_literal_safe(text: &str) -> bool {
    text.contains('\n')
        && text.chars().all(|c| c == '\n' || c == '\t' || is_printable(c))
        && !text.starts_with([' ', '\t', '\n'])
        && text.trim_end_matches('\n').split('\n').all(|line| {
            let blank = line.starts_with(' ') && line.trim().is_empty();
            !(blank || line.starts_with('\t') || line.ends_with([' ', '\t']))
        })
}

/// Printable in every YAML version, and not a line break to YAML 1.1 (NEL, LS, PS) or a BOM.
fn is_printable(c: char) -> bool {
    matches!(c, '\u{20}'..='\u{7E}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
        && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{FEFF}')
}

fn write_double_quoted(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if is_printable(c) => out.push(c),
            c if (c as u32) <= 0xFFFF => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08X}", c as u32);
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scalars_resolve_as_kubectl_resolves_them() {
        // (YAML, JSON kubectl reads)
        let cases = [
            ("0400", json!(256)),
            ("0644", json!(420)),
            ("0o17", json!(15)),
            ("0x1F", json!(31)),
            ("0b101", json!(5)),
            ("+12", json!(12)),
            ("-0", json!(0)),
            ("1_000", json!(1000)),
            ("08", json!(8)),
            ("1.0", json!(1)),
            ("1.5", json!(1.5)),
            ("1e3", json!(1000)),
            (".5", json!(0.5)),
            ("18446744073709551615", json!(18446744073709551615u64)),
            ("yes", json!(true)),
            ("On", json!(true)),
            ("y", json!(true)),
            ("N", json!(false)),
            ("tRUE", json!("tRUE")),
            ("~", json!(null)),
            ("2001-12-14", json!("2001-12-14")),
            ("1.2.3", json!("1.2.3")),
            ("0x", json!("0x")),
            ("'0400'", json!("0400")),
            ("!!str 0400", json!("0400")),
            ("!!int '12'", json!(12)),
            ("!!float 1", json!(1)),
            ("|\n  a\n", json!("a\n")),
        ];
        for (yaml, want) in cases {
            let docs = read(&format!("v: {yaml}\n")).unwrap_or_else(|e| panic!("{yaml}: {e}"));
            assert_eq!(docs, vec![json!({ "v": want })], "{yaml}");
        }
    }

    #[test]
    fn keys_duplicates_and_merges_as_kubectl() {
        let docs =
            read("1: a\ny: b\n1.5: c\nk: 1\nk: 2\nbase: &b {x: 1, y2: 2}\nm:\n  y2: 0\n  <<: *b\n  x: 3\n").unwrap();
        assert_eq!(
            docs,
            vec![json!({"1": "a", "true": "b", "1.5": "c", "k": 2, "base": {"x": 1, "y2": 2}, "m": {"x": 3, "y2": 2}})]
        );
        assert!(read("~: a\n").unwrap_err().message.contains("mapping key is null"));
        assert!(read("18446744073709551615: a\n").unwrap_err().message.contains("beyond a signed 64-bit"));
        assert!(read("v: .inf\n").unwrap_err().message.contains("not a finite number"));
    }

    #[test]
    fn limits_name_the_document_and_the_limit() {
        let limits = Limits { nodes: 50, nodes_per_byte: 1000, ..LIMITS };
        let mut text = String::from("a: 1\n---\nitems:\n");
        for i in 0..60 {
            text.push_str(&format!("  - {i}\n"));
        }
        let err = read_with(&text, limits).unwrap_err();
        assert_eq!(
            err.message,
            "document 2: more than 50 YAML nodes in the input (aliases count each time they are used): split it into several files"
        );
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let err = read(&bomb).unwrap_err();
        let budget = 16 * bomb.len();
        assert_eq!(err.line, Some(4), "stopped at a3, whose 11,110 nodes pass the budget of {budget}");
        assert_eq!(
            err.message,
            format!(
                "document 1: more than {budget} YAML nodes in an input of {} bytes (aliases count each time they are used; at most 16 nodes per byte of input): expand the aliases or split the input",
                bomb.len()
            )
        );
        let docs = Limits { documents: 2, ..LIMITS };
        assert!(read_with("a: 1\n---\nb: 2\n---\nc: 3\n", docs).unwrap_err().message.contains("more than 2 documents"));
    }

    #[test]
    fn streams_split_and_read_as_kubectl_reads_them() {
        // What kubectl's reader gives (`tests/kubectl_yaml.rs` checks these against it).
        let cases: &[(&str, Result<Value, &str>)] = &[
            ("a: 1\n...\nb: 2\n", Ok(json!([{"a": 1}]))),
            ("a: 1\n...\n---\nb: 2\n", Ok(json!([{"a": 1}, {"b": 2}]))),
            ("v: !!binary aGVsbG8=\n", Ok(json!([{"v": "hello"}]))),
            ("v: !!binary |\n  aGVs\n  bG8=\n", Ok(json!([{"v": "hello"}]))),
            ("v: !!binary /w==\n", Ok(json!([{"v": "\u{fffd}"}]))),
            ("v: !!binary 'not base64'\n", Err("invalid base64")),
            ("--- {inline: document}\n", Err("invalid YAML document separator: {inline: document}")),
            ("a: 1\n----\nb: 2\n", Err("invalid YAML document separator: -")),
            ("a: 1\n--- # next\nb: 2\n", Ok(json!([{"a": 1}, {"b": 2}]))),
            ("%YAML 1.1\n---\na: 1\n", Err("document 1")),
            ("{\"a\": 1}\n{\"b\": [1, 2.5]}{\"c\": null}\n", Ok(json!([{"a": 1}, {"b": [1, 2.5]}, {"c": null}]))),
            ("{\n  // \"context\"\n  \"a\": 1\n}\n", Err("key must be a string")),
            ("{\"a\": 1,}\n", Ok(json!([{"a": 1}]))),
            ("{\"a\": 1}{\"b\": 2}\n{\"c\": 3,}\n", Err("document 3: trailing comma")),
            ("# x\n{a\n b: 1}\n", Err("must fit on one line")),
            ("# x\n{? a\n b: 1}\n", Ok(json!([{"a b": 1}]))),
        ];
        for (text, expected) in cases {
            match (read(text), expected) {
                (Ok(documents), Ok(expected)) => assert_eq!(&json!(documents), expected, "{text:?}"),
                (Err(e), Err(expected)) => assert!(e.message.contains(expected), "{text:?}: {}", e.message),
                (got, expected) => panic!("{text:?}: {got:?}, expected {expected:?}"),
            }
        }
        // Lines count from the start of the input in every document.
        let err = read("a: 1\n---\nb: 2\nc: [\n").unwrap_err();
        assert_eq!((err.line, err.message.starts_with("document 2:")), (Some(4), true), "{err:?}");
    }

    #[test]
    fn colons_in_flow_scalars_read_as_kubectl_reads_them() {
        // What `e2e/bin/yamlread` (kubectl's reader) prints for each.
        let cases: &[(&str, Result<Value, &str>)] = &[
            ("args: [--bind, --listen-addr=::]", Ok(json!({"args": ["--bind", "--listen-addr=::"]}))),
            ("a: [1.2.3.4, 001:db8::]", Ok(json!({"a": ["1.2.3.4", "001:db8::"]}))),
            ("a: {k: v:}", Ok(json!({"a": {"k": "v:"}}))),
            ("a: {k: v:, j: w::}", Ok(json!({"a": {"k": "v:", "j": "w::"}}))),
            ("a: {k:}", Ok(json!({"a": {"k:": null}}))),
            ("a: [a:, b]", Ok(json!({"a": ["a:", "b"]}))),
            ("a: [a: b:]", Ok(json!({"a": [{"a": "b:"}]}))),
            ("a: [a :]", Ok(json!({"a": ["a :"]}))),
            ("a: {k: v :}", Ok(json!({"a": {"k": "v :"}}))),
            ("a: [x:y:, a:::]", Ok(json!({"a": ["x:y:", "a:::"]}))),
            ("a: {a:: b}", Ok(json!({"a": {"a:": "b"}}))),
            // After a quote or at the end of a line the colon is an indicator for both readers.
            ("a: [\"a\":]", Ok(json!({"a": [{"a": null}]}))),
            ("a: ['a':]", Ok(json!({"a": [{"a": null}]}))),
            ("a: [a:\n]", Ok(json!({"a": [{"a": null}]}))),
            ("a: [a:\t]", Ok(json!({"a": [{"a": null}]}))),
            // Kept colons change nothing in quotes, block scalars, comments and block context.
            ("a: [\"x:]\", 'y:,']", Ok(json!({"a": ["x:]", "y:,"]}))),
            ("a: |\n  [a:]\nb: 1 # [c:]", Ok(json!({"a": "[a:]\n", "b": 1}))),
            ("k: a:,b", Ok(json!({"k": "a:,b"}))),
            ("k: :a", Ok(json!({"k": ":a"}))),
            // A stand-in that the text already holds is not used.
            ("a: [\u{e000}:, b]", Ok(json!({"a": ["\u{e000}:", "b"]}))),
            // kubectl refuses these.
            ("a: [a:[b]]", Err("")),
            ("a: [::1]", Err("quote the value")),
            ("a: [a, :b]", Err("quote the value")),
            ("a: {k: :v}", Err("quote the value")),
            ("a: {:a: b}", Err("quote the value")),
            // An empty key inside [...] or {...}.
            ("a: [:]", Err("key is null")),
            ("a: [a, :]", Err("key is null")),
            ("a: [: a]", Err("key is null")),
            ("a: {: v}", Err("key is null")),
            ("a: {? }", Err("")),
            ("a: [?:]", Err("")),
            // go-yaml ends a plain scalar at `?` inside [...] and {...}: kubectl refuses these
            // (and reads `[?a]` as the explicit key `a`, which is refused here too).
            ("a: [http://x/?a=b]", Err("`?`")),
            ("a: {k: a?b}", Err("`?`")),
            ("a: {k?: b}", Err("`?`")),
            ("a: [b, c?]", Err("`?`")),
            ("a: [a ?]", Err("`?`")),
            ("a: [?a, b]", Err("`?`")),
            ("a: [a, ?]", Err("")),
            ("a: {k: ?}", Err("")),
            // Explicit keys, quoted values and block context are read alike.
            ("a: [? a]", Ok(json!({"a": [{"a": null}]}))),
            ("a: {? a: b}", Ok(json!({"a": {"a": "b"}}))),
            ("a: [\"a?b\", 'c?']", Ok(json!({"a": ["a?b", "c?"]}))),
            ("a: a?b\nb: ?x", Ok(json!({"a": "a?b", "b": "?x"}))),
        ];
        for (text, expected) in cases {
            match (read(text), expected) {
                (Ok(documents), Ok(expected)) => assert_eq!(&json!(documents), &json!([expected]), "{text:?}"),
                (Err(e), Err(expected)) => assert!(e.message.contains(expected), "{text:?}: {}", e.message),
                (got, expected) => panic!("{text:?}: {got:?}, expected {expected:?}"),
            }
        }
        // Lines and columns of errors are those of the text as written.
        let err = read("a: [x:, y]\nb: [::1]\n").unwrap_err();
        assert_eq!((err.line, err.column), (Some(2), Some(5)), "{err:?}");
    }

    #[test]
    fn written_strings_read_back_unchanged() {
        let strings = [
            "plain",
            "nginx:1.25",
            "--path=/var/log/*.log",
            "0400",
            "yes",
            "Y",
            "tRUE",
            "null",
            "",
            " lead",
            "trail ",
            "a: b",
            "a #b",
            "\tx\ny",
            "line1\nline2\n",
            "line1\n  indented\n",
            "two\n\n",
            "no newline\nat end",
            "unicode é ✓ \u{2028} \u{85} \u{feff}",
            "-1",
            "- item",
            "@x",
            "*x",
            "&x",
            "!x",
            "%x",
            "{x}",
            "[x]",
            ">x",
            "|x",
            "'q'",
            "\"dq\"",
            "\u{1}ctl",
            "ends:",
            "a :",
            "--listen-addr=::",
            "001:db8::",
            "x:]",
            "::1",
            "1e3",
            ".inf",
            "~",
            "a\r\nb",
        ];
        for s in strings {
            let doc = json!({"k": s, "list": [s, {"in": s}]});
            let text = write(std::slice::from_ref(&doc));
            assert_eq!(read(&text).unwrap(), vec![doc.clone()], "{s:?} written as:\n{text}");
        }
        let numbers = json!({"i": 256, "neg": -3, "f": 1.5, "small": 1e-7, "big": 1.5e300, "t": true, "n": null, "e": {}, "l": []});
        assert_eq!(read(&write(std::slice::from_ref(&numbers))).unwrap(), vec![numbers]);
    }
}
