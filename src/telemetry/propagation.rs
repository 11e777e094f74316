//! W3C Trace Context in and out (<https://www.w3.org/TR/trace-context/> §3): `traceparent` and
//! `tracestate`, read from a request's `params._meta` (SEP-414, 2026-07-28 `_meta`) or its HTTP
//! header fields, and written for the upstream.
//!
//! Which parent a request's span gets ([`Incoming::choose`]): `params._meta.traceparent` when it
//! is valid, else the HTTP `traceparent`; when both are valid and name different spans, `_meta`
//! is the parent and the HTTP one becomes a link (a proxy in front of taskgate that started its
//! own span, while the client put its own in `_meta`).

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// The span context a `traceparent` (and its `tracestate`, when valid) names, remote;
/// `None` when `traceparent` is not valid W3C Trace Context (§3.2: lowercase hex, version
/// `ff` refused, all-zero trace and parent ids refused, a later version's extra fields after
/// a `-` ignored).
pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let tp = traceparent.trim_matches(|c| c == ' ' || c == '\t');
    let b = tp.as_bytes();
    if b.len() < 55 || !is_lower_hex(&b[..2]) || &b[..2] == b"ff" {
        return None;
    }
    // Version 00 is exactly 55 characters; a later one may carry more after a '-'.
    if (&b[..2] == b"00" && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
        return None;
    }
    if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let (trace, span, flags) = (&tp[3..35], &tp[36..52], &tp[53..55]);
    if !is_lower_hex(trace.as_bytes())
        || !is_lower_hex(span.as_bytes())
        || !is_lower_hex(flags.as_bytes())
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let state = tracestate.and_then(trace_state).unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags & TraceFlags::SAMPLED.to_u8()),
        true,
        state,
    ))
}

/// `context` as a version-00 `traceparent` (`00-<trace id>-<span id>-<flags>`).
pub fn traceparent(context: &SpanContext) -> String {
    // Only ASCII digits, lowercase hex letters and '-' are written.
    String::from_utf8(traceparent_bytes(context).to_vec()).unwrap_or_default()
}

/// [`traceparent`] without an allocation: its 55 ASCII bytes (made for every upstream request
/// when tracing is on: `format!` with the ids' `{:032x}` cost about 1,500 instructions,
/// collecting the bytes as `char`s ~1,200, with `hex::encode_to_slice` ~280, a digit table ~250,
/// four bytes at a time in a `u64` (`hex4`) ~150; callgrind, issue 34).
pub fn traceparent_bytes(context: &SpanContext) -> [u8; 55] {
    let mut out = [0u8; 55];
    out[..3].copy_from_slice(b"00-");
    let trace = u128::from_be_bytes(context.trace_id().to_bytes());
    for (i, at) in [3, 11, 19, 27].into_iter().enumerate() {
        out[at..at + 8].copy_from_slice(&hex4((trace >> (96 - 32 * i)) as u32));
    }
    out[35] = b'-';
    let span = u64::from_be_bytes(context.span_id().to_bytes());
    out[36..44].copy_from_slice(&hex4((span >> 32) as u32));
    out[44..52].copy_from_slice(&hex4(span as u32));
    out[52] = b'-';
    let flags = hex4(u32::from(context.trace_flags().to_u8()));
    out[53..55].copy_from_slice(&flags[6..]);
    out
}

/// `word` as eight lowercase hex digits, most significant first: its nibbles spread one to a
/// byte of a `u64`, each then made a digit by adding `'0'`, and `'a' - '0' - 10` more to those
/// of 10 and above (found by the carry of adding 6), all eight at once.
#[inline]
fn hex4(word: u32) -> [u8; 8] {
    let mut v = u64::from(word);
    v = (v | v << 16) & 0x0000_ffff_0000_ffff;
    v = (v | v << 8) & 0x00ff_00ff_00ff_00ff;
    v = (v | v << 4) & 0x0f0f_0f0f_0f0f_0f0f;
    let letters = ((v + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    (v + 0x3030_3030_3030_3030 + letters * (b'a' - b'0' - 10) as u64).to_be_bytes()
}

/// [`traceparent_bytes`] in quotes: the JSON string an upstream request's
/// `params._meta.traceparent` gets, whose inside is its `traceparent` header field's value
/// (one copy made and checked for both places: a UTF-8 check of each cost ~100 instructions per
/// upstream request, callgrind, issue 34).
pub fn traceparent_quoted(context: &SpanContext) -> [u8; 57] {
    let mut out = [b'"'; 57];
    out[1..56].copy_from_slice(&traceparent_bytes(context));
    out
}

/// The `tracestate` header value of `context`; `None` when it has no trace state (the common
/// case, told without making the empty header value).
pub fn tracestate(context: &SpanContext) -> Option<String> {
    let state = context.trace_state();
    (*state != TraceState::NONE)
        .then(|| state.header())
        .filter(|h| !h.is_empty())
}

/// A `tracestate` header value (§3.3: `key=value` list members, empty ones skipped), or `None`
/// when a member is not valid (the whole value is then ignored, as §3.3.1.1 allows).
fn trace_state(value: &str) -> Option<TraceState> {
    let mut members = Vec::new();
    for member in value.split(',').map(|m| m.trim_matches([' ', '\t'])) {
        if member.is_empty() {
            continue;
        }
        let (key, value) = member.split_once('=')?;
        if key.is_empty() || value.is_empty() {
            return None;
        }
        members.push((key, value));
    }
    TraceState::from_key_value(members).ok()
}

fn is_lower_hex(b: &[u8]) -> bool {
    b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// The trace context a request arrived with, from both places ([`Incoming::choose`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Incoming {
    /// The parent of the request's SERVER span; `None`: the span starts a trace.
    pub parent: Option<SpanContext>,
    /// The HTTP header's span when `_meta` named another (linked, not the parent).
    pub link: Option<SpanContext>,
}

impl Incoming {
    /// Chooses the parent from `params._meta`'s context and the HTTP header's (both already
    /// [`parse`]d): `_meta` first, the header's linked when it names another span.
    pub fn choose(meta: Option<SpanContext>, header: Option<SpanContext>) -> Incoming {
        match (meta, header) {
            (Some(meta), Some(header)) => {
                let same =
                    meta.trace_id() == header.trace_id() && meta.span_id() == header.span_id();
                Incoming {
                    parent: Some(meta),
                    link: (!same).then_some(header),
                }
            }
            (Some(meta), None) => Incoming {
                parent: Some(meta),
                link: None,
            },
            (None, header) => Incoming {
                parent: header,
                link: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_read_with_its_tracestate() {
        let c = parse(TP, Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")).unwrap();
        assert_eq!(c.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.span_id().to_string(), "00f067aa0ba902b7");
        assert!(c.is_sampled() && c.is_remote());
        assert_eq!(c.trace_state().get("congo"), Some("t61rcWkgMzE"));
        assert_eq!(traceparent(&c), TP);
        // Not sampled, and a tracestate that is not valid is left out, not the parent.
        let c = parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            Some("=,=="),
        )
        .unwrap();
        assert!(!c.is_sampled());
        assert_eq!(c.trace_state().header(), "");
    }

    /// The ids and flags are written as `format!`'s lowercase hex writes them.
    #[test]
    fn traceparent_bytes_are_the_formatted_ids() {
        use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};
        let ids = RandomIdGenerator::default();
        let mut cases: Vec<(u128, u64, u8)> = (0..500)
            .map(|i| {
                let trace = u128::from_be_bytes(ids.new_trace_id().to_bytes());
                let span = u64::from_be_bytes(ids.new_span_id().to_bytes());
                (trace, span, i as u8)
            })
            .collect();
        cases.extend([
            (1, 1, 0),
            (u128::MAX, u64::MAX, 0xff),
            (0x0123_4567_89ab_cdef, 0xfedc_ba98, 1),
        ]);
        for (trace, span, flags) in cases {
            let context = SpanContext::new(
                TraceId::from(trace),
                SpanId::from(span),
                TraceFlags::new(flags),
                false,
                TraceState::default(),
            );
            let written = traceparent_bytes(&context);
            assert_eq!(
                std::str::from_utf8(&written).unwrap(),
                format!("00-{trace:032x}-{span:016x}-{flags:02x}")
            );
        }
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse(bad, None), None, "{bad:?}");
        }
        // A later version may carry more fields.
        assert!(parse(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future",
            None
        )
        .is_some());
    }

    #[test]
    fn meta_is_the_parent_and_a_different_header_a_link() {
        let meta = parse(TP, None);
        let header = parse(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            None,
        );
        let both = Incoming::choose(meta.clone(), header.clone());
        assert_eq!((both.parent, both.link), (meta.clone(), header.clone()));
        let same = Incoming::choose(meta.clone(), meta.clone());
        assert_eq!((same.parent, same.link), (meta.clone(), None));
        let only_header = Incoming::choose(None, header.clone());
        assert_eq!((only_header.parent, only_header.link), (header, None));
        assert_eq!(Incoming::choose(None, None), Incoming::default());
    }
}
