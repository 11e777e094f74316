#!/usr/bin/env node
// An MCP server WITHOUT task support (no capabilities.tasks, no task store), built with the
// TypeScript SDK 1.32.2 low-level Server: the upstream of the gateway-owned tasks step
// (gateway-tasks.sh, issue 32), where taskgate runs the tasks itself (`tasks = "gateway"`).
//
//   node gateway-task-server.mjs [--port N]
//
// Prints one line `{"listening":"http://127.0.0.1:PORT/mcp","port":PORT,...}` on stdout. One
// Server + StreamableHTTPServerTransport per Mcp-Session-Id (SSE answers). Tools (none declares
// execution.taskSupport):
//   slow      args {duration_ms=1500, steps=5}: a progress notification per step (on the call's
//             progressToken, with a message "step i/n"), then "slow done"; it honours the
//             request's abort signal (notifications/cancelled): it stops at once and counts it
//   fail      a JSON-RPC error (-32000 "fail: it broke"), thrown from the handler
//   oops      a CallToolResult {isError:true}
//   stats     {started, aborted, finished} of `slow` so far, as JSON text (a plain call)
//   ask       asks the client (elicitation/create, "Proceed?", {ok: boolean}) during the call,
//             then answers "ask: <action> <content as JSON>" (the client's answer, as it came)

import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import { CallToolRequestSchema, ElicitResultSchema, ListToolsRequestSchema, McpError, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { listenAndAnnounce, newSessionId, parseArgs, sendJsonRpcHttpError, sleep } from './lib.mjs';

const args = parseArgs(process.argv.slice(2), { port: Number(process.env.PORT ?? 0) });
const log = (...a) => console.error('[gateway-task-server]', ...a);
const stats = { started: 0, aborted: 0, finished: 0 };
const text = t => ({ type: 'text', text: t });
const object = { type: 'object', properties: {} };

function buildServer() {
    const server = new Server({ name: 'taskgate-gateway-task-fixture', version: '1.0.0' }, { capabilities: { tools: {} } });
    server.setRequestHandler(ListToolsRequestSchema, async () => ({
        tools: [
            { name: 'slow', description: 'Steps with progress; honours cancellation', inputSchema: object },
            { name: 'fail', description: 'Answers a JSON-RPC error', inputSchema: object },
            { name: 'oops', description: 'Answers an isError result', inputSchema: object },
            { name: 'stats', description: 'Counts of slow calls', inputSchema: object },
            { name: 'ask', description: 'Asks the client (elicitation) during the call', inputSchema: object }
        ]
    }));
    server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
        const { name, arguments: a = {} } = request.params;
        switch (name) {
            case 'slow': {
                stats.started++;
                const steps = Number(a.steps ?? 5);
                const each = Number(a.duration_ms ?? 1500) / steps;
                const token = request.params._meta?.progressToken;
                for (let i = 1; i <= steps; i++) {
                    if (token !== undefined) {
                        await extra.sendNotification({
                            method: 'notifications/progress',
                            params: { progressToken: token, progress: i, total: steps, message: `step ${i}/${steps}` }
                        });
                    }
                    await Promise.race([sleep(each), new Promise(resolve => extra.signal.addEventListener('abort', resolve, { once: true }))]);
                    if (extra.signal.aborted) {
                        stats.aborted++;
                        log(`slow: aborted at step ${i} (${extra.signal.reason ?? 'no reason'})`);
                        throw new McpError(-32800, 'slow: cancelled');
                    }
                }
                stats.finished++;
                return { content: [text('slow done')] };
            }
            case 'fail':
                throw new McpError(-32000, 'fail: it broke');
            case 'oops':
                return { content: [text('oops: bad input')], isError: true };
            case 'stats':
                return { content: [text(JSON.stringify(stats))] };
            case 'ask': {
                const answer = await extra.sendRequest(
                    {
                        method: 'elicitation/create',
                        params: { message: 'Proceed?', requestedSchema: { type: 'object', properties: { ok: { type: 'boolean' } } } }
                    },
                    ElicitResultSchema,
                    { timeout: 30000 }
                );
                log(`ask: the client answered ${answer.action}`);
                return { content: [text(`ask: ${answer.action} ${JSON.stringify(answer.content ?? {})}`)] };
            }
            default:
                throw new McpError(-32602, `unknown tool ${name}`);
        }
    });
    return server;
}

const app = createMcpExpressApp({ host: '127.0.0.1' });
const sessions = new Map(); // Mcp-Session-Id -> transport

app.post('/mcp', async (req, res) => {
    const sessionId = req.headers['mcp-session-id'];
    try {
        if (sessionId) {
            const transport = sessions.get(sessionId);
            if (!transport) return sendJsonRpcHttpError(res, 404, -32001, 'Session not found');
            return await transport.handleRequest(req, res, req.body);
        }
        if (!isInitializeRequest(req.body)) return sendJsonRpcHttpError(res, 400, -32000, 'Bad Request: Mcp-Session-Id header is required');
        const server = buildServer();
        const transport = new StreamableHTTPServerTransport({
            sessionIdGenerator: newSessionId,
            onsessioninitialized: id => sessions.set(id, transport)
        });
        transport.onclose = () => {
            if (transport.sessionId) sessions.delete(transport.sessionId);
        };
        await server.connect(transport);
        await transport.handleRequest(req, res, req.body);
    } catch (error) {
        log('POST /mcp failed:', error);
        if (!res.headersSent) sendJsonRpcHttpError(res, 500, -32603, 'Internal server error');
    }
});
const bySession = async (req, res) => {
    const sessionId = req.headers['mcp-session-id'];
    if (!sessionId) return sendJsonRpcHttpError(res, 400, -32000, 'Bad Request: Mcp-Session-Id header is required');
    const transport = sessions.get(sessionId);
    if (!transport) return sendJsonRpcHttpError(res, 404, -32001, 'Session not found');
    try {
        await transport.handleRequest(req, res);
    } catch (error) {
        log(`${req.method} /mcp failed:`, error);
        if (!res.headersSent) sendJsonRpcHttpError(res, 500, -32603, 'Internal server error');
    }
};
app.get('/mcp', bySession);
app.delete('/mcp', bySession);

await listenAndAnnounce(app, args.port, { server: 'gateway-task-fixture' }, async () => {
    for (const transport of sessions.values()) await transport.close().catch(() => {});
});
