#!/usr/bin/env node
// Task-capable MCP server (2025-11-25 experimental tasks) built with the TypeScript SDK 1.32.2.
//
//   node task-server.mjs --mode stateful|stateless|json|notasks|legacy|stdio [--port N]
//
// Prints one line `{"listening":"http://127.0.0.1:PORT/mcp","port":PORT,"mode":MODE}` on stdout.
//
// capabilities.tasks = {list:{}, cancel:{}, requests:{tools:{call:{}}}}; tools:
//   slow_task     taskSupport required  args {duration_ms=1500, steps=5}: progress each step, then completes
//   fast_task     taskSupport optional  args {text="fast"}: completes after ~50 ms
//   failing_task  taskSupport optional  no args: ends `failed` with a CallToolResult {isError:true}
//   plain_echo    no taskSupport        args {text}: answers at once (plain tools/call only)
//   ask_task      taskSupport required  args {question}: goes input_required and sends elicitation/create
//                 (related to the task, so it is queued and delivered on the tasks/result stream)
//                 whatever the client declared; completes with the answer, or stays put if none comes
//   race_task     taskSupport optional  args {delay_ms=0..60000}: completes after delay_ms (the client
//                 picks it at random for cancel-vs-completion races), unless cancelled first
//
// Modes:
//   stdio      one client on stdin/stdout (StdioServerTransport), the stateful mode's tools.
//   stateful   one McpServer + StreamableHTTPServerTransport per Mcp-Session-Id, SSE responses.
//   json       as stateful, but enableJsonResponse: true (POST answers are application/json).
//   notasks    as stateful, but WITHOUT capabilities.tasks (no task store): tools plain_echo and
//              fast_task, both plain (no execution.taskSupport). The SDK refuses a tools/call carrying
//              params.task itself, as the Protocol checks the server's tasks capability first
//              (a JSON-RPC error "Server does not support task creation ...").
//   legacy     as notasks, but tools/call's params.task is dropped before the SDK sees it, like a
//              server from before tasks that ignores unknown params: a plain CallToolResult comes back.
//   stateless  sessionIdGenerator undefined: a fresh McpServer + transport per POST, closed when the
//              response ends. The InMemoryTaskStore and InMemoryTaskMessageQueue are created once
//              and shared by every per-request server, so a task outlives the request that created
//              it; the background work writes to that shared store. Tasks are not bound to any
//              session (the store sees sessionId undefined), tasks/list shows every task.
//
// Where notifications go (what a client can observe, per mode):
//   progress #0 for slow_task is sent on the tools/call POST stream before CreateTaskResult
//     (stateful only: a JSON response carries no notifications, stateless too if json).
//   later progress and notifications/tasks/status go to the session's GET stream (stateful, json);
//     in stateless mode there is no stream to reach after the POST ended, so they are dropped.
//   Work stops at the next step once the task is cancelled (tasks/cancel); its result is discarded.

import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import { InMemoryTaskMessageQueue, InMemoryTaskStore, isTerminal } from '@modelcontextprotocol/sdk/experimental/tasks';
import { ElicitResultSchema, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import * as z from 'zod';
import { listenAndAnnounce, newSessionId, parseArgs, sendJsonRpcHttpError, sleep } from './lib.mjs';

const args = parseArgs(process.argv.slice(2), { mode: 'stateful', port: Number(process.env.PORT ?? 0), 'poll-interval-ms': 200 });
const NO_TASKS = ['notasks', 'legacy'].includes(args.mode);
if (!['stateful', 'stateless', 'json', 'notasks', 'legacy', 'stdio'].includes(args.mode)) {
    console.error(`--mode must be stateful, stateless, json, notasks, legacy or stdio, not ${args.mode}`);
    process.exit(2);
}

// One store and queue for the whole process: in stateless mode they must outlive each request.
const taskStore = new InMemoryTaskStore();
const taskMessageQueue = new InMemoryTaskMessageQueue();
const log = (...a) => console.error(`[task-server ${args.mode}]`, ...a);

const text = t => ({ type: 'text', text: t });

/**
 * Runs `work(step)` for `steps` steps of `stepMs` each in the background, then stores `result`
 * (status `completed` or `failed`). Stops early, storing nothing, once the task is terminal
 * (cancelled). `store` is the request-bound task store, which also sends notifications/tasks/status;
 * when that notification cannot be delivered (stateless: the request's transport is closed) the
 * result is already in the shared store, so the error is only logged.
 */
function runInBackground({ taskId, sessionId, store, steps, stepMs, onStep, status, result }) {
    (async () => {
        for (let step = 1; step <= steps; step++) {
            await sleep(stepMs);
            const task = await taskStore.getTask(taskId, sessionId);
            if (!task || isTerminal(task.status)) {
                log(`task ${taskId} is ${task?.status ?? 'gone'}: work stopped at step ${step}/${steps}`);
                return;
            }
            await onStep?.(step).catch(e => log(`progress for ${taskId} not delivered: ${e.message}`));
        }
        const task = await taskStore.getTask(taskId, sessionId);
        if (!task || isTerminal(task.status)) {
            log(`task ${taskId} is ${task?.status ?? 'gone'}: result discarded`);
            return;
        }
        try {
            await store.storeTaskResult(taskId, status, result);
        } catch (e) {
            const stored = await taskStore.getTask(taskId, sessionId);
            if (stored?.status === status) log(`task ${taskId} ${status}; status notification not delivered: ${e.message}`);
            else log(`task ${taskId}: storing the result failed: ${e.message}`);
        }
    })().catch(e => log(`background work for ${taskId} crashed:`, e));
}

/** The TaskRequestHandler pair every registerToolTask needs (the SDK's tasks/get|result use the store). */
const taskReaders = {
    getTask: async (_args, extra) => extra.taskStore.getTask(extra.taskId),
    getTaskResult: async (_args, extra) => extra.taskStore.getTaskResult(extra.taskId)
};

/** notasks / legacy: no capabilities.tasks, no task store, plain tools only. */
function buildPlainServer() {
    const mcp = new McpServer({ name: `taskgate-task-fixture-${args.mode}`, version: '1.0.0' }, { capabilities: { logging: {} } });
    mcp.registerTool(
        'plain_echo',
        { description: 'Echoes text at once', inputSchema: { text: z.string().describe('Text to echo') } },
        async ({ text: t }) => ({ content: [text(`echo: ${t}`)] })
    );
    mcp.registerTool(
        'fast_task',
        { description: 'Answers after ~50 ms, echoing text (a plain tool: this server has no tasks)', inputSchema: { text: z.string().default('fast').describe('Text to echo') } },
        async ({ text: t }) => {
            await sleep(50);
            return { content: [text(`fast_task: ${t}`)] };
        }
    );
    return mcp;
}

function buildServer() {
    if (NO_TASKS) return buildPlainServer();
    const mcp = new McpServer(
        { name: `taskgate-task-fixture-${args.mode}`, version: '1.0.0' },
        {
            capabilities: { logging: {}, tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } } },
            taskStore,
            taskMessageQueue
        }
    );

    mcp.experimental.tasks.registerToolTask(
        'slow_task',
        {
            description: 'Works for duration_ms, reporting progress each of `steps` steps, then completes (task required)',
            inputSchema: {
                duration_ms: z.number().int().min(0).max(120000).default(1500).describe('Total work time in ms'),
                steps: z.number().int().min(1).max(100).default(5).describe('Number of progress steps')
            },
            execution: { taskSupport: 'required' }
        },
        {
            createTask: async ({ duration_ms, steps }, extra) => {
                const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl, pollInterval: args['poll-interval-ms'] });
                const progressToken = extra._meta?.progressToken;
                const progress = async step => {
                    if (progressToken === undefined) return;
                    const params = { progressToken, progress: step, total: steps, message: `step ${step}/${steps}` };
                    // step 0 rides on this POST's stream; later steps go to the GET stream.
                    if (step === 0) await extra.sendNotification({ method: 'notifications/progress', params });
                    else await mcp.server.notification({ method: 'notifications/progress', params });
                };
                await progress(0).catch(e => log(`progress 0 not delivered: ${e.message}`));
                runInBackground({
                    taskId: task.taskId,
                    sessionId: extra.sessionId,
                    store: extra.taskStore,
                    steps,
                    stepMs: duration_ms / steps,
                    onStep: progress,
                    status: 'completed',
                    result: { content: [text(`slow_task done after ${duration_ms} ms in ${steps} steps`)] }
                });
                return { task };
            },
            ...taskReaders
        }
    );

    mcp.experimental.tasks.registerToolTask(
        'fast_task',
        {
            description: 'Completes after ~50 ms, echoing text (task optional)',
            inputSchema: { text: z.string().default('fast').describe('Text to echo') },
            execution: { taskSupport: 'optional' }
        },
        {
            createTask: async ({ text: t }, extra) => {
                const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl, pollInterval: args['poll-interval-ms'] });
                runInBackground({
                    taskId: task.taskId,
                    sessionId: extra.sessionId,
                    store: extra.taskStore,
                    steps: 1,
                    stepMs: 50,
                    status: 'completed',
                    result: { content: [text(`fast_task: ${t}`)] }
                });
                return { task };
            },
            ...taskReaders
        }
    );

    mcp.experimental.tasks.registerToolTask(
        'failing_task',
        { description: 'Ends failed with an isError tool result after ~50 ms (task optional)', execution: { taskSupport: 'optional' } },
        {
            createTask: async extra => {
                const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl, pollInterval: args['poll-interval-ms'] });
                runInBackground({
                    taskId: task.taskId,
                    sessionId: extra.sessionId,
                    store: extra.taskStore,
                    steps: 1,
                    stepMs: 50,
                    status: 'failed',
                    result: { isError: true, content: [text('failing_task failed on purpose')] }
                });
                return { task };
            },
            getTask: async extra => extra.taskStore.getTask(extra.taskId),
            getTaskResult: async extra => extra.taskStore.getTaskResult(extra.taskId)
        }
    );

    mcp.experimental.tasks.registerToolTask(
        'ask_task',
        {
            description: 'Asks the client a question (elicitation/create tied to the task), then completes with the answer (task required)',
            inputSchema: { question: z.string().default('Proceed?').describe('The question to ask') },
            execution: { taskSupport: 'required' }
        },
        {
            createTask: async ({ question }, extra) => {
                const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl, pollInterval: args['poll-interval-ms'] });
                const { taskId } = task;
                const store = extra.taskStore;
                (async () => {
                    await sleep(100);
                    await store.updateTaskStatus(taskId, 'input_required', `asking: ${question}`);
                    // Sent even when the client did not declare elicitation (the SDK does not check
                    // unless enforceStrictCapabilities): a gateway must cope with such servers.
                    const answer = await extra.sendRequest(
                        {
                            method: 'elicitation/create',
                            params: {
                                message: question,
                                requestedSchema: { type: 'object', properties: { answer: { type: 'string', enum: ['yes', 'no'] } }, required: ['answer'] }
                            }
                        },
                        ElicitResultSchema,
                        { relatedTask: { taskId } }
                    );
                    const now = await taskStore.getTask(taskId, extra.sessionId);
                    if (!now || isTerminal(now.status)) {
                        log(`task ${taskId} is ${now?.status ?? 'gone'}: answer ${JSON.stringify(answer)} discarded`);
                        return;
                    }
                    await store.updateTaskStatus(taskId, 'working', `answer: ${answer.action}`);
                    await sleep(100);
                    await store.storeTaskResult(taskId, 'completed', { content: [text(`ask_task: ${answer.action} ${JSON.stringify(answer.content ?? {})}`)] });
                })().catch(e => log(`ask_task ${taskId}: ${e.message}`));
                return { task };
            },
            ...taskReaders
        }
    );

    mcp.experimental.tasks.registerToolTask(
        'race_task',
        {
            description: 'Completes after delay_ms unless cancelled first (task optional)',
            inputSchema: { delay_ms: z.number().int().min(0).max(60000).default(25).describe('Time until completion in ms') },
            execution: { taskSupport: 'optional' }
        },
        {
            createTask: async ({ delay_ms }, extra) => {
                const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl, pollInterval: args['poll-interval-ms'] });
                runInBackground({
                    taskId: task.taskId,
                    sessionId: extra.sessionId,
                    store: extra.taskStore,
                    steps: 1,
                    stepMs: delay_ms,
                    status: 'completed',
                    result: { content: [text(`race_task completed after ${delay_ms} ms`)] }
                });
                return { task };
            },
            ...taskReaders
        }
    );

    mcp.registerTool(
        'plain_echo',
        { description: 'Echoes text at once (no task support)', inputSchema: { text: z.string().describe('Text to echo') } },
        async ({ text: t }) => ({ content: [text(`echo: ${t}`)] })
    );

    return mcp;
}

// stdio: one client on stdin/stdout (StdioServerTransport), the tools of stateful mode; nothing
// listens and stdout carries only JSON-RPC (what taskgate's `command` upstreams start, stdio.sh).
if (args.mode === 'stdio') {
    const { StdioServerTransport } = await import('@modelcontextprotocol/sdk/server/stdio.js');
    await buildServer().connect(new StdioServerTransport());
}

const app = createMcpExpressApp({ host: '127.0.0.1' });
const sessions = new Map(); // Mcp-Session-Id -> transport (stateful, json)

if (args.mode === 'stateless') {
    app.post('/mcp', async (req, res) => {
        const mcp = buildServer();
        const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
        res.on('close', () => {
            transport.close().catch(() => {});
            mcp.close().catch(() => {});
        });
        try {
            await mcp.connect(transport);
            await transport.handleRequest(req, res, req.body);
        } catch (error) {
            log('POST /mcp failed:', error);
            if (!res.headersSent) sendJsonRpcHttpError(res, 500, -32603, 'Internal server error');
        }
    });
    // No session to attach a GET stream or a DELETE to.
    const notAllowed = (_req, res) => res.status(405).set('Allow', 'POST').json({ jsonrpc: '2.0', error: { code: -32000, message: 'Method not allowed (stateless server)' }, id: null });
    app.get('/mcp', notAllowed);
    app.delete('/mcp', notAllowed);
} else {
    if (args.mode === 'legacy') {
        // A server from before tasks ignores params it does not know: drop params.task.
        app.post('/mcp', (req, _res, next) => {
            for (const m of Array.isArray(req.body) ? req.body : [req.body]) {
                if (m?.method === 'tools/call' && m.params && 'task' in m.params) {
                    log(`legacy: ignoring params.task of tools/call ${m.params.name}`);
                    delete m.params.task;
                }
            }
            next();
        });
    }
    app.post('/mcp', async (req, res) => {
        const sessionId = req.headers['mcp-session-id'];
        try {
            if (sessionId) {
                const transport = sessions.get(sessionId);
                if (!transport) return sendJsonRpcHttpError(res, 404, -32001, 'Session not found');
                return await transport.handleRequest(req, res, req.body);
            }
            if (!isInitializeRequest(req.body)) return sendJsonRpcHttpError(res, 400, -32000, 'Bad Request: Mcp-Session-Id header is required');
            const mcp = buildServer();
            const transport = new StreamableHTTPServerTransport({
                sessionIdGenerator: newSessionId,
                enableJsonResponse: args.mode === 'json',
                onsessioninitialized: id => sessions.set(id, transport)
            });
            transport.onclose = () => {
                if (transport.sessionId) sessions.delete(transport.sessionId);
            };
            await mcp.connect(transport);
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
}

if (args.mode !== 'stdio') await listenAndAnnounce(app, args.port, { server: 'task-fixture', mode: args.mode }, async () => {
    for (const transport of sessions.values()) await transport.close().catch(() => {});
    taskStore.cleanup();
});
