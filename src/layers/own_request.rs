//! taskgate's own requests: the ones it sends upstream on its own rather than forwarding a
//! client's, built one way. About a task: `observe`'s `tasks/cancel` of a task it could not
//! record (`Undo`), `cancel`'s `tasks/get` after a forwarded 2026-07-28 cancel was acknowledged,
//! `lost_task`'s `tasks/get` after a `tasks/*` was answered `-32602` (is the task lost?), and the
//! `bridge`'s
//! `tasks/*` requests; the bridges' other requests (`server/discover`, a translated call) take
//! their context and message from here too. Not yet: `upgrade`'s requests, the reverse
//! bridge's 2025 bodies and the MRTR retry (ARCHITECTURE.md says why).
//!
//! - **Id**: taskgate's own ([`own_id`]: `"taskgate-<purpose>-<n>"`, a string no client id
//!   equals by type and prefix, from one sequence). The bridge and the relay number theirs
//!   from their own per-upstream sequence (`relay::OwnIds`, shared with their tokens).
//! - **Context** ([`context`]): the one of the request it follows (its upstream, session and
//!   headers, which may carry credentials), with the headers that describe that request
//!   removed (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`) and, under 2026-07-28, the ones that
//!   describe this one set: no session, `MCP-Protocol-Version: 2026-07-28`, `Mcp-Method` and
//!   `Mcp-Name` matching the body (2026-07-28 §2.2: a server rejects a request whose routing
//!   headers disagree with its body). A 2025-11-25 request keeps the session and version it
//!   follows and carries no routing headers (that era has none).
//! - **Body** ([`message`]): formatted once from its parts and parsed once.
//! - **About a task** ([`task_request`]): `params` `{taskId}` (plus the required `_meta` under
//!   2026-07-28), the era as a request extension, and the whole exchange bounded by the
//!   upstream's `timeout_ms` (`Deadline::Exchange`, a streamed answer included). A caller that
//!   holds the task's record adds its `AuthorisedTask` (`observe` applies the answer then).
//! - **Its answer** ([`ask`]): the reply read up to the message answering its id
//!   ([`McpReply::answer_to`]).

use crate::exchange::{Deadline, McpReply, McpRequest, Operation, RequestContext, RequestParts};
use crate::jsonrpc::{Id, Message};
use crate::mcp::era::{Era, MODERN_VERSION};
use crate::mcp::routing_headers::{self, MCP_METHOD, MCP_NAME};
use bytes::Bytes;
use http::HeaderValue;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};

/// The sequence of [`own_id`].
static OWN_IDS: AtomicU64 = AtomicU64::new(1);

/// A fresh id for one of taskgate's own requests: `"taskgate-<purpose>-<n>"` (`purpose` says
/// which, in logs and in what the upstream received).
pub(crate) fn own_id(purpose: &str) -> Id {
    let n = OWN_IDS.fetch_add(1, Ordering::Relaxed);
    Id::from_json(&format!("\"taskgate-{purpose}-{n}\"")).expect("a JSON string")
}

/// The context of taskgate's own `method` request (about `name`: a task id, a tool name) in
/// `era`, from `ctx`, the context of the request it follows (see the module docs).
pub(crate) fn context(
    ctx: &RequestContext,
    era: Era,
    method: &str,
    name: Option<&str>,
) -> RequestContext {
    let mut ctx = ctx.clone();
    let stale: Vec<http::HeaderName> = ctx
        .headers
        .keys()
        .filter(|n| *n == MCP_METHOD || *n == MCP_NAME || n.as_str().starts_with("mcp-param-"))
        .cloned()
        .collect();
    for name in stale {
        ctx.headers.remove(name);
    }
    if era == Era::Modern {
        ctx.session_id = None;
        ctx.headers.insert(
            &crate::headers::MCP_PROTOCOL_VERSION,
            HeaderValue::from_static(MODERN_VERSION),
        );
        // A method that cannot be a header value goes without `Mcp-Method` (found by fuzzing
        // the bridge, which sends a client's method on).
        if let Ok(m) = HeaderValue::from_str(method) {
            ctx.headers.insert(&MCP_METHOD, m);
        }
        if let Some(n) = name {
            ctx.headers.insert(&MCP_NAME, routing_headers::encode(n));
        }
    }
    ctx
}

/// The JSON-RPC request `method` with `params` under `id`, formatted once and parsed once.
pub(crate) fn message(id: &Id, method: &str, params: &Value) -> Message {
    let text = format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":{},"params":{params}}}"#,
        id.as_json(),
        Value::String(method.to_string()),
    );
    Message::parse(Bytes::from(text)).expect("a request made of an id, a string and a JSON value")
}

/// taskgate's own `method` (`tasks/get`, `tasks/cancel`) about `task_id` under `id`, in `era`,
/// following a request whose context is `ctx` (see the module docs). Its extensions: the era
/// and `Deadline::Exchange`; add the task's `AuthorisedTask` when its record is at hand.
pub(crate) fn task_request(
    ctx: &RequestContext,
    era: Era,
    method: &str,
    task_id: &str,
    id: &Id,
) -> McpRequest {
    let params = match era {
        Era::Legacy => serde_json::json!({ "taskId": task_id }),
        Era::Modern => serde_json::json!({
            "taskId": task_id,
            "_meta": crate::mcp::modern::modern_meta(None),
        }),
    };
    let mut extensions = http::Extensions::new();
    extensions.insert(era);
    // Bounded whole by the upstream's `timeout_ms`, a streamed answer included.
    extensions.insert(Deadline::Exchange);
    McpRequest::from(RequestParts {
        op: Operation::Post(message(id, method, &params)),
        ctx: context(ctx, era, method, Some(task_id)),
        extensions,
        trace: None,
    })
}

/// Sends `req` (one of taskgate's own, with an id) through `inner` and reads its reply up to
/// the message answering it (JSON or SSE, within the request's deadline): that message;
/// `Ok(None)` when the reply holds none.
pub(crate) async fn ask<S>(inner: &mut S, req: McpRequest) -> Result<Option<Bytes>, S::Error>
where
    S: tower::Service<McpRequest, Response = McpReply>,
{
    use tower::ServiceExt;
    let Some(id) = req.id().cloned() else {
        return Ok(None);
    };
    let reply = inner.ready().await?.call(req).await?;
    Ok(reply.answer_to(&id).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client_ctx() -> RequestContext {
        let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}"#;
        let mut ctx = crate::layers::testing::request(call).ctx.clone();
        ctx.session_id = Some(HeaderValue::from_static("s-1"));
        let h = &mut ctx.headers;
        h.insert(&MCP_METHOD, HeaderValue::from_static("tools/call"));
        h.insert(&MCP_NAME, HeaderValue::from_static("slow"));
        h.insert("mcp-param-city", HeaderValue::from_static("Paris"));
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        ctx
    }

    #[test]
    fn a_2026_request_names_itself_in_its_headers() {
        let req = task_request(&client_ctx(), Era::Modern, "tasks/get", "t é", &own_id("x"));
        let h = &req.ctx.headers;
        assert_eq!(h[&MCP_METHOD], "tasks/get");
        assert_eq!(h[&MCP_NAME], routing_headers::encode("t é"));
        assert!(h.get("mcp-param-city").is_none());
        assert_eq!(h[&crate::headers::MCP_PROTOCOL_VERSION], MODERN_VERSION);
        assert_eq!(h["authorization"], "Bearer t", "credentials kept");
        assert!(req.ctx.session_id.is_none());
        assert_eq!(req.era(), Era::Modern);
        assert!(req.extensions.get::<Deadline>().is_some());
        assert_eq!(req.request_method(), Some("tasks/get"));
        let params: Value = serde_json::from_str(req_params(&req)).unwrap();
        assert_eq!(params["taskId"], "t é");
        assert_eq!(
            params["_meta"][crate::mcp::era::PROTOCOL_VERSION_META],
            MODERN_VERSION
        );
    }

    #[test]
    fn a_2025_request_keeps_its_session_and_no_routing_header() {
        let id = own_id("lost-check");
        assert!(id.as_json().starts_with("\"taskgate-lost-check-"));
        let req = task_request(&client_ctx(), Era::Legacy, "tasks/cancel", "t1", &id);
        let h = &req.ctx.headers;
        assert!(h.get(&MCP_METHOD).is_none() && h.get(&MCP_NAME).is_none());
        assert!(h.get("mcp-param-city").is_none());
        assert_eq!(req.ctx.session_id.as_ref().unwrap(), "s-1");
        assert_eq!(req.era(), Era::Legacy);
        assert_eq!(req.id(), Some(&id));
        assert_eq!(req_params(&req), r#"{"taskId":"t1"}"#);
    }

    fn req_params(req: &McpRequest) -> &str {
        match &req.op {
            Operation::Post(m) => m.params().unwrap(),
            _ => panic!("a POST"),
        }
    }
}
