#!/usr/bin/env node
// Conformance fixture: an MCP server built with the TypeScript SDK 1.32.2 (McpServer +
// StreamableHTTPServerTransport on express) that offers the tools, resources and prompts the
// server scenarios of @modelcontextprotocol/conformance 0.1.16 call (`conformance list --server`).
//
//   node conformance-server.mjs [--port N]      (port 0 or absent: any free port; env PORT also works)
//
// Prints one line `{"listening":"http://127.0.0.1:PORT/mcp","port":PORT}` on stdout once bound.
//
// Design choices that matter for a proxy in front of it:
// - Every server-to-client request (sampling/createMessage, elicitation/create) and every
//   notification (logging, progress) of a tools/call goes on that POST's own SSE stream
//   (`extra.sendRequest` / `extra.sendNotification` carry relatedRequestId), never on the GET
//   stream, so there is no race with the client opening its GET stream.
// - Each session has an in-memory event store and a retry interval, so POST streams start with a
//   priming event and can be resumed with `Last-Event-ID` (used by `test_reconnection`).
// - Host validation (DNS-rebinding protection) comes from the SDK's createMcpExpressApp: only
//   127.0.0.1 / localhost / [::1] Host headers are accepted, anything else gets 403.

import { McpServer, ResourceTemplate } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import { completable } from '@modelcontextprotocol/sdk/server/completable.js';
import {
    CreateMessageResultSchema,
    ElicitResultSchema,
    ListToolsRequestSchema,
    SubscribeRequestSchema,
    UnsubscribeRequestSchema,
    isInitializeRequest
} from '@modelcontextprotocol/sdk/types.js';
import * as z from 'zod';
import { MemoryEventStore, listenAndAnnounce, newSessionId, parseArgs, sendJsonRpcHttpError, sleep } from './lib.mjs';

const args = parseArgs(process.argv.slice(2), { port: Number(process.env.PORT ?? 0), 'retry-ms': 500 });

// 1x1 red PNG.
const PNG_BASE64 = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
const WAV_BASE64 = makeWavBase64();

/** 8 samples of 8-bit mono PCM silence at 8 kHz, as a complete RIFF/WAVE file. */
function makeWavBase64() {
    const samples = Buffer.alloc(8, 0x80);
    const header = Buffer.alloc(44);
    header.write('RIFF', 0);
    header.writeUInt32LE(36 + samples.length, 4);
    header.write('WAVE', 8);
    header.write('fmt ', 12);
    header.writeUInt32LE(16, 16); // fmt chunk size
    header.writeUInt16LE(1, 20); // PCM
    header.writeUInt16LE(1, 22); // mono
    header.writeUInt32LE(8000, 24); // sample rate
    header.writeUInt32LE(8000, 28); // byte rate
    header.writeUInt16LE(1, 32); // block align
    header.writeUInt16LE(8, 34); // bits per sample
    header.write('data', 36);
    header.writeUInt32LE(samples.length, 40);
    return Buffer.concat([header, samples]).toString('base64');
}

const text = t => ({ type: 'text', text: t });

/** Builds one McpServer (one per session: an McpServer serves a single transport). */
function buildServer() {
    const mcp = new McpServer(
        { name: 'taskgate-conformance-fixture', version: '1.0.0' },
        { capabilities: { logging: {}, resources: { subscribe: true, listChanged: true }, prompts: { listChanged: true }, tools: { listChanged: true } } }
    );

    // ---- tools -------------------------------------------------------------------------------
    mcp.registerTool('test_simple_text', { description: 'Returns one text item' }, async () => ({
        content: [text('This is a simple text response for testing.')]
    }));

    mcp.registerTool('test_image_content', { description: 'Returns one base64 PNG image item' }, async () => ({
        content: [{ type: 'image', data: PNG_BASE64, mimeType: 'image/png' }]
    }));

    mcp.registerTool('test_audio_content', { description: 'Returns one base64 WAV audio item' }, async () => ({
        content: [{ type: 'audio', data: WAV_BASE64, mimeType: 'audio/wav' }]
    }));

    mcp.registerTool('test_embedded_resource', { description: 'Returns one embedded text resource' }, async () => ({
        content: [
            { type: 'resource', resource: { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' } }
        ]
    }));

    mcp.registerTool('test_multiple_content_types', { description: 'Returns text, image and embedded resource items' }, async () => ({
        content: [
            text('Multiple content types test:'),
            { type: 'image', data: PNG_BASE64, mimeType: 'image/png' },
            {
                type: 'resource',
                resource: { uri: 'test://mixed-content-resource', mimeType: 'application/json', text: '{"test":"data","value":123}' }
            }
        ]
    }));

    mcp.registerTool('test_tool_with_logging', { description: 'Sends three info log notifications ~50 ms apart' }, async (extra) => {
        for (const [i, data] of ['Tool execution started', 'Tool processing data', 'Tool execution completed'].entries()) {
            if (i > 0) await sleep(50);
            await extra.sendNotification({ method: 'notifications/message', params: { level: 'info', logger: 'conformance-fixture', data } });
        }
        return { content: [text('Tool with logging executed successfully')] };
    });

    mcp.registerTool('test_tool_with_progress', { description: 'Reports progress 0, 50, 100 of 100 when given a progressToken' }, async (extra) => {
        const progressToken = extra._meta?.progressToken;
        for (const [i, progress] of [0, 50, 100].entries()) {
            if (i > 0) await sleep(50);
            if (progressToken !== undefined) {
                await extra.sendNotification({ method: 'notifications/progress', params: { progressToken, progress, total: 100 } });
            }
        }
        return { content: [text(`Progress tool completed (progressToken: ${progressToken ?? 'none'})`)] };
    });

    mcp.registerTool('test_error_handling', { description: 'Always fails with isError: true' }, async () => ({
        isError: true,
        content: [text('This tool intentionally returns an error for testing')]
    }));

    mcp.registerTool(
        'test_sampling',
        { description: 'Asks the client for sampling/createMessage on this POST stream', inputSchema: { prompt: z.string().describe('Prompt for the LLM') } },
        async ({ prompt }, extra) => {
            const result = await extra.sendRequest(
                { method: 'sampling/createMessage', params: { messages: [{ role: 'user', content: text(prompt) }], maxTokens: 100 } },
                CreateMessageResultSchema
            );
            const reply = result.content?.type === 'text' ? result.content.text : JSON.stringify(result.content);
            return { content: [text(`LLM response: ${reply}`)] };
        }
    );

    mcp.registerTool(
        'test_elicitation',
        { description: 'Asks the client for elicitation/create on this POST stream', inputSchema: { message: z.string().describe('Message shown to the user') } },
        async ({ message }, extra) => {
            const result = await extra.sendRequest(
                {
                    method: 'elicitation/create',
                    params: {
                        message,
                        requestedSchema: {
                            type: 'object',
                            properties: {
                                username: { type: 'string', description: "User's response" },
                                email: { type: 'string', description: "User's email address" }
                            },
                            required: ['username', 'email']
                        }
                    }
                },
                ElicitResultSchema
            );
            return { content: [text(`User response: action=${result.action}, content=${JSON.stringify(result.content ?? {})}`)] };
        }
    );

    mcp.registerTool('test_elicitation_sep1034_defaults', { description: 'Elicitation whose schema has defaults for every primitive type (SEP-1034)' }, async (extra) => {
        const result = await extra.sendRequest(
            {
                method: 'elicitation/create',
                params: {
                    message: 'Please review your details (defaults are filled in)',
                    requestedSchema: {
                        type: 'object',
                        properties: {
                            name: { type: 'string', description: 'Name', default: 'John Doe' },
                            age: { type: 'integer', description: 'Age', default: 30 },
                            score: { type: 'number', description: 'Score', default: 95.5 },
                            status: { type: 'string', description: 'Status', enum: ['active', 'inactive', 'pending'], default: 'active' },
                            verified: { type: 'boolean', description: 'Verified', default: true }
                        }
                    }
                }
            },
            ElicitResultSchema
        );
        return { content: [text(`Elicitation completed: action=${result.action}, content=${JSON.stringify(result.content ?? {})}`)] };
    });

    mcp.registerTool('test_elicitation_sep1330_enums', { description: 'Elicitation with the five enum schema variants (SEP-1330)' }, async (extra) => {
        const result = await extra.sendRequest(
            {
                method: 'elicitation/create',
                params: {
                    message: 'Pick some options',
                    requestedSchema: {
                        type: 'object',
                        properties: {
                            untitledSingle: { type: 'string', title: 'Untitled single', enum: ['option1', 'option2', 'option3'] },
                            titledSingle: {
                                type: 'string',
                                title: 'Titled single',
                                oneOf: [
                                    { const: 'value1', title: 'First Option' },
                                    { const: 'value2', title: 'Second Option' },
                                    { const: 'value3', title: 'Third Option' }
                                ]
                            },
                            legacyEnum: {
                                type: 'string',
                                title: 'Legacy titled',
                                enum: ['opt1', 'opt2', 'opt3'],
                                enumNames: ['Option One', 'Option Two', 'Option Three']
                            },
                            untitledMulti: {
                                type: 'array',
                                title: 'Untitled multi',
                                items: { type: 'string', enum: ['option1', 'option2', 'option3'] }
                            },
                            titledMulti: {
                                type: 'array',
                                title: 'Titled multi',
                                items: {
                                    anyOf: [
                                        { const: 'value1', title: 'First Choice' },
                                        { const: 'value2', title: 'Second Choice' },
                                        { const: 'value3', title: 'Third Choice' }
                                    ]
                                }
                            }
                        }
                    }
                }
            },
            ElicitResultSchema
        );
        return { content: [text(`Elicitation completed: action=${result.action}, content=${JSON.stringify(result.content ?? {})}`)] };
    });

    // Its advertised inputSchema is replaced below by a literal JSON Schema 2020-12 document:
    // McpServer only accepts zod schemas and would emit a draft-07 dialect.
    mcp.registerTool(
        'json_schema_2020_12_tool',
        { description: 'Tool whose inputSchema uses JSON Schema 2020-12 keywords ($schema, $defs, additionalProperties)' },
        async () => ({ content: [text('json_schema_2020_12_tool called')] })
    );

    mcp.registerTool(
        'test_reconnection',
        { description: 'Closes its POST SSE stream mid-call; the result is then delivered after a Last-Event-ID reconnect (SEP-1699)' },
        async (extra) => {
            // closeSSEStream exists only when the client's protocol version supports resumption.
            if (extra.closeSSEStream) {
                await extra.sendNotification({ method: 'notifications/message', params: { level: 'info', data: 'closing the stream, reconnect with Last-Event-ID' } });
                extra.closeSSEStream();
                await sleep(100);
            }
            return { content: [text('Reconnection test completed')] };
        }
    );

    const JSON_SCHEMA_2020_12 = {
        $schema: 'https://json-schema.org/draft/2020-12/schema',
        type: 'object',
        $defs: { address: { type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } } },
        properties: { name: { type: 'string' }, address: { $ref: '#/$defs/address' } },
        additionalProperties: false
    };
    // Wrap McpServer's own tools/list handler (installed by registerTool) and patch one schema.
    const listTools = mcp.server._requestHandlers.get('tools/list');
    mcp.server.setRequestHandler(ListToolsRequestSchema, async (request, extra) => {
        const result = await listTools(request, extra);
        for (const tool of result.tools) if (tool.name === 'json_schema_2020_12_tool') tool.inputSchema = JSON_SCHEMA_2020_12;
        return result;
    });

    // ---- resources ---------------------------------------------------------------------------
    mcp.registerResource('static-text', 'test://static-text', { description: 'Static text resource', mimeType: 'text/plain' }, async uri => ({
        contents: [{ uri: uri.href, mimeType: 'text/plain', text: 'This is the content of the static text resource.' }]
    }));
    mcp.registerResource('static-binary', 'test://static-binary', { description: 'Static binary (PNG) resource', mimeType: 'image/png' }, async uri => ({
        contents: [{ uri: uri.href, mimeType: 'image/png', blob: PNG_BASE64 }]
    }));
    mcp.registerResource(
        'template-data',
        new ResourceTemplate('test://template/{id}/data', { list: undefined }),
        { description: 'Resource template with an id parameter', mimeType: 'application/json' },
        async (uri, { id }) => ({
            contents: [{ uri: uri.href, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) }]
        })
    );
    let watchedVersion = 0;
    mcp.registerResource('watched-resource', 'test://watched-resource', { description: 'Subscribable resource', mimeType: 'text/plain' }, async uri => ({
        contents: [{ uri: uri.href, mimeType: 'text/plain', text: `Watched resource content, version ${watchedVersion}` }]
    }));
    const subscriptions = new Set();
    mcp.server.setRequestHandler(SubscribeRequestSchema, async request => {
        subscriptions.add(request.params.uri);
        // One update right away; it goes on the GET stream if the client opened one.
        watchedVersion++;
        mcp.server.sendResourceUpdated({ uri: request.params.uri }).catch(() => {});
        return {};
    });
    mcp.server.setRequestHandler(UnsubscribeRequestSchema, async request => {
        subscriptions.delete(request.params.uri);
        return {};
    });

    // ---- prompts -----------------------------------------------------------------------------
    mcp.registerPrompt('test_simple_prompt', { description: 'Prompt without arguments' }, async () => ({
        messages: [{ role: 'user', content: text('This is a simple prompt for testing.') }]
    }));
    mcp.registerPrompt(
        'test_prompt_with_arguments',
        {
            description: 'Prompt with two required arguments',
            argsSchema: {
                arg1: completable(z.string().describe('First test argument'), value =>
                    ['paris', 'park', 'party', 'test-value'].filter(v => v.startsWith(value))
                ),
                arg2: z.string().describe('Second test argument')
            }
        },
        async ({ arg1, arg2 }) => ({
            messages: [{ role: 'user', content: text(`Prompt with arguments: arg1='${arg1}', arg2='${arg2}'`) }]
        })
    );
    mcp.registerPrompt(
        'test_prompt_with_embedded_resource',
        { description: 'Prompt embedding the resource named by resourceUri', argsSchema: { resourceUri: z.string().describe('URI of the resource to embed') } },
        async ({ resourceUri }) => ({
            messages: [
                { role: 'user', content: { type: 'resource', resource: { uri: resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' } } },
                { role: 'user', content: text('Please process the embedded resource above.') }
            ]
        })
    );
    mcp.registerPrompt('test_prompt_with_image', { description: 'Prompt with an image' }, async () => ({
        messages: [
            { role: 'user', content: { type: 'image', data: PNG_BASE64, mimeType: 'image/png' } },
            { role: 'user', content: text('Please analyze the image above.') }
        ]
    }));

    return mcp;
}

// ---- HTTP: one transport + McpServer per session ----------------------------------------------
const sessions = new Map(); // Mcp-Session-Id -> { transport, mcp }
const app = createMcpExpressApp({ host: '127.0.0.1' });

app.post('/mcp', async (req, res) => {
    const sessionId = req.headers['mcp-session-id'];
    try {
        if (sessionId) {
            const session = sessions.get(sessionId);
            if (!session) return sendJsonRpcHttpError(res, 404, -32001, 'Session not found');
            return await session.transport.handleRequest(req, res, req.body);
        }
        if (!isInitializeRequest(req.body)) return sendJsonRpcHttpError(res, 400, -32000, 'Bad Request: Mcp-Session-Id header is required');
        const mcp = buildServer();
        const transport = new StreamableHTTPServerTransport({
            sessionIdGenerator: newSessionId,
            eventStore: new MemoryEventStore(),
            retryInterval: args['retry-ms'],
            onsessioninitialized: id => sessions.set(id, { transport, mcp })
        });
        transport.onclose = () => {
            if (transport.sessionId) sessions.delete(transport.sessionId);
        };
        await mcp.connect(transport);
        await transport.handleRequest(req, res, req.body);
    } catch (error) {
        console.error('POST /mcp failed:', error);
        if (!res.headersSent) sendJsonRpcHttpError(res, 500, -32603, 'Internal server error');
    }
});

const bySession = async (req, res) => {
    const sessionId = req.headers['mcp-session-id'];
    if (!sessionId) return sendJsonRpcHttpError(res, 400, -32000, 'Bad Request: Mcp-Session-Id header is required');
    const session = sessions.get(sessionId);
    if (!session) return sendJsonRpcHttpError(res, 404, -32001, 'Session not found');
    try {
        await session.transport.handleRequest(req, res);
    } catch (error) {
        console.error(`${req.method} /mcp failed:`, error);
        if (!res.headersSent) sendJsonRpcHttpError(res, 500, -32603, 'Internal server error');
    }
};
app.get('/mcp', bySession);
app.delete('/mcp', bySession);

await listenAndAnnounce(app, args.port, { server: 'conformance-fixture' }, async () => {
    for (const { transport } of sessions.values()) await transport.close().catch(() => {});
});
