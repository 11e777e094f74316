#!/usr/bin/env node
// Drives the 2025-11-25 task lifecycle against task-server.mjs (or anything offering the same
// tools) with the TypeScript SDK 1.32.2 client, directly or through a gateway.
//
//   node task-client.mjs URL [--label NAME] [--timeout-ms 60000] [--trace] [--token T]
//
// Prints one JSON summary on stdout: {label, url, ok, failed:[names], checks:[{name,ok,detail}],
// observed:{...}, info:{...}} and exits 0 only when every check passed; the names of the failed
// checks also go to stderr. `observed` counts what arrived without being asked for (progress and
// notifications/tasks/status), which depends on the server mode; `info` records peer behaviour
// the spec leaves open (never a failure). --trace adds every HTTP exchange (method, JSON-RPC
// method, status, content-type) to the summary. --token sends `Authorization: Bearer T` on every
// request (a gateway with bearer auth).

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { InMemoryTaskStore } from '@modelcontextprotocol/sdk/experimental/tasks';
import { CallToolResultSchema, CreateTaskResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { parseArgs, sleep, withTimeout } from './lib.mjs';

const RELATED_TASK = 'io.modelcontextprotocol/related-task';
const opts = parseArgs(process.argv.slice(2), { _: [], label: '', 'timeout-ms': 60000, trace: false, token: '' });
const url = opts._[0];
if (!url || opts._.length !== 1) {
    console.error('usage: node task-client.mjs URL [--label NAME] [--timeout-ms N] [--trace]');
    process.exit(2);
}
const REQUEST_TIMEOUT = 15000;

const checks = [];
const observed = { progress: [], taskStatusNotifications: [], getStream: null };
const info = {};
const trace = [];

function check(name, ok, detail) {
    checks.push({ name, ok: !!ok, ...(detail === undefined ? {} : { detail }) });
    return !!ok;
}

/** Runs `fn`; a throw becomes a failed check `name` (the lifecycle goes on where it can). */
async function step(name, fn) {
    try {
        return await fn();
    } catch (error) {
        check(name, false, { error: describeError(error) });
        return undefined;
    }
}

function describeError(error) {
    if (error instanceof McpError) return { code: error.code, message: error.message, data: error.data };
    return { message: error?.message ?? String(error) };
}

/** Expects `promise` to reject with JSON-RPC error `code`; records check `name`. */
async function expectError(name, promise, codes) {
    try {
        const result = await promise;
        return check(name, false, { expected: `JSON-RPC error ${codes.join(' or ')}`, got: { result } });
    } catch (error) {
        const d = describeError(error);
        return check(name, codes.includes(d.code), { expected: codes, got: d });
    }
}

const isIso = s => typeof s === 'string' && !Number.isNaN(Date.parse(s));
const TERMINAL = ['completed', 'failed', 'cancelled'];

/** Shape checks every Task object must pass (2025-11-25 tasks: Task). */
function taskShapeErrors(task) {
    const errors = [];
    if (typeof task?.taskId !== 'string' || task.taskId === '') errors.push('taskId not a non-empty string');
    if (!['working', 'input_required', 'completed', 'failed', 'cancelled'].includes(task?.status)) errors.push(`bad status ${task?.status}`);
    if (!isIso(task?.createdAt)) errors.push('createdAt not ISO 8601');
    if (!isIso(task?.lastUpdatedAt)) errors.push('lastUpdatedAt not ISO 8601');
    if (!task || !('ttl' in task) || !(task.ttl === null || typeof task.ttl === 'number')) errors.push('ttl missing or not number|null');
    if (task && 'pollInterval' in task && typeof task.pollInterval !== 'number') errors.push('pollInterval not a number');
    return errors;
}

/** fetch wrapper: records each exchange; resolves `getStreamAnswered` on the first GET answer. */
let resolveGetAnswered;
const getStreamAnswered = new Promise(resolve => (resolveGetAnswered = resolve));
async function tracingFetch(input, init = {}) {
    if (opts.token) {
        const headers = new Headers(init.headers);
        headers.set('authorization', `Bearer ${opts.token}`);
        init = { ...init, headers };
    }
    const method = init.method ?? 'GET';
    let rpc;
    try {
        const body = typeof init.body === 'string' ? JSON.parse(init.body) : undefined;
        rpc = body?.method ?? (body && 'result' in body ? 'response' : undefined);
    } catch {
        // not JSON
    }
    const started = Date.now();
    try {
        const response = await fetch(input, init);
        const entry = { method, rpc, status: response.status, contentType: response.headers.get('content-type'), ms: Date.now() - started };
        trace.push(entry);
        if (method === 'GET') {
            observed.getStream ??= { status: response.status, contentType: entry.contentType };
            resolveGetAnswered();
        }
        return response;
    } catch (error) {
        trace.push({ method, rpc, error: error.message });
        if (method === 'GET') resolveGetAnswered();
        throw error;
    }
}

function newClient(name) {
    const client = new Client(
        { name, version: '1.0.0' },
        // A client serving tasks/list and tasks/cancel needs a store of its own.
        { capabilities: { tasks: { list: {}, cancel: {} } }, taskStore: new InMemoryTaskStore() }
    );
    client.fallbackNotificationHandler = async notification => {
        if (notification.method === 'notifications/tasks/status') observed.taskStatusNotifications.push({ taskId: notification.params?.taskId, status: notification.params?.status });
    };
    client.onerror = error => trace.push({ clientError: error.message });
    return client;
}

const req = { timeout: REQUEST_TIMEOUT };

/** tools/call with params.task; returns the CreateTaskResult. */
function callAsTask(client, name, args, { ttl = 60000, onprogress } = {}) {
    return client.request(
        { method: 'tools/call', params: { name, arguments: args, task: { ttl } } },
        CreateTaskResultSchema,
        { ...req, ...(onprogress ? { onprogress } : {}) }
    );
}

/** Polls tasks/get (honouring pollInterval, 100..1000 ms) until `until(status)` or `maxMs`. */
async function pollTask(client, taskId, until, maxMs = 10000) {
    const deadline = Date.now() + maxMs;
    let task;
    const statuses = [];
    for (;;) {
        task = await client.experimental.tasks.getTask(taskId, req);
        if (statuses.at(-1) !== task.status) statuses.push(task.status);
        if (until(task.status) || Date.now() > deadline) return { task, statuses };
        await sleep(Math.min(Math.max(task.pollInterval ?? 200, 100), 1000));
    }
}

async function lifecycle() {
    const client = newClient('taskgate-interop-task-client');
    const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: tracingFetch });

    // 1. initialize, declaring the tasks capability
    const connected = await step('initialize', async () => {
        await withTimeout(client.connect(transport, req), REQUEST_TIMEOUT, 'initialize');
        return check('initialize', true, { protocolVersion: transport.protocolVersion, sessionId: transport.sessionId ? 'present' : 'absent' });
    });
    if (!connected) return;
    info.protocolVersion = transport.protocolVersion;
    info.sessionId = transport.sessionId ? 'present' : 'absent';

    const tasksCap = client.getServerCapabilities()?.tasks;
    // tasks.list is left out on purpose by a receiver that cannot tell requestors apart (2025-11-25
    // tasks, Security: SHOULD NOT advertise it), e.g. a gateway in front of a stateless server
    // without auth; then tasks/list is not called and info.tasksList says so.
    check('server-capabilities-tasks', tasksCap?.cancel && tasksCap?.requests?.tools?.call, { tasks: tasksCap });
    info.tasksList = tasksCap?.list ? 'advertised' : 'not advertised';

    // Let the GET stream open (or be refused) before anything that reports on it.
    await Promise.race([getStreamAnswered, sleep(5000)]);

    // 2. tools/list and taskSupport
    await step('tools-list-task-support', async () => {
        const { tools } = await client.listTools(undefined, req);
        const support = Object.fromEntries(tools.map(t => [t.name, t.execution?.taskSupport ?? 'absent']));
        const want = { slow_task: 'required', fast_task: 'optional', failing_task: 'optional' };
        const ok = Object.entries(want).every(([n, s]) => support[n] === s) && ['absent', 'forbidden'].includes(support.plain_echo);
        check('tools-list-task-support', ok, { taskSupport: support });
    });

    // 3. plain call on a tool without task support
    await step('plain-call', async () => {
        const result = await client.callTool({ name: 'plain_echo', arguments: { text: 'hi' } }, CallToolResultSchema, req);
        check('plain-call', !result.isError && result.content?.[0]?.text === 'echo: hi', { result });
    });

    // 4. a required tool called without params.task must not run as a plain call
    await step('required-without-task-refused', async () => {
        try {
            const result = await client.request({ method: 'tools/call', params: { name: 'slow_task', arguments: { duration_ms: 10 } } }, CallToolResultSchema, req);
            // SDK servers answer with a CallToolResult {isError:true} instead of the -32601 the spec asks for.
            check('required-without-task-refused', result.isError === true, { got: 'CallToolResult', result });
            info.requiredWithoutTask = { kind: 'CallToolResult', isError: result.isError, text: result.content?.[0]?.text };
        } catch (error) {
            const d = describeError(error);
            check('required-without-task-refused', [-32601, -32600].includes(d.code), { got: d });
            info.requiredWithoutTask = { kind: 'error', ...d };
        }
    });

    // 5. an optional tool called without params.task answers with the plain result
    await step('optional-without-task', async () => {
        const result = await client.callTool({ name: 'fast_task', arguments: { text: 'plain' } }, CallToolResultSchema, req);
        check('optional-without-task', !result.isError && result.content?.[0]?.text === 'fast_task: plain', { result });
    });

    // 6. task-augmented call of the slow tool, with a progress token
    const progressSlow = [];
    const created = await step('task-create', async () => {
        const r = await callAsTask(client, 'slow_task', { duration_ms: 1500, steps: 5 }, { onprogress: p => progressSlow.push(p.progress) });
        const errors = taskShapeErrors(r.task);
        if (r.task?.status !== 'working') errors.push(`status ${r.task?.status}, want working`);
        if (r.content !== undefined) errors.push('CreateTaskResult carries content');
        check('task-create', errors.length === 0, { task: r.task, errors });
        info.ttlRequested = 60000;
        info.ttlGranted = r.task?.ttl;
        return r.task;
    });
    const slowId = created?.taskId;

    if (slowId) {
        // 7. tasks/get while working
        await step('tasks-get-working', async () => {
            const t = await client.experimental.tasks.getTask(slowId, req);
            const errors = taskShapeErrors(t);
            if (t.taskId !== slowId) errors.push('taskId differs');
            if (t.status !== 'working') errors.push(`status ${t.status}, want working`);
            if (t._meta?.[RELATED_TASK]) errors.push('related-task _meta on tasks/get result');
            check('tasks-get-working', errors.length === 0, { task: t, errors });
        });

        // 8. tasks/list shows it
        if (tasksCap?.list) await step('tasks-list-contains', async () => {
            const ids = [];
            let cursor;
            for (let page = 0; page < 20; page++) {
                const r = await client.experimental.tasks.listTasks(cursor, req);
                ids.push(...r.tasks.map(t => t.taskId));
                const bad = r.tasks.map(taskShapeErrors).filter(e => e.length);
                if (bad.length) return check('tasks-list-contains', false, { shapeErrors: bad });
                cursor = r.nextCursor;
                if (!cursor) break;
            }
            check('tasks-list-contains', ids.includes(slowId), { listed: ids.length });
        });

        // 9. tasks/result blocks until the task is terminal, then carries related-task _meta
        await step('tasks-result-blocks', async () => {
            const started = Date.now();
            const r = await client.experimental.tasks.getTaskResult(slowId, CallToolResultSchema, req);
            const waited = Date.now() - started;
            const errors = [];
            if (!r.content?.[0]?.text?.startsWith('slow_task done')) errors.push('unexpected content');
            if (r.isError) errors.push('isError');
            if (r._meta?.[RELATED_TASK]?.taskId !== slowId) errors.push(`related-task _meta ${JSON.stringify(r._meta?.[RELATED_TASK])}`);
            if (waited < 300) errors.push(`returned after ${waited} ms: did not block`);
            check('tasks-result-blocks', errors.length === 0, { waitedMs: waited, errors, result: r });
        });

        await step('tasks-get-completed', async () => {
            const t = await client.experimental.tasks.getTask(slowId, req);
            check('tasks-get-completed', t.status === 'completed' && taskShapeErrors(t).length === 0, { task: t });
        });
    }

    // 10. fast task: poll tasks/get to completion, then tasks/result
    const fastId = await step('fast-task-completed', async () => {
        const r = await callAsTask(client, 'fast_task', { text: 'as task' });
        const { task, statuses } = await pollTask(client, r.task.taskId, s => TERMINAL.includes(s));
        check('fast-task-completed', task.status === 'completed', { statuses });
        const result = await client.experimental.tasks.getTaskResult(r.task.taskId, CallToolResultSchema, req);
        check(
            'fast-task-result',
            result.content?.[0]?.text === 'fast_task: as task' && result._meta?.[RELATED_TASK]?.taskId === r.task.taskId,
            { result }
        );
        return r.task.taskId;
    });

    // 11. failing task: ends `failed`; tasks/result returns the isError tool result
    await step('failing-task-failed', async () => {
        const r = await callAsTask(client, 'failing_task', {});
        const { task, statuses } = await pollTask(client, r.task.taskId, s => TERMINAL.includes(s));
        check('failing-task-failed', task.status === 'failed', { statuses, statusMessage: task.statusMessage });
        const result = await client.experimental.tasks.getTaskResult(r.task.taskId, CallToolResultSchema, req);
        check('failing-task-result-iserror', result.isError === true && result._meta?.[RELATED_TASK]?.taskId === r.task.taskId, { result });
    });

    // 12. tasks/cancel on a working task -> cancelled, and it stays cancelled
    await step('tasks-cancel-working', async () => {
        const r = await callAsTask(client, 'slow_task', { duration_ms: 1000, steps: 4 });
        const id = r.task.taskId;
        const cancelled = await client.experimental.tasks.cancelTask(id, req);
        check('tasks-cancel-working', cancelled.status === 'cancelled' && cancelled.taskId === id && taskShapeErrors(cancelled).length === 0, { result: cancelled });
        const now = await client.experimental.tasks.getTask(id, req);
        check('tasks-get-after-cancel', now.status === 'cancelled', { task: now });
        await sleep(1300); // past the time the work would have completed
        const later = await client.experimental.tasks.getTask(id, req);
        check('tasks-cancelled-stays-cancelled', later.status === 'cancelled', { task: later });
        try {
            const res = await client.experimental.tasks.getTaskResult(id, CallToolResultSchema, req);
            info.resultOfCancelled = { kind: 'result', result: res };
        } catch (error) {
            info.resultOfCancelled = { kind: 'error', ...describeError(error) };
        }
        await expectError('tasks-cancel-cancelled', client.experimental.tasks.cancelTask(id, req), [-32602]);
    });

    // 13. tasks/cancel on a terminal (completed) task -> -32602
    const terminalId = fastId ?? slowId;
    if (terminalId) await expectError('tasks-cancel-terminal', client.experimental.tasks.cancelTask(terminalId, req), [-32602]);
    else check('tasks-cancel-terminal', false, { error: 'no completed task to cancel' });

    // 14. unknown task ids -> -32602
    const unknown = 'no-such-task-0000';
    await expectError('tasks-get-unknown', client.experimental.tasks.getTask(unknown, req), [-32602]);
    await expectError('tasks-result-unknown', client.experimental.tasks.getTaskResult(unknown, CallToolResultSchema, req), [-32602]);
    await expectError('tasks-cancel-unknown', client.experimental.tasks.cancelTask(unknown, req), [-32602]);

    // 15. info only: is a task visible from a second session? (SDK stores bind tasks to the session)
    if (slowId && transport.sessionId) {
        const other = newClient('taskgate-interop-task-client-2');
        const otherTransport = new StreamableHTTPClientTransport(new URL(url), { fetch: tracingFetch });
        try {
            await withTimeout(other.connect(otherTransport, req), REQUEST_TIMEOUT, 'second initialize');
            try {
                const t = await other.experimental.tasks.getTask(slowId, req);
                info.crossSessionGet = { kind: 'result', status: t.status };
            } catch (error) {
                info.crossSessionGet = { kind: 'error', ...describeError(error) };
            }
            await otherTransport.terminateSession().catch(() => {});
        } catch (error) {
            info.crossSessionGet = { kind: 'connect-failed', ...describeError(error) };
        } finally {
            await other.close().catch(() => {});
        }
    }

    // Notifications that arrive late (the GET stream) get a moment.
    await sleep(300);
    observed.progress = progressSlow;

    if (transport.sessionId) {
        await step('session-delete', async () => {
            await transport.terminateSession();
            check('session-delete', true);
        });
    }
    await client.close().catch(() => {});
}

const started = Date.now();
let crashed;
try {
    await withTimeout(lifecycle(), opts['timeout-ms'], 'whole task lifecycle');
} catch (error) {
    crashed = error;
    check('lifecycle-finished', false, { error: describeError(error) });
}
const failed = checks.filter(c => !c.ok).map(c => c.name);
const summary = {
    label: opts.label || undefined,
    url,
    ok: failed.length === 0 && checks.length > 0,
    passed: checks.length - failed.length,
    failed,
    ms: Date.now() - started,
    observed: {
        progressValues: observed.progress,
        taskStatusNotifications: observed.taskStatusNotifications,
        getStream: observed.getStream
    },
    info,
    checks,
    ...(opts.trace ? { trace } : {})
};
process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
if (!summary.ok) console.error(`task-client${opts.label ? ` [${opts.label}]` : ''}: FAILED checks: ${failed.join(', ') || '(none ran)'}${crashed ? ` (${crashed.message})` : ''}`);
process.exit(summary.ok ? 0 : 1);
