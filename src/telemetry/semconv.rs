//! The attribute names and values of the OpenTelemetry semantic conventions taskgate's spans
//! use: MCP (`mcp.*`, conventions for MCP, development status), JSON-RPC, GenAI, error, server
//! and network. The conventions' own Rust constants are deprecated upstream, so the names are
//! defined here once, and `tests::names_are_pinned` fails when one changes.

/// `mcp.method.name`: the JSON-RPC method of the request (`tools/call`, `tasks/get`).
pub const MCP_METHOD_NAME: &str = "mcp.method.name";
/// `mcp.protocol.version`: the MCP revision of the request (`2025-11-25`, `2026-07-28`).
pub const MCP_PROTOCOL_VERSION: &str = "mcp.protocol.version";
/// `mcp.session.id`: the client's `Mcp-Session-Id`.
pub const MCP_SESSION_ID: &str = "mcp.session.id";
/// `mcp.task.id`: the `taskId` the span concerns (an attribute, never a metric label).
pub const MCP_TASK_ID: &str = "mcp.task.id";
/// `jsonrpc.request.id`: the request's JSON-RPC id as text (a string id without its quotes).
pub const JSONRPC_REQUEST_ID: &str = "jsonrpc.request.id";
/// `gen_ai.tool.name`: the tool of a `tools/call`.
pub const GEN_AI_TOOL_NAME: &str = "gen_ai.tool.name";
/// `gen_ai.prompt.name`: the prompt of a `prompts/get`.
pub const GEN_AI_PROMPT_NAME: &str = "gen_ai.prompt.name";
/// `gen_ai.operation.name`: what the request does in GenAI terms ([`EXECUTE_TOOL`]).
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
/// `error.type`: the JSON-RPC error code as a string (`-32602`), [`TOOL_ERROR`] for a tool
/// result with `isError: true`, or the HTTP status of a non-2xx answer.
pub const ERROR_TYPE: &str = "error.type";
/// `server.address`: the upstream's host name or address.
pub const SERVER_ADDRESS: &str = "server.address";
/// `server.port`: the upstream's port.
pub const SERVER_PORT: &str = "server.port";
/// `network.transport`: [`TCP`] for a Streamable HTTP upstream, [`PIPE`] for a stdio one.
pub const NETWORK_TRANSPORT: &str = "network.transport";
/// `network.protocol.name`: `http` for a Streamable HTTP upstream.
pub const NETWORK_PROTOCOL_NAME: &str = "network.protocol.name";

/// `gen_ai.operation.name` of a `tools/call`.
pub const EXECUTE_TOOL: &str = "execute_tool";
/// `error.type` of a tool result with `isError: true`.
pub const TOOL_ERROR: &str = "tool_error";
/// `network.transport` over TCP.
pub const TCP: &str = "tcp";
/// `network.transport` over a child's stdin/stdout.
pub const PIPE: &str = "pipe";

/// The span event of the "status cancelled" audit fact (DESIGN.md, "Cancellation and the two
/// audit facts").
pub const EVENT_STATUS_CANCELLED: &str = "mcp.task.status_cancelled";
/// The span event of the "resources released" audit fact.
pub const EVENT_RESOURCES_RELEASED: &str = "mcp.task.resources_released";

/// The W3C Trace Context header and `params._meta` key (SEP-414) carrying the parent.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C Trace Context header and `params._meta` key carrying vendor state.
pub const TRACESTATE: &str = "tracestate";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_pinned() {
        let names = [
            (MCP_METHOD_NAME, "mcp.method.name"),
            (MCP_PROTOCOL_VERSION, "mcp.protocol.version"),
            (MCP_SESSION_ID, "mcp.session.id"),
            (MCP_TASK_ID, "mcp.task.id"),
            (JSONRPC_REQUEST_ID, "jsonrpc.request.id"),
            (GEN_AI_TOOL_NAME, "gen_ai.tool.name"),
            (GEN_AI_PROMPT_NAME, "gen_ai.prompt.name"),
            (GEN_AI_OPERATION_NAME, "gen_ai.operation.name"),
            (ERROR_TYPE, "error.type"),
            (SERVER_ADDRESS, "server.address"),
            (SERVER_PORT, "server.port"),
            (NETWORK_TRANSPORT, "network.transport"),
            (NETWORK_PROTOCOL_NAME, "network.protocol.name"),
            (EXECUTE_TOOL, "execute_tool"),
            (TOOL_ERROR, "tool_error"),
            (TCP, "tcp"),
            (PIPE, "pipe"),
            (TRACEPARENT, "traceparent"),
            (TRACESTATE, "tracestate"),
        ];
        for (constant, spelled) in names {
            assert_eq!(constant, spelled);
        }
    }
}
