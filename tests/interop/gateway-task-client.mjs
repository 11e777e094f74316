#!/usr/bin/env node
// The 2025-11-25 task lifecycle with the TypeScript SDK 1.32.2 client against a server WITHOUT
// task support (gateway-task-server.mjs) through taskgate with `tasks = "gateway"` (issue 32):
// taskgate runs the tasks itself. A sibling of task-client.mjs for that case.
//
//   node gateway-task-client.mjs URL [--label NAME] [--timeout-ms 60000]
//
// Prints one JSON summary {label, url, ok, failed, checks, info} on stdout; exit 0 only when
// every check passed (the failed names also go to stderr). Checks, in order: initialize shows
// capabilities.tasks (cancel, requests.tools.call); tools/list shows every tool taskSupport
// "optional"; a plain call passes through; a task call of `slow` is a working Task at once;
// tasks/get working, later with the server's progress message as statusMessage; tasks/list has
// it; tasks/result blocks, then the result with related-task _meta; tasks/get completed; `fail`
// (a JSON-RPC error) ends failed and tasks/result rejects with the server's error; `oops`
// (isError) ends completed with that result; tasks/cancel of a working `slow` answers cancelled,
// which stays, while the server saw the cancel (its abort signal: `stats.aborted` grows); a
// second cancel and unknown ids get -32602. Then input (a second client that declares
// capabilities.elicitation, callToolStream): `ask` makes the task input_required, the
// server's elicitation/create reaches the client on the tasks/result stream with related-task
// _meta, the client's answer reaches the server, and the result carries it.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { InMemoryTaskStore } from '@modelcontextprotocol/sdk/experimental/tasks';
import { CallToolResultSchema, CreateTaskResultSchema, ElicitRequestSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { parseArgs, sleep, withTimeout } from './lib.mjs';

const RELATED_TASK = 'io.modelcontextprotocol/related-task';
const TERMINAL = ['completed', 'failed', 'cancelled'];
const opts = parseArgs(process.argv.slice(2), { _: [], label: '', 'timeout-ms': 60000 });
const url = opts._[0];
if (!url || opts._.length !== 1) {
    console.error('usage: node gateway-task-client.mjs URL [--label NAME] [--timeout-ms N]');
    process.exit(2);
}
const req = { timeout: 15000 };
const checks = [];
const info = {};

function check(name, ok, detail) {
    checks.push({ name, ok: !!ok, ...(detail === undefined ? {} : { detail }) });
    return !!ok;
}
function describeError(error) {
    if (error instanceof McpError) return { code: error.code, message: error.message };
    return { message: error?.message ?? String(error) };
}
async function step(name, fn) {
    try {
        return await fn();
    } catch (error) {
        check(name, false, { error: describeError(error) });
        return undefined;
    }
}
async function expectError(name, promise, codes) {
    try {
        const result = await promise;
        return check(name, false, { expected: codes, got: { result } });
    } catch (error) {
        const d = describeError(error);
        return check(name, codes.includes(d.code), { expected: codes, got: d });
    }
}

const client = new Client(
    { name: 'taskgate-interop-gateway-task-client', version: '1.0.0' },
    { capabilities: { tasks: { list: {}, cancel: {} } }, taskStore: new InMemoryTaskStore() }
);
const transport = new StreamableHTTPClientTransport(new URL(url));

function callAsTask(name, args, onprogress) {
    return client.request(
        { method: 'tools/call', params: { name, arguments: args, task: { ttl: 60000 } } },
        CreateTaskResultSchema,
        { ...req, ...(onprogress ? { onprogress } : {}) }
    );
}
async function pollTask(taskId, until, maxMs = 15000) {
    const deadline = Date.now() + maxMs;
    const statuses = [];
    for (;;) {
        const task = await client.experimental.tasks.getTask(taskId, req);
        if (statuses.at(-1) !== task.status) statuses.push(task.status);
        if (until(task) || Date.now() > deadline) return { task, statuses };
        await sleep(Math.min(Math.max(task.pollInterval ?? 200, 100), 500));
    }
}
async function stats() {
    const r = await client.callTool({ name: 'stats', arguments: {} }, CallToolResultSchema, req);
    return JSON.parse(r.content[0].text);
}

async function lifecycle() {
    await withTimeout(client.connect(transport, req), 15000, 'initialize');
    const caps = client.getServerCapabilities()?.tasks;
    check('server-capabilities-tasks', caps?.cancel && caps?.requests?.tools?.call, { tasks: caps });

    await step('tools-list-optional', async () => {
        const { tools } = await client.listTools(undefined, req);
        const support = Object.fromEntries(tools.map(t => [t.name, t.execution?.taskSupport ?? 'absent']));
        check('tools-list-optional', Object.values(support).every(s => s === 'optional'), { support });
    });

    await step('plain-call', async () => {
        const s = await stats();
        check('plain-call', typeof s.started === 'number', { stats: s });
    });

    const progress = [];
    const slow = await step('task-create', async () => {
        const r = await callAsTask('slow', { duration_ms: 2000, steps: 4 }, p => progress.push(p));
        check('task-create', r.task?.status === 'working' && typeof r.task?.taskId === 'string' && r.task?.ttl === 60000, { task: r.task });
        return r.task;
    });
    if (slow) {
        await step('tasks-get-working', async () => {
            const t = await client.experimental.tasks.getTask(slow.taskId, req);
            check('tasks-get-working', t.status === 'working', { task: t });
        });
        await step('status-message-from-progress', async () => {
            const { task } = await pollTask(slow.taskId, t => /^step \d\/4$/.test(t.statusMessage ?? '') || TERMINAL.includes(t.status), 5000);
            check('status-message-from-progress', /^step \d\/4$/.test(task.statusMessage ?? ''), { task });
        });
        await step('tasks-list-contains', async () => {
            const r = await client.experimental.tasks.listTasks(undefined, req);
            check('tasks-list-contains', r.tasks.some(t => t.taskId === slow.taskId), { listed: r.tasks.length });
        });
        await step('tasks-result-blocks', async () => {
            const started = Date.now();
            const r = await client.experimental.tasks.getTaskResult(slow.taskId, CallToolResultSchema, req);
            const waited = Date.now() - started;
            check(
                'tasks-result-blocks',
                r.content?.[0]?.text === 'slow done' && r._meta?.[RELATED_TASK]?.taskId === slow.taskId && waited > 300,
                { waitedMs: waited, result: r }
            );
        });
        await step('tasks-get-completed', async () => {
            const t = await client.experimental.tasks.getTask(slow.taskId, req);
            check('tasks-get-completed', t.status === 'completed', { task: t });
        });
    }

    await step('rpc-error-failed', async () => {
        const r = await callAsTask('fail', {});
        const { task, statuses } = await pollTask(r.task.taskId, t => TERMINAL.includes(t.status));
        check('rpc-error-failed', task.status === 'failed' && (task.statusMessage ?? '').includes('fail: it broke'), { statuses, task });
        await expectError('rpc-error-result', client.experimental.tasks.getTaskResult(r.task.taskId, CallToolResultSchema, req), [-32000]);
    });

    await step('is-error-completed', async () => {
        const r = await callAsTask('oops', {});
        const { task } = await pollTask(r.task.taskId, t => TERMINAL.includes(t.status));
        const result = await client.experimental.tasks.getTaskResult(r.task.taskId, CallToolResultSchema, req);
        check('is-error-completed', task.status === 'completed' && result.isError === true, { task, result });
    });

    await step('tasks-cancel-working', async () => {
        const before = await stats();
        const r = await callAsTask('slow', { duration_ms: 10000, steps: 10 });
        const id = r.task.taskId;
        // The server's handler runs (it counted the call) before it is cancelled.
        for (let i = 0; i < 50 && (await stats()).started === before.started; i++) await sleep(100);
        const cancelled = await client.experimental.tasks.cancelTask(id, req);
        check('tasks-cancel-working', cancelled.status === 'cancelled' && cancelled.taskId === id, { result: cancelled });
        let after = await stats();
        for (let i = 0; i < 50 && after.aborted === before.aborted; i++) {
            await sleep(100);
            after = await stats();
        }
        check('server-saw-the-cancel', after.aborted === before.aborted + 1 && after.finished === before.finished, { before, after });
        const later = await client.experimental.tasks.getTask(id, req);
        check('tasks-cancelled-stays-cancelled', later.status === 'cancelled', { task: later });
        await expectError('tasks-cancel-cancelled', client.experimental.tasks.cancelTask(id, req), [-32602]);
    });

    const unknown = 'no-such-task-0000';
    await expectError('tasks-get-unknown', client.experimental.tasks.getTask(unknown, req), [-32602]);
    await expectError('tasks-cancel-unknown', client.experimental.tasks.cancelTask(unknown, req), [-32602]);
    info.progressSeenByClient = progress.length;
    await transport.terminateSession().catch(() => {});
    await client.close().catch(() => {});
}

// Input during a gateway task: the SDK's own task flow (callToolStream polls tasks/get; on
// input_required it calls tasks/result, whose stream carries the server's request).
async function input() {
    const asker = new Client({ name: 'taskgate-interop-gateway-task-asker', version: '1.0.0' }, { capabilities: { elicitation: {} } });
    const asked = [];
    asker.setRequestHandler(ElicitRequestSchema, async request => {
        asked.push(request.params);
        return { action: 'accept', content: { ok: true } };
    });
    const t = new StreamableHTTPClientTransport(new URL(url));
    await withTimeout(asker.connect(t, req), 15000, 'initialize (asker)');
    const statuses = [];
    let result;
    let taskId;
    const stream = asker.experimental.tasks.callToolStream({ name: 'ask', arguments: {} }, CallToolResultSchema, { ...req, task: { ttl: 60000 } });
    for await (const m of stream) {
        if (m.type === 'taskCreated') taskId = m.task.taskId;
        if (m.type === 'taskStatus' && statuses.at(-1) !== m.task.status) statuses.push(m.task.status);
        if (m.type === 'result') result = m.result;
        if (m.type === 'error') throw m.error;
    }
    check('input-required-seen', statuses.includes('input_required'), { statuses });
    check(
        'input-request-related-task',
        asked.length === 1 && asked[0]?.message === 'Proceed?' && asked[0]?._meta?.[RELATED_TASK]?.taskId === taskId,
        { asked }
    );
    check('input-answer-reached-the-server', result?.content?.[0]?.text === 'ask: accept {"ok":true}', { result });
    const after = await asker.experimental.tasks.getTask(taskId, req);
    check('input-task-completed', after.status === 'completed', { task: after });
    await t.terminateSession().catch(() => {});
    await asker.close().catch(() => {});
}

const started = Date.now();
try {
    await withTimeout(lifecycle(), opts['timeout-ms'], 'whole gateway task lifecycle');
    await step('input', () => withTimeout(input(), 30000, 'input during a gateway task'));
} catch (error) {
    check('lifecycle-finished', false, { error: describeError(error) });
}
const failed = checks.filter(c => !c.ok).map(c => c.name);
const summary = { label: opts.label || undefined, url, ok: failed.length === 0 && checks.length > 0, passed: checks.length - failed.length, failed, ms: Date.now() - started, info, checks };
process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
if (!summary.ok) console.error(`gateway-task-client${opts.label ? ` [${opts.label}]` : ''}: FAILED checks: ${failed.join(', ')}`);
process.exit(summary.ok ? 0 : 1);
