//! W3C Trace Context `tracestate`: validation against the list-member grammar
//! and limits, and the truncation rules for propagation.
//!
//! The gateway adds no entry of its own; it validates what it received and
//! forwards it, borrowing the incoming value whenever it is already canonical
//! and short enough (the common case costs no allocation).
//!
//! The rules are those of the current W3C Trace Context text (editor's draft,
//! `spec/20-http_request_header_format.md`, and its conformance suite as of
//! w3c/trace-context#584, June 2026):
//!
//! * at most [`MAX_MEMBERS`] (32) non-empty list-members;
//! * keys: `key = (lcalpha / DIGIT) 0*255(keychar)`, `keychar = lcalpha /
//!   DIGIT / "_" / "-" / "*" / "/" / "@"`: 1 to 256 characters, starting with
//!   a lowercase letter or a digit. `@` may appear anywhere after the first
//!   character and any number of times (`foo@=1`, `foo@@bar=1`, `t@vendor=1`
//!   are valid); a key that starts with `@`, or is 257 characters long, is not;
//! * values: 1–256 printable ASCII chars other than `,` and `=`, not ending in a space;
//! * empty and whitespace-only members are allowed and skipped;
//! * a key that appears again (`foo=1,foo=2`) keeps its first (left-most,
//!   most recent) entry; the later ones are dropped and the rest of the list
//!   is forwarded (the specification lets a vendor discard duplicates, never
//!   the whole header for them).
//!
//! A value that breaks any other rule is invalid as a whole and must be dropped.
//! When propagating, a list longer than [`MAX_PROPAGATED_LEN`] is truncated:
//! members longer than [`LARGE_MEMBER_LEN`] are removed first (from the end),
//! then members from the end, until it fits.

use std::borrow::Cow;

/// Most non-empty list-members a `tracestate` may hold (repeated keys count).
pub const MAX_MEMBERS: usize = 32;
/// Longest key, in characters.
pub const MAX_KEY_LEN: usize = 256;
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
    /// Validates a (combined) `tracestate` value. No allocation. A member
    /// whose key appeared earlier in the list is skipped, not an error.
    pub fn parse(raw: &'a str) -> Result<Self, TracestateError> {
        let mut members = [""; MAX_MEMBERS];
        // Members kept (distinct keys), and non-empty members seen (repeats included).
        let mut len = 0;
        let mut count = 0;
        for piece in raw.split(',') {
            let member = piece.trim_matches([' ', '\t']);
            if member.is_empty() {
                continue;
            }
            if count == MAX_MEMBERS {
                return Err(TracestateError::TooManyMembers);
            }
            let (key, value) = member
                .split_once('=')
                .ok_or(TracestateError::MissingEquals(count))?;
            if !valid_key(key.as_bytes()) {
                return Err(TracestateError::Key(count));
            }
            if !valid_value(value.as_bytes()) {
                return Err(TracestateError::Value(count));
            }
            count += 1;
            if members[..len].iter().any(|m| member_key(m) == key) {
                // Keep the first (left-most) entry of a key, drop the repeat.
                continue;
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

    /// Number of list-members kept (one per distinct key).
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

/// `keychar = lcalpha / DIGIT / "_" / "-" / "*" / "/" / "@"`.
fn key_char(c: u8) -> bool {
    matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/' | b'@')
}

/// `key = (lcalpha / DIGIT) 0*255(keychar)`: 1 to 256 characters.
fn valid_key(key: &[u8]) -> bool {
    match key.split_first() {
        Some((&first, rest)) => {
            rest.len() < MAX_KEY_LEN
                && (first.is_ascii_lowercase() || first.is_ascii_digit())
                && rest.iter().all(|&c| key_char(c))
        }
        None => false,
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
    fn list_rules() {
        use TracestateError::*;
        let max_key = format!("k{}", "a".repeat(255));
        let too_long_key = format!("k{}", "a".repeat(256));
        let max_at_key = format!("{}@{}", "t".repeat(241), "v".repeat(14));
        let max_value = "v".repeat(256);
        let cases: Vec<(&str, String, Result<usize, TracestateError>)> = vec![
            ("max key", format!("{max_key}=1"), Ok(1)),
            ("key too long", format!("{too_long_key}=1"), Err(Key(0))),
            (
                "key too long, second member",
                format!("foo=1,{too_long_key}=1"),
                Err(Key(1)),
            ),
            ("max value", format!("k={max_value}"), Ok(1)),
            ("value too long", format!("k={max_value}v"), Err(Value(0))),
            ("upper-case key", "Key=1".into(), Err(Key(0))),
            ("key starting with a digit", "1key=1".into(), Ok(1)),
            ("key of one digit", "7=1".into(), Ok(1)),
            ("key starting with '_'", "_k=1".into(), Err(Key(0))),
            ("key with '.'", "special.vendor=1".into(), Err(Key(0))),
            ("empty key", "=1".into(), Err(Key(0))),
            ("empty value", "k=".into(), Err(Value(0))),
            ("value with '='", "k=a=b".into(), Err(Value(0))),
            ("no equals", "a=1,k".into(), Err(MissingEquals(1))),
            ("control char in value", "k=a\u{1}b".into(), Err(Value(0))),
            // '@' anywhere after the first character, any number of times.
            ("vendor key", "foo@bar=1,bar=2".into(), Ok(2)),
            ("empty vendor", "foo@=1,bar=2".into(), Ok(2)),
            ("two at signs in a row", "foo@@bar=1,bar=2".into(), Ok(2)),
            ("two vendors", "foo@bar@baz=1,bar=2".into(), Ok(2)),
            ("vendor starting with a digit", "t@1s=1".into(), Ok(1)),
            ("256 characters with '@'", format!("{max_at_key}=1"), Ok(1)),
            ("long tenant", format!("{}@v=1", "t".repeat(242)), Ok(1)),
            ("long vendor", format!("t@{}=1", "v".repeat(15)), Ok(1)),
            (
                "257 characters with '@'",
                format!("{max_at_key}v=1"),
                Err(Key(0)),
            ),
            ("key starting with '@'", "@foo=1,bar=2".into(), Err(Key(0))),
            ("only '@'", "bar=2,@=1".into(), Err(Key(1))),
            // A repeated key keeps its first entry; the header survives.
            ("duplicate key", "a=1,b=2,a=3".into(), Ok(2)),
            ("same entry twice", "foo=1,foo=1".into(), Ok(1)),
            // Indices count every non-empty member, repeats included.
            ("error after a repeat", "a=1,a=2,K=1".into(), Err(Key(2))),
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
            (
                "33 members, one repeated",
                (0..32)
                    .map(|i| format!("k{i}=v"))
                    .chain(["k0=w".to_owned()])
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
    fn vendor_keys_are_read_and_forwarded_as_sent() {
        let raw = "foo@=1,foo@@bar=2,t@v=3,1st=4";
        let ts = TraceState::parse(raw).unwrap();
        assert_eq!(ts.get("foo@"), Some("1"));
        assert_eq!(ts.get("foo@@bar"), Some("2"));
        assert_eq!(ts.get("t@v"), Some("3"));
        assert_eq!(ts.get("1st"), Some("4"));
        assert!(matches!(
            ts.to_propagate(MAX_PROPAGATED_LEN),
            Some(Cow::Borrowed(r)) if r == raw
        ));
    }

    #[test]
    fn repeated_keys_keep_the_first_entry_and_the_rest_of_the_list() {
        let ts = TraceState::parse("foo=1,bar=2,foo=2, baz=3,bar=9").unwrap();
        assert_eq!(
            ts.members().collect::<Vec<_>>(),
            ["foo=1", "bar=2", "baz=3"]
        );
        assert_eq!(ts.get("foo"), Some("1"));
        assert_eq!(
            ts.to_propagate(MAX_PROPAGATED_LEN).as_deref(),
            Some("foo=1,bar=2,baz=3")
        );
        let ts = TraceState::parse("foo=1,foo=2").unwrap();
        assert_eq!(
            ts.to_propagate(MAX_PROPAGATED_LEN).as_deref(),
            Some("foo=1")
        );
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

    /// Keys of the grammar (with '@'), values of the grammar.
    const KEY: &str = "[a-z0-9][a-z0-9_*/@-]{0,20}";
    const VALUE: &str = "[!-+\\--<>-~]{1,30}";

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
            members in proptest::collection::btree_map(KEY, VALUE, 0..=32)
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

        /// Any key of the grammar, '@' included, up to 256 characters, is kept.
        #[test]
        fn keys_of_the_grammar_up_to_256_characters_are_valid(
            key in "[a-z0-9][a-z0-9_*/@-]{0,255}",
            value in VALUE,
        ) {
            let raw = format!("{key}={value},other=1");
            let ts = TraceState::parse(&raw);
            prop_assert!(ts.is_ok(), "{raw:?}: {ts:?}");
            let ts = ts.unwrap();
            prop_assert_eq!(ts.get(&key), Some(value.as_str()));
            prop_assert_eq!(ts.get("other"), Some("1"));
        }

        /// A 257-character key invalidates the whole header, wherever it is.
        #[test]
        fn a_key_of_257_characters_invalidates_the_header(
            key in "[a-z0-9][a-z0-9_*/@-]{256}",
            before in proptest::collection::vec(("[a-z][a-z0-9]{0,8}", VALUE), 0..5),
        ) {
            let mut list: Vec<String> = before.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let at = list.len();
            list.push(format!("{key}=1"));
            let raw = list.join(",");
            prop_assert_eq!(TraceState::parse(&raw).unwrap_err(), TracestateError::Key(at));
        }

        /// A key that starts with '@' invalidates the whole header, wherever it is.
        #[test]
        fn a_key_starting_with_at_invalidates_the_header(
            rest in "[a-z0-9_*/@-]{0,255}",
            before in proptest::collection::vec(("[a-z][a-z0-9]{0,8}", VALUE), 0..5),
        ) {
            let mut list: Vec<String> = before.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let at = list.len();
            list.push(format!("@{rest}=1"));
            list.push("after=1".into());
            let raw = list.join(",");
            prop_assert_eq!(TraceState::parse(&raw).unwrap_err(), TracestateError::Key(at));
        }

        /// Repeated keys never drop the header: each key keeps its first value,
        /// in first-seen order, and what is forwarded has every key once.
        #[test]
        fn repeated_keys_keep_their_first_entry(
            entries in proptest::collection::vec(("[a-c]@?", VALUE), 1..=32)
        ) {
            let raw = entries.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            let ts = TraceState::parse(&raw).unwrap();
            let mut first: Vec<(&str, &str)> = Vec::new();
            for (k, v) in &entries {
                if !first.iter().any(|(seen, _)| *seen == k.as_str()) {
                    first.push((k.as_str(), v.as_str()));
                }
            }
            prop_assert_eq!(ts.len(), first.len());
            for (k, v) in &first {
                prop_assert_eq!(ts.get(k), Some(*v));
            }
            let out = ts.to_propagate(MAX_PROPAGATED_LEN);
            prop_assert!(out.is_some());
            let out = out.unwrap();
            let want = first.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            if want.len() <= MAX_PROPAGATED_LEN {
                prop_assert_eq!(out.as_ref(), want.as_str());
            }
            let again = TraceState::parse(&out).unwrap();
            prop_assert_eq!(again.len(), again.members().map(member_key).collect::<std::collections::BTreeSet<_>>().len());
        }
    }
}
