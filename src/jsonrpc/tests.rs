//! Tests of the JSON-RPC envelope: parsing, ids, nesting and UTF-8 checks.
use super::*;

/// A body ending in an escape inside a string (`"\"\`, found by `fuzz/envelope`) used to
/// slice past its end and panic; it is now an ordinary parse error.
#[test]
fn an_escape_at_the_end_of_the_body_is_a_parse_error_not_a_panic() {
    for body in [&b"\"\\\"\\"[..], b"\"\\", b"{\"a\":\"\\"] {
        assert!(nesting_over(body, MAX_DEPTH).is_none());
        assert!(Message::parse(bytes::Bytes::copy_from_slice(body)).is_err());
    }
}

/// Brackets inside strings (escaped quotes included) do not count as nesting; 128 levels
/// pass, 129 do not; invalid UTF-8 is named.
#[test]
fn check_json_counts_nesting_outside_strings_only() {
    let nested = |n: usize| format!("{{\"a\":{}1{}}}", "[".repeat(n - 1), "]".repeat(n - 1));
    assert!(check_json(nested(128).as_bytes()).is_ok());
    let err = check_json(nested(129).as_bytes()).unwrap_err().to_string();
    assert!(err.contains("nested deeper than 128"), "{err}");
    let in_string = format!("{{\"a\":\"\\\"{}\"}}", "[".repeat(500));
    assert!(check_json(in_string.as_bytes()).is_ok(), "{in_string}");
    let err = check_json(b"{\"a\":\"\xff\"}").unwrap_err().to_string();
    assert!(err.contains("invalid UTF-8 at byte 6"), "{err}");
}

fn parse(s: &str) -> Result<Message, EnvelopeError> {
    Message::parse(Bytes::copy_from_slice(s.as_bytes()))
}

/// The parse-free recognition of plain ids agrees with serde_json's on ids and near-ids.
#[test]
fn plain_ids_are_recognised_as_serde_json_would() {
    let by_serde = |t: &str| match serde_json::from_str::<serde_json::Value>(t) {
        Ok(serde_json::Value::String(_)) => true,
        Ok(serde_json::Value::Number(n)) => n.is_i64() || n.is_u64(),
        _ => false,
    };
    for t in [
        "0",
        "-0",
        "7",
        "-12",
        "00",
        "01",
        "-",
        "",
        "1.5",
        "1e3",
        "123456789012345678",
        "9223372036854775807",
        "99999999999999999999",
        "\"\"",
        "\"a\"",
        "\"é\"",
        "\"a\"b\"",
        "\"",
        "\"\u{1}\"",
        "\"tab\there\"",
        "\"\\u0061\"",
        "null",
        "true",
        "[1]",
        " 1",
    ] {
        let fast = is_plain_string(t) || is_small_integer(t);
        assert!(
            !fast || by_serde(t),
            "{t:?} taken as an id without being one"
        );
        assert_eq!(Id::from_json(t).is_some(), by_serde(t), "{t:?}");
    }
}

#[test]
fn ids_keep_their_json_type() {
    let n = parse(r#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#).unwrap();
    let s = parse(r#"{"jsonrpc":"2.0","id":"0","method":"ping"}"#).unwrap();
    assert_eq!(n.id().unwrap().as_json(), "0");
    assert_eq!(s.id().unwrap().as_json(), "\"0\"");
    assert_ne!(n.id(), s.id());
    let err = error_response(s.id(), INVALID_PARAMS, "x");
    assert_eq!(
        &err[..],
        br#"{"jsonrpc":"2.0","id":"0","error":{"code":-32602,"message":"x"}}"#
    );
}

#[test]
fn null_ids_and_escaped_ids() {
    assert_eq!(
        parse(r#"{"jsonrpc":"2.0","id":null,"method":"tasks/get","params":{}}"#)
            .unwrap_err()
            .code(),
        INVALID_REQUEST
    );
    let escaped = parse(r#"{"jsonrpc":"2.0","id":"\u0061bc","method":"ping"}"#).unwrap();
    let plain = parse(r#"{"jsonrpc":"2.0","id":"abc","result":{}}"#).unwrap();
    assert_eq!(escaped.id(), plain.id());
}

#[test]
fn kinds() {
    assert_eq!(
        parse(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .unwrap()
            .kind(),
        Kind::Notification
    );
    assert_eq!(
        parse(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#)
            .unwrap()
            .kind(),
        Kind::Response
    );
    assert_eq!(
        parse(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"m"}}"#)
            .unwrap()
            .kind(),
        Kind::Error
    );
}

#[test]
fn bad_input_maps_to_codes() {
    assert_eq!(parse("{nope").unwrap_err().code(), PARSE_ERROR);
    assert_eq!(parse("").unwrap_err().code(), PARSE_ERROR);
    assert!(matches!(
        parse(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#).unwrap_err(),
        EnvelopeError::Batch
    ));
    assert_eq!(parse("[1,").unwrap_err().code(), PARSE_ERROR);
    assert_eq!(parse("42").unwrap_err().code(), INVALID_REQUEST);
    assert_eq!(
        parse(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#)
            .unwrap_err()
            .code(),
        INVALID_REQUEST
    );
    assert_eq!(
        parse(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#)
            .unwrap_err()
            .code(),
        INVALID_REQUEST
    );
    assert_eq!(
        parse(r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#)
            .unwrap_err()
            .code(),
        INVALID_REQUEST
    );
}

/// Short ids are kept inline, long ones shared: either way an id is its JSON text, equal and
/// hashed as that text, whatever its length (the inline limit and one past it included).
#[test]
fn ids_are_their_text_inline_or_shared() {
    use std::collections::HashSet;
    let hash = |id: &Id| {
        use std::hash::{BuildHasher, BuildHasherDefault};
        BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(id)
    };
    for n in [
        0usize,
        1,
        INLINE_ID - 3,
        INLINE_ID - 2,
        INLINE_ID - 1,
        40,
        300,
    ] {
        let text = format!("\"{}\"", "é".repeat(n / 2) + &"a".repeat(n % 2));
        let a = Id::from_json(&text).unwrap();
        let b = Id::from_json(&text).unwrap();
        assert_eq!(a.as_json(), text);
        assert_eq!(a, b);
        assert_eq!(hash(&a), hash(&b));
        assert_eq!(a.clone().as_json(), text);
        assert_eq!(format!("{a}"), text);
    }
    let ids: HashSet<Id> = [
        "1",
        "\"1\"",
        "12345678901234567890",
        "\"12345678901234567890123\"",
    ]
    .iter()
    .map(|t| Id::from_json(t).expect(t))
    .collect();
    assert_eq!(ids.len(), 4);
    assert!(ids.contains(&Id::from_json("\"12345678901234567890123\"").unwrap()));
    assert!(!ids.contains(&Id::from_json("2").unwrap()));
}

type Members = (Option<String>, Option<String>, Option<String>, bool, bool);

/// The envelope as the checked serde_json parse reads it, `None` where it refuses the text.
fn by_serde(text: &str) -> Option<Members> {
    check_json(text.as_bytes()).ok()?;
    let env: Envelope<'_> = serde_json::from_str(text).ok()?;
    Some((
        env.jsonrpc.map(|v| v.get().to_string()),
        env.id.map(|v| v.get().to_string()),
        env.method.map(|m| m.into_owned()),
        env.result.is_some(),
        env.error.is_some(),
    ))
}

/// The envelope as the one-pass reader reads it, `None` where it leaves the text to serde_json.
fn by_reader(text: &str) -> Option<Members> {
    let m = envelope::read(text)?;
    Some((
        m.jsonrpc.map(str::to_string),
        m.id.map(str::to_string),
        m.method.map(str::to_string),
        m.result,
        m.error,
    ))
}

/// Whatever the one-pass reader accepts, serde_json accepts with the same envelope (the reader
/// may only hand texts back, never decide one differently): common messages, edge cases, and
/// every one-byte deletion and substitution of a few messages.
#[test]
fn the_envelope_reader_agrees_with_serde_json() {
    let common = [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}"#,
        r#" { "jsonrpc" : "2.0" , "id" : "a-1" , "method" : "tasks/get" , "params" : { "taskId" : "t" } } "#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"a\"b\\c\n"}],"n":[-0.5e+3,0,1E2,true,false,null]}}"#,
        r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"x"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"x/y","params":[],"other":{},"another":"é"}"#,
    ];
    for text in common {
        let fast = by_reader(text);
        assert!(
            fast.is_some(),
            "the common shape is read in one pass: {text}"
        );
        assert_eq!(fast, by_serde(text), "{text}");
    }
    let handed_back = [
        r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"m"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"x/y","params":[],"other":{},"other":"é"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"taskId":"a","taskId":"b"}}"#,
        r#"{"jsonrpc":"2.0","id":null,"error":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":null}"#,
        r#"{"jsonrpc":"2.0","id":1,"m\u0065thod":"m"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m\/n"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"\ud800"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":5}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":null}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m\u0041"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":{"a":"m"}}"#,
        r#"{"jsonrpc":"2.0","id":01,"method":"m"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m",}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m"} x"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1,]}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":"a	b"}"#,
        "\u{feff}{}",
        "[]",
        "",
    ];
    for text in handed_back {
        assert_eq!(by_reader(text), None, "{text}");
    }
    let nested = |n: usize| format!("{{\"a\":{}1{}}}", "[".repeat(n - 1), "]".repeat(n - 1));
    assert!(by_reader(&nested(128)).is_some());
    assert_eq!(by_reader(&nested(129)), None);
    assert_eq!(by_serde(&nested(129)), None);
    let alphabet = b" \t\n{}[]:,\"\\/-+.0123456789eEtrufalsnbx\x01";
    for text in common.iter().chain(&handed_back[..4]) {
        let b = text.as_bytes();
        let mut variants = Vec::new();
        for i in 0..b.len() {
            let mut v = b.to_vec();
            v.remove(i);
            variants.push(v);
            for &c in alphabet {
                let mut v = b.to_vec();
                v[i] = c;
                variants.push(v);
            }
        }
        for v in variants {
            let Ok(v) = String::from_utf8(v) else {
                continue;
            };
            if let Some(fast) = by_reader(&v) {
                assert_eq!(Some(fast), by_serde(&v), "{v}");
            }
        }
    }
}

/// The same agreement on texts with several random edits (a fixed seed: the run repeats), JSON
/// tokens inserted, replaced and removed anywhere. `ENVELOPE_ROUNDS=N` runs N texts instead of
/// 40,000 (1,500,000 agreed when the reader was written).
#[test]
fn the_envelope_reader_agrees_with_serde_json_after_random_edits() {
    let seeds = [
        r#"{"jsonrpc":"2.0","id":"x1","method":"tools/call","params":{"a":[1,-2.5e3,{"b":null}],"c":"d\n"}}"#,
        r#"{"jsonrpc":"2.0","id":12,"result":{"content":[{"type":"text","text":"\u00e9"}]},"x":true}"#,
    ];
    let tokens: Vec<&str> = super::lex::JSON_TOKENS
        .iter()
        .copied()
        .chain(["\"id\"", "\"method\"", "\"result\"", "\"error\""])
        .collect();
    let mut read = 0;
    let rounds = std::env::var("ENVELOPE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40_000usize);
    super::lex::random_edits(&seeds, &tokens, 0x2545_f491_4f6c_dd1d, rounds, |text| {
        if let Some(fast) = by_reader(text) {
            read += 1;
            assert_eq!(Some(fast), by_serde(text), "{text}");
        }
    });
    assert!(
        read > 1_000,
        "the reader took too few texts to compare ({read})"
    );
}

/// Issue 29 item 13: a key twice in one object, anywhere in a client's message, is refused
/// with `-32600` naming the key and where it is (taskgate and the upstream could otherwise read
/// different values); the one-pass reader hands every such message back. Keys are compared as
/// the strings they spell; the same key in different objects is no duplicate.
#[test]
fn duplicate_keys_anywhere_are_refused_by_the_checked_parse() {
    let checked = |s: &str| Message::parse_checked(Bytes::copy_from_slice(s.as_bytes()));
    let many = |n: usize, extra: &str| {
        let keys: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{{{}{extra}}}}}}}"#,
            keys.join(",")
        )
    };
    let deep = |n: usize, extra: &str| {
        let open: String = (0..n).map(|i| format!("{{\"k{i}\":1,\"n\":")).collect();
        let close = "}".repeat(n);
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{open}{{"x":1{extra}}}{close}}}"#)
    };
    let refused = [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"mine","taskId":"yours"}}"#,
            r#""taskId" in /params"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","task":{"ttl":1},"task":{"ttl":2}}}"#,
            r#""task" in /params"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","task":{"ttl":1,"ttl":0}}}"#,
            r#""ttl" in /params/task"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{},"params":{"taskId":"x"}}"#,
            r#""params" in the message"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","method":"m"}"#,
            r#""method" in the message"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":[{"b":1},{"c":1,"c":2}]}}"#,
            r#""c" in /params/a/1"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"task":1,"t\u0061sk":2}}"#,
            r#""task" in /params"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a/b":1,"a\/b":2}}"#,
            r#""a/b" in /params"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"a","taskId":"b"}}}}"#,
            r#""taskId" in /params/_meta/io.modelcontextprotocol~1related-task"#,
        ),
    ];
    for (text, at) in refused {
        assert!(
            by_reader(text).is_none(),
            "the reader hands it back: {text}"
        );
        let err = checked(text)
            .err()
            .unwrap_or_else(|| panic!("accepted: {text}"));
        assert_eq!(err.code(), INVALID_REQUEST, "{text}");
        assert!(
            err.to_string().contains(&format!("duplicate key {at}")),
            "{err} for {text}"
        );
    }
    // Past what the reader keeps (64 keys open, 16 compared in a list): the parse finds them.
    for text in [
        many(20, ",\"k3\":0"),
        many(80, ",\"k79\":0"),
        deep(70, ",\"x\":2"),
    ] {
        assert!(by_reader(&text).is_none());
        let err = checked(&text).err().expect("refused");
        assert_eq!(err.code(), INVALID_REQUEST);
        assert!(err.to_string().contains("duplicate key"), "{err}");
    }
    let accepted = [
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":{"x":1},"b":{"x":1},"x":[{"x":1},{"x":2}]}}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"ab":1,"a":2,"b":{"ab":{"ab":3}}}}"#.to_string(),
        many(20, ""),
        many(80, ""),
        deep(70, ""),
    ];
    for text in &accepted {
        assert!(checked(text).is_ok(), "{text}");
        assert_eq!(duplicate_key(text), None, "{text}");
    }
    // The common shapes stay on the one pass.
    assert!(by_reader(&accepted[0]).is_some());
    assert!(by_reader(&many(20, "")).is_some());
}

#[test]
fn a_member_is_inserted_first_and_every_other_byte_stays() {
    let text = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","n":1.10}}"#;
    let m = Message::parse(Bytes::from_static(text.as_bytes())).unwrap();
    let out = splice::insert_first(m.bytes(), m.params().unwrap(), r#""task":{"ttl":5}"#);
    assert_eq!(
        out.as_deref(),
        Some(&br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"task":{"ttl":5},"name":"x","n":1.10}}"#[..])
    );
    let text = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{ }}"#;
    let m = Message::parse(Bytes::from_static(text.as_bytes())).unwrap();
    let out = splice::insert_first(m.bytes(), m.params().unwrap(), r#""a":1"#);
    assert_eq!(
        out.as_deref(),
        Some(&br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"a":1 }}"#[..])
    );
    // Not a slice of the message: nothing.
    assert_eq!(splice::insert_first(m.bytes(), "{}", r#""a":1"#), None);
}

/// The members looked up by name (`task`, `taskId`, `name`, `_meta`, `requestId`: `Known`)
/// are found from the index the envelope pass notes, in whichever of the indexed places they
/// are, and read exactly as the walk of `params` reads them; others are found by their key; an
/// absent one is absent (issue 36).
#[test]
fn known_params_are_found_by_their_place_as_the_walk_finds_them() {
    let known = ["task", "taskId", "name", "_meta", "requestId"];
    let values = ["{\"ttl\":1}", "\"t-1\"", "\"tool\"", "{\"k\":[1]}", "7"];
    for (i, name) in known.iter().enumerate() {
        for place in 0..PARAMS {
            let mut members: Vec<String> = (0..PARAMS - 1)
                .map(|n| format!("\"other{n}\":{n}"))
                .collect();
            members.insert(place, format!("\"{name}\":{}", values[i]));
            let text = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{{}}}}}"#,
                members.join(",")
            );
            let m = Message::parse_checked(Bytes::from(text.clone())).unwrap();
            assert_eq!(m.params.state, ParamsState::Indexed, "{text}");
            let walked = splice::raw_at(m.bytes(), &["params", name])
                .unwrap()
                .map(RawValue::get);
            assert_eq!(m.param(name), Some(values[i]), "{text}");
            assert_eq!(m.param(name), walked, "{text}");
            assert_eq!(m.param_bytes(name), walked.map(str::as_bytes), "{text}");
            assert_eq!(m.param("other0"), Some("0"), "{text}");
            assert_eq!(m.param_bytes("other0"), Some(&b"0"[..]), "{text}");
            for other in known.iter().filter(|k| *k != name) {
                assert_eq!(m.param(other), None, "{other} in {text}");
            }
        }
    }
    // Past the indexed members, a known one is found by the walk.
    let text =
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1,"b":2,"c":3,"d":4,"taskId":"x"}}"#;
    let m = Message::parse_checked(Bytes::from_static(text.as_bytes())).unwrap();
    assert_eq!(m.params.state, ParamsState::Walk);
    assert_eq!(m.param("taskId"), Some("\"x\""));
    assert_eq!(m.param_bytes("taskId"), Some(&b"\"x\""[..]));
    assert_eq!(m.param("task"), None);
    assert_eq!(m.param_bytes("task"), None);
}

/// `params._meta.<key>` set by splicing keeps every other byte, the envelope it keeps (not
/// parsed again) is what parsing the result notes, and `params`' members are found where a walk
/// of the result finds them (their places not noted again): every
/// shape of `params` (members before and after `_meta`, known and other keys, whitespace, an
/// empty `_meta` or `params`, the key there already, four members, none) (issue 34).
#[test]
fn a_meta_member_spliced_in_keeps_the_envelope_a_parse_would_make() {
    let tp = "\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"";
    let params = [
        r#"{"name":"echo","arguments":{"text":"hello"}}"#,
        r#"{"arguments":{"text":"hello"},"name":"echo"}"#,
        r#"{}"#,
        r#"{ }"#,
        r#"{ "name" : "x" , "_meta" : { "traceparent" : "old" , "p" : 1.50 } , "task":{"ttl":5} }"#,
        r#"{"_meta":{},"taskId":"t"}"#,
        r#"{"taskId":"t","_meta":{ }}"#,
        r#"{"_meta":{"progressToken":7},"name":"x","task":{},"requestId":3}"#,
        r#"{"a":1,"name":"x","task":{},"requestId":3}"#,
        r#"{"a":1,"b":2,"c":3,"d":4,"taskId":"x"}"#,
        r#"{"_meta":{"traceparent":"a","traceparent":"b"},"name":"x"}"#,
        r#"{"_meta":{"tr\u0061ceparent":"a"}}"#,
    ];
    for p in params {
        for head in [
            r#""jsonrpc":"2.0","id":1,"method":"tools/call""#,
            r#""method":"n","jsonrpc":"2.0""#,
        ] {
            let text = format!(r#"{{{head},"params":{p}}}"#);
            let m = Message::parse(Bytes::from(text.clone())).unwrap();
            let out = m
                .with_meta_member("traceparent", tp.as_bytes())
                .expect(&text);
            let again = Message::parse(out.bytes().clone()).unwrap();
            assert_eq!(
                (out.kind, &out.id, &out.method),
                (again.kind, &again.id, &again.method),
                "{text}"
            );
            // Its places are not noted again: a look-up walks (and finds what a walk finds).
            assert_eq!(out.params.state, ParamsState::Walk, "{text}");
            // What a walk of the spliced bytes finds.
            let walked = splice::raw_at(out.bytes(), &["params", "_meta", "traceparent"]).unwrap();
            assert_eq!(walked.map(RawValue::get), Some(tp), "{text}");
            for name in [
                "name",
                "arguments",
                "task",
                "taskId",
                "requestId",
                "_meta",
                "a",
                "d",
            ] {
                let walked = splice::raw_at(out.bytes(), &["params", name])
                    .unwrap()
                    .map(RawValue::get);
                assert_eq!(out.param(name), walked, "{name} in {text}");
            }
        }
    }
    // No `params`: added, the envelope kept.
    let m = Message::parse(Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":7,"method":"m"}"#,
    ))
    .unwrap();
    let out = m.with_meta_member("traceparent", tp.as_bytes()).unwrap();
    let again = Message::parse(out.bytes().clone()).unwrap();
    assert_eq!(
        (out.kind, &out.id, &out.method),
        (again.kind, &again.id, &again.method)
    );
    assert_eq!(out.params(), again.params());
    // The spliced bytes.
    let m = Message::parse(Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{ "a" : 1 }}"#,
    ))
    .unwrap();
    assert_eq!(
        m.with_meta_member("k", b"2").unwrap().bytes(),
        &br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"k":2}, "a" : 1 }}"#[..]
    );
    // Not a request or notification, params or _meta not an object: nothing.
    for text in [
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1]}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":[]}}"#,
    ] {
        let m = Message::parse(Bytes::from(text.to_string())).unwrap();
        assert!(m.with_meta_member("k", b"1").is_none(), "{text}");
    }
}

/// `with_meta_member_at` says where the value starts in the spliced bytes, in every shape
/// (the value replaced, the member added to `_meta`, `_meta` added, `params` added, a `params`
/// walked), and a message of at most `CARVED_MESSAGE` bytes is carved from its thread's buffer
/// (shared with it: a slice of it, the upstream client's `traceparent` header value, is no
/// copy) while a longer one has a `Vec` of its own; both byte for byte what
/// `with_meta_member` makes (issue 34).
#[test]
fn a_spliced_meta_member_is_found_where_it_is_said_to_start() {
    let value = br#""00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01""#;
    let pad = |n: usize| "p".repeat(n);
    for text in [
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"traceparent":"x"}}}"#
            .to_string(),
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"a":1}}}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"name":"echo"}}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{ }}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#.to_string(),
        r#"{"method":"m","params":{"a":[{"b":1}],"a":2},"jsonrpc":"2.0","id":1}"#.to_string(),
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"s":"{}"}}}}"#,
            pad(800)
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"s":"{}"}}}}"#,
            pad(5000)
        ),
    ] {
        let m = Message::parse(Bytes::from(text.clone())).unwrap();
        let (out, at) = m
            .with_meta_member_at(br#""traceparent":"#, value)
            .expect(&text);
        assert_eq!(&out.bytes()[at..at + value.len()], &value[..], "{text}");
        let plain = m.with_meta_member("traceparent", value).unwrap();
        assert_eq!(out.bytes(), plain.bytes(), "{text}");
        let walked = splice::raw_at(out.bytes(), &["params", "_meta", "traceparent"]).unwrap();
        assert_eq!(
            walked.map(|v| v.get().as_bytes()),
            Some(&value[..]),
            "{text}"
        );
        // Carved, the message shares its thread's buffer; else it has a `Vec` of its own.
        let carved = out.bytes().len() <= CARVED_MESSAGE;
        assert_eq!(out.bytes().is_unique(), !carved, "{text}");
    }
}
