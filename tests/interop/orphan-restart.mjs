#!/usr/bin/env node
// The upgraded call orphaned by a kill -9 of taskgate (issue 37, item 3), against a real 2026-07-28
// server's task-only tool slow_required, behind taskgate with [upgrade] enabled: modern_task_server.py
// (FastMCP 4.1.4 + fastmcp-tasks 4.1.4) or rmcp-server/ (rmcp 3.11.0, --modern-only: taskgate holds
// the 2025 session).
//
//   node orphan-restart.mjs URL --phase before-restart --admin HOST:PORT --upstream NAME --direct URL
//        --kill PID --state FILE
//   node orphan-restart.mjs URL --phase after-restart --admin HOST:PORT --upstream NAME --direct URL
//        --received URL|FILE --log FILE --state FILE [--label L] [--timeout-ms N]
//
// URL is taskgate's route to the server (http://GW/mcp/NAME), --direct the server itself,
// --received what it received: the FastMCP fixture's tasks/* counter (GET /received), or the rmcp
// fixture's stdout (a `{"received":"tasks/cancel","taskId":...}` line per cancel). before-restart: a 2025-11-25 client without capabilities.tasks
// (raw wire) sends a plain tools/call of slow_required (60 s); once taskgate recorded it as an
// upgraded task and the server itself says that task is `working`, it kill -9s taskgate (PID, while
// the call is still open) and writes the task id to FILE. The caller then starts taskgate again on
// the same store; after-restart waits (polling, bounded by --timeout-ms) until the server itself
// says the task is `cancelled` (tasks/get sent to it directly), and checks that it received a
// tasks/cancel for it, that taskgate's record is `cancelled`, and that taskgate's log (--log, the
// restarted taskgate's stderr) says it cancelled the orphan and reports no refused cancel.
// Prints PASS/FAIL per check and `N/M passed`; exit 0 only when all passed.

import { readFileSync, writeFileSync } from 'node:fs';

const argv = process.argv.slice(2);
const opt = { phase: '', admin: '', upstream: 'modern', direct: '', kill: '', state: '', received: '', log: '', label: 'orphan-restart', 'timeout-ms': '20000' };
let url = '';
for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[++i];
    else url = argv[i];
}
const EXT = 'io.modelcontextprotocol/tasks';
const TIMEOUT = Number(opt['timeout-ms']);
const sleep = ms => new Promise(r => setTimeout(r, ms));
let nextId = 1;

const checks = [];
function check(name, ok, detail = '') {
    checks.push({ name, ok: Boolean(ok), detail: ok ? '' : JSON.stringify(detail).slice(0, 500) });
    console.log(ok ? `PASS ${name}` : `FAIL ${name}: ${checks.at(-1).detail}`);
}

/** Polls `probe` every 150 ms until it returns a truthy value or `ms` pass; returns the last value. */
async function until(probe, ms = TIMEOUT) {
    const end = Date.now() + ms;
    let last;
    while (Date.now() < end) {
        last = await probe().catch(error => ({ error: String(error) }));
        if (last?.done) return last;
        await sleep(150);
    }
    return last;
}

/** Reads a JSON or SSE answer; returns the message with `id`. */
async function answer(res, id) {
    const text = await res.text();
    if (!(res.headers.get('content-type') ?? '').includes('text/event-stream')) return text ? JSON.parse(text) : undefined;
    for (const line of text.split(/\r?\n/)) {
        if (!line.startsWith('data:')) continue;
        try {
            const m = JSON.parse(line.slice(5));
            if (m.id === id) return m;
        } catch {}
    }
}

/** A 2026-07-28 request straight to the server (the task's own view, not taskgate's). */
async function direct(method, params) {
    const id = nextId++;
    const res = await fetch(opt.direct, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2026-07-28', 'mcp-method': method, 'mcp-name': params.taskId },
        body: JSON.stringify({
            jsonrpc: '2.0',
            id,
            method,
            params: { ...params, _meta: { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': { extensions: { [EXT]: {} } } } },
        }),
        signal: AbortSignal.timeout(10000),
    });
    const msg = await answer(res, id);
    return { http: res.status, result: msg?.result, error: msg?.error };
}

async function records() {
    const r = await fetch(`http://${opt.admin}/admin/tasks?upstream=${encodeURIComponent(opt.upstream)}`, { signal: AbortSignal.timeout(10000) });
    return (await r.json()).tasks ?? [];
}

/** How many tasks/cancel of `taskId` the server received (see --received). */
async function cancelsReceived(taskId) {
    if (/^https?:/.test(opt.received)) {
        const received = await fetch(opt.received, { signal: AbortSignal.timeout(10000) }).then(r => r.json());
        return received['tasks/cancel']?.[taskId] ?? 0;
    }
    return readFileSync(opt.received, 'utf8')
        .split('\n')
        .filter(l => l.includes('"received"'))
        .map(l => JSON.parse(l))
        .filter(m => m.received === 'tasks/cancel' && m.taskId === taskId).length;
}

async function beforeRestart() {
    // A 2025-11-25 client that does not declare capabilities.tasks: its plain call of a task-only
    // tool is what taskgate upgrades.
    const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
    const init = await fetch(url, {
        method: 'POST',
        headers,
        body: JSON.stringify({ jsonrpc: '2.0', id: nextId++, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'orphan-restart', version: '1' } } }),
        signal: AbortSignal.timeout(10000),
    });
    await init.text();
    const session = init.headers.get('mcp-session-id');
    check('plain-client-session', init.status === 200 && session, { http: init.status, session });
    Object.assign(headers, { 'mcp-session-id': session, 'mcp-protocol-version': '2025-11-25' });
    await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) }).then(r => r.text());
    // The plain call stays open until taskgate dies.
    const call = fetch(url, {
        method: 'POST',
        headers,
        body: JSON.stringify({ jsonrpc: '2.0', id: nextId++, method: 'tools/call', params: { name: 'slow_required', arguments: { seconds: 60 }, _meta: { progressToken: 'orphan' } } }),
    }).then(
        async res => {
            try {
                return { ended: `HTTP ${res.status}: ${(await res.text()).slice(0, 200)}` };
            } catch (error) {
                return { ended: `stream broke: ${error.cause?.code ?? error.message}` };
            }
        },
        error => ({ ended: `request failed: ${error.cause?.code ?? error.message}` })
    );
    let ended;
    call.then(v => (ended = v));
    const rec = await until(async () => {
        if (ended) return { done: true, ended };
        const r = (await records()).find(t => t.tool === 'slow_required' && t.origin === 'upgraded');
        return { done: r?.status === 'working', record: r };
    });
    check('plain-call-upgraded', rec?.record?.status === 'working' && !ended, rec);
    const taskId = rec?.record?.task_id;
    if (!taskId) return;
    const seen = await until(async () => {
        const r = await direct('tasks/get', { taskId });
        return { done: r.result?.status === 'working', r };
    });
    check('server-runs-the-task', seen?.done, seen);
    writeFileSync(opt.state, JSON.stringify({ taskId }));
    process.kill(Number(opt.kill), 'SIGKILL');
    const broke = await Promise.race([call, sleep(10000).then(() => ({ ended: 'still open 10 s after the kill' }))]);
    check('call-open-until-kill-9', broke.ended && !broke.ended.startsWith('HTTP 200') && !broke.ended.startsWith('still open'), broke);
}

async function afterRestart() {
    const { taskId } = JSON.parse(readFileSync(opt.state, 'utf8'));
    const status = await until(async () => {
        const r = await direct('tasks/get', { taskId });
        return { done: r.result?.status === 'cancelled', http: r.http, status: r.result?.status, error: r.error };
    });
    check('server-says-orphan-cancelled', status?.done, { taskId, waitedMs: TIMEOUT, last: status });
    const cancels = await cancelsReceived(taskId);
    check('server-received-one-tasks-cancel', cancels === 1, { taskId, 'tasks/cancel received': cancels });
    // (Bounded by a short wait when the server never got the cancel: the record then has no
    // reason to move.)
    const rec = await until(async () => {
        const r = (await records()).find(t => t.task_id === taskId);
        return { done: r?.status === 'cancelled', status: r?.status };
    }, status?.done ? TIMEOUT : 2000);
    check('taskgate-record-cancelled', rec?.done, rec);
    // The sweep logs its verdict on the task once it has the cancel's answer: wait for that line
    // (either verdict), then read what the log says.
    const line = await until(async () => {
        const lines = readFileSync(opt.log, 'utf8').split('\n').filter(l => l.includes(taskId) || /orphan/i.test(l));
        return { done: lines.some(l => l.includes(taskId) && /orphaned upgraded task cancelled|could not cancel/.test(l)), lines };
    });
    const lines = line?.lines ?? [];
    check('log-says-orphan-cancelled', lines.some(l => l.includes(taskId) && /orphaned upgraded task cancelled/.test(l)), lines);
    check('log-reports-no-refused-cancel', !lines.some(l => /could not cancel|not found|-32602|refused/i.test(l)), lines);
    const told = lines.filter(l => !l.includes('taskgate::audit')).map(l => l.replace(/^\S+\s+/, ''));
    console.log(`  note taskgate's log on the orphan: ${told.join(' | ').slice(0, 800)}`);
}

const phases = { 'before-restart': beforeRestart, 'after-restart': afterRestart };
try {
    if (!phases[opt.phase] || !url || !opt.admin || !opt.direct || !opt.state) throw new Error('usage: see the head of orphan-restart.mjs');
    await phases[opt.phase]();
} catch (error) {
    check(`${opt.phase || 'phase'}-ran`, false, error?.stack ?? String(error));
}
const passed = checks.filter(c => c.ok).length;
console.log(`${opt.label} ${opt.phase}: ${passed}/${checks.length} passed`);
process.exit(passed === checks.length && checks.length ? 0 : 1);
