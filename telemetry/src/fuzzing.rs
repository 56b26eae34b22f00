//! The harness of the `trace_context` fuzz target (`fuzz/`, run by
//! `scripts/fuzz`) and of its regression test in the data plane
//! (`data-plane/tests/fuzz_regressions.rs`). Not part of the crate's API.

use std::borrow::Cow;

use http::{HeaderMap, HeaderValue};

use crate::propagation::{TRACEPARENT, TRACESTATE, extract};
use crate::traceparent::TraceContext;
use crate::tracestate::{LARGE_MEMBER_LEN, MAX_MEMBERS, MAX_PROPAGATED_LEN, TraceState};

/// Reads `data` as a request's trace headers: its first line a `traceparent`,
/// each further line a `tracestate` field. Each value is parsed on its own,
/// then all of them together through [`extract`], as a request's would be.
///
/// Holds: an accepted `traceparent` formats back to itself (ids and the flags
/// the gateway keeps) and has no all-zero id; an accepted `tracestate` has at
/// most 32 members, each of which is accepted alone; what is propagated of it
/// is at most 512 bytes, accepted again, made of its members in their order,
/// and propagated unchanged a second time (nothing is left only when every
/// member is over 128 bytes); `extract` gives a parent exactly when there is one valid
/// `traceparent`, and a `tracestate` only with a parent.
pub fn trace_context(data: &[u8]) {
    let mut lines = data.split(|b| *b == b'\n');
    let traceparent = lines.next().unwrap_or_default();
    let tracestates: Vec<&[u8]> = lines.collect();
    check_traceparent(traceparent);
    for value in &tracestates {
        check_tracestate(value);
    }
    let mut headers = HeaderMap::new();
    let parent_field = HeaderValue::from_bytes(traceparent).ok();
    if let Some(v) = &parent_field {
        headers.append(TRACEPARENT, v.clone());
    }
    for value in &tracestates {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.append(TRACESTATE, v);
        }
    }
    let incoming = extract(&headers);
    let valid_parent = parent_field
        .as_ref()
        .and_then(|v| TraceContext::parse(v.as_bytes()).ok());
    assert_eq!(incoming.parent, valid_parent);
    assert_eq!(
        incoming.invalid_traceparent,
        parent_field.is_some() && valid_parent.is_none()
    );
    if let Some(state) = &incoming.tracestate {
        assert!(incoming.parent.is_some(), "tracestate only with a parent");
        assert!(!state.is_empty() && state.len() <= MAX_PROPAGATED_LEN);
        let again = TraceState::parse_bytes(state.as_bytes()).expect("propagated is valid");
        assert_eq!(
            again.to_propagate(MAX_PROPAGATED_LEN).as_deref(),
            state.to_str().ok(),
            "propagated is canonical"
        );
    }
}

fn check_traceparent(value: &[u8]) {
    let Ok(ctx) = TraceContext::parse(value) else {
        return;
    };
    assert_ne!(ctx.trace_id, [0; 16]);
    assert_ne!(ctx.span_id, [0; 8]);
    assert_eq!(
        ctx.flags & !(TraceContext::FLAG_SAMPLED | TraceContext::FLAG_RANDOM),
        0
    );
    let encoded = ctx.encode();
    assert_eq!(TraceContext::parse(&encoded), Ok(ctx), "formats back");
    assert_eq!(ctx.to_string().as_bytes(), &encoded[..]);
    assert_eq!(&encoded[2..53], &value[2..53], "the same ids");
}

fn check_tracestate(value: &[u8]) {
    let Ok(state) = TraceState::parse_bytes(value) else {
        return;
    };
    assert!(state.len() <= MAX_MEMBERS);
    let members: Vec<&str> = state.members().collect();
    for member in &members {
        let alone = TraceState::parse(member).expect("each member is valid alone");
        assert_eq!(alone.members().collect::<Vec<_>>(), [*member]);
    }
    match state.to_propagate(MAX_PROPAGATED_LEN) {
        // The spec's first rule drops members over 128 bytes, from the end, until
        // the rest fits; the second drops members from the end, but never the last
        // one (alone it is at most 128 bytes, so it fits). So nothing is left only
        // when every member is large: `a=<600 bytes>,x=<150 bytes>` loses both,
        // though `x` alone would fit.
        None => assert!(
            members.iter().all(|m| m.len() > LARGE_MEMBER_LEN),
            "something small fits of {members:?}"
        ),
        Some(out) => {
            assert!(!out.is_empty() && out.len() <= MAX_PROPAGATED_LEN);
            if let Cow::Borrowed(same) = &out {
                assert_eq!(same.as_bytes(), value, "borrowed means unchanged");
            }
            let again = TraceState::parse(&out).expect("propagated is valid");
            let kept: Vec<&str> = again.members().collect();
            let mut rest = members.iter();
            for m in &kept {
                assert!(
                    rest.any(|x| x == m),
                    "{m:?} is one of {members:?}, in order"
                );
            }
            assert_eq!(
                again.to_propagate(MAX_PROPAGATED_LEN),
                Some(Cow::Borrowed(out.as_ref())),
                "propagated is canonical"
            );
        }
    }
}
