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

/// Picks `n` of `items` at random (repeats allowed), joined by `sep`.
fn pick_join(rng: &mut impl Rng, items: &[&str], n: usize, sep: &str) -> String {
    (0..n)
        .map(|_| items[rng.gen_range(0..items.len())])
        .collect::<Vec<_>>()
        .join(sep)
}

const TASK_MEMBERS: &[&str] = &[
    r#""taskId":"t""#,
    r#""taskId":7"#,
    r#""status":"completed""#,
    r#""status":"failed""#,
    r#""status":"working""#,
    r#""status":"input_required""#,
    r#""result":{"isError":true,"content":[]}"#,
    r#""result":{"content":[],"resultType":"complete"}"#,
    r#""error":{"code":-32000,"message":"x"}"#,
    r#""resultType":"task""#,
    r#""resultType":"input_required""#,
    r#""ttlMs":null"#,
    r#""ttlMs":60000"#,
    r#""ttl":5"#,
    r#""pollIntervalMs":100"#,
    r#""inputRequests":{"k":{"method":"elicitation/create","params":{"message":"?"}},"r":{"method":"roots/list"},"p":{"method":"ping"}}"#,
    r#""inputRequests":{"s":{"method":"sampling/createMessage","params":[1]}}"#,
    r#""_meta":{"io.modelcontextprotocol/subscriptionId":"s1"}"#,
    r#""_meta":{"io.modelcontextprotocol/subscriptionId":"s1","x":1}"#,
    r#""statusMessage":"s""#,
];

/// A random object of `members`, at most `max` of them (duplicates possible: the properties
/// must hold for what serde_json keeps too).
fn object_of(rng: &mut impl Rng, members: &[&str], max: usize) -> String {
    let n = rng.gen_range(0..=max);
    format!("{{{}}}", pick_join(rng, members, n, ","))
}

/// The bridge's whole-message translations and error mapping on random 2026 messages
/// (20,000, fixed seed).
#[test]
fn bridge_legacy_translations_map_exactly_what_they_must() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let errors: &[&str] = &[
        r#""code":-32021"#,
        r#""code":-32020"#,
        r#""code":-32022"#,
        r#""code":-32601"#,
        r#""code":-32021.0"#,
        r#""code":"-32021""#,
        r#""message":"m""#,
        r#""data":{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#,
        r#""data":{"requiredCapabilities":{"sampling":{}}}"#,
        r#""data":{"supported":["2026-07-28"],"requested":"x"}"#,
    ];
    let tools: &[&str] = &[
        r#"{"name":"a"}"#,
        r#"{"name":"bb","execution":{}}"#,
        r#"{"name":"c","execution":{"taskSupport":"forbidden"}}"#,
        r#"{"execution":7}"#,
        r#"{"name":1,"execution":{"x":1}}"#,
        "3",
    ];
    let methods: &[&str] = &[
        r#""method":"notifications/tasks""#,
        r#""method":"notifications\/tasks""#,
        r#""method":"notifications\u002ftasks""#,
        r#""method":"notifications/tasks/status""#,
        r#""method":"notifications/progress""#,
    ];
    for _ in 0..20_000 {
        let body = match rng.gen_range(0..6) {
            0 => {
                let method = methods[rng.gen_range(0..methods.len())];
                let id = if rng.gen_bool(0.2) { r#""id":1,"# } else { "" };
                let params = object_of(&mut rng, TASK_MEMBERS, 6);
                format!(r#"{{"jsonrpc":"2.0",{id}{method},"params":{params}}}"#)
            }
            1 => {
                let e = object_of(&mut rng, errors, 4);
                format!(r#"{{"jsonrpc":"2.0","id":"x","error":{e}}}"#)
            }
            2 => object_of(&mut rng, errors, 4),
            3 => object_of(&mut rng, TASK_MEMBERS, 7),
            4 => {
                let n = rng.gen_range(0..5);
                format!(
                    r#"{{"tools":[{}],"nextCursor":"c"}}"#,
                    pick_join(&mut rng, tools, n, ",")
                )
            }
            _ => {
                let caps = [r#"{"tools":{}}"#, r#"{"tasks":{}}"#, "[]", "{}"][rng.gen_range(0..4)];
                format!(r#"{{"capabilities":{caps},"x":1}}"#)
            }
        };
        bridge_legacy(body.as_bytes());
    }
    bridge_legacy(b"-32021 not json");
    bridge_legacy(b"\xFF");
}

const REQUEST_PARTS: &[&str] = &[
    r#""name":"echo""#,
    r#""name":" é ""#,
    r#""name":"=?base64?eA==?=""#,
    r#""name":7"#,
    r#""uri":"file:///a b""#,
    r#""uri":"x\ny""#,
    r#""taskId":"t-1""#,
    r#""taskId":"\u0000""#,
    r#""arguments":{"a":[1,2.5,null]}"#,
    r#""task":{"ttl":5}"#,
    r#""_meta":{"progressToken":1}"#,
    r#""_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t"},"x":null}"#,
    r#""_meta":{"io.modelcontextprotocol/clientInfo":{"name":"own"},"io.modelcontextprotocol/protocolVersion":"2025-11-25"}"#,
    r#""_meta":{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#,
    r#""_meta":[1]"#,
];

/// A random client request (or notification, or answer) of a held session.
fn random_request(rng: &mut impl Rng) -> String {
    let methods = [
        "tools/call",
        "prompts/get",
        "resources/read",
        "tasks/get",
        "tasks/cancel",
        "tools/list",
        "ping",
        "x\u{7f}y",
        "é/x",
        "a\\u0062",
    ];
    let ids = [
        "1",
        "\"1\"",
        "\"a\\u0062\"",
        "-3",
        "12345678901234567890",
        "0",
    ];
    let id = ids[rng.gen_range(0..ids.len())];
    let method = methods[rng.gen_range(0..methods.len())];
    let params = match rng.gen_range(0..8) {
        0 => "[1]".to_string(),
        1 => "\"p\"".to_string(),
        _ => object_of(rng, REQUEST_PARTS, 4),
    };
    match rng.gen_range(0..10) {
        0 => format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{params}}}"#),
        1 => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#),
        2 => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}"}}"#),
        _ => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#),
    }
}

/// Held sessions' requests as the 2026 requests that go upstream (20,000, fixed seed).
#[test]
fn held_requests_go_upstream_as_2026_requests_that_keep_their_id() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(30);
    for _ in 0..20_000 {
        held_request(rng.gen(), random_request(&mut rng).as_bytes());
    }
    held_request(
        0,
        br#"{"jsonrpc":"2.0","id":"\u0061","method":"tools/call","params":{"name":"x"}}"#,
    );
}

/// Found by the seeded run of `held_requests_go_upstream_as_2026_requests_that_keep_their_id`: a held request whose method
/// cannot be a header value (a DEL) went upstream with the client's own `Mcp-Method` (here a
/// stale `other/method`), which the upstream leg's check refuses. `modern_request` now drops
/// the client's `Mcp-Method` before setting its own.
#[test]
fn a_method_that_is_no_header_value_goes_upstream_without_the_clients_mcp_method() {
    held_request(8, b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\x7fy\"}");
}

/// A random 2026 upstream message for a held session's client.
fn random_upstream_message(rng: &mut impl Rng) -> String {
    let ids = ["1", "\"1\"", "\"a\\u0062\"", "null", "1.5", "-0", "[1]"];
    let id = ids[rng.gen_range(0..ids.len())];
    let task = object_of(rng, TASK_MEMBERS, 6);
    match rng.gen_range(0..7) {
        0 => format!(r#"{{"jsonrpc":"2.0","method":"notifications/tasks","params":{task}}}"#),
        1 => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{task}}}"#),
        2 => format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"resultType":"input_required","inputRequests":{{}}}}}}"#
        ),
        3 => format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"m"}}}}"#),
        4 => format!(r#"{{"id":{id},"error":{{"code":1}}}}"#),
        5 => {
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}"#.into()
        }
        _ => "\"input_required\" not json".into(),
    }
}

/// 2026 upstream answers (JSON bodies and SSE streams) as a held session's client takes them
/// (20,000, fixed seed).
#[test]
fn held_answers_reach_the_client_in_2025_form() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    for _ in 0..20_000 {
        let flags: u8 = rng.gen();
        let body = if flags & 8 == 0 {
            random_upstream_message(&mut rng).into_bytes()
        } else {
            let n = rng.gen_range(0..4);
            let events: Vec<String> = (0..n).map(|_| random_upstream_message(&mut rng)).collect();
            events
                .join("\u{FF}")
                .into_bytes()
                .iter()
                .map(|&b| if b == 0xC3 { 0xFF } else { b })
                .collect()
        };
        held_answer(flags, &body);
    }
    held_answer(1, b"\xFF\xFE");
}

/// The held `initialize` answer from random `server/discover` results (5,000, fixed seed).
#[test]
fn held_initialize_answers_from_any_discover_result() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(32);
    let members: &[&str] = &[
        r#""capabilities":{"tools":{"listChanged":true},"extensions":{"io.modelcontextprotocol/tasks":{}}}"#,
        r#""capabilities":{"tasks":{"list":{}}}"#,
        r#""capabilities":[]"#,
        r#""instructions":"be nice""#,
        r#""instructions":7"#,
        r#""_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s","version":"2"}}"#,
        r#""_meta":{"io.modelcontextprotocol/serverInfo":{"name":1}}"#,
        r#""supportedVersions":["2026-07-28"]"#,
        r#""resultType":"complete""#,
    ];
    for _ in 0..5_000 {
        held_initialize(rng.gen(), object_of(&mut rng, members, 5).as_bytes());
    }
    held_initialize(0, b"[1]");
}

/// Held-session records (valid, past a bound, cut short, odd) and the sled expiry keys
/// (10,000, fixed seed).
#[test]
fn held_records_round_trip_within_their_bounds() {
    use crate::store::held::HeldSessionRecord;
    let mut rng = rand::rngs::StdRng::seed_from_u64(33);
    let texts = ["", "u", "é\u{0}\"", "\u{FFFF}", "tgh-0123"];
    for _ in 0..10_000 {
        let text = |rng: &mut rand::rngs::StdRng| {
            let t = texts[rng.gen_range(0..texts.len())];
            t.repeat(rng.gen_range(0..300))
        };
        let r = HeldSessionRecord {
            upstream: text(&mut rng),
            session_id: text(&mut rng),
            owner: rng.gen_bool(0.5).then(|| text(&mut rng)),
            protocol_version: rng.gen_bool(0.5).then(|| text(&mut rng)),
            capability_bits: rng.gen(),
            upstream_tasks_tools_call: rng.gen(),
            upstream_without_tasks: rng.gen(),
            upstream_issued: rng.gen(),
            client_capabilities: match rng.gen_range(0..3) {
                0 => serde_json::json!({"roots": {"x": text(&mut rng)}}),
                1 => serde_json::json!([1]),
                _ => serde_json::json!({}),
            },
            client_info: rng
                .gen_bool(0.5)
                .then(|| serde_json::json!({"name": text(&mut rng)})),
            expires_at: rng.gen(),
        };
        let mut bytes = r.encode().into_bytes();
        if rng.gen_bool(0.2) {
            bytes.truncate(rng.gen_range(0..=bytes.len()));
        }
        held_record(&bytes);
        let n = rng.gen_range(0..40);
        let raw: Vec<u8> = (0..n)
            .map(|_| [0u8, 1, 0xFF, b'a', 0xC3, 0xA9, 0x7F][rng.gen_range(0..7)])
            .collect();
        held_record(&raw);
    }
    held_record(br#"{"capabilities":{"tasks":{},"elicitation":{"x":"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"}},"clientInfo":[1]}"#);
    let big = format!(
        r#"{{"capabilities":{{"sampling":{{}},"x":"{}"}},"clientInfo":{{"n":"{}"}}}}"#,
        "\\u0000".repeat(1000),
        "z".repeat(2000)
    );
    held_record(big.as_bytes());
    let mut key = crate::store::sled_store::held::expiry_key(5, "up", "s");
    key.extend_from_slice(b"more");
    held_record(&key);
}

/// The routing headers on random methods, names and header values (20,000, fixed seed).
#[test]
fn routing_headers_round_trip_and_check_what_they_must() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(34);
    let alphabet: &[&[u8]] = &[
        b"a",
        b" ",
        b"\t",
        b"=?base64?",
        b"?=",
        b"eA==",
        b"w6k=",
        b"/w==",
        b"\xC3\xA9",
        b"\x7F",
        b"\x00",
        b"\x80",
        b"tools/call",
        b"t-1",
        b"=",
        b"?",
        b"\r",
    ];
    for _ in 0..20_000 {
        let mut parts = Vec::new();
        for i in 0..4 {
            if i > 0 {
                parts.push(0xFF);
            }
            for _ in 0..rng.gen_range(0..5) {
                parts.extend_from_slice(alphabet[rng.gen_range(0..alphabet.len())]);
            }
        }
        routing_headers(rng.gen(), &parts);
    }
    routing_headers(8 | 64, b"\xFF t-1\xFF\xFFt-1");
}

/// `subscriptions/listen` messages and MRTR `input_required` answers (20,000, fixed seed).
#[test]
fn listen_events_and_input_requests_reach_the_client_as_it_takes_them() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    let listen: &[&str] = &[
        r#"{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"io.modelcontextprotocol/subscriptionId":"s1"}}}"#,
        r#"{"jsonrpc":"2.0","id":"l","result":{}}"#,
        r#"{"jsonrpc":"2.0","id":"l","method":"ping"}"#,
        r#"{"method":7}"#,
        r#"{"capabilities":{"tools":{"listChanged":true},"resources":{"subscribe":true,"listChanged":false}}}"#,
        r#"{"prompts":{"listChanged":true},"resources":{"listChanged":true}}"#,
    ];
    let ids = ["1", "\"1\"", "-7", "\"taskgate-bridge-1\"", "2", "null"];
    for _ in 0..20_000 {
        let body = match rng.gen_range(0..3) {
            0 => listen[rng.gen_range(0..listen.len())].to_string(),
            1 => {
                let task = object_of(&mut rng, TASK_MEMBERS, 5);
                let meta = [
                    r#""_meta":{"io.modelcontextprotocol/subscriptionId":"s1"}"#,
                    r#""_meta":{"x":1}"#,
                    r#""_meta":[]"#,
                ][rng.gen_range(0..3)];
                let task = task
                    .replacen('{', &format!("{{{meta},"), 1)
                    .replace(",}", "}");
                format!(r#"{{"jsonrpc":"2.0","method":"notifications/tasks","params":{task}}}"#)
            }
            _ => {
                let id = ids[rng.gen_range(0..ids.len())];
                let result = object_of(&mut rng, TASK_MEMBERS, 4);
                let method = if rng.gen_bool(0.1) {
                    r#","method":"m""#
                } else {
                    ""
                };
                format!(r#"{{"jsonrpc":"2.0","id":{id}{method},"result":{result}}}"#)
            }
        };
        listen_mrtr(rng.gen(), body.as_bytes());
    }
    listen_mrtr(0, b"not json");
}
