//! A `serde_json::Value` written as block-style YAML that [`crate::yaml`]
//! reads back to the same value: keys plain (they are field names), `name`
//! first in each mapping; a string plain when it is a simple word or path
//! that reads back as a string (`users`, `/api/users`, `AUTH_JWT`), else
//! double-quoted with JSON's escapes (valid YAML); numbers and bools plain;
//! empty lists and mappings in flow style.

use serde_json::Value;

/// `value` as YAML, ending in a newline.
pub fn yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => mapping(&mut out, map, 0, false),
        Value::Array(list) if !list.is_empty() => sequence(&mut out, list, 0),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

/// A mapping's entries, `name` first (what a reader looks for), the rest in order.
fn entries(map: &serde_json::Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
    let name = map.get_key_value("name");
    name.into_iter()
        .chain(map.iter().filter(|(k, _)| k.as_str() != "name"))
}

/// `map`'s entries at `depth`; with `first_inline`, the first continues the
/// current line (a list item's `- `).
fn mapping(
    out: &mut String,
    map: &serde_json::Map<String, Value>,
    depth: usize,
    first_inline: bool,
) {
    for (i, (key, value)) in entries(map).enumerate() {
        if i > 0 || !first_inline {
            indent(out, depth);
        }
        out.push_str(&key_text(key));
        out.push(':');
        after_key(out, value, depth);
    }
}

/// What follows `key:`: a scalar on the same line, or a nested block.
fn after_key(out: &mut String, value: &Value, depth: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            mapping(out, map, depth + 1, false);
        }
        Value::Array(list) if !list.is_empty() => {
            out.push('\n');
            sequence(out, list, depth + 1);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn sequence(out: &mut String, list: &[Value], depth: usize) {
    for item in list {
        indent(out, depth);
        out.push('-');
        match item {
            // The first key on the dash's line, the rest under it.
            Value::Object(map) if !map.is_empty() => {
                out.push(' ');
                mapping(out, map, depth + 1, true);
            }
            // A nested list or a scalar follows `-` as it follows `key:`.
            other => after_key(out, other, depth),
        }
    }
}

/// A key as it is when it is a plain identifier (every proto field name),
/// else quoted.
fn key_text(key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && key.as_bytes()[0].is_ascii_alphabetic();
    if plain {
        key.to_owned()
    } else {
        Value::String(key.to_owned()).to_string()
    }
}

/// Whether `s` can be written unquoted and read back as the same string: a
/// word or path of letters, digits, `_`, `-`, `.` and `/`, starting with a
/// letter or `/`, that the core schema does not read as null, a bool or a
/// number.
fn plain_string(s: &str) -> bool {
    let Some(first) = s.bytes().next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == b'/')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
        && matches!(crate::yaml::resolve_plain(s), Value::String(_))
}

/// A scalar (or an empty list or mapping) in flow style.
fn scalar(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
        Value::String(s) if plain_string(s) => s.clone(),
        // JSON's string syntax is YAML's double-quoted style.
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        reason = "test code: unwrap stops the test where it failed"
    )]

    use super::*;
    use serde_json::json;

    #[test]
    fn what_is_written_reads_back_the_same() {
        let value = json!({
            "routes": [
                {"name": "users", "pathPrefix": "/api/users", "methods": ["GET", "POST"],
                 "timeoutMs": 1500, "stripPrefix": true,
                 "rateLimits": [{"policy": "p", "limit": "20"}],
                 "cors": {"allowOrigins": ["https://a.example"], "maxAgeSeconds": 600},
                 "empty": [], "none": {}, "nothing": null},
                {"name": "true", "pathPrefix": "null", "upstream": "123",
                 "note": "quote \" backslash \\ newline \n tab \t: # - [x] é"}
            ],
            "upstreams": [],
            "odd key": [[1, 2], [], ["a"]]
        });
        let text = yaml(&value);
        let back = crate::yaml::read(&text, &|_| None).unwrap();
        assert_eq!(back.value, value, "{text}");
    }

    #[test]
    fn scalars_and_empty_documents() {
        assert_eq!(yaml(&json!({})), "{}\n");
        assert_eq!(yaml(&json!("x")), "x\n");
        assert_eq!(
            yaml(&json!({"a": {"b": [1, {"c": true, "name": "n"}]}})),
            "a:\n  b:\n    - 1\n    - name: n\n      c: true\n"
        );
        // Strings that would read back as something else are quoted.
        for s in [
            "true", "null", "15", "1e3", "", "-x", "a b", "a:b", "${X}", "x#",
        ] {
            assert_eq!(yaml(&json!(s)), format!("{}\n", json!(s)), "{s}");
        }
        for s in ["users", "/api/users", "AUTH_JWT", "v1.2", "a-b"] {
            assert_eq!(yaml(&json!(s)), format!("{s}\n"));
        }
    }
}
