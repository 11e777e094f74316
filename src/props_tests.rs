//! The properties of `props` on random inputs (the fuzz targets run them on any input).

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

const CHUNKED: &[&[u8]] = &[
    b"0",
    b"1",
    b"5",
    b"a",
    b"F",
    b"10",
    b"ffffffffffffffffff",
    b";ext",
    b"=v",
    b"\r\n",
    b"\n",
    b"\r",
    b"hello",
    b"\r\n\r\n",
    b"X-T: 1",
    b" ",
    b"z",
    b"\xFF",
];

/// Random chunked bodies (framing pieces, valid and broken), each cut at random places:
/// the same data and ending as read whole (`chunked_framing`).
#[test]
fn chunked_bodies_decode_the_same_in_any_pieces() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    for _ in 0..20_000 {
        let n = rng.gen_range(0..24);
        let wire: Vec<u8> = (0..n)
            .flat_map(|_| CHUNKED[rng.gen_range(0..CHUNKED.len())].to_vec())
            .collect();
        let cuts: Vec<usize> = (0..rng.gen_range(0..6)).map(|_| rng.gen()).collect();
        chunked_framing(&wire, &cuts);
    }
    // A valid body, and the bounds hit whatever the pieces.
    chunked_framing(b"5\r\nhello\r\n0\r\n\r\n", &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let long_line = [b"1;".as_slice(), &[b'x'; 5000], b"\r\nz\r\n0\r\n\r\n"].concat();
    chunked_framing(&long_line, &[100, 4000, 4097]);
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
    envelope(br#"{"jsonrpc":"2.0","id":"\u0061","method":"m","params":{"a":[1,2,{"b":null}]}}"#);
}

/// The terminal-status rewrite on random task-shaped messages of both eras, with duplicate
/// members, escapes and odd values among them (20,000 messages, fixed seed).
#[test]
fn status_rewrite_changes_only_the_status() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let members: &[&str] = &[
        r#""status":"working""#,
        r#""status":"completed""#,
        r#""status":1"#,
        r#""statusMessage":"m""#,
        r#""statusMessage":null"#,
        r#""result":{"content":[]}"#,
        r#""error":{"code":-1,"message":"x"}"#,
        r#""taskId":"t""#,
        r#""st\u0061tus":"working""#,
        r#""ttlMs":null"#,
        r#""resultType":"complete""#,
    ];
    for _ in 0..20_000 {
        let n = rng.gen_range(0..6);
        let task: Vec<&str> = (0..n)
            .map(|_| members[rng.gen_range(0..members.len())])
            .collect();
        let task = format!("{{{}}}", task.join(","));
        let body = match rng.gen_range(0..4) {
            0 => format!(r#"{{"jsonrpc":"2.0","id":1,"result":{task}}}"#),
            1 => format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"task":{task},"x":2}}}}"#),
            2 => {
                format!(r#"{{"jsonrpc":"2.0","method":"notifications/tasks","params":{task}}}"#)
            }
            _ => format!(r#"{{"result":{task},"result":{{"status":"working"}}}}"#),
        };
        let message = [None, Some("done"), Some("a\"b")][rng.gen_range(0..3)];
        status_rewrite(body.as_bytes(), rng.gen(), rng.gen(), message);
    }
}

/// The fuzz crash that found the 1-ulp float change in a whole-message rewrite (fixed by
/// serde_json's `float_roundtrip`): a task without `status` is rewritten whole.
#[test]
fn whole_rewrite_keeps_floats_exactly() {
    let body = br#"{"jsonrpc":"2.0","id":0,"result":{"task":{"taskId":"t","sid":1,"id":0.0111111111111111119111111111111111111111111111111111}}}"#;
    status_rewrite(body, 1, 0, None);
}

#[test]
fn modern_task_keeps_every_other_member() {
    for body in [
        r#"{"taskId":"t","status":"working","ttlMs":null,"pollIntervalMs":500}"#,
        r#"{"taskId":"t","ttlMs":60000,"ttl":1}"#,
        r#"[1,2]"#,
        r#""x""#,
        r#"{}"#,
    ] {
        modern_task(body.as_bytes(), 86_400_000);
    }
}

/// The bridge's translations on random task-shaped objects (10,000, fixed seed).
#[test]
fn bridge_translations_keep_what_they_must() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let members: &[&str] = &[
        r#""taskId":"t""#,
        r#""taskId":7"#,
        r#""status":"completed""#,
        r#""status":"failed""#,
        r#""status":"working""#,
        r#""status":"cancelled""#,
        r#""result":{"isError":true,"content":[]}"#,
        r#""result":{"content":[],"resultType":"complete"}"#,
        r#""result":3"#,
        r#""error":{"code":-32000,"message":"x"}"#,
        r#""error":{"code":1.5}"#,
        r#""resultType":"task""#,
        r#""ttlMs":null"#,
        r#""ttl":5"#,
        r#""pollIntervalMs":100"#,
        r#""inputRequests":{}"#,
        r#""task":{"ttl":1}"#,
        r#""_meta":{"progressToken":1,"io.modelcontextprotocol/related-task":{}}"#,
        r#""_meta":[1]"#,
        r#""statusMessage":"s""#,
    ];
    for _ in 0..10_000 {
        let n = rng.gen_range(0..7);
        let picked: Vec<&str> = (0..n)
            .map(|_| members[rng.gen_range(0..members.len())])
            .collect();
        bridge_translate(format!("{{{}}}", picked.join(",")).as_bytes());
    }
    bridge_translate(b"[1]");
    bridge_translate(b"null");
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
