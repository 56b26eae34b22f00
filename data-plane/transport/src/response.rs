//! The one response type of the proxy listener: a status, the header
//! [`Fields`] and a body (issue 26, item 2).
//!
//! An upstream's fields may be kept as the bytes they came in
//! ([`crate::response_head`]: copying them to the client as they are is an
//! eighth of the plain route's user time less). [`Fields`] hides that: every
//! lookup ([`Fields::get`], [`Fields::get_all`], [`Fields::contains`],
//! [`Fields::iter`]) sees the upstream's fields and the gateway's alike, the
//! gateway's replacing the upstream's of the same name; [`Fields::insert`] and
//! [`Fields::extend`] add the gateway's own without touching the rest; and
//! [`Fields::map_mut`], for whatever edits fields otherwise, turns them all
//! into one `HeaderMap` first. No stage can see half of a response's fields.

use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};

use crate::body::ResponseBody;
use crate::response_head::RawFields;

/// A response on its way to the client (or read from an upstream instance):
/// its status, every header field, and its body.
#[derive(Debug)]
pub struct Response<B = ResponseBody> {
    status: StatusCode,
    fields: Fields,
    body: B,
}

impl<B> Response<B> {
    /// A `200 OK` answer with no fields.
    pub fn new(body: B) -> Self {
        Self::from_parts(StatusCode::OK, Fields::default(), body)
    }

    /// An answer with `status`, `fields` and `body`.
    pub fn from_parts(status: StatusCode, fields: Fields, body: B) -> Self {
        Self {
            status,
            fields,
            body,
        }
    }

    /// The status, the fields and the body.
    pub fn into_parts(self) -> (StatusCode, Fields, B) {
        (self.status, self.fields, self.body)
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The status code, to change.
    pub fn status_mut(&mut self) -> &mut StatusCode {
        &mut self.status
    }

    /// Every header field.
    pub fn fields(&self) -> &Fields {
        &self.fields
    }

    /// Every header field, to change.
    pub fn fields_mut(&mut self) -> &mut Fields {
        &mut self.fields
    }

    /// The body.
    pub fn body(&self) -> &B {
        &self.body
    }

    /// The body, to change.
    pub fn body_mut(&mut self) -> &mut B {
        &mut self.body
    }

    /// The body alone.
    pub fn into_body(self) -> B {
        self.body
    }

    /// The same answer with `f` applied to its body.
    pub fn map_body<C>(self, f: impl FnOnce(B) -> C) -> Response<C> {
        Response::from_parts(self.status, self.fields, f(self.body))
    }

    /// The answer as an `http::Response` (HTTP/1.1; hyper writes it in the
    /// version of the exchange), its fields one map.
    pub fn into_http(self) -> http::Response<B> {
        let mut resp = http::Response::new(self.body);
        *resp.status_mut() = self.status;
        *resp.version_mut() = Version::HTTP_11;
        *resp.headers_mut() = self.fields.into_map();
        resp
    }
}

impl<B> From<http::Response<B>> for Response<B> {
    /// An `http::Response`'s status, fields and body (its version and
    /// extensions are not kept).
    fn from(resp: http::Response<B>) -> Self {
        let (parts, body) = resp.into_parts();
        Self::from_parts(parts.status, Fields::from(parts.headers), body)
    }
}

/// Every header field of a response: an upstream's kept as bytes, when they
/// are ([`crate::response_head`]), and the rest in a map, whose names replace
/// the upstream's of the same name.
#[derive(Debug, Default, Clone)]
pub struct Fields {
    /// The gateway's own fields, or every field when `raw` is `None`.
    map: HeaderMap,
    /// An upstream's forwarded fields as bytes, hop-by-hop ones left out.
    raw: Option<Arc<RawFields>>,
}

impl From<HeaderMap> for Fields {
    fn from(map: HeaderMap) -> Self {
        Self { map, raw: None }
    }
}

impl Fields {
    /// An upstream's fields: `raw` kept as bytes, when they were, and `map`.
    pub(crate) fn upstream(map: HeaderMap, raw: Option<Arc<RawFields>>) -> Self {
        Self { map, raw }
    }

    /// The first value of the field `name` (any case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        if let Some(value) = self.map.get(name) {
            return Some(value.as_bytes());
        }
        self.raw_iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// The first value of the field `name` as text, when it is UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every value of the field `name` (any case), in order: the gateway's
    /// when it set the name, else the upstream's.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        let set = self.map_has(name);
        let raw = self
            .raw_iter()
            .filter(move |(n, _)| !set && n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v);
        let map = self
            .map
            .iter()
            .filter(move |(n, _)| set && n.as_str().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_bytes());
        raw.chain(map)
    }

    /// Whether there is a field `name` (any case).
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Every field as the client gets it: name, value. The upstream's kept
    /// fields come first, in the order they came (the case of their names
    /// kept), then the map's.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.raw_iter().filter(|(n, _)| !self.replaced(n)).chain(
            self.map
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
        )
    }

    /// How many fields there are.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// Sets the field `name` to `value`, replacing every value it had (the
    /// upstream's included), without turning kept fields into a map.
    pub fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        self.map.insert(name, value);
    }

    /// Adds `value` after every value the field `name` has (the upstream's
    /// included: kept fields of that name become a map first).
    pub fn append(&mut self, name: HeaderName, value: HeaderValue) {
        let upstream_has = self
            .raw_iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name.as_str().as_bytes()));
        if upstream_has && !self.map.contains_key(&name) {
            self.map_mut();
        }
        self.map.append(name, value);
    }

    /// Each name of `fields`: its values replace every value the name had (the
    /// upstream's included), without turning kept fields into a map.
    pub fn extend(&mut self, fields: HeaderMap) {
        // `HeaderMap::extend`: a name's first value replaces, the others append.
        self.map.extend(fields);
    }

    /// Every field as one map, to read or change in any way (kept fields
    /// become map entries first: a copy of each).
    pub fn map_mut(&mut self) -> &mut HeaderMap {
        if let Some(raw) = self.raw.take() {
            let added = std::mem::take(&mut self.map);
            self.map = merged(&raw, added);
        }
        &mut self.map
    }

    /// Every field as one map.
    pub fn into_map(mut self) -> HeaderMap {
        self.map_mut();
        self.map
    }

    /// Whether an upstream's fields are kept as bytes (their hop-by-hop
    /// fields already left out, [`crate::response_head`]).
    pub fn kept_as_bytes(&self) -> bool {
        self.raw.is_some()
    }

    /// The upstream's fields kept as bytes, and whether each is a length.
    pub(crate) fn raw(&self) -> Option<&RawFields> {
        self.raw.as_deref()
    }

    /// The map: the gateway's fields when [`raw`](Self::raw) is some, else all.
    pub(crate) fn map(&self) -> &HeaderMap {
        &self.map
    }

    fn raw_iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.raw
            .iter()
            .flat_map(|r| r.iter())
            .map(|(n, v, _)| (n, v))
    }

    /// Whether the map sets `name` (an upstream field's name, any case).
    fn replaced(&self, name: &[u8]) -> bool {
        !self.map.is_empty()
            && self
                .map
                .keys()
                .any(|k| k.as_str().as_bytes().eq_ignore_ascii_case(name))
    }

    fn map_has(&self, name: &str) -> bool {
        self.replaced(name.as_bytes())
    }
}

/// `raw`'s fields as a map, with `added` over them.
fn merged(raw: &RawFields, added: HeaderMap) -> HeaderMap {
    let mut headers = raw.header_map(added.len());
    // The first value of each name replaces, the others are appended: what the
    // gateway's `insert`s and `extend`s did when the map was whole.
    headers.extend(added);
    headers
}

#[cfg(test)]
mod tests;
