#!/usr/bin/env node
// Issue 12: the TypeScript SDK 1.32.2 task client (2025-11-25 tasks: params.task,
// client.experimental.tasks.*) against a 2026-07-28 task server (modern_task_server.py: FastMCP
// 4.1.4 + fastmcp-tasks 4.1.4), directly (where it cannot work: the server runs params.task calls
// plainly and has no 2025 tasks/*) or through taskgate's bridge.
//
//   node bridge-client.mjs URL [--label NAME] [--timeout-ms 90000] [--received SPEC] [--mrtr-plain] [--listen]
//
// --listen adds a check (get-stream-listen): the SDK's GET stream gets the server's
// notifications/tools/list_changed (through taskgate, a held session's GET stream is the 2026
// server's subscriptions/listen; the rmcp fixture sends one per listen).
//
// 17 checks: the task lifecycle (12), an input_required task answered through elicitation, MRTR
// (2026-07-28 input within the request, which taskgate turns into elicitation/create requests on
// the call's stream: test_tool_with_task called with params.task asks the user's name before its
// task exists; with --mrtr-plain an 18th, ask_name, a plain call that asks it and echoes its
// requestState: only a server whose 2025 sessions taskgate holds answers a 2025 client's plain
// call with MRTR, dual-era servers refuse MRTR on their own 2025 sessions), and a
// plain client (no tasks capability) calling task-only tools (needs [upgrade] enabled): the real
// result of failing_job with progress first, and its cancel (AbortSignal, so the SDK sends
// notifications/cancelled) of slow_required reaching the upstream as exactly one tasks/cancel.
// SPEC says where the upstream's received tasks/cancel requests are counted: the fixture's
// `/received` URL (modern_task_server.py) or a file of `{"received":"tasks/cancel","taskId":ID}`
// lines (the rmcp fixture's stdout); without it the cancel check fails.
//
// Prints one JSON summary {label, url, ok, passed, failed:[names], checks:[{name,ok,detail}]} and
// exits 0 only when every check passed.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { InMemoryTaskStore } from '@modelcontextprotocol/sdk/experimental/tasks';
import { CallToolResultSchema, CreateTaskResultSchema, ElicitRequestSchema, McpError, ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { readFileSync } from 'node:fs';
import { parseArgs, sleep, withTimeout } from './lib.mjs';

const RELATED_TASK = 'io.modelcontextprotocol/related-task';
const opts = parseArgs(process.argv.slice(2), { _: [], label: '', 'timeout-ms': 90000, received: '', 'mrtr-plain': false, listen: false });
const url = opts._[0];
if (!url || opts._.length !== 1) {
    console.error('usage: node bridge-client.mjs URL [--label NAME] [--timeout-ms N]');
    process.exit(2);
}
const req = { timeout: 20000 };
const checks = [];
const check = (name, ok, detail) => (checks.push({ name, ok: !!ok, ...(detail === undefined ? {} : { detail }) }), !!ok);
const describe = e => (e instanceof McpError ? { code: e.code, message: e.message } : { message: e?.message ?? String(e) });
async function step(name, fn) {
    try {
        return await fn();
    } catch (error) {
        check(name, false, { error: describe(error) });
        return undefined;
    }
}
async function expectError(name, promise, codes) {
    try {
        return check(name, false, { expected: codes, got: { result: await promise } });
    } catch (error) {
        const d = describe(error);
        return check(name, codes.includes(d.code), { expected: codes, got: d });
    }
}
const TERMINAL = ['completed', 'failed', 'cancelled'];
// taskId -> tasks/cancel requests the upstream received (see --received).
async function receivedCancels() {
    if (opts.received.startsWith('http')) {
        const r = await fetch(opts.received);
        return (await r.json())['tasks/cancel'] ?? {};
    }
    const counts = {};
    for (const line of readFileSync(opts.received, 'utf8').split('\n')) {
        if (!line.includes('"received"')) continue;
        try {
            const m = JSON.parse(line);
            if (m.received === 'tasks/cancel') counts[m.taskId] = (counts[m.taskId] ?? 0) + 1;
        } catch {}
    }
    return counts;
}
const callAsTask = (client, name, args) =>
    client.request({ method: 'tools/call', params: { name, arguments: args, task: { ttl: 60000 } } }, CreateTaskResultSchema, req);
async function pollTask(client, taskId, until, maxMs = 15000) {
    const deadline = Date.now() + maxMs;
    for (;;) {
        const task = await client.experimental.tasks.getTask(taskId, req);
        if (until(task.status) || Date.now() > deadline) return task;
        await sleep(Math.min(Math.max(task.pollInterval ?? 200, 100), 1000));
    }
}

async function lifecycle() {
    const client = new Client(
        { name: 'taskgate-bridge-client', version: '1.0.0' },
        { capabilities: { tasks: { list: {}, cancel: {} }, elicitation: {} }, taskStore: new InMemoryTaskStore() }
    );
    const elicited = [];
    client.setRequestHandler(ElicitRequestSchema, async request => {
        elicited.push({ message: request.params?.message, related: request.params?._meta?.[RELATED_TASK]?.taskId });
        if (request.params?.message === 'Your name?') return { action: 'accept', content: { name: 'Luca' } };
        return { action: 'accept', content: { confirm: true } };
    });
    let listChanged;
    const listChangedSeen = new Promise(resolve => (listChanged = resolve));
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => listChanged(true));
    const transport = new StreamableHTTPClientTransport(new URL(url));
    if (!(await step('initialize', async () => check('initialize', (await withTimeout(client.connect(transport, req), 20000, 'initialize'), true))))) return;
    if (opts.listen) {
        // The SDK opens its GET stream after notifications/initialized.
        const seen = await Promise.race([listChangedSeen, sleep(10000).then(() => false)]);
        check('get-stream-listen', seen === true, { seen });
    }
    const tasksCap = client.getServerCapabilities()?.tasks;
    check('server-capabilities-tasks', tasksCap?.cancel && tasksCap?.requests?.tools?.call, { tasks: tasksCap });
    await step('tools-list-task-support', async () => {
        const { tools } = await client.listTools(undefined, req);
        const support = Object.fromEntries(tools.map(t => [t.name, t.execution?.taskSupport ?? 'absent']));
        check('tools-list-task-support', ['optional', 'required'].includes(support.slow_compute) && ['optional', 'required'].includes(support.failing_job), { slow_compute: support.slow_compute, failing_job: support.failing_job });
    });
    const slow = await step('task-create', async () => {
        const r = await callAsTask(client, 'slow_compute', { seconds: 1.5, label: 'bridge' });
        check('task-create', r.task?.status === 'working' && typeof r.task?.taskId === 'string', { task: r.task });
        return r.task;
    });
    if (slow) {
        await step('tasks-get-working', async () => {
            const t = await client.experimental.tasks.getTask(slow.taskId, req);
            check('tasks-get-working', t.status === 'working' && t.taskId === slow.taskId, { task: t });
        });
        await step('tasks-list-contains', async () => {
            const r = await client.experimental.tasks.listTasks(undefined, req);
            check('tasks-list-contains', r.tasks.some(t => t.taskId === slow.taskId), { listed: r.tasks.length });
        });
        await step('tasks-result-blocks', async () => {
            const started = Date.now();
            const r = await client.experimental.tasks.getTaskResult(slow.taskId, CallToolResultSchema, req);
            const waited = Date.now() - started;
            check('tasks-result-blocks', r.content?.[0]?.text?.startsWith('slow_compute(bridge) done') && !r.isError && r._meta?.[RELATED_TASK]?.taskId === slow.taskId && waited >= 300, { waitedMs: waited, result: r });
        });
        await step('tasks-get-completed', async () => {
            const t = await client.experimental.tasks.getTask(slow.taskId, req);
            check('tasks-get-completed', t.status === 'completed', { task: t });
        });
    } else {
        for (const n of ['tasks-get-working', 'tasks-list-contains', 'tasks-result-blocks', 'tasks-get-completed']) check(n, false, { error: 'no task' });
    }
    await step('failing-task-failed', async () => {
        const r = await callAsTask(client, 'failing_job', {});
        const task = await pollTask(client, r.task.taskId, s => TERMINAL.includes(s));
        const result = await client.experimental.tasks.getTaskResult(r.task.taskId, CallToolResultSchema, req);
        check('failing-task-failed', task.status === 'failed' && result.isError === true, { status: task.status, result });
    });
    await step('protocol-error-task', async () => {
        const r = await callAsTask(client, 'protocol_error_job', {});
        await pollTask(client, r.task.taskId, s => TERMINAL.includes(s));
        await expectError('protocol-error-task', client.experimental.tasks.getTaskResult(r.task.taskId, CallToolResultSchema, req), [-32603]);
    });
    await step('tasks-cancel-working', async () => {
        const r = await callAsTask(client, 'slow_compute', { seconds: 3, label: 'cancel' });
        const cancelled = await client.experimental.tasks.cancelTask(r.task.taskId, req);
        const now = await client.experimental.tasks.getTask(r.task.taskId, req);
        check('tasks-cancel-working', cancelled.status === 'cancelled' && now.status === 'cancelled', { cancel: cancelled, get: now });
    });
    await step('elicitation-input', async () => {
        const r = await callAsTask(client, 'confirm_delete', { filename: 'bridge.txt' });
        const result = await client.experimental.tasks.getTaskResult(r.task.taskId, CallToolResultSchema, req);
        const text = result.content?.[0]?.text ?? '';
        check('elicitation-input', text.startsWith('confirm_delete(bridge.txt)') && text.includes('true') && elicited.length === 1 && elicited[0].related === r.task.taskId, { text, elicited });
    });
    // MRTR (2026-07-28 input within the request): asked before the task exists, on the call's
    // stream (no related-task _meta: there is no task yet), then the task's result names the user.
    await step('mrtr-task-input', async () => {
        const before = elicited.length;
        const r = await callAsTask(client, 'test_tool_with_task', {});
        const result = await client.experimental.tasks.getTaskResult(r.task.taskId, CallToolResultSchema, req);
        const text = result.content?.[0]?.text ?? '';
        const asked = elicited.slice(before);
        check('mrtr-task-input', text === 'Hello from the task, Luca!' && asked.length === 1 && asked[0].related === undefined, { text, asked });
    });
    // The same for a plain call: the answer names the user and shows the requestState came back.
    if (opts['mrtr-plain']) await step('mrtr-plain-input', async () => {
        const before = elicited.length;
        const result = await client.callTool({ name: 'ask_name', arguments: {} }, CallToolResultSchema, req);
        const text = result.content?.[0]?.text ?? '';
        const asked = elicited.slice(before);
        check('mrtr-plain-input', text === 'Hello, Luca! (state asked:name)' && asked.length === 1, { text, asked });
    });
    // A client that never asks for tasks calls a task-only tool (taskSupport "required"; the 2026
    // server answers -32021 to a plain call): through taskgate with [upgrade] the real result.
    await step('upgrade-plain-call', async () => {
        const plain = new Client({ name: 'taskgate-bridge-plain-client', version: '1.0.0' }, { capabilities: {} });
        const t = new StreamableHTTPClientTransport(new URL(url));
        await withTimeout(plain.connect(t, req), 20000, 'initialize (plain)');
        try {
            const progress = [];
            const result = await plain.callTool({ name: 'failing_job', arguments: {} }, CallToolResultSchema, { ...req, onprogress: p => progress.push(p) });
            check('upgrade-plain-call', result.isError === true && result.content?.[0]?.text?.includes('failed on purpose'), { result, progress });
            // Progress first: the SDK calls onprogress for messages before the answer only.
            check('upgrade-progress-first', progress.length >= 1, { progress });
        } finally {
            await t.terminateSession().catch(() => {});
            await plain.close().catch(() => {});
        }
    });
    // The plain client cancels its call (AbortSignal: the SDK sends notifications/cancelled) once it
    // has run for a while: the upstream gets exactly one tasks/cancel, for one new task.
    await step('upgrade-cancel-once', async () => {
        if (!opts.received) return check('upgrade-cancel-once', false, { error: 'no --received' });
        const before = await receivedCancels();
        const plain = new Client({ name: 'taskgate-bridge-plain-client', version: '1.0.0' }, { capabilities: {} });
        const t = new StreamableHTTPClientTransport(new URL(url));
        await withTimeout(plain.connect(t, req), 20000, 'initialize (plain)');
        const abort = new AbortController();
        let progressed;
        const firstProgress = new Promise(resolve => (progressed = resolve));
        const call = plain
            .callTool({ name: 'slow_required', arguments: { seconds: 30 } }, CallToolResultSchema, { timeout: 60000, signal: abort.signal, onprogress: () => progressed() })
            .then(r => ({ result: r }), e => ({ error: describe(e) }));
        const started = await Promise.race([firstProgress.then(() => true), call.then(() => false), sleep(20000).then(() => false)]);
        abort.abort('the user gave up');
        const outcome = await call;
        if (!started) {
            await t.terminateSession().catch(() => {});
            await plain.close().catch(() => {});
            return check('upgrade-cancel-once', false, { started, outcome });
        }
        let fresh = {};
        const deadline = Date.now() + 15000;
        while (Date.now() < deadline) {
            const now = await receivedCancels();
            fresh = Object.fromEntries(Object.entries(now).filter(([id, n]) => n !== (before[id] ?? 0)).map(([id, n]) => [id, n - (before[id] ?? 0)]));
            if (Object.keys(fresh).length > 0) break;
            await sleep(100);
        }
        // Anything more would come soon after the first: look again a little later.
        await sleep(1500);
        const after = await receivedCancels();
        fresh = Object.fromEntries(Object.entries(after).filter(([id, n]) => n !== (before[id] ?? 0)).map(([id, n]) => [id, n - (before[id] ?? 0)]));
        await t.terminateSession().catch(() => {});
        await plain.close().catch(() => {});
        const counts = Object.values(fresh);
        check('upgrade-cancel-once', started && counts.length === 1 && counts[0] === 1, { started, outcome, cancels: fresh });
    });
    if (slow) await expectError('tasks-cancel-terminal', client.experimental.tasks.cancelTask(slow.taskId, req), [-32602]);
    else check('tasks-cancel-terminal', false, { error: 'no task' });
    await transport.terminateSession().catch(() => {});
    await client.close().catch(() => {});
}

try {
    await withTimeout(lifecycle(), opts['timeout-ms'], 'bridge lifecycle');
} catch (error) {
    check('lifecycle-finished', false, { error: describe(error) });
}
const failed = checks.filter(c => !c.ok).map(c => c.name);
const summary = { label: opts.label || undefined, url, ok: failed.length === 0, passed: checks.length - failed.length, total: checks.length, failed, checks };
process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
process.exit(summary.ok ? 0 : 1);
