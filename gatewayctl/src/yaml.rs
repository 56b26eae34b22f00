//! A YAML (or JSON) document read into a `serde_json::Value`, with the line
//! of every node, so an error about `routes[2].rate_limits[0].policy` can
//! point at its line. `${NAME}` in a secret field ([`SECRET_FIELDS`]) is
//! replaced by the environment variable `NAME`, which must start with
//! [`VAR_PREFIX`] (secrets stay out of files kept in git, and a file cannot
//! pull any other variable, `GATEWAY_TOKEN` above all, into a field that is
//! shown or sent upstream); `$${` is a literal `${` in any string.
//!
//! The YAML 1.2 core schema decides what a plain scalar is: `null`/`~`/empty
//! → null, `true`/`false` → bool, decimal integers and floats → numbers,
//! anything else (and every quoted or block scalar) → a string. Anchors,
//! aliases, tags, duplicate keys and keys that are not strings are refused:
//! a configuration file has no use for them, and each would make what the
//! file says differ from what a reader sees.

use std::collections::BTreeMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A read document: its value and where each node starts.
#[derive(Debug, Clone)]
pub struct Document {
    /// The document as JSON.
    pub value: Value,
    /// Each node's path (`routes[0].rate_limits[1].policy`, keys in
    /// snake_case) → its 1-based line.
    pub lines: BTreeMap<String, usize>,
    /// The values substituted for `${GATEWAY_VAR_...}`: never shown ([`Document::redact`]).
    pub substituted: Vec<String>,
}

impl Document {
    /// `text` with every substituted value replaced by `<secret>`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        // Longest first, so a value that holds another is replaced whole.
        let mut values: Vec<&String> = self.substituted.iter().collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        for v in values {
            out = out.replace(v.as_str(), "<secret>");
        }
        out
    }

    /// The line of `path`, or of the nearest enclosing node that has one.
    pub fn line_of(&self, path: &str) -> Option<usize> {
        let mut p = path;
        loop {
            if let Some(line) = self.lines.get(p) {
                return Some(*line);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }
}

/// Why a document could not be read.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ReadError {
    /// 1-based.
    pub line: usize,
    /// What is wrong there.
    pub message: String,
}

/// The only variables substituted: `${GATEWAY_VAR_...}`.
pub const VAR_PREFIX: &str = "GATEWAY_VAR_";

/// The fields whose strings may hold `${NAME}`, as `(section, field)` in
/// snake_case: the write-only secrets, which no output shows.
pub const SECRET_FIELDS: [(&str, &str); 1] = [("upstreams", "identity_signing_secret")];

/// Whether the node at `path` is a secret field: `SECTION[N].FIELD` exactly
/// (a map key of the same name deeper down, such as a header named so in
/// `request_headers.set`, is not).
fn is_secret_path(path: &str) -> bool {
    SECRET_FIELDS.iter().any(|(section, field)| {
        path.strip_prefix(section)
            .and_then(|rest| rest.strip_prefix('['))
            .and_then(|rest| rest.split_once("]."))
            .is_some_and(|(index, name)| {
                !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) && name == *field
            })
    })
}

/// Reads `text`, one YAML document (JSON is YAML), replacing `${NAME}` in
/// secret fields with the value `env` gives for `NAME` (`GATEWAY_VAR_*` only).
/// The values substituted are kept in [`Document::substituted`], so that every
/// output can be scrubbed of them.
pub fn read(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Document, ReadError> {
    let mut builder = Builder {
        env,
        stack: Vec::new(),
        root: None,
        lines: BTreeMap::new(),
        error: None,
        documents: 0,
        substituted: Vec::new(),
    };
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, true).map_err(|e| ReadError {
        line: e.marker().line(),
        message: e.info().to_owned(),
    })?;
    if let Some(e) = builder.error {
        return Err(e);
    }
    if builder.documents > 1 {
        return Err(ReadError {
            line: 1,
            message: "more than one YAML document (`---`): a file holds one configuration".into(),
        });
    }
    Ok(Document {
        value: builder.root.unwrap_or(Value::Null),
        lines: builder.lines,
        substituted: builder.substituted,
    })
}

/// A node being built: a mapping (with the key waiting for its value) or a sequence.
enum Open {
    Mapping {
        path: String,
        map: Map<String, Value>,
        key: Option<String>,
    },
    Sequence {
        path: String,
        items: Vec<Value>,
    },
}

struct Builder<'e> {
    env: &'e dyn Fn(&str) -> Option<String>,
    stack: Vec<Open>,
    root: Option<Value>,
    lines: BTreeMap<String, usize>,
    error: Option<ReadError>,
    documents: usize,
    substituted: Vec<String>,
}

impl Builder<'_> {
    fn fail(&mut self, line: usize, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(ReadError {
                line,
                message: message.into(),
            });
        }
    }

    /// The path of the node that starts now (the value of the pending key, or
    /// the next item), or `None` when the node is a mapping's key.
    fn next_path(&self) -> Option<String> {
        match self.stack.last() {
            None => Some(String::new()),
            Some(Open::Mapping { key: None, .. }) => None,
            Some(Open::Mapping {
                path, key: Some(k), ..
            }) => Some(join_key(path, k)),
            Some(Open::Sequence { path, items }) => Some(format!("{path}[{}]", items.len())),
        }
    }

    /// Puts a finished node where it belongs.
    fn place(&mut self, value: Value, line: usize) {
        let refused = match self.stack.last_mut() {
            None => {
                self.root = Some(value);
                None
            }
            Some(Open::Sequence { items, .. }) => {
                items.push(value);
                None
            }
            Some(Open::Mapping { map, key, .. }) => match (key.take(), value) {
                (Some(k), value) => {
                    map.insert(k, value);
                    None
                }
                (None, Value::String(k)) if map.contains_key(&k) => {
                    Some(format!("duplicate key \"{k}\""))
                }
                (None, Value::String(k)) => {
                    *key = Some(k);
                    None
                }
                (None, other) => Some(format!("a key must be a string, not {other}")),
            },
        };
        if let Some(message) = refused {
            self.fail(line, message);
        }
    }

    fn scalar(&mut self, text: String, style: TScalarStyle, line: usize) {
        // `None`: the scalar is a mapping's key.
        let path = self.next_path();
        let value = if style == TScalarStyle::Plain {
            resolve_plain(&text)
        } else {
            Value::String(text)
        };
        let value = match (value, &path) {
            (Value::String(s), Some(path)) => {
                match substitute(&s, self.env, path, &mut self.substituted) {
                    Ok(s) => Value::String(s),
                    Err(message) => {
                        self.fail(line, message);
                        return;
                    }
                }
            }
            // Keys are field names: numbers and booleans are not field names.
            (Value::String(s), None) => Value::String(s),
            (other, None) => Value::String(other.to_string()),
            (other, Some(_)) => other,
        };
        if let Some(path) = path {
            self.lines.entry(path).or_insert(line);
        }
        self.place(value, line);
    }
}

impl MarkedEventReceiver for Builder<'_> {
    fn on_event(&mut self, event: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        let line = mark.line();
        match event {
            Event::DocumentStart => self.documents += 1,
            Event::Scalar(text, style, anchor, tag) => {
                if anchor != 0 || tag.is_some() {
                    return self.fail(line, "anchors and tags are not supported");
                }
                self.scalar(text, style, line);
            }
            Event::Alias(_) => self.fail(line, "aliases (`*name`) are not supported"),
            Event::MappingStart(anchor, tag) | Event::SequenceStart(anchor, tag)
                if anchor != 0 || tag.is_some() =>
            {
                self.fail(line, "anchors and tags are not supported");
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let Some(path) = self.next_path() else {
                    return self.fail(line, "a key must be a string, not a mapping or a list");
                };
                self.lines.entry(path.clone()).or_insert(line);
                self.stack
                    .push(if matches!(event, Event::MappingStart(..)) {
                        Open::Mapping {
                            path,
                            map: Map::new(),
                            key: None,
                        }
                    } else {
                        Open::Sequence {
                            path,
                            items: Vec::new(),
                        }
                    });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                let value = match self.stack.pop() {
                    Some(Open::Mapping { map, .. }) => Value::Object(map),
                    Some(Open::Sequence { items, .. }) => Value::Array(items),
                    None => return,
                };
                self.place(value, line);
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
        }
    }
}

/// `path.key`, the key in snake_case (the proto's JSON names are camelCase;
/// both are accepted, and validation names fields in snake_case).
fn join_key(path: &str, key: &str) -> String {
    let key = snake_case(key);
    if path.is_empty() {
        key
    } else {
        format!("{path}.{key}")
    }
}

/// `rateLimits` → `rate_limits`.
pub fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A plain scalar's value under the YAML 1.2 core schema.
pub(crate) fn resolve_plain(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let unsigned = text.strip_prefix('+').unwrap_or(text);
        if let Ok(n) = unsigned.parse::<i64>() {
            return Value::Number(n.into());
        }
        if let Ok(n) = unsigned.parse::<u64>() {
            return Value::Number(n.into());
        }
    }
    let float_like = digits.bytes().any(|b| b.is_ascii_digit())
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'));
    if float_like && let Some(n) = text.parse::<f64>().ok().and_then(Number::from_f64) {
        return Value::Number(n);
    }
    Value::String(text.to_owned())
}

/// `text` (the string at `path`) with each `${NAME}` replaced by `env(NAME)`,
/// each value pushed on `substituted`; `$${` stays a literal `${`. Refused in a
/// field that is not a secret, and for a name without [`VAR_PREFIX`].
fn substitute(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    path: &str,
    substituted: &mut Vec<String>,
) -> Result<String, String> {
    if !text.contains("${") {
        return Ok(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        if rest[..at].ends_with('$') {
            out.push_str(&rest[..at - 1]);
            out.push_str("${");
            rest = &rest[at + 2..];
            continue;
        }
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("unclosed \"${{\" in \"{text}\""));
        };
        let name = &after[..end];
        let valid = !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !name.as_bytes()[0].is_ascii_digit();
        if !valid {
            return Err(format!(
                "\"${{{name}}}\": an environment variable name is letters, digits and _"
            ));
        }
        if !is_secret_path(path) {
            return Err(format!(
                "${{{name}}} in {}: environment variables are substituted only in secret fields (identitySigningSecret); write $${{ for a literal ${{",
                if path.is_empty() {
                    "the document"
                } else {
                    path
                }
            ));
        }
        if !name.starts_with(VAR_PREFIX) || name.len() == VAR_PREFIX.len() {
            return Err(format!(
                "${{{name}}}: only variables named {VAR_PREFIX}* are substituted (so a file cannot read GATEWAY_TOKEN or any other variable of the shell that runs it)"
            ));
        }
        let Some(value) = env(name) else {
            return Err(format!(
                "environment variable {name} is not set (the file says ${{{name}}})"
            ));
        };
        if !value.is_empty() {
            substituted.push(value.clone());
        }
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests;
