#!/usr/bin/env node
// A 2025-11-25 task server (TypeScript SDK 1.32.2: McpServer, experimental tasks, stateful
// sessions, SSE answers) offering the tools the conformance 0.2.0-alpha.12 tasks-* server
// scenarios call, as 2025 tasks: what reverse.sh runs those scenarios against through taskgate's
// reverse bridge (issue 33), to set beside the 2026 fixture (modern_task_server.py) direct. The
// names and behaviour come from the scenarios' descriptions (as modern_task_server.py has them);
// the code is ours.
//
//   node reverse-fixture.mjs [--port N]      (0 or absent: any free port)
//
// Prints `{"listening":"http://127.0.0.1:PORT/mcp","port":PORT,"server":"reverse-fixture"}` once bound.
//
//   greet(name)                plain: "Hello, {name}!"
//   slow_compute(seconds,label) task optional: after `seconds`, "slow_compute(label) done after Ns";
//                              stops once cancelled
//   failing_job()              task required: after ~1 s ends `failed` with the CallToolResult
//                              {isError: true, "failing_job: the job failed on purpose"}
//   slow_required(seconds)     task required: after `seconds` (default 30), done; stops once cancelled
//   protocol_error_job()       task optional: ends `failed`; tasks/result answers the JSON-RPC error
//                              -32603 "protocol_error_job: internal failure on purpose"
//   confirm_delete(filename)   task optional: input_required, one elicitation/create tied to the task
//                              (delivered on the tasks/result stream), then completes with the answer
//   multi_input()              task optional: two elicitation/create at once, completes with both
//   test_tool_with_task(user_name) task optional: asks user_name by elicitation/create when not given,
//                              then completes "Hello from the task, NAME!" (2025-11-25 has no MRTR:
//                              the scenario's InputRequiredResult before the task has no 2025 form)

import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import { InMemoryTaskMessageQueue, InMemoryTaskStore, isTerminal } from '@modelcontextprotocol/sdk/experimental/tasks';
import { ElicitResultSchema, McpError, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import * as z from 'zod';
import { listenAndAnnounce, newSessionId, parseArgs, sendJsonRpcHttpError, sleep } from './lib.mjs';

const args = parseArgs(process.argv.slice(2), { port: Number(process.env.PORT ?? 0) });
const POLL_MS = 200;
/** Protocol errors a task ended with, answered by its tasks/result. */
const protocolErrors = new Map();
/** The SDK answers tasks/result from the store itself: a task that ended with a protocol error
 *  answers it as the JSON-RPC error (2025-11-25 tasks: the result of a failed request). */
class FixtureStore extends InMemoryTaskStore {
    async getTaskResult(taskId, sessionId) {
        const error = protocolErrors.get(taskId);
        if (error) throw new McpError(error.code, error.message);
        return super.getTaskResult(taskId, sessionId);
    }
}
const taskStore = new FixtureStore();
const taskMessageQueue = new InMemoryTaskMessageQueue();
const log = (...a) => console.error('[reverse-fixture]', ...a);
const text = t => ({ type: 'text', text: t });

/** Whether the task is gone or terminal (cancelled): its work stops. */
async function ended(taskId, sessionId) {
    const t = await taskStore.getTask(taskId, sessionId);
    return !t || isTerminal(t.status);
}

/** Runs `work()` in the background and stores what it returns (status, result); nothing once ended. */
function background(taskId, extra, work) {
    (async () => {
        const out = await work();
        if (!out || (await ended(taskId, extra.sessionId))) return;
        await extra.taskStore.storeTaskResult(taskId, out.status, out.result);
    })().catch(e => log(`task ${taskId}: ${e.message}`));
}

/** Sleeps `ms` in steps, false once the task ended meanwhile. */
async function working(taskId, sessionId, ms) {
    const end = Date.now() + ms;
    while (Date.now() < end) {
        await sleep(Math.min(100, end - Date.now()));
        if (await ended(taskId, sessionId)) return false;
    }
    return true;
}

function elicit(extra, taskId, message, properties, required) {
    return extra.sendRequest(
        { method: 'elicitation/create', params: { message, requestedSchema: { type: 'object', properties, required } } },
        ElicitResultSchema,
        { relatedTask: { taskId } }
    );
}

const answerText = a => (a?.action === 'accept' ? JSON.stringify(a.content ?? {}) : a?.action ?? 'none');

// A tool without arguments gets (extra) only, one with them (args, extra).
const readers = {
    getTask: async (a, b) => (b ?? a).taskStore.getTask((b ?? a).taskId),
    getTaskResult: async (a, b) => (b ?? a).taskStore.getTaskResult((b ?? a).taskId)
};

function task(mcp, name, description, inputSchema, taskSupport, run) {
    mcp.experimental.tasks.registerToolTask(
        name,
        { description, inputSchema, execution: { taskSupport } },
        {
            createTask: async (a, extra) => {
                // Tools without arguments get (extra) only.
                const [params, ex] = extra === undefined ? [{}, a] : [a, extra];
                const created = await ex.taskStore.createTask({ ttl: ex.taskRequestedTtl, pollInterval: POLL_MS });
                background(created.taskId, ex, () => run(params, ex, created.taskId));
                return { task: created };
            },
            ...readers
        }
    );
}

function buildServer() {
    const mcp = new McpServer(
        { name: 'taskgate-reverse-fixture', version: '1.0.0' },
        { capabilities: { logging: {}, tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } } }, taskStore, taskMessageQueue }
    );
    mcp.registerTool('greet', { description: 'Hello, {name}!', inputSchema: { name: z.string().default('World') } }, async ({ name }) => ({
        content: [text(`Hello, ${name}!`)]
    }));
    task(mcp, 'slow_compute', 'Sleeps `seconds`, then returns', { seconds: z.number().default(1), label: z.string().default('') }, 'optional', async ({ seconds, label }, extra, id) => {
        if (!(await working(id, extra.sessionId, seconds * 1000))) return null;
        return { status: 'completed', result: { content: [text(`slow_compute(${label}) done after ${seconds}s`)] } };
    });
    task(mcp, 'failing_job', 'Task only; after ~1 s a tool error', undefined, 'required', async (_p, extra, id) => {
        if (!(await working(id, extra.sessionId, 1000))) return null;
        return { status: 'failed', result: { isError: true, content: [text('failing_job: the job failed on purpose')] } };
    });
    task(mcp, 'slow_required', 'Task only; sleeps `seconds`', { seconds: z.number().default(30) }, 'required', async ({ seconds }, extra, id) => {
        if (!(await working(id, extra.sessionId, seconds * 1000))) return null;
        return { status: 'completed', result: { content: [text(`slow_required done after ${seconds}s`)] } };
    });
    task(mcp, 'protocol_error_job', 'Ends failed with a JSON-RPC error', undefined, 'optional', async (_p, extra, id) => {
        if (!(await working(id, extra.sessionId, 100))) return null;
        protocolErrors.set(id, { code: -32603, message: 'protocol_error_job: internal failure on purpose' });
        return { status: 'failed', result: { isError: true, content: [text('protocol_error_job: internal failure on purpose')] } };
    });
    task(mcp, 'confirm_delete', 'Asks one confirmation, then completes', { filename: z.string().default('file.txt') }, 'optional', async ({ filename }, extra, id) => {
        await sleep(50);
        await extra.taskStore.updateTaskStatus(id, 'input_required', `Delete ${filename}?`);
        const a = await elicit(extra, id, `Delete ${filename}?`, { confirm: { type: 'boolean' } }, ['confirm']);
        if (await ended(id, extra.sessionId)) return null;
        await extra.taskStore.updateTaskStatus(id, 'working');
        return { status: 'completed', result: { content: [text(`confirm_delete(${filename}): ${answerText(a)}`)] } };
    });
    task(mcp, 'multi_input', 'Asks two inputs at once', undefined, 'optional', async (_p, extra, id) => {
        await sleep(50);
        await extra.taskStore.updateTaskStatus(id, 'input_required', 'two inputs');
        const props = { name: { type: 'string' }, confirm: { type: 'boolean' } };
        const [first, second] = await Promise.all([
            elicit(extra, id, 'Input first?', props, ['name']),
            elicit(extra, id, 'Input second?', props, ['name'])
        ]);
        if (await ended(id, extra.sessionId)) return null;
        await extra.taskStore.updateTaskStatus(id, 'working');
        return { status: 'completed', result: { content: [text(`multi_input: ${answerText(first)}, ${answerText(second)}`)] } };
    });
    task(mcp, 'test_tool_with_task', 'Asks user_name, then names the user', { user_name: z.string().default('') }, 'optional', async ({ user_name }, extra, id) => {
        let name = user_name;
        if (!name) {
            await extra.taskStore.updateTaskStatus(id, 'input_required', 'Your name?');
            const a = await elicit(extra, id, 'Your name?', { name: { type: 'string' } }, ['name']);
            if (await ended(id, extra.sessionId)) return null;
            await extra.taskStore.updateTaskStatus(id, 'working');
            name = a?.content?.name ?? '';
        }
        await sleep(200);
        return { status: 'completed', result: { content: [text(`Hello from the task, ${name}!`)] } };
    });
    return mcp;
}

const app = createMcpExpressApp({ host: '127.0.0.1' });
const sessions = new Map();
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
        const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: newSessionId, onsessioninitialized: id => sessions.set(id, transport) });
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
    const transport = sessions.get(req.headers['mcp-session-id']);
    if (!transport) return sendJsonRpcHttpError(res, 404, -32001, 'Session not found');
    try {
        await transport.handleRequest(req, res);
    } catch (error) {
        if (!res.headersSent) sendJsonRpcHttpError(res, 500, -32603, 'Internal server error');
    }
};
app.get('/mcp', bySession);
app.delete('/mcp', bySession);

await listenAndAnnounce(app, args.port, { server: 'reverse-fixture' }, async () => {
    for (const transport of sessions.values()) await transport.close().catch(() => {});
    taskStore.cleanup();
});
