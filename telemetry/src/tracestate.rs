//! W3C Trace Context `tracestate`: validation against the list-member grammar
//! and limits, and the truncation rules for propagation.
//!
//! The gateway adds no entry of its own; it validates what it received and
//! forwards it, borrowing the incoming value whenever it is already canonical
//! and short enough (the common case costs no allocation).
//!
//! * at most [`MAX_MEMBERS`] (32) list-members, keys unique;
//! * keys: `lcalpha 0*255(lcalpha / DIGIT / "_" / "-" / "*" / "/")`, or
//!   `tenant@system` with a 1–241 char tenant (starting with a letter or digit)
//!   and a 1–14 char system (starting with a letter);
//! * values: 1–256 printable ASCII chars other than `,` and `=`, not ending in a space;
//! * empty and whitespace-only members are allowed and skipped.
//!
//! A value that breaks any rule is invalid as a whole and must be dropped.
//! When propagating, a list longer than [`MAX_PROPAGATED_LEN`] is truncated:
//! members longer than [`LARGE_MEMBER_LEN`] are removed first (from the end),
//! then members from the end, until it fits.

use std::borrow::Cow;

/// Most list-members a `tracestate` may hold.
pub const MAX_MEMBERS: usize = 32;
/// Length the gateway propagates at most (the specification's "at least 512").
pub const MAX_PROPAGATED_LEN: usize = 512;
/// Members longer than this are the first to go when truncating.
pub const LARGE_MEMBER_LEN: usize = 128;

/// Why a `tracestate` value was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TracestateError {
    /// More than 32 list-members.
    #[error("tracestate has more than 32 list-members")]
    TooManyMembers,
    /// A list-member has no `=`.
    #[error("tracestate list-member {0} has no '='")]
    MissingEquals(usize),
    /// A key breaks the key grammar.
    #[error("tracestate list-member {0} has an invalid key")]
    Key(usize),
    /// A value breaks the value grammar.
    #[error("tracestate list-member {0} has an invalid value")]
    Value(usize),
    /// The same key appears twice.
    #[error("tracestate list-member {0} repeats a key")]
    DuplicateKey(usize),
    /// The header is not visible ASCII.
    #[error("tracestate is not ASCII")]
    NotAscii,
}

/// A validated `tracestate`, borrowing the header value it was parsed from.
#[derive(Clone, Copy, Debug)]
pub struct TraceState<'a> {
    raw: &'a str,
    members: [&'a str; MAX_MEMBERS],
    len: usize,
}

impl<'a> TraceState<'a> {
    /// Validates a (combined) `tracestate` value. No allocation.
    pub fn parse(raw: &'a str) -> Result<Self, TracestateError> {
        let mut members = [""; MAX_MEMBERS];
        let mut len = 0;
        for piece in raw.split(',') {
            let member = piece.trim_matches([' ', '\t']);
            if member.is_empty() {
                continue;
            }
            if len == MAX_MEMBERS {
                return Err(TracestateError::TooManyMembers);
            }
            let (key, value) = member
                .split_once('=')
                .ok_or(TracestateError::MissingEquals(len))?;
            if !valid_key(key.as_bytes()) {
                return Err(TracestateError::Key(len));
            }
            if !valid_value(value.as_bytes()) {
                return Err(TracestateError::Value(len));
            }
            if members[..len].iter().any(|m| member_key(m) == key) {
                return Err(TracestateError::DuplicateKey(len));
            }
            members[len] = member;
            len += 1;
        }
        Ok(Self { raw, members, len })
    }

    /// Validates a header's raw bytes (must be ASCII).
    pub fn parse_bytes(raw: &'a [u8]) -> Result<Self, TracestateError> {
        let raw = std::str::from_utf8(raw).map_err(|_| TracestateError::NotAscii)?;
        if !raw.is_ascii() {
            return Err(TracestateError::NotAscii);
        }
        Self::parse(raw)
    }

    /// Number of list-members.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no list-members (then nothing should be propagated).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The list-members, in order, as `key=value` strings.
    pub fn members(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.members[..self.len].iter().copied()
    }

    /// The value for `key`, if present.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.members()
            .find(|m| member_key(m) == key)
            .map(|m| &m[key.len() + 1..])
    }

    /// The value to send downstream, at most `max_len` bytes, applying the
    /// truncation rules. Borrows the input when it is canonical (no optional
    /// whitespace or empty members) and fits; `None` when nothing remains.
    pub fn to_propagate(&self, max_len: usize) -> Option<Cow<'a, str>> {
        let members = &self.members[..self.len];
        let canonical_len = joined_len(members.iter().copied());
        if canonical_len <= max_len {
            if members.is_empty() {
                return None;
            }
            if canonical_len == self.raw.len() {
                return Some(Cow::Borrowed(self.raw));
            }
            return Some(Cow::Owned(members.join(",")));
        }
        let mut keep = [true; MAX_MEMBERS];
        let mut total = canonical_len;
        // Rule 1: drop large members first, from the end.
        for i in (0..members.len()).rev() {
            if total <= max_len {
                break;
            }
            if members[i].len() > LARGE_MEMBER_LEN {
                keep[i] = false;
                total = kept_len(members, &keep);
            }
        }
        // Rule 2: then drop members from the end.
        for i in (0..members.len()).rev() {
            if total <= max_len {
                break;
            }
            if keep[i] {
                keep[i] = false;
                total = kept_len(members, &keep);
            }
        }
        let mut out = String::with_capacity(total);
        for (member, _) in members.iter().zip(keep).filter(|(_, k)| *k) {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(member);
        }
        (!out.is_empty()).then_some(Cow::Owned(out))
    }
}

fn member_key(member: &str) -> &str {
    member.split_once('=').map_or(member, |(k, _)| k)
}

fn joined_len<'s>(members: impl Iterator<Item = &'s str>) -> usize {
    let (count, bytes) = members.fold((0usize, 0usize), |(c, b), m| (c + 1, b + m.len()));
    bytes + count.saturating_sub(1)
}

fn kept_len(members: &[&str], keep: &[bool; MAX_MEMBERS]) -> usize {
    joined_len(
        members
            .iter()
            .zip(keep)
            .filter(|(_, k)| **k)
            .map(|(m, _)| *m),
    )
}

fn key_char(c: u8) -> bool {
    matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/')
}

fn valid_key(key: &[u8]) -> bool {
    match key.iter().position(|&c| c == b'@') {
        None => {
            (1..=256).contains(&key.len())
                && key[0].is_ascii_lowercase()
                && key.iter().all(|&c| key_char(c))
        }
        Some(at) => {
            let (tenant, system) = (&key[..at], &key[at + 1..]);
            (1..=241).contains(&tenant.len())
                && (tenant[0].is_ascii_lowercase() || tenant[0].is_ascii_digit())
                && tenant.iter().all(|&c| key_char(c))
                && (1..=14).contains(&system.len())
                && system[0].is_ascii_lowercase()
                && system.iter().all(|&c| key_char(c))
        }
    }
}

fn valid_value(value: &[u8]) -> bool {
    let nblk = |c: u8| matches!(c, 0x21..=0x2b | 0x2d..=0x3c | 0x3e..=0x7e);
    match value.split_last() {
        Some((&last, rest)) => {
            value.len() <= 256 && nblk(last) && rest.iter().all(|&c| c == b' ' || nblk(c))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn valid_lists() {
        let ts = TraceState::parse("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE").unwrap();
        assert_eq!(ts.len(), 2);
        assert_eq!(ts.get("congo"), Some("t61rcWkgMzE"));
        assert_eq!(ts.get("rojo"), Some("00f067aa0ba902b7"));
        assert_eq!(ts.get("nope"), None);
        // Canonical and short: borrowed as is.
        assert!(matches!(
            ts.to_propagate(MAX_PROPAGATED_LEN),
            Some(Cow::Borrowed(_))
        ));

        let ts = TraceState::parse(" a=1 ,\t,  b@vendor=x y , ").unwrap();
        assert_eq!(ts.members().collect::<Vec<_>>(), ["a=1", "b@vendor=x y"]);
        assert_eq!(
            ts.to_propagate(MAX_PROPAGATED_LEN).as_deref(),
            Some("a=1,b@vendor=x y")
        );

        assert!(TraceState::parse("").unwrap().is_empty());
        assert_eq!(TraceState::parse(" , ").unwrap().to_propagate(512), None);
        assert!(TraceState::parse("0tenant@sys=v,k_-*/9=!\"#$%&'()*+-./:;<>?@[~").is_ok());
    }

    #[test]
    fn invalid_lists() {
        use TracestateError::*;
        let max_key = format!("k{}", "a".repeat(255));
        let too_long_key = format!("k{}", "a".repeat(256));
        let max_value = "v".repeat(256);
        let cases: Vec<(&str, String, Result<usize, TracestateError>)> = vec![
            ("max key", format!("{max_key}=1"), Ok(1)),
            ("key too long", format!("{too_long_key}=1"), Err(Key(0))),
            ("max value", format!("k={max_value}"), Ok(1)),
            ("value too long", format!("k={max_value}v"), Err(Value(0))),
            ("upper-case key", "Key=1".into(), Err(Key(0))),
            ("key starting with digit", "1key=1".into(), Err(Key(0))),
            ("empty key", "=1".into(), Err(Key(0))),
            ("empty value", "k=".into(), Err(Value(0))),
            ("value with '='", "k=a=b".into(), Err(Value(0))),
            ("no equals", "a=1,k".into(), Err(MissingEquals(1))),
            ("duplicate key", "a=1,b=2,a=3".into(), Err(DuplicateKey(2))),
            ("control char in value", "k=a\u{1}b".into(), Err(Value(0))),
            (
                "tenant too long",
                format!("{}@s=1", "t".repeat(242)),
                Err(Key(0)),
            ),
            (
                "system too long",
                format!("t@{}=1", "s".repeat(15)),
                Err(Key(0)),
            ),
            ("system starting with digit", "t@1s=1".into(), Err(Key(0))),
            ("empty tenant", "@s=1".into(), Err(Key(0))),
            ("two at signs", "t@s@x=1".into(), Err(Key(0))),
            (
                "32 members",
                (0..32)
                    .map(|i| format!("k{i}=v"))
                    .collect::<Vec<_>>()
                    .join(","),
                Ok(32),
            ),
            (
                "33 members",
                (0..33)
                    .map(|i| format!("k{i}=v"))
                    .collect::<Vec<_>>()
                    .join(","),
                Err(TooManyMembers),
            ),
        ];
        for (name, input, want) in cases {
            let got = TraceState::parse(&input).map(|ts| ts.len());
            assert_eq!(got, want, "case {name:?}");
        }
        assert_eq!(TraceState::parse_bytes(b"k=\xff").unwrap_err(), NotAscii);
    }

    #[test]
    fn over_long_list_drops_large_members_first_then_from_the_end() {
        // 4 small members of 50 bytes, one large (200 bytes) in second position,
        // and 4 more small ones: 9 members, 600 + 8 commas = 608 bytes.
        let small = |i: usize| format!("s{i}={}", "x".repeat(48 - i.to_string().len()));
        let large = format!("large={}", "y".repeat(194));
        let mut members: Vec<String> = (0..8).map(small).collect();
        members.insert(1, large);
        assert!(
            members
                .iter()
                .enumerate()
                .all(|(i, m)| m.len() == if i == 1 { 200 } else { 50 })
        );
        let raw = members.join(",");
        assert_eq!(raw.len(), 608);
        let ts = TraceState::parse(&raw).unwrap();

        // Dropping the large member alone (201 bytes) brings it to 407 <= 512.
        let out = ts.to_propagate(MAX_PROPAGATED_LEN).unwrap();
        assert!(!out.contains("large="));
        assert_eq!(out, (0..8).map(small).collect::<Vec<_>>().join(","));

        // With a tighter limit, members then go from the end.
        let out = ts.to_propagate(200).unwrap();
        assert_eq!(out, (0..3).map(small).collect::<Vec<_>>().join(","));
        assert!(out.len() <= 200);

        // A limit below every member's size leaves nothing.
        assert_eq!(ts.to_propagate(10), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn parse_never_panics(s in "[ -~\t]{0,600}") {
            if let Ok(ts) = TraceState::parse(&s) {
                for limit in [0, 64, 512] {
                    if let Some(out) = ts.to_propagate(limit) {
                        prop_assert!(out.len() <= limit);
                        // What we send on is itself valid.
                        prop_assert!(TraceState::parse(&out).is_ok());
                    }
                }
            }
        }

        #[test]
        fn generated_lists_are_valid_and_round_trip(
            members in proptest::collection::btree_map("[a-z][a-z0-9_*/-]{0,20}", "[!-+\\--<>-~]{1,30}", 0..=32)
        ) {
            let raw = members.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            let ts = TraceState::parse(&raw).unwrap();
            prop_assert_eq!(ts.len(), members.len());
            for (k, v) in &members {
                prop_assert_eq!(ts.get(k), Some(v.as_str()));
            }
            if raw.len() <= MAX_PROPAGATED_LEN && !raw.is_empty() {
                let out = ts.to_propagate(MAX_PROPAGATED_LEN);
                prop_assert_eq!(out.as_deref(), Some(raw.as_str()));
            }
        }
    }
}
