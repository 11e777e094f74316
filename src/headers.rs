//! Header names and hop-by-hop rules shared by the edge (`http/`) and the upstream client
//! (`upstream/`), so neither imports the other (2025-11-25 basic/transports: Session Management,
//! Protocol Version Header).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// `Mcp-Session-Id` (case-insensitive on the wire).
pub static MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");

/// `MCP-Protocol-Version` (case-insensitive on the wire).
pub static MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// `value` in an allocation of its own, with its sensitivity. hyper's header values are slices of
/// the connection's read buffer (8 KiB or more): a value kept after its request (a session
/// table entry, a note) must be a copy, or it keeps that whole buffer alive.
pub fn owned(value: &HeaderValue) -> HeaderValue {
    let mut copy = HeaderValue::from_maybe_shared(bytes::Bytes::copy_from_slice(value.as_bytes()))
        .unwrap_or_else(|_| value.clone());
    copy.set_sensitive(value.is_sensitive());
    copy
}

/// A header value of `bytes` (checked as `HeaderValue::from_bytes` checks them: `None` when
/// not valid), its bytes copied into a buffer this thread keeps ([`CARVED_BUFFER`] bytes,
/// shared by the values carved from it, a new one when it is full) rather than into an
/// allocation of their own. For a short value made for every traced upstream request (its
/// `traceparent`): an allocation of its own, freed when the request was written, cost ~100
/// instructions more (callgrind, issue 34). A carved value keeps its whole buffer alive while
/// it lives: made only for a request on its way out, never for a value that is kept ([`owned`]
/// is).
pub fn carved(bytes: &[u8]) -> Option<HeaderValue> {
    if bytes.len() > CARVED_BUFFER / 8 {
        return HeaderValue::from_bytes(bytes).ok();
    }
    if !valid_value(bytes) {
        return None;
    }
    // SAFETY: `valid_value` checked every byte by `HeaderValue::from_bytes`'s rule. Why not the
    // checked constructor: its loop, a branch per byte, cost ~200 instructions per traced
    // upstream request (55 bytes), more than the check above costs (callgrind, issue 34).
    // (Checked again in debug builds by `http` itself.)
    Some(unsafe { carved_unchecked(bytes) })
}

/// [`carved`] of bytes the caller made valid, not checked again: the `traceparent` of each
/// traced upstream request, lowercase hex digits and dashes by construction (checked, its 55
/// bytes cost ~115 instructions per traced request, callgrind, issue 34). A value too long to
/// carve is copied into an allocation of its own.
///
/// # Safety
///
/// Every byte of `bytes` must be one `HeaderValue::from_bytes` accepts: a tab, or 0x20 and
/// above but DEL (`http` relies on it when the value is written).
pub unsafe fn carved_unchecked(bytes: &[u8]) -> HeaderValue {
    use std::cell::RefCell;
    thread_local! {
        static BUFFER: RefCell<bytes::BytesMut> = RefCell::new(bytes::BytesMut::new());
    }
    debug_assert!(
        valid_value(bytes),
        "a header value of bytes it may not hold"
    );
    let carved = (bytes.len() <= CARVED_BUFFER / 8)
        .then(|| {
            BUFFER.with(|buffer| {
                let mut buffer = buffer.try_borrow_mut().ok()?;
                if buffer.capacity() - buffer.len() < bytes.len() {
                    *buffer = bytes::BytesMut::with_capacity(CARVED_BUFFER);
                }
                buffer.extend_from_slice(bytes);
                Some(buffer.split().freeze())
            })
        })
        .flatten();
    let value = carved.unwrap_or_else(|| bytes::Bytes::copy_from_slice(bytes));
    // SAFETY: the caller's: every byte is one `HeaderValue::from_bytes` accepts.
    unsafe { HeaderValue::from_maybe_shared_unchecked(value) }
}

/// A header value of `bytes` itself, not copied (a slice of a message carved from a shared
/// buffer: the `traceparent` inside an upstream request's `params._meta`,
/// `jsonrpc::Message::with_meta_member_at`), not checked: as [`carved_unchecked`].
///
/// # Safety
///
/// As [`carved_unchecked`]: every byte of `bytes` must be one `HeaderValue::from_bytes`
/// accepts.
pub unsafe fn shared_unchecked(bytes: bytes::Bytes) -> HeaderValue {
    debug_assert!(
        valid_value(&bytes),
        "a header value of bytes it may not hold"
    );
    // SAFETY: the caller's: every byte is one `HeaderValue::from_bytes` accepts.
    unsafe { HeaderValue::from_maybe_shared_unchecked(bytes) }
}

/// Whether every byte of `bytes` may be in a header value by `HeaderValue::from_bytes`'s rule
/// (a tab, or 0x20 and above but DEL): visible ASCII is read eight bytes at a time
/// ([`visible_ascii`]), anything else byte by byte.
fn valid_value(bytes: &[u8]) -> bool {
    visible_ascii(bytes)
        || bytes.iter().fold(true, |ok, &b| {
            ok & ((b >= 0x20 && b != 0x7f) | (b == b'\t'))
        })
}

/// Whether every byte of `bytes` is visible ASCII (0x20 to 0x7e) or a tab: eight bytes at a
/// time in a `u64` (any byte below 0x20, any above 0x7e, each found by a carry into its high
/// bit), byte by byte only when that finds one (a tab, or a byte that is not). Byte by byte,
/// a `traceparent` (55 bytes) cost ~170 instructions per traced upstream request, a session
/// id (36) ~100 (the loop is not vectorised; callgrind, issue 34).
#[inline]
fn visible_ascii(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let outside = |w: u64| (w.wrapping_sub(0x20 * ONES) & !w) | w.wrapping_add(ONES) | w;
    let mut words = bytes.chunks_exact(8);
    let mut bad = 0;
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        bad |= outside(u64::from_ne_bytes(w));
    }
    let mut last = [b' '; 8];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    bad |= outside(u64::from_ne_bytes(last));
    bad & HIGH == 0
        || bytes
            .iter()
            .all(|&b| (0x20..0x7f).contains(&b) || b == b'\t')
}

/// `value` as text when every byte is visible ASCII or a tab: what `HeaderValue::to_str`
/// returns, checked eight bytes at a time (`visible_ascii`). For the values read for every
/// traced request (its session and protocol version): `to_str`'s loop cost ~100
/// instructions for a 36-byte session id (callgrind, issue 34).
#[inline]
pub fn text(value: &HeaderValue) -> Option<&str> {
    let bytes = value.as_bytes();
    // SAFETY: every byte is ASCII, so the bytes are UTF-8.
    visible_ascii(bytes).then(|| unsafe { std::str::from_utf8_unchecked(bytes) })
}

/// The size of [`carved`]'s buffers: about 18 `traceparent` values.
pub const CARVED_BUFFER: usize = 1024;

/// `length` as a `Content-Length` value. Up to [`KEPT_LENGTHS`] the value is made once per
/// length and kept (its text leaked, so a copy is two words and no reference count), then
/// copied: `HeaderValue::from(u64)` allocates, ~230 instructions per upstream request, ~550
/// with traces on (their frees on the export thread make this thread's allocations dearer;
/// callgrind, issue 34). Longer bodies get theirs made as before.
pub fn content_length(length: u64) -> HeaderValue {
    static KEPT: [std::sync::OnceLock<HeaderValue>; KEPT_LENGTHS] =
        [const { std::sync::OnceLock::new() }; KEPT_LENGTHS];
    let Some(kept) = usize::try_from(length).ok().and_then(|n| KEPT.get(n)) else {
        return HeaderValue::from(length);
    };
    kept.get_or_init(|| {
        let text: &'static str = Box::leak(length.to_string().into_boxed_str());
        HeaderValue::from_static(text)
    })
    .clone()
}

/// The lengths [`content_length`] keeps a value for: 0 to 4095 (at most ~20 KiB of text,
/// leaked once each, and 4096 values, made as they are met).
pub const KEPT_LENGTHS: usize = 4096;

/// The first value of `name`, found by a look at each field present rather than a hashed
/// look-up. Why: `HeaderMap::get`/`remove`/`entry` hash the name on every call (about 190
/// instructions for a custom name like `MCP-Protocol-Version`, 380 for a `&str`;
/// benches/profile.sh small), while a message carries a dozen fields or so, compared by
/// pointer-sized checks. For a name looked for on every message.
#[inline]
pub fn find<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
}

/// Whether a `name` field is present ([`find`]'s scan over the names only, which skips the
/// values: about 60 instructions a message cheaper, benches/profile.sh small).
#[inline]
pub fn has(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers.keys().any(|n| n == name)
}

/// `headers.remove(name)`, hashed only when [`has`] sees the field (see [`find`] why).
#[inline]
pub fn take(headers: &mut HeaderMap, name: &HeaderName) -> Option<HeaderValue> {
    if !has(headers, name) {
        return None;
    }
    headers.remove(name)
}

/// Whether `name` is hop-by-hop by itself (RFC 9110 section 7.6.1; `Keep-Alive` and
/// `Proxy-Connection` by RFC 9112 and common practice), not counting names `Connection` lists.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::TE
        || name == header::TRAILER
        || name == header::UPGRADE
        || name == header::PROXY_AUTHORIZATION
        || name == header::PROXY_AUTHENTICATE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Removes hop-by-hop headers (RFC 9110 section 7.6.1), including those named in `Connection`.
///
/// Most messages carry none (a `Connection` header, which names the others, is itself
/// hop-by-hop), so one pass over the few names present decides first. Why: nine hashed
/// `HeaderMap::remove`s per message, twice per request, were about 2,700 of the ~81,000
/// instructions of a small `tools/call` (benches/profile.sh small; the pair is in
/// benches/RESULTS.md, "hop-by-hop scan").
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.keys().any(is_hop_by_hop) {
        remove_hop_by_hop(headers);
    }
}

/// The removal of [`strip_hop_by_hop`], for a caller that already knows one is present
/// ([`is_hop_by_hop`] of a name).
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// Whether `name` is in taskgate's reserved namespace (`x-taskgate-*`). Layers hand facts to
/// each other as typed reply extensions, not headers, but an upstream still cannot put a name
/// of taskgate's in front of the client (nor in front of an older taskgate further out).
fn is_internal(name: &HeaderName) -> bool {
    name.as_str().starts_with("x-taskgate-")
}

/// An upstream reply's headers as they may go on: without hop-by-hop headers
/// ([`strip_hop_by_hop`]) and without taskgate's internal ones, so an upstream cannot set them.
/// One pass over the names present decides for both (most replies carry neither).
pub fn strip_upstream_reply(headers: &mut HeaderMap) {
    let (mut hop, mut internal) = (false, false);
    for name in headers.keys() {
        hop |= is_hop_by_hop(name);
        internal |= is_internal(name);
    }
    if hop {
        remove_hop_by_hop(headers);
    }
    if internal {
        let names: Vec<HeaderName> = headers.keys().filter(|k| is_internal(k)).cloned().collect();
        for name in names {
            headers.remove(name);
        }
    }
}

/// Whether a `Content-Type` value names the media type `essence` (`"text/event-stream"`), per
/// RFC 9110 section 8.3.1: type and subtype are case-insensitive, parameters follow `;` with
/// optional whitespace, parameter names are case-insensitive and values may be quoted.
/// `Err` carries the charset when the value names `essence` with a `charset` other than UTF-8
/// (MCP messages are UTF-8).
pub fn content_type_is(value: Option<&HeaderValue>, essence: &str) -> Result<bool, String> {
    // On bytes, as `response::accept_lists` (a memchr searcher per `str::split` cost more than
    // the comparison); `essence` and the parameter names are ASCII.
    let Some(text) = value.map(HeaderValue::as_bytes) else {
        return Ok(false);
    };
    if text == essence.as_bytes() {
        // What nearly every client and server sends: decided without the parse below, which
        // cost about 300 instructions per call (three calls per request).
        return Ok(true);
    }
    let mut parts = text.split(|&b| b == b';');
    let named = parts
        .next()
        .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(essence.as_bytes()));
    if !named || !is_text(text) {
        return Ok(false);
    }
    for param in parts {
        let Some(eq) = param.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (&param[..eq], &param[eq + 1..]);
        if !name.trim_ascii().eq_ignore_ascii_case(b"charset") {
            continue;
        }
        let mut charset = value.trim_ascii();
        while let Some(rest) = charset.strip_prefix(b"\"") {
            charset = rest;
        }
        while let Some(rest) = charset.strip_suffix(b"\"") {
            charset = rest;
        }
        if !(charset.eq_ignore_ascii_case(b"utf-8") || charset.eq_ignore_ascii_case(b"utf8")) {
            return Err(String::from_utf8_lossy(charset).into_owned());
        }
    }
    Ok(true)
}

/// Whether a header value is what `HeaderValue::to_str` accepts (visible ASCII, space, tab).
pub fn is_text(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) || b == b'\t')
}

/// Whether a session id is in the spec's range: one or more visible ASCII characters (0x21 to
/// 0x7E; 2025-11-25 basic/transports: Session Management).
pub fn is_visible_ascii(value: &HeaderValue) -> bool {
    !value.is_empty() && value.as_bytes().iter().all(|b| (0x21..=0x7e).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` reads a value as `to_str` does, and `valid_value` accepts what `from_bytes`
    /// does, for every byte at every place of a word.
    #[test]
    fn text_is_to_str() {
        for b in 0..=255u8 {
            for len in 1..20 {
                for at in 0..len {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = b;
                    let expected = HeaderValue::from_bytes(&bytes).ok();
                    assert_eq!(valid_value(&bytes), expected.is_some(), "{bytes:?}");
                    if let Some(v) = expected {
                        assert_eq!(text(&v), v.to_str().ok(), "{bytes:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn media_types_are_case_insensitive_and_charset_checked() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        let sse = "text/event-stream";
        assert_eq!(
            content_type_is(Some(&v("Text/Event-Stream; Charset=UTF-8")), sse),
            Ok(true)
        );
        assert_eq!(
            content_type_is(Some(&v("text/event-stream;charset=\"utf-8\"")), sse),
            Ok(true)
        );
        assert_eq!(
            content_type_is(Some(&v(" TEXT/EVENT-STREAM ")), sse),
            Ok(true)
        );
        assert_eq!(
            content_type_is(Some(&v("text/event-streamx")), sse),
            Ok(false)
        );
        assert_eq!(content_type_is(None, sse), Ok(false));
        assert_eq!(
            content_type_is(Some(&v("text/event-stream; charset=latin1")), sse),
            Err("latin1".into())
        );
        assert!(is_visible_ascii(&v("abc-123_~")));
        assert!(!is_visible_ascii(&v("a b")));
        assert!(!is_visible_ascii(&v("")));
    }

    /// Each hop-by-hop name alone is removed (the one-pass check must not let any through), a
    /// name `Connection` lists goes with it, and end-to-end headers stay.
    #[test]
    fn every_hop_by_hop_header_is_removed_even_alone() {
        for name in [
            "connection",
            "transfer-encoding",
            "te",
            "trailer",
            "upgrade",
            "proxy-authorization",
            "proxy-authenticate",
            "keep-alive",
            "proxy-connection",
        ] {
            let mut h = HeaderMap::new();
            h.insert("content-type", HeaderValue::from_static("application/json"));
            h.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("x"),
            );
            strip_hop_by_hop(&mut h);
            assert!(h.get(name).is_none(), "{name} kept");
            assert!(h.get("content-type").is_some());
        }
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("close, X-Private"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(MCP_SESSION_ID.clone(), HeaderValue::from_static("s"));
        strip_hop_by_hop(&mut h);
        assert!(h.get("x-private").is_none());
        assert!(h.get(&MCP_SESSION_ID).is_some());
        assert_eq!(h.len(), 1);
    }

    /// An upstream reply loses its hop-by-hop headers and every `x-taskgate-*` header in one
    /// call, alone or together; end-to-end headers stay.
    #[test]
    fn an_upstream_reply_loses_hop_by_hop_and_internal_headers() {
        for (extra, gone) in [
            (&["x-taskgate-held"][..], &["x-taskgate-held"][..]),
            (&["keep-alive"][..], &["keep-alive"][..]),
            (
                &["x-taskgate-local", "x-taskgate-held", "te"][..],
                &["x-taskgate-local", "x-taskgate-held", "te"][..],
            ),
        ] {
            let mut h = HeaderMap::new();
            h.insert("content-type", HeaderValue::from_static("application/json"));
            h.insert("x-taskgatex", HeaderValue::from_static("kept"));
            for name in extra {
                h.insert(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_static("1"),
                );
            }
            strip_upstream_reply(&mut h);
            for name in gone {
                assert!(h.get(*name).is_none(), "{name} kept");
            }
            assert_eq!(h.len(), 2, "end-to-end headers stay: {h:?}");
        }
    }

    /// Carved values are the bytes given, checked as `from_bytes` checks them, each its own
    /// however many share a buffer; a value too long to carve is made as usual. A kept
    /// `Content-Length` is the one `HeaderValue::from` makes, met first or again.
    #[test]
    fn carved_values_are_their_bytes_across_buffers() {
        let values: Vec<(String, HeaderValue)> = (0..200u64)
            .map(|n| {
                let text = format!("00-{n:032x}-{n:016x}-01");
                let value = carved(text.as_bytes()).unwrap();
                (text, value)
            })
            .collect();
        for (text, value) in &values {
            assert_eq!(value.as_bytes(), text.as_bytes());
        }
        for n in [0u64, 9, 10, 1024, 4095, 4096, 4_294_967_296, u64::MAX, 1024] {
            assert_eq!(content_length(n), HeaderValue::from(n));
        }
        assert_eq!(carved(b"a\tb").unwrap(), HeaderValue::from_static("a\tb"));
        // Every byte is judged as `HeaderValue::from_bytes` judges it.
        for b in 0..=255u8 {
            let text = [b'a', b, b'z'];
            assert_eq!(
                carved(&text).map(|v| v.as_bytes().to_vec()),
                HeaderValue::from_bytes(&text)
                    .ok()
                    .map(|v| v.as_bytes().to_vec()),
                "byte {b:#04x}"
            );
        }
        assert!(carved(b"a\x00b").is_none());
        assert!(carved(b"line\nbreak").is_none());
        let long = "x".repeat(CARVED_BUFFER);
        assert_eq!(carved(long.as_bytes()).unwrap().as_bytes(), long.as_bytes());
        // Unchecked, valid bytes make the same values, short (carved), long (copied) and
        // shared.
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        for text in [traceparent, "", "a\tb", long.as_str()] {
            // SAFETY: every byte of each is one a header value may hold.
            let value = unsafe { carved_unchecked(text.as_bytes()) };
            assert_eq!(value, HeaderValue::from_str(text).unwrap(), "{text}");
            let bytes = bytes::Bytes::copy_from_slice(text.as_bytes());
            // SAFETY: as above.
            let shared = unsafe { shared_unchecked(bytes.clone()) };
            assert_eq!(shared, value, "{text}");
            assert_eq!(shared.as_bytes().as_ptr(), bytes.as_ptr(), "not copied");
        }
    }
}
