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
