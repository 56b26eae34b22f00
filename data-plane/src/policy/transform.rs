//! Per-route header transforms (`Route.request_headers` /
//! `Route.response_headers`): names and values parsed once per snapshot into
//! `HeaderName`s / `HeaderValue`s, applied with no allocation beyond what the
//! header map itself needs.
//!
//! Order: remove, then set (replaces every value), then add (appends).
//! Validation keeps each name to one operation and off the headers the
//! gateway owns (identity, `Host`, `Content-Length`, hop-by-hop), but for
//! identity and `Host` where the transform says `allow_identity_and_host`.

use std::str::FromStr;

use gateway_proto::v1;
use http::header::{HeaderMap, HeaderName, HeaderValue, InvalidHeaderName, InvalidHeaderValue};

/// A compiled transform. The default changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderTransform {
    remove: Box<[HeaderName]>,
    set: Box<[(HeaderName, HeaderValue)]>,
    add: Box<[(HeaderName, HeaderValue)]>,
}

/// A header name or value that HTTP does not accept (validation refuses it first).
#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    /// A bad name.
    #[error("invalid header name: {0}")]
    Name(#[from] InvalidHeaderName),
    /// A bad value.
    #[error("invalid header value: {0}")]
    Value(#[from] InvalidHeaderValue),
}

impl HeaderTransform {
    /// Parses a configured transform (`None`: no transform).
    pub fn compile(t: Option<&v1::HeaderTransform>) -> Result<Self, TransformError> {
        let Some(t) = t else {
            return Ok(Self::default());
        };
        let pairs = |m: &std::collections::HashMap<String, String>| {
            let mut v = m
                .iter()
                .map(|(n, v)| Ok((HeaderName::from_str(n)?, HeaderValue::from_str(v)?)))
                .collect::<Result<Vec<_>, TransformError>>()?;
            // Map order is random; a fixed order keeps `add` output stable.
            v.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
            Ok::<_, TransformError>(v.into_boxed_slice())
        };
        Ok(Self {
            remove: t
                .remove
                .iter()
                .map(|n| HeaderName::from_str(n))
                .collect::<Result<_, _>>()?,
            set: pairs(&t.set)?,
            add: pairs(&t.add)?,
        })
    }

    /// Whether the transform changes nothing.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }

    /// Applies the transform to `headers`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transform(set: &[(&str, &str)], add: &[(&str, &str)], remove: &[&str]) -> HeaderTransform {
        let map = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        HeaderTransform::compile(Some(&v1::HeaderTransform {
            set: map(set),
            add: map(add),
            remove: remove.iter().map(|s| (*s).to_owned()).collect(),
            allow_identity_and_host: false,
        }))
        .unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_str(k).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn all<'h>(h: &'h HeaderMap, name: &str) -> Vec<&'h str> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn set_replaces_add_appends_remove_deletes() {
        let t = transform(&[("X-Env", "test")], &[("x-tag", "b")], &["X-Debug"]);
        let mut h = headers(&[
            ("x-env", "prod"),
            ("x-env", "staging"),
            ("x-tag", "a"),
            ("x-debug", "1"),
            ("x-debug", "2"),
            ("accept", "*/*"),
        ]);
        t.apply(&mut h);
        assert_eq!(all(&h, "x-env"), ["test"]);
        assert_eq!(all(&h, "x-tag"), ["a", "b"]);
        assert!(all(&h, "x-debug").is_empty());
        assert_eq!(all(&h, "accept"), ["*/*"]);
    }

    #[test]
    fn absent_headers_are_created_or_ignored() {
        let t = transform(&[("x-a", "1")], &[("x-b", "2")], &["x-c"]);
        let mut h = HeaderMap::new();
        t.apply(&mut h);
        assert_eq!(all(&h, "x-a"), ["1"]);
        assert_eq!(all(&h, "x-b"), ["2"]);
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn no_transform_changes_nothing() {
        let t = HeaderTransform::compile(None).unwrap();
        assert!(t.is_empty());
        let mut h = headers(&[("x-a", "1")]);
        t.apply(&mut h);
        assert_eq!(h, headers(&[("x-a", "1")]));
        assert!(!transform(&[], &[], &["x-a"]).is_empty());
    }

    #[test]
    fn invalid_names_and_values_do_not_compile() {
        let bad_name = v1::HeaderTransform {
            remove: vec!["bad name".into()],
            ..Default::default()
        };
        assert!(HeaderTransform::compile(Some(&bad_name)).is_err());
        let bad_value = v1::HeaderTransform {
            set: [("x-a".to_owned(), "a\r\nb".to_owned())].into(),
            ..Default::default()
        };
        assert!(HeaderTransform::compile(Some(&bad_value)).is_err());
    }
}
