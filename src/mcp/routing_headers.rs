//! The 2026-07-28 routing headers `Mcp-Method` and `Mcp-Name` (spec 2026-07-28, transports:
//! "HTTP headers"): what they must say, how a value that is not header-safe is written
//! (`=?base64?…?=`), and whether a request's headers agree with its body. No I/O.
//!
//! taskgate authorises and routes by the body; an upstream or a balancer may route by these
//! headers. So the edge checks them once, before any layer decides anything ([`check`]):
//!
//! | request | answer |
//! |---|---|
//! | `Mcp-Method` present and not the body's `method` | 400 `-32020` HeaderMismatch |
//! | `Mcp-Name` present and malformed (not visible ASCII, a `=?base64?…?=` form that is not valid base64 of UTF-8) | 400 `-32020` |
//! | `Mcp-Name` present and not the body's name ([`name_param`]) | 400 `-32020` |
//! | either sent on two header lines | 400 `-32020` |
//! | a 2026-07-28 request without `Mcp-Method`, or without `Mcp-Name` on `tools/call`, `resources/read`, `prompts/get` | 400 `-32020` ([`Routing::refusal_for_modern`]) |
//! | a 2026-07-28 `tasks/*` request without `Mcp-Name` | passes; the upstream leg gets it ([`Routing::missing`]) |
//!
//! A missing `Mcp-Name` on `tasks/*` passes on the client side because `fastmcp.Client` 4.1.4
//! leaves it out there; the upstream still gets what the spec requires, derived from the body.

use crate::jsonrpc::Message;
use http::{HeaderMap, HeaderName, HeaderValue};

/// `Mcp-Method`: the JSON-RPC method of the request.
pub static MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name`: the name the request acts on ([`name_param`]).
pub static MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// The `params` member `Mcp-Name` carries for `method`: `name` for `tools/call` and
/// `prompts/get`, `uri` for `resources/read`, `taskId` for `tasks/*`; `None` for a method
/// without one.
pub fn name_param(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        m if m.starts_with("tasks/") => Some("taskId"),
        _ => None,
    }
}

/// `value` as an `Mcp-Name`/`Mcp-Param-*` header value: as it is when it is visible ASCII or
/// spaces without leading or trailing whitespace, else `=?base64?<standard base64 of its UTF-8>?=`.
pub fn encode(value: &str) -> HeaderValue {
    let safe = value.bytes().all(|b| (0x20..0x7f).contains(&b)) && value.trim() == value;
    if safe && !value.starts_with("=?base64?") {
        if let Ok(v) = HeaderValue::from_str(value) {
            return v;
        }
    }
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(value);
    HeaderValue::from_str(&format!("=?base64?{b64}?=")).expect("base64 is visible ASCII")
}

/// The text an `Mcp-Name` value stands for (see [`encode`]). Errors: a value that is not
/// visible ASCII and spaces, or a `=?base64?…?=` form that is not valid base64 of UTF-8; the
/// message says which.
pub fn decode(value: &HeaderValue) -> Result<String, String> {
    let raw = value
        .to_str()
        .ok()
        .filter(|s| s.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .ok_or("Mcp-Name must be visible ASCII (other values are sent as =?base64?...?=)")?;
    let Some(b64) = raw
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    else {
        return Ok(raw.to_string());
    };
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("Mcp-Name: the =?base64?...?= form is not valid base64 ({e})"))?;
    String::from_utf8(bytes).map_err(|_| "Mcp-Name: the base64 form is not UTF-8".to_string())
}

/// What a request's routing headers lack, to be added on the upstream leg of a 2026-07-28
/// request.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Routing {
    /// The headers to add (the body's method; its name, encoded), in that order.
    pub missing: Vec<(&'static HeaderName, HeaderValue)>,
}

impl Routing {
    /// For a 2026-07-28 request (2026-07-28 §2.2, "missing header → 400 `-32020`"): the
    /// `-32020` message when a header the spec requires is missing, `None` when the request
    /// may go on. `Mcp-Method` is required on every request, `Mcp-Name` on `tools/call`,
    /// `resources/read` and `prompts/get`; a missing `Mcp-Name` on `tasks/*` is tolerated
    /// (`fastmcp.Client` 4.1.4 omits it) and added on the upstream leg from `params.taskId`.
    pub fn refusal_for_modern(&self, method: &str) -> Option<String> {
        let lacks = |name: &HeaderName| self.missing.iter().any(|(n, _)| *n == name);
        if lacks(&MCP_METHOD) {
            return Some(format!(
                "Header mismatch: Mcp-Method is required on 2026-07-28 requests (the body's method is {method:?})"
            ));
        }
        if lacks(&MCP_NAME) && !method.starts_with("tasks/") {
            return Some(format!(
                "Header mismatch: Mcp-Name is required on a 2026-07-28 {method}"
            ));
        }
        None
    }
}

/// Checks `headers` against `msg` (see the module docs); `Ok` carries what a 2026-07-28 request
/// must gain upstream. Errors: the `-32020` message naming the header and what was wrong.
///
/// Cost: the body is read for its name only when `Mcp-Name` is present or must be added, and
/// then as a borrowed look at `params`.
pub fn check(headers: &HeaderMap, msg: &Message) -> Result<Routing, String> {
    let Some(method) = msg.method() else {
        return Ok(Routing::default());
    };
    let mut routing = Routing::default();
    let mut methods = headers.get_all(&MCP_METHOD).iter();
    match (methods.next(), methods.next()) {
        (_, Some(_)) => return Err("Header mismatch: Mcp-Method was sent more than once".into()),
        (Some(v), None) => {
            if v.as_bytes() != method.as_bytes() {
                return Err(format!(
                    "Header mismatch: Mcp-Method {:?} is not the body's method {method:?}",
                    String::from_utf8_lossy(v.as_bytes())
                ));
            }
        }
        (None, None) => {
            if let Ok(v) = HeaderValue::from_str(method) {
                routing.missing.push((&MCP_METHOD, v));
            }
        }
    }
    let mut names = headers.get_all(&MCP_NAME).iter();
    let sent = match (names.next(), names.next()) {
        (_, Some(_)) => return Err("Header mismatch: Mcp-Name was sent more than once".into()),
        (Some(v), None) => Some(decode(v).map_err(|e| format!("Header mismatch: {e}"))?),
        (None, None) => None,
    };
    let Some(key) = name_param(method) else {
        return match sent {
            Some(_) => Err(format!(
                "Header mismatch: Mcp-Name was sent, but {method} names nothing"
            )),
            None => Ok(routing),
        };
    };
    let body_name = body_name(msg, key);
    match (sent, body_name) {
        (Some(s), Some(b)) if s == b => {}
        (Some(s), Some(b)) => {
            return Err(format!(
                "Header mismatch: Mcp-Name {s:?} is not params.{key} ({b:?})"
            ))
        }
        (Some(s), None) => {
            // Present but not a string (`"taskId": 5`) is not "absent": say what it is.
            let found = match msg.param(key) {
                None => "absent".to_string(),
                Some(raw) => format!("{}, not a string", crate::jsonrpc::kind_of(raw)),
            };
            return Err(format!(
                "Header mismatch: Mcp-Name {s:?} is not params.{key} ({found})"
            ));
        }
        (None, Some(b)) => routing.missing.push((&MCP_NAME, encode(&b))),
        (None, None) => {}
    }
    Ok(routing)
}

/// `params.<key>` of `msg` when it is a string (read from the places the envelope parse noted,
/// [`Message::param`], not by walking the body again).
fn body_name(msg: &Message, key: &str) -> Option<String> {
    serde_json::from_str::<String>(msg.param(key)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn msg(text: &str) -> Message {
        Message::parse(Bytes::from(text.to_string())).unwrap()
    }

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const GET: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"t-1"}}"#;

    #[test]
    fn agreeing_headers_pass_and_missing_ones_are_derived() {
        let ok = headers(&[(&MCP_METHOD, "tasks/get"), (&MCP_NAME, "t-1")]);
        assert_eq!(check(&ok, &msg(GET)), Ok(Routing::default()));
        let derived = check(&HeaderMap::new(), &msg(GET)).unwrap();
        assert_eq!(
            derived.missing,
            vec![
                (&MCP_METHOD, HeaderValue::from_static("tasks/get")),
                (&MCP_NAME, HeaderValue::from_static("t-1"))
            ]
        );
        let odd = msg(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":" é "}}"#);
        let r = check(&headers(&[(&MCP_METHOD, "tools/call")]), &odd).unwrap();
        assert_eq!(r.missing[0].1, "=?base64?IMOpIA==?=");
        let encoded = headers(&[(&MCP_NAME, "=?base64?IMOpIA==?=")]);
        assert!(check(&encoded, &odd).is_ok());
        let list = msg(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        assert!(check(&headers(&[(&MCP_METHOD, "tools/list")]), &list).is_ok());
    }

    #[test]
    fn disagreeing_or_malformed_headers_are_refused() {
        let cases: [&[(&HeaderName, &str)]; 6] = [
            &[(&MCP_METHOD, "tasks/cancel")],
            &[(&MCP_NAME, "t-2")],
            &[(&MCP_NAME, "=?base64?not base64!?=")],
            &[(&MCP_NAME, "=?base64?/w==?=")],
            &[(&MCP_NAME, "t-1"), (&MCP_NAME, "t-1")],
            &[(&MCP_METHOD, "tasks/get"), (&MCP_METHOD, "tasks/get")],
        ];
        for h in cases {
            let e = check(&headers(h), &msg(GET)).unwrap_err();
            assert!(e.starts_with("Header mismatch"), "{h:?}: {e}");
        }
        let mut bytes = HeaderMap::new();
        bytes.insert(&MCP_NAME, HeaderValue::from_bytes(b"t-\xff").unwrap());
        assert!(check(&bytes, &msg(GET)).is_err());
        let list = msg(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        assert!(check(&headers(&[(&MCP_NAME, "x")]), &list).is_err());
        // A taskId that is there but not a string is named as what it is, not "absent".
        let numeric = msg(r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":5}}"#);
        let e = check(&headers(&[(&MCP_NAME, "5")]), &numeric).unwrap_err();
        assert!(
            e.ends_with("is not params.taskId (a number, not a string)"),
            "{e}"
        );
        let none = msg(r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{}}"#);
        let e = check(&headers(&[(&MCP_NAME, "5")]), &none).unwrap_err();
        assert!(e.ends_with("is not params.taskId (absent)"), "{e}");
    }

    /// 2026-07-28 §2.2: a missing header is refused like a mismatch, but for `Mcp-Name` on
    /// `tasks/*` (what `fastmcp.Client` 4.1.4 sends), which is derived instead.
    #[test]
    fn a_2026_request_must_carry_its_headers_but_tasks_may_lack_mcp_name() {
        let refusal = |h: &[(&HeaderName, &str)], body: &str| {
            let m = msg(body);
            check(&headers(h), &m)
                .unwrap()
                .refusal_for_modern(m.method().unwrap())
        };
        assert!(refusal(&[], GET)
            .unwrap()
            .contains("Mcp-Method is required"));
        assert_eq!(refusal(&[(&MCP_METHOD, "tasks/get")], GET), None);
        let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}"#;
        assert!(refusal(&[(&MCP_METHOD, "tools/call")], call)
            .unwrap()
            .contains("Mcp-Name is required"));
        assert_eq!(
            refusal(&[(&MCP_METHOD, "tools/call"), (&MCP_NAME, "echo")], call),
            None
        );
        let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        assert_eq!(refusal(&[(&MCP_METHOD, "tools/list")], list), None);
    }

    #[test]
    fn encode_and_decode_agree() {
        for v in ["plain", " lead", "tab\t", "ünï", "=?base64?x?=", ""] {
            assert_eq!(decode(&encode(v)).unwrap(), v, "{v:?}");
        }
    }
}
