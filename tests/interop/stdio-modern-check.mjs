#!/usr/bin/env node
// The 2026-07-28 task lifecycle through taskgate to an rmcp 3.11 stdio server (issue 31): the
// rmcp fixture (rmcp-server/, `--stdio`, dual-era or `--modern-only`) as taskgate's `command`
// child, driven on the raw 2026-07-28 wire (fetch only, no SDK: every request a stateless POST
// with the MCP-Protocol-Version, Mcp-Method and Mcp-Name headers and protocolVersion,
// clientCapabilities (the tasks extension) and clientInfo in params._meta). stdio.sh runs it.
//
//   node stdio-modern-check.mjs URL --admin HOST:PORT --upstream NAME --received FILE
//        --pid-file FILE [--label L] [--json FILE]
//
// URL is taskgate's route to the upstream (http://GW/mcp/NAME); FILE (--received) the fixture's
// `{"received":"tasks/cancel","taskId":ID}` lines; --pid-file the child's pid (read once, just
// before it is killed). Checks, in order:
//   discover        server/discover (the client's first request) names 2026-07-28 and the tasks
//                   extension
//   lifecycle       a task-augmented tools/call answered resultType "task"; tasks/get polled until
//                   terminal: completed with the result inline; taskgate's record completed
//   cancel          20 concurrent tasks/cancel of a running task: all acked, exactly one reaches
//                   the child; the task settles cancelled; the record has both audit facts
//                   (status_cancelled, resources_released) and /metrics counts them
//                   (taskgate_tasks_cancelled_total, taskgate_task_resources_released_total) and
//                   one forwarded cancel
//   parallel        two clients at once whose JSON-RPC ids collide (each counts from 1), each
//                   with its own task: each sees its own task complete with its own result
//   killed          kill -9 of the child mid-task: the task becomes failed with a statusMessage
//                   naming the restart; taskgate_upstream_restarts_total counts it; /readyz is
//                   green again; the next call and a new task work (on the new child)
// Prints PASS/FAIL per check and `N/M passed`; exit 0 only when all passed. --json FILE:
// {label, ok, checks:[{name, ok, detail}], ms}.

import { readFileSync, writeFileSync } from 'node:fs';

const argv = process.argv.slice(2);
const opt = { label: 'stdio-modern', json: '', admin: '', upstream: '', received: '', 'pid-file': '' };
let url = '';
for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[++i];
    else url = argv[i];
}
if (!url || !opt.admin || !opt.upstream || !opt.received || !opt['pid-file']) {
    console.error('usage: stdio-modern-check.mjs URL --admin HOST:PORT --upstream NAME --received FILE --pid-file FILE [--label L] [--json FILE]');
    process.exit(2);
}
const EXT = 'io.modelcontextprotocol/tasks';
const VERSION = '2026-07-28';
const TERMINAL = ['completed', 'failed', 'cancelled'];
const sleep = ms => new Promise(r => setTimeout(r, ms));
const started = Date.now();

/** A 2026-07-28 client: its own JSON-RPC ids, counted from 1. */
function client(name) {
    let nextId = 1;
    return async function rpc(method, params = {}) {
        const body = {
            jsonrpc: '2.0',
            id: nextId++,
            method,
            params: {
                ...params,
                _meta: {
                    'io.modelcontextprotocol/protocolVersion': VERSION,
                    'io.modelcontextprotocol/clientCapabilities': { extensions: { [EXT]: {} } },
                    'io.modelcontextprotocol/clientInfo': { name, version: '1.0.0' },
                },
            },
        };
        const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': VERSION, 'mcp-method': method };
        const routed = params.taskId ?? params.name;
        if (routed) headers['mcp-name'] = routed;
        const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body), signal: AbortSignal.timeout(30000) });
        const text = await res.text();
        let msg;
        if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
            for (const line of text.split(/\r?\n/)) {
                if (!line.startsWith('data:')) continue;
                try {
                    const m = JSON.parse(line.slice(5));
                    if (m.id === body.id) msg = m;
                } catch {}
            }
        } else {
            try {
                msg = JSON.parse(text);
            } catch {
                msg = { raw: text.slice(0, 200) };
            }
        }
        return { http: res.status, id: body.id, body: msg, result: msg?.result, error: msg?.error };
    };
}

const checks = [];
function check(name, ok, detail = '') {
    checks.push({ name, ok: Boolean(ok), detail: ok ? '' : String(typeof detail === 'string' ? detail : JSON.stringify(detail)).slice(0, 500) });
    console.log(ok ? `PASS ${name}` : `FAIL ${name}: ${checks.at(-1).detail}`);
    return Boolean(ok);
}
const brief = r => ({ http: r?.http, result: r?.result && { resultType: r.result.resultType, status: r.result.status, statusMessage: r.result.statusMessage, text: r.result.result?.content?.[0]?.text }, error: r?.error });

async function create(rpc, tool, args) {
    const r = await rpc('tools/call', { name: tool, arguments: args });
    return { r, taskId: r.result?.resultType === 'task' ? r.result.taskId : undefined };
}
/** tasks/get until terminal (or `ms`); the statuses seen, in order. */
async function poll(rpc, taskId, ms = 20000) {
    const end = Date.now() + ms;
    const seen = [];
    let last;
    while (Date.now() < end) {
        last = await rpc('tasks/get', { taskId });
        const s = last.result?.status ?? `error ${last.error?.code}`;
        if (seen.at(-1) !== s) seen.push(s);
        if (TERMINAL.includes(last.result?.status)) break;
        await sleep(150);
    }
    return { last, seen };
}
async function admin(path) {
    const r = await fetch(`http://${opt.admin}${path}`, { signal: AbortSignal.timeout(10000) });
    return { status: r.status, body: r.headers.get('content-type')?.includes('json') ? await r.json() : await r.text() };
}
const record = async taskId => (await admin(`/admin/tasks/${encodeURIComponent(opt.upstream)}/${encodeURIComponent(taskId)}`)).body;
/** Prometheus samples of our upstream: {name{labels}: value}, labels other than upstream kept. */
async function metrics() {
    const text = (await admin('/metrics')).body;
    const out = {};
    for (const line of String(text).split('\n')) {
        const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/);
        if (!m) continue;
        const labels = Object.fromEntries([...(m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)].map(l => [l[1], l[2]]));
        if (labels.upstream !== opt.upstream) continue;
        const rest = Object.entries(labels).filter(([k]) => k !== 'upstream').map(([k, v]) => `${k}=${v}`).join(',');
        out[`${m[1]}{${rest}}`] = Number(m[3]);
    }
    return out;
}
/** The sum of `name` samples (any other labels) in `after` minus `before`. */
function grew(before, after, name, where = '') {
    const sum = s => Object.entries(s).filter(([k]) => k.startsWith(`${name}{`) && k.includes(where)).reduce((a, [, v]) => a + v, 0);
    return sum(after) - sum(before);
}
/** The child's tasks/cancel lines for taskId. */
function cancelsReceived(taskId) {
    let text = '';
    try {
        text = readFileSync(opt.received, 'utf8');
    } catch {}
    return text.split('\n').filter(l => l.trim()).map(l => JSON.parse(l)).filter(m => m.received === 'tasks/cancel' && m.taskId === taskId).length;
}

async function discover() {
    const rpc = client(`${opt.label}-discover`);
    const d = await rpc('server/discover');
    check('discover-names-2026-07-28', (d.result?.supportedVersions ?? []).includes(VERSION), brief(d));
    check('discover-advertises-tasks-extension', d.result?.capabilities?.extensions?.[EXT] !== undefined, d.result?.capabilities ?? d.body);
}

async function lifecycle() {
    const rpc = client(`${opt.label}-lifecycle`);
    const { r, taskId } = await create(rpc, 'slow_compute', { seconds: 1, label: 'stdio-lifecycle' });
    check('call-answered-resulttype-task', taskId && r.result.status === 'working' && r.http === 200, brief(r));
    if (!taskId) return;
    const { last, seen } = await poll(rpc, taskId);
    check('polled-working-then-completed', seen[0] === 'working' && last.result?.status === 'completed', seen);
    check('completed-result-inline', last.result?.result?.content?.[0]?.text === 'slow_compute(stdio-lifecycle) done after 1s', brief(last));
    const rec = await record(taskId);
    check('record-completed-modern', rec?.task?.status === 'completed' && rec?.task?.era === 'modern', rec?.task ?? rec);
}

async function cancel() {
    const rpc = client(`${opt.label}-cancel`);
    const before = await metrics();
    const { r, taskId } = await create(rpc, 'slow_required', { seconds: 60 });
    if (!check('cancel-task-created', taskId, brief(r))) return;
    const working = await rpc('tasks/get', { taskId });
    check('cancel-task-working', working.result?.status === 'working', brief(working));
    const acks = await Promise.all(Array.from({ length: 20 }, () => rpc('tasks/cancel', { taskId }).catch(e => ({ error: String(e) }))));
    const acked = acks.filter(a => a.result?.resultType === 'complete').length;
    check('cancel-20-concurrent-all-acked', acked === 20, `${acked}/20; first other: ${JSON.stringify(acks.find(a => a.result?.resultType !== 'complete')?.body ?? null)}`);
    const { last, seen } = await poll(rpc, taskId, 10000);
    check('cancel-settles-cancelled', last.result?.status === 'cancelled', seen);
    await sleep(300); // a straggling cancel would be on the child's stderr by now
    const got = cancelsReceived(taskId);
    check('cancel-exactly-one-reaches-the-child', got === 1, `the child logged ${got} tasks/cancel for ${taskId}`);
    // "resources released" waits for tasks.release_quiet_ms of quiet after "status cancelled".
    let rec;
    for (let i = 0; i < 50; i++) {
        rec = await record(taskId);
        if (rec?.audit?.some(e => e.event === 'resources_released')) break;
        await sleep(200);
    }
    const events = (rec?.audit ?? []).map(e => e.event);
    check('record-cancelled', rec?.task?.status === 'cancelled' && rec?.task?.cancelled_at != null, rec?.task ?? rec);
    check('record-audit-both-facts', events.includes('status_cancelled') && events.includes('resources_released'), events);
    const after = await metrics();
    const facts = {
        cancelled: grew(before, after, 'taskgate_tasks_cancelled_total'),
        released: grew(before, after, 'taskgate_task_resources_released_total'),
        forwarded: grew(before, after, 'taskgate_cancel_requests_total', 'outcome=forwarded'),
    };
    check('metrics-both-audit-facts', facts.cancelled === 1 && facts.released === 1, facts);
    check('metrics-one-cancel-forwarded', facts.forwarded === 1, facts);
}

async function parallel() {
    // Two clients at once, each counting its JSON-RPC ids from 1: taskgate writes its own ids to
    // the shared child and maps the answers back.
    const one = async who => {
        const rpc = client(`${opt.label}-${who}`);
        const { r, taskId } = await create(rpc, 'slow_compute', { seconds: 1, label: who });
        if (!taskId) return { who, created: brief(r) };
        const { last } = await poll(rpc, taskId);
        return { who, taskId, firstId: r.id, status: last.result?.status, text: last.result?.result?.content?.[0]?.text };
    };
    const [a, b] = await Promise.all([one('client-a'), one('client-b')]);
    check('parallel-ids-collide', a.firstId === 1 && b.firstId === 1, [a, b]);
    check('parallel-distinct-tasks', a.taskId && b.taskId && a.taskId !== b.taskId, [a, b]);
    check('parallel-each-own-result', [a, b].every(x => x.status === 'completed' && x.text === `slow_compute(${x.who}) done after 1s`), [a, b]);
}

async function killed() {
    const rpc = client(`${opt.label}-killed`);
    const before = await metrics();
    const { r, taskId } = await create(rpc, 'slow_required', { seconds: 60 });
    if (!check('killed-task-created', taskId, brief(r))) return;
    const working = await rpc('tasks/get', { taskId });
    check('killed-task-working', working.result?.status === 'working', brief(working));
    const pids = readFileSync(opt['pid-file'], 'utf8').trim().split(/\s+/).map(Number).filter(Boolean);
    if (!check('killed-child-known', pids.length === 1, pids)) return;
    process.kill(pids[0], 'SIGKILL');
    const { last, seen } = await poll(rpc, taskId, 15000);
    check('killed-task-failed', last.result?.status === 'failed', seen);
    check('killed-status-message-names-restart', /restarted/.test(last.result?.statusMessage ?? '') && last.result.statusMessage.includes(opt.upstream), brief(last));
    // The 2026-07-28 shape (a flat Task with resultType, ttlMs), whoever answers it.
    check('killed-answer-2026-shape', last.result?.resultType === 'complete' && !('ttl' in (last.result ?? {})), last.body);
    let ready = false;
    for (let i = 0; i < 100 && !ready; i++) {
        ready = (await admin('/readyz')).status === 200;
        if (!ready) await sleep(100);
    }
    check('killed-ready-again', ready);
    const rec = await record(taskId);
    const events = (rec?.audit ?? []).map(e => e.event);
    check('killed-record-failed-released', rec?.task?.status === 'failed' && events.includes('resources_released'), { task: rec?.task, events });
    const after = await metrics();
    check('killed-restart-counted', grew(before, after, 'taskgate_upstream_restarts_total') === 1, grew(before, after, 'taskgate_upstream_restarts_total'));
    const greet = await rpc('tools/call', { name: 'greet', arguments: { name: 'after restart' } });
    check('killed-next-call-works', greet.result?.content?.[0]?.text === 'Hello, after restart!', brief(greet));
    const next = await create(rpc, 'slow_compute', { seconds: 0.2, label: 'after-restart' });
    const done = next.taskId ? (await poll(rpc, next.taskId)).last : next.r;
    check('killed-next-task-completes', done.result?.status === 'completed' && /after-restart/.test(done.result?.result?.content?.[0]?.text ?? ''), brief(done));
}

for (const step of [discover, lifecycle, cancel, parallel, killed]) {
    try {
        await step();
    } catch (e) {
        check(`${step.name}-no-exception`, false, String(e?.stack ?? e));
    }
}
const passed = checks.filter(c => c.ok).length;
console.log(`${opt.label}: ${passed}/${checks.length} passed`);
if (opt.json) writeFileSync(opt.json, JSON.stringify({ label: opt.label, ok: passed === checks.length, checks, ms: Date.now() - started }));
process.exit(passed === checks.length ? 0 : 1);
