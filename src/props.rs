//! Properties of the parsers that clients and upstreams feed, checked on any input: by the
//! `fuzz/` targets (cargo-fuzz) and, with random inputs, by `cargo test` (the tests below).
//! Each function panics (with what was wrong) when its property does not hold, so a fuzzer
//! reports it as a crash.
//!
//! - [`sse_chunking`]: how a stream is cut into chunks does not change its events.
//! - [`sse_roundtrip`]: [`sse::encode`] then decode gives the events back.
//! - [`envelope`]: a body [`Message::parse_checked`] accepts is one JSON object whose `id`
//!   round-trips; nothing panics.
//! - [`config`]: loading any text never panics.

use crate::jsonrpc::{Id, Kind, Message};
use crate::sse::{self, Decoder, Event};
use bytes::Bytes;

/// Decodes `wire` whole, and cut at the positions `cuts` (taken modulo its length, in any
/// order): both give the same events, and both hit the line limit (`max`) or neither does.
pub fn sse_chunking(wire: &[u8], cuts: &[usize], max: usize) {
    let run = |chunks: &[&[u8]]| {
        let mut d = Decoder::new(max);
        let mut out = Vec::new();
        let mut failed = false;
        for c in chunks {
            if d.feed(c, &mut out).is_err() {
                failed = true;
                break;
            }
        }
        (out, failed)
    };
    let (whole, whole_failed) = run(&[wire]);
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    at.sort_unstable();
    let mut chunks = Vec::new();
    let mut start = 0;
    for c in at {
        chunks.push(&wire[start..c]);
        start = c;
    }
    chunks.push(&wire[start..]);
    let (parts, parts_failed) = run(&chunks);
    if whole_failed || parts_failed {
        // Past the limit the events before it may differ by how much was buffered; what is
        // decoded before the failure is a prefix of the whole.
        assert!(
            whole.starts_with(&parts) || parts.starts_with(&whole),
            "events before the limit differ"
        );
        return;
    }
    assert_eq!(parts, whole, "chunks {chunks:?}");
}

/// The events that `fields` spell (each `(kind, text)`: 0 `event`, 1 `id`, 2 `data`, 3 `retry`,
/// 4 end of event), made valid for the wire (no CR/LF in values, no NUL in ids), encoded with
/// [`sse::encode`] and decoded again: the same events.
pub fn sse_roundtrip(fields: &[(u8, String)]) {
    let clean = |s: &str| s.replace(['\r', '\n'], " ");
    let mut events = Vec::new();
    let mut ev = Event::default();
    for (kind, text) in fields {
        match kind % 5 {
            0 => ev.event = Some(clean(text)),
            1 => ev.id = Some(clean(text).replace('\0', "")),
            2 => {
                // Lines of data, joined by LF (a CR would end a line on the wire).
                ev.data = Some(text.replace('\r', " "));
            }
            3 => ev.retry = Some(text.len() as u64),
            _ => {
                if ev != Event::default() {
                    events.push(std::mem::take(&mut ev));
                }
            }
        }
    }
    if ev != Event::default() {
        events.push(ev);
    }
    // A leading space of a value is eaten by the decoder only when it follows the colon, and
    // `encode` always writes ": ": values keep their own leading spaces.
    let wire: Vec<u8> = events
        .iter()
        .flat_map(|e| sse::encode(e).to_vec())
        .collect();
    let mut d = Decoder::new(usize::MAX / 2);
    let mut out = Vec::new();
    d.feed(&wire, &mut out).expect("no limit");
    assert_eq!(out, events, "wire {:?}", String::from_utf8_lossy(&wire));
}

/// A client body as the edge parses it: accepted ⇒ one JSON object, with `jsonrpc: "2.0"`, whose
/// `id` (if any) is the message's id and reads back as itself.
pub fn envelope(body: &[u8]) {
    let Ok(msg) = Message::parse_checked(Bytes::copy_from_slice(body)) else {
        return;
    };
    let v: serde_json::Value = serde_json::from_slice(body).expect("accepted ⇒ JSON");
    let obj = v.as_object().expect("accepted ⇒ one JSON object");
    assert_eq!(obj.get("jsonrpc"), Some(&serde_json::json!("2.0")));
    match msg.id() {
        Some(id) => {
            assert_eq!(
                Id::from_json(id.as_json()).as_ref(),
                Some(id),
                "id reads back"
            );
            assert_eq!(
                Id::from_value(&obj["id"]).as_ref(),
                Some(id),
                "id is the message's"
            );
        }
        None => assert!(
            matches!(msg.kind(), Kind::Notification | Kind::Error),
            "only notifications and errors have no id"
        ),
    }
}

/// Loading any text as a configuration returns a config or an error; it never panics.
pub fn config(text: &str) {
    let _ = crate::config::Config::from_toml_str(text);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const ALPHABET: &[&[u8]] = &[
        b"data",
        b"data:",
        b": ",
        b"id:",
        b"event: x",
        b"retry: 7",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        b"\xEF\xBB\xBF",
        b"\xEF",
        b"\xBB\xBF",
        b"\xC3\xA9",
        b"\xFF",
        b"{\"a\":1}",
        b":c",
        b" ",
    ];

    fn random_wire(rng: &mut impl Rng) -> Vec<u8> {
        let n = rng.gen_range(0..40);
        (0..n)
            .flat_map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())].to_vec())
            .collect()
    }

    /// Issue 16 item 6: a BOM after the first bytes of a stream is kept (as part of its line)
    /// wherever the chunks are cut; only a BOM at the very start is removed.
    #[test]
    fn mid_stream_bom_is_kept_at_any_chunking() {
        let wire = b"\n\xEF\xBB\xBFdata: b\n\n";
        let mut d = Decoder::new(1024);
        let mut whole = Vec::new();
        d.feed(wire, &mut whole).unwrap();
        assert!(
            whole.is_empty(),
            "`\\u{{FEFF}}data` is an unknown field: {whole:?}"
        );
        for at in 0..=wire.len() {
            sse_chunking(wire, &[at], 1024);
        }
        sse_chunking(b"\xEF\xBB\xBFdata: a\n\n", &[1, 2], 1024);
    }

    /// Any chunking of random streams yields the same events (10,000 streams, fixed seed).
    #[test]
    fn sse_any_chunking_yields_the_same_events() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(16);
        for _ in 0..10_000 {
            let wire = random_wire(&mut rng);
            let cuts: Vec<usize> = (0..rng.gen_range(0..6)).map(|_| rng.gen()).collect();
            sse_chunking(&wire, &cuts, 64);
        }
    }

    #[test]
    fn sse_encode_then_decode_is_the_identity() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for _ in 0..5_000 {
            let fields: Vec<(u8, String)> = (0..rng.gen_range(0..8))
                .map(|_| {
                    let w = random_wire(&mut rng);
                    (rng.gen(), String::from_utf8_lossy(&w).into_owned())
                })
                .collect();
            sse_roundtrip(&fields);
        }
    }

    #[test]
    fn envelope_accepts_only_objects_whose_id_round_trips() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let parts: &[&str] = &[
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            "\"jsonrpc\"",
            "\"2.0\"",
            "\"id\"",
            "\"method\"",
            "\"m\"",
            "1",
            "-0",
            "1e3",
            "\"\\u0061\"",
            "null",
            "\"params\"",
            "\"result\"",
            "\"error\"",
            " ",
            "\"\\ud800\"",
            "\u{e9}",
            "\u{0}",
        ];
        for _ in 0..20_000 {
            let mut body: Vec<u8> = (0..rng.gen_range(0..24))
                .flat_map(|_| parts[rng.gen_range(0..parts.len())].as_bytes().to_vec())
                .collect();
            if rng.gen_bool(0.05) {
                body.push(0xFF);
            }
            envelope(&body);
        }
        envelope(
            br#"{"jsonrpc":"2.0","id":"\u0061","method":"m","params":{"a":[1,2,{"b":null}]}}"#,
        );
    }

    #[test]
    fn config_loader_never_panics() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let lines = include_str!("../config/taskgate.toml")
            .lines()
            .collect::<Vec<_>>();
        for _ in 0..300 {
            let text: String = (0..rng.gen_range(0..30))
                .map(|_| {
                    let l = lines[rng.gen_range(0..lines.len())];
                    match rng.gen_range(0..4) {
                        0 => l.replace(|c: char| c.is_ascii_digit(), "0"),
                        1 => l.replace('"', ""),
                        _ => l.to_string(),
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            config(&text);
        }
    }
}
