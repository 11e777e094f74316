#!/usr/bin/env node
// Cancellation paths (issue 4) against real task servers, direct or through taskgate, with the
// TypeScript SDK 1.32.2 client.
//
//   node cancel-check.mjs SCENARIO URL [--admin HOST:PORT --upstream NAME] [--direct-url URL]
//                         [--tool NAME] [--rounds 30] [--window-ms 50] [--label L] [--seed N]
//
// Without --admin the run is "direct": URL is the server itself. With --admin it is "via": URL is
// taskgate's route to upstream NAME, and the checks include taskgate's own facts (its admin
// /metrics and /admin/tasks). --direct-url (via only) is the same server without taskgate, for a
// view of the upstream's own store where that store is not bound to the session (fastmcp).
// --received is fastmcp_task_server.py's log of the tasks/* requests that reached it.
//
// Scenarios:
//   fastmcp-terminal   fastmcp_task_server.py: quick_task as a task, tasks/get until completed,
//                      then tasks/cancel. direct: fastmcp accepts it (result status cancelled, the
//                      known peer bug) and logged one tasks/cancel; what its store says afterwards
//                      is recorded in info. via: -32602 naming `completed` from taskgate,
//                      rejected_terminal +1 and forwarded +0 on /metrics, fastmcp logged no
//                      tasks/cancel for the task, the registry record still completed with no
//                      cancel_requested_at, fastmcp's own tasks/get (direct, another session)
//                      completed, later tasks/get through taskgate completed.
//   fastmcp-unseen-completion
//                      fastmcp_task_server.py, with a raw-HTTP client that opens no GET stream, so
//                      nothing tells taskgate that quick_task completed: tasks/cancel 600 ms later
//                      is forwarded (taskgate cannot know better) and fastmcp wrongly accepts it.
//                      direct: accepted, and fastmcp's tasks/get still says completed (recorded).
//                      via: the reply says cancelled, and so do the registry (cancelled_at set) and
//                      every later tasks/get through taskgate although fastmcp reports completed:
//                      the first terminal status wins (taskgate_task_late_results_total +1, a
//                      late_result audit event). What tasks/result answers is recorded in info.
//   no-capability      task-server.mjs --mode notasks|legacy (no capabilities.tasks): tools/call of
//                      --tool with params.task. Records what comes back (info.answer: a JSON-RPC
//                      error or a plain result; compared direct vs via by harness.mjs) and, via,
//                      that taskgate holds no task record for the upstream and created none
//                      (taskgate_tasks_created_total unchanged).
//   cancel-working     task-server.mjs stateful: slow_task (3 s) cancelled while working ->
//                      cancelled in the reply, in tasks/get, and (via) in the registry with
//                      cancelled_at set; still cancelled after the work would have completed.
//   cancel-completed   task-server.mjs stateful: fast_task polled to completed, then tasks/cancel
//                      -> -32602 naming `completed`; via: answered by taskgate (rejected_terminal +1,
//                      forwarded +0), the registry still completed; tasks/get still completed.
//   race               task-server.mjs stateful: --rounds rounds of race_task completing after a
//                      random 0..window ms, tasks/cancel at a random moment in the same window. Per
//                      round the cancel reply (result cancelled, or -32602 = it completed first),
//                      tasks/get and (via) the registry agree on one terminal status, and 150 ms
//                      later still do (a recorded cancelled never becomes completed).
//
// Prints one JSON summary {label, scenario, url, mode, ok, failed, checks, info, observed, ms}
// (the shape harness.mjs `tasks` reads) and exits 0 only when every check passed.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, CreateTaskResultSchema, McpError, ResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { parseArgs, sleep, withTimeout } from './lib.mjs';

const opts = parseArgs(process.argv.slice(2), {
    _: [],
    label: '',
    admin: '',
    upstream: '',
    'direct-url': '',
    received: '',
    tool: 'fast_task',
    rounds: 30,
    'window-ms': 50,
    seed: 0,
    'timeout-ms': 120000
});
const [scenario, url] = opts._;
const SCENARIOS = ['fastmcp-terminal', 'fastmcp-unseen-completion', 'no-capability', 'cancel-working', 'cancel-completed', 'race'];
if (!SCENARIOS.includes(scenario) || !url || opts._.length !== 2 || (opts.admin && !opts.upstream)) {
    console.error(`usage: node cancel-check.mjs ${SCENARIOS.join('|')} URL [--admin HOST:PORT --upstream NAME] [--direct-url URL] [--rounds N] [--label L]`);
    process.exit(2);
}
const VIA = !!opts.admin;
const REQ = { timeout: 15000 };
const TERMINAL = ['completed', 'failed', 'cancelled'];

const checks = [];
const info = {};
const observed = {};

function check(name, ok, detail) {
    checks.push({ name, ok: !!ok, ...(detail === undefined ? {} : { detail }) });
    return !!ok;
}

function describeError(error) {
    if (error instanceof McpError) return { code: error.code, message: error.message, ...(error.data === undefined ? {} : { data: error.data }) };
    return { message: error?.message ?? String(error) };
}

/** Resolves to {result} or {error} (never throws). */
async function settle(promise) {
    try {
        return { result: await promise };
    } catch (error) {
        return { error: describeError(error) };
    }
}

// A small seeded PRNG (mulberry32) so a failing race round can be replayed with --seed.
let seed = opts.seed || (Date.now() ^ (process.pid << 8)) >>> 0;
const firstSeed = seed;
function random() {
    seed = (seed + 0x6d2b79f5) >>> 0;
    let t = seed;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}

async function connect(target, name, capabilities = { tasks: { list: {}, cancel: {} } }) {
    const client = new Client({ name, version: '1.0.0' }, { capabilities });
    const statusNotes = []; // notifications/tasks/status as they arrive: "taskId status"
    client.fallbackNotificationHandler = async n => {
        if (n.method === 'notifications/tasks/status') statusNotes.push({ taskId: n.params?.taskId, status: n.params?.status });
    };
    const transport = new StreamableHTTPClientTransport(new URL(target));
    await withTimeout(client.connect(transport, REQ), 15000, `initialize ${target}`);
    return {
        client,
        transport,
        statusNotes,
        close: async () => {
            await transport.terminateSession().catch(() => {});
            await client.close().catch(() => {});
        }
    };
}

function callAsTask(client, name, args, ttl = 60000) {
    return client.request({ method: 'tools/call', params: { name, arguments: args, task: { ttl } } }, CreateTaskResultSchema, REQ);
}

async function pollUntilTerminal(client, taskId, maxMs = 10000) {
    const deadline = Date.now() + maxMs;
    const statuses = [];
    for (;;) {
        const task = await client.experimental.tasks.getTask(taskId, REQ);
        if (statuses.at(-1) !== task.status) statuses.push(task.status);
        if (TERMINAL.includes(task.status) || Date.now() > deadline) return { task, statuses };
        await sleep(50);
    }
}

// ---- taskgate's admin listener (via only) --------------------------------------------------------

/** Parses the Prometheus text exposition into [{name, labels, value}]. */
async function metrics() {
    const r = await fetch(`http://${opts.admin}/metrics`);
    if (!r.ok) throw new Error(`/metrics: HTTP ${r.status}`);
    const out = [];
    for (const line of (await r.text()).split('\n')) {
        const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/);
        if (!m) continue;
        const labels = {};
        for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
        out.push({ name: m[1], labels, value: Number(m[3]) });
    }
    return out;
}

/** Sum of `name` samples on our upstream whose labels match `where`. */
function metric(samples, name, where = {}) {
    return samples
        .filter(s => s.name === name && s.labels.upstream === opts.upstream && Object.entries(where).every(([k, v]) => s.labels[k] === v))
        .reduce((a, s) => a + s.value, 0);
}

const CANCEL_OUTCOMES = ['forwarded', 'deduplicated', 'rejected_terminal', 'rejected_unknown', 'upstream_error'];
function cancelCounts(samples) {
    return Object.fromEntries(CANCEL_OUTCOMES.map(o => [o, metric(samples, 'taskgate_cancel_requests_total', { outcome: o })]));
}
function delta(after, before) {
    return Object.fromEntries(Object.keys(after).map(k => [k, after[k] - before[k]]));
}

/** How many tasks/cancel for taskId the upstream logged (fastmcp_task_server.py GET /received). */
async function receivedCancels(taskId) {
    const r = await fetch(opts.received);
    if (!r.ok) throw new Error(`${opts.received}: HTTP ${r.status}`);
    return (await r.json())['tasks/cancel']?.[taskId] ?? 0;
}

/** taskgate's record and audit events for one task, or null (404). */
async function registry(taskId) {
    const r = await fetch(`http://${opts.admin}/admin/tasks/${encodeURIComponent(opts.upstream)}/${encodeURIComponent(taskId)}`);
    if (r.status === 404) return null;
    if (!r.ok) throw new Error(`/admin/tasks/${opts.upstream}/${taskId}: HTTP ${r.status}`);
    return r.json();
}

async function registryList() {
    const r = await fetch(`http://${opts.admin}/admin/tasks?upstream=${encodeURIComponent(opts.upstream)}`);
    if (!r.ok) throw new Error(`/admin/tasks: HTTP ${r.status}`);
    return (await r.json()).tasks ?? [];
}

const brief = rec => rec && { status: rec.task.status, cancel_requested_at: rec.task.cancel_requested_at, cancelled_at: rec.task.cancelled_at, terminal_at: rec.task.terminal_at, audit: rec.audit.map(e => e.event) };

// ---- scenarios -----------------------------------------------------------------------------------

/** Completed task, then tasks/cancel: shared by fastmcp-terminal and cancel-completed. */
async function cancelAfterCompletion({ tool, args, peer }) {
    const { client, close, statusNotes } = await connect(url, `taskgate-interop-cancel-${scenario}`);
    try {
        const created = await callAsTask(client, tool, args);
        const taskId = created.task.taskId;
        info.createStatus = created.task.status;
        const { task, statuses } = await pollUntilTerminal(client, taskId);
        if (!check('task-completed-before-cancel', task.status === 'completed', { statuses })) return;
        const before = VIA ? await metrics() : null;
        const notesBefore = statusNotes.length;
        const cancel = await settle(client.experimental.tasks.cancelTask(taskId, REQ));
        info.cancelAnswer = cancel.error ? { error: cancel.error } : { result: { status: cancel.result.status, statusMessage: cancel.result.statusMessage } };
        await sleep(300); // a status notification the cancel may cause
        info.statusNotificationsAfterCancel = statusNotes.slice(notesBefore).filter(n => n.taskId === taskId).map(n => n.status);
        const later = await settle(client.experimental.tasks.getTask(taskId, REQ));
        const laterStatus = later.result?.status ?? later.error;
        info.tasksGetAfterCancel = laterStatus;
        const result = await settle(client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema, REQ));
        info.tasksResultAfterCancel = result.error ? { error: result.error } : { text: result.result.content?.[0]?.text };

        const received = opts.received ? await receivedCancels(taskId) : undefined;
        if (received !== undefined) info.cancelsReceivedByUpstream = received;
        if (!VIA && peer === 'fastmcp') {
            // The peer bug, pinned: if a later fastmcp gets this right, this check says so. What its
            // store says afterwards is recorded (info.tasksGetAfterCancel), not judged.
            check('direct-fastmcp-accepts-cancel-of-completed', cancel.result?.status === 'cancelled', { answer: cancel });
            if (opts.received) check('direct-fastmcp-received-the-cancel', received === 1, { received });
            return;
        }
        const rejected = cancel.error?.code === -32602 && /completed/.test(cancel.error.message ?? '');
        check('cancel-of-completed-is-32602-naming-status', rejected, { answer: cancel });
        check('tasks-get-after-cancel-still-completed', laterStatus === 'completed', { tasksGet: later });
        if (!VIA) return;

        const counts = delta(cancelCounts(await metrics()), cancelCounts(before));
        observed.cancelOutcomes = counts;
        check('metrics-rejected-terminal-1-forwarded-0', counts.rejected_terminal === 1 && counts.forwarded === 0 && counts.upstream_error === 0, { delta: counts });
        const rec = await registry(taskId);
        info.registry = brief(rec);
        check(
            'registry-still-completed-no-cancel-forwarded',
            rec?.task.status === 'completed' && rec.task.cancel_requested_at == null && rec.task.cancelled_at == null && !rec.audit.some(e => e.event === 'cancel_requested'),
            { registry: brief(rec) }
        );
        if (opts.received) check('upstream-never-received-the-cancel', received === 0, { received });
        if (opts['direct-url']) {
            // fastmcp's store is not bound to a session (no auth: one anonymous scope), so a direct
            // session sees the task as fastmcp holds it: still completed means the cancel never got there.
            const direct = await connect(opts['direct-url'], 'taskgate-interop-upstream-view');
            try {
                const view = await settle(direct.client.experimental.tasks.getTask(taskId, REQ));
                info.upstreamView = view.result?.status ?? view.error;
                check('upstream-own-view-still-completed', view.result?.status === 'completed', { upstreamTasksGet: view });
            } finally {
                await direct.close();
            }
        }
    } finally {
        await close();
    }
}

/** A bare Streamable HTTP client (fetch only): no GET stream, so no notification reaches it. */
function rawSession(target) {
    let sessionId;
    let n = 0;
    const headers = () => ({
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': '2025-11-25',
        ...(sessionId ? { 'mcp-session-id': sessionId } : {})
    });
    const post = async body => {
        const r = await fetch(target, { method: 'POST', headers: headers(), body: JSON.stringify(body), signal: AbortSignal.timeout(15000) });
        sessionId ??= r.headers.get('mcp-session-id') ?? undefined;
        return r;
    };
    return {
        async request(method, params) {
            const id = ++n;
            const r = await post({ jsonrpc: '2.0', id, method, params });
            const text = await r.text();
            const msgs = (r.headers.get('content-type') ?? '').startsWith('text/event-stream')
                ? text.split('\n').filter(l => l.startsWith('data:')).map(l => l.slice(5).trim()).filter(Boolean).map(l => JSON.parse(l))
                : [JSON.parse(text)];
            const reply = msgs.find(m => m.id === id);
            if (!reply) throw new Error(`${method}: HTTP ${r.status}, no reply in ${text.slice(0, 200)}`);
            return reply; // {result} or {error}
        },
        async notify(method, params) {
            await (await post({ jsonrpc: '2.0', method, params })).text();
        },
        async close() {
            if (sessionId) await fetch(target, { method: 'DELETE', headers: headers() }).catch(() => {});
        }
    };
}

async function unseenCompletion() {
    const raw = rawSession(url);
    try {
        const init = await raw.request('initialize', { protocolVersion: '2025-11-25', capabilities: { tasks: { list: {}, cancel: {} } }, clientInfo: { name: 'taskgate-interop-raw', version: '1.0.0' } });
        if (!check('initialize', init.result, init)) return;
        await raw.notify('notifications/initialized', {});
        const created = await raw.request('tools/call', { name: 'quick_task', arguments: { text: 'unseen' }, task: { ttl: 60000 } });
        const taskId = created.result?.task?.taskId;
        if (!check('task-created', taskId, created)) return;
        await sleep(600); // quick_task completed upstream long ago; nobody told taskgate
        const before = VIA ? await metrics() : null;
        const regBefore = VIA ? brief(await registry(taskId)) : undefined;
        if (VIA) check('registry-has-not-seen-completion', regBefore?.status === 'working', { registry: regBefore });
        const cancel = await raw.request('tasks/cancel', { taskId });
        info.cancelAnswer = cancel.error ? { error: cancel.error } : { result: { status: cancel.result.status, statusMessage: cancel.result.statusMessage } };
        check('cancel-accepted-cancelled', cancel.result?.status === 'cancelled', { answer: cancel });
        const gets = [];
        for (let i = 0; i < 2; i++) {
            if (i) await sleep(200);
            const g = await raw.request('tasks/get', { taskId });
            gets.push(g.result?.status ?? g.error);
        }
        info.tasksGetAfterCancel = gets;
        const result = await raw.request('tasks/result', { taskId });
        info.tasksResultAfterCancel = result.error ? { error: result.error } : { isError: result.result.isError ?? false, text: result.result.content?.[0]?.text };
        if (opts.received) {
            const received = await receivedCancels(taskId);
            info.cancelsReceivedByUpstream = received;
            check('upstream-received-the-cancel', received === 1, { received });
        }
        if (!VIA) {
            // fastmcp's reply contradicts its own store: recorded, not judged.
            return;
        }
        check('tasks-get-stays-cancelled', gets.every(g => g === 'cancelled'), { tasksGet: gets });
        const rec = await registry(taskId);
        info.registry = brief(rec);
        check('registry-cancelled-with-late-result', rec?.task.status === 'cancelled' && rec.task.cancelled_at != null && rec.audit.some(e => e.event === 'late_result'), { registry: brief(rec) });
        const after = await metrics();
        const late = metric(after, 'taskgate_task_late_results_total') - metric(before, 'taskgate_task_late_results_total');
        const counts = delta(cancelCounts(after), cancelCounts(before));
        observed.cancelOutcomes = counts;
        check('metrics-forwarded-1-late-result-1', counts.forwarded === 1 && late >= 1, { delta: counts, lateResults: late });
    } finally {
        await raw.close();
    }
}

async function noCapability() {
    const { client, close } = await connect(url, 'taskgate-interop-no-capability');
    try {
        const caps = client.getServerCapabilities();
        check('server-declares-no-tasks-capability', caps && caps.tasks === undefined, { capabilities: caps });
        const before = VIA ? await metrics() : null;
        const recordsBefore = VIA ? await registryList() : null;
        // ResultSchema (loose): whatever comes back is recorded, CreateTaskResult or not.
        const answer = await settle(client.request({ method: 'tools/call', params: { name: opts.tool, arguments: { text: 'no-cap' }, task: { ttl: 60000 } } }, ResultSchema, REQ));
        const r = answer.result;
        info.answer = answer.error
            ? { kind: 'error', code: answer.error.code, message: answer.error.message }
            : r.task
              ? { kind: 'CreateTaskResult', status: r.task.status }
              : { kind: 'result', isError: r.isError ?? false, text: r.content?.[0]?.text };
        check('answer-is-no-task', answer.error || !r.task, { answer });
        const plain = await settle(client.callTool({ name: opts.tool, arguments: { text: 'plain' } }, CallToolResultSchema, REQ));
        check('plain-call-still-works', !plain.error && !plain.result.isError, { plain });
        if (!VIA) return;
        await sleep(200);
        const records = await registryList();
        info.records = records.length;
        check('no-task-record-for-upstream', records.length === 0 && recordsBefore.length === 0, { records: records.map(x => ({ task_id: x.task_id, status: x.status, tool: x.tool })) });
        const created = metric(await metrics(), 'taskgate_tasks_created_total') - metric(before, 'taskgate_tasks_created_total');
        check('metrics-no-task-created', created === 0, { taskgate_tasks_created_total_delta: created });
    } finally {
        await close();
    }
}

async function cancelWorking() {
    const { client, close } = await connect(url, 'taskgate-interop-cancel-working');
    try {
        const before = VIA ? await metrics() : null;
        const created = await callAsTask(client, 'slow_task', { duration_ms: 3000, steps: 3 });
        const taskId = created.task.taskId;
        check('created-working', created.task.status === 'working', { task: created.task });
        await sleep(200);
        const cancel = await settle(client.experimental.tasks.cancelTask(taskId, REQ));
        info.cancelAnswer = cancel.error ? { error: cancel.error } : { result: { status: cancel.result.status } };
        check('cancel-reply-cancelled', cancel.result?.status === 'cancelled' && cancel.result.taskId === taskId, { answer: cancel });
        const now = await settle(client.experimental.tasks.getTask(taskId, REQ));
        check('tasks-get-cancelled', now.result?.status === 'cancelled', { tasksGet: now });
        if (VIA) {
            const rec = await registry(taskId);
            info.registryAfterCancel = brief(rec);
            check('registry-cancelled', rec?.task.status === 'cancelled' && rec.task.cancelled_at != null && rec.task.cancel_requested_at != null, { registry: brief(rec) });
        }
        await sleep(3300); // past the moment the work would have completed
        const later = await settle(client.experimental.tasks.getTask(taskId, REQ));
        check('tasks-get-still-cancelled-after-work-time', later.result?.status === 'cancelled', { tasksGet: later });
        if (VIA) {
            const rec = await registry(taskId);
            info.registryLater = brief(rec);
            check('registry-still-cancelled', rec?.task.status === 'cancelled', { registry: brief(rec) });
            const counts = delta(cancelCounts(await metrics()), cancelCounts(before));
            observed.cancelOutcomes = counts;
            check('metrics-forwarded-1', counts.forwarded === 1 && counts.rejected_terminal === 0 && counts.upstream_error === 0, { delta: counts });
        }
    } finally {
        await close();
    }
}

let roundsDetail;
async function race() {
    const { client, close } = await connect(url, 'taskgate-interop-cancel-race');
    const window = opts['window-ms'];
    const tally = { cancelled: 0, completed: 0, other: 0 };
    const bad = [];
    const rounds = [];
    try {
        const before = VIA ? await metrics() : null;
        for (let i = 0; i < opts.rounds; i++) {
            const completeAfter = Math.floor(random() * (window + 1));
            const cancelAt = Math.floor(random() * (window + 1));
            const round = { i, completeAfter, cancelAt };
            rounds.push(round);
            const created = await callAsTask(client, 'race_task', { delay_ms: completeAfter });
            const taskId = created.task.taskId;
            round.taskId = taskId;
            const t0 = Date.now();
            await sleep(cancelAt);
            round.cancelSentAfter = Date.now() - t0;
            const cancel = await settle(client.experimental.tasks.cancelTask(taskId, REQ));
            round.cancel = cancel.error ? { code: cancel.error.code, message: cancel.error.message } : { status: cancel.result.status };
            // What the cancel reply says the final state is: cancelled when accepted, completed
            // when refused as terminal (-32602) -- the only other end race_task can reach.
            const fromReply = cancel.result?.status === 'cancelled' ? 'cancelled' : cancel.error?.code === -32602 ? 'completed' : `unexpected ${JSON.stringify(round.cancel)}`;
            if (cancel.error?.code === -32602 && !/completed/.test(cancel.error.message ?? '')) round.note = 'refusal does not name completed';
            const get1 = await settle(client.experimental.tasks.getTask(taskId, REQ));
            round.get = get1.result?.status ?? get1.error;
            let reg1;
            if (VIA) round.registry = (reg1 = await registry(taskId))?.task.status ?? null;
            await sleep(150); // past completeAfter whatever happened: a late completion would show now
            const get2 = await settle(client.experimental.tasks.getTask(taskId, REQ));
            round.getLater = get2.result?.status ?? get2.error;
            if (VIA) round.registryLater = (await registry(taskId))?.task.status ?? null;
            const seen = [fromReply, round.get, round.getLater, ...(VIA ? [round.registry, round.registryLater] : [])];
            const agree = seen.every(s => s === fromReply) && TERMINAL.includes(fromReply);
            if (!agree) bad.push(round);
            if (VIA && fromReply === 'cancelled' && reg1?.task.cancelled_at == null) bad.push({ ...round, problem: 'registry cancelled without cancelled_at' });
            tally[fromReply] !== undefined ? tally[fromReply]++ : tally.other++;
        }
        observed.raceTally = tally;
        info.rounds = opts.rounds;
        check('race-every-round-agrees', bad.length === 0, { disagreeing: bad.slice(0, 10), tally });
        // Both ends must actually have been reached, or the race did not race.
        check('race-both-outcomes-seen', tally.cancelled > 0 && tally.completed > 0, { tally });
        if (VIA) {
            const counts = delta(cancelCounts(await metrics()), cancelCounts(before));
            observed.cancelOutcomes = counts;
            const sum = CANCEL_OUTCOMES.reduce((a, o) => a + counts[o], 0);
            check('metrics-one-outcome-per-cancel', sum === opts.rounds && counts.rejected_unknown === 0 && counts.forwarded >= tally.cancelled, { delta: counts, tally });
        }
    } finally {
        roundsDetail = rounds.map(r => `${r.i}:${r.completeAfter}/${r.cancelAt}->${r.cancel?.status ?? r.cancel?.code}`).join(' ');
        await close();
    }
}

const started = Date.now();
try {
    await withTimeout(
        (async () => {
            switch (scenario) {
                case 'fastmcp-terminal':
                    return cancelAfterCompletion({ tool: 'quick_task', args: { text: 'terminal' }, peer: 'fastmcp' });
                case 'fastmcp-unseen-completion':
                    return unseenCompletion();
                case 'cancel-completed':
                    return cancelAfterCompletion({ tool: 'fast_task', args: { text: 'terminal' }, peer: 'ts' });
                case 'no-capability':
                    return noCapability();
                case 'cancel-working':
                    return cancelWorking();
                case 'race':
                    return race();
            }
        })(),
        opts['timeout-ms'],
        scenario
    );
} catch (error) {
    check('scenario-finished', false, { error: describeError(error) });
}
const failed = checks.filter(c => !c.ok).map(c => c.name);
const summary = {
    label: opts.label || undefined,
    scenario,
    url,
    mode: VIA ? 'via' : 'direct',
    seed: firstSeed,
    ...(roundsDetail ? { rounds: roundsDetail } : {}),
    ok: failed.length === 0 && checks.length > 0,
    passed: checks.length - failed.length,
    failed,
    ms: Date.now() - started,
    observed,
    info,
    checks
};
process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
if (!summary.ok) console.error(`cancel-check ${scenario}${opts.label ? ` [${opts.label}]` : ''}: FAILED checks: ${failed.join(', ') || '(none ran)'}`);
process.exit(summary.ok ? 0 : 1);
