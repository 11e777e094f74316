#!/usr/bin/env node
// A held session across a kill -9 of taskgate (issue 12): a 2025-11-25 client (raw wire, as the
// TS SDK 1.x sends it) on a pure 2026-07-28 upstream (rmcp 3.11 --modern-only: no initialize,
// taskgate holds the 2025 session itself), auth none (a task's owner is the session id).
//
//   node held-restart.mjs URL --phase before-restart|after-restart --state FILE [--label L]
//
// URL is taskgate's route to the pure fixture (http://GW/mcp/rmcp-pure). before-restart:
// initialize (a held session id), create two bridged tasks (slow_compute 3 s, slow_required
// 600 s), write the session id and task ids to FILE. modern.sh then kill -9s taskgate and starts
// it again; after-restart, with the same Mcp-Session-Id: tools/list answers, tasks/get and
// tasks/list find the tasks created before the kill, tasks/cancel of the long one is
// `cancelled`, a blocking tasks/result of the short one completes, and DELETE ends the session
// (then 404). Prints PASS/FAIL per check and `N/M passed`; exit 0 only when all passed.

import { readFileSync, writeFileSync } from 'node:fs';

const argv = process.argv.slice(2);
const opt = { phase: '', state: '', label: 'held-restart' };
let url = '';
for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[++i];
    else url = argv[i];
}
const V = '2025-11-25';
let nextId = 1;
const checks = [];
function check(name, ok, detail) {
    checks.push({ name, ok: Boolean(ok), detail });
    console.log(`${ok ? 'PASS' : 'FAIL'} ${name}${ok ? '' : `: ${JSON.stringify(detail)}`}`);
}

async function post(session, message, timeoutMs = 30000) {
    const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
    if (message.method !== 'initialize') headers['mcp-protocol-version'] = V;
    if (session) headers['mcp-session-id'] = session;
    const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify(message), signal: AbortSignal.timeout(timeoutMs) });
    const text = await res.text();
    let msg;
    if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
        for (const line of text.split(/\r?\n/)) {
            if (!line.startsWith('data:')) continue;
            try {
                const m = JSON.parse(line.slice(5));
                if (m.id === message.id) msg = m;
            } catch {}
        }
    } else if (text) {
        try {
            msg = JSON.parse(text);
        } catch {
            msg = { raw: text.slice(0, 200) };
        }
    }
    return { http: res.status, session: res.headers.get('mcp-session-id'), body: msg, result: msg?.result, error: msg?.error };
}
const rpc = (session, method, params = {}, timeoutMs) => post(session, { jsonrpc: '2.0', id: nextId++, method, params }, timeoutMs);
const brief = r => ({ http: r.http, result: r.result, error: r.error });

async function beforeRestart() {
    const init = await rpc(null, 'initialize', {
        protocolVersion: V,
        capabilities: { tasks: { requests: { tools: { call: {} } } }, elicitation: {} },
        clientInfo: { name: 'held-restart', version: '1' },
    });
    const session = init.session;
    check('held-session-issued', init.http === 200 && /^tgh-[0-9a-f]{32}$/.test(session ?? ''), { ...brief(init), session });
    check('initialize-advertises-tasks', Boolean(init.result?.capabilities?.tasks), brief(init));
    await post(session, { jsonrpc: '2.0', method: 'notifications/initialized' });
    const short = await rpc(session, 'tools/call', { name: 'slow_compute', arguments: { seconds: 3, label: 'held-restart' }, task: { ttl: 120000 } });
    const long = await rpc(session, 'tools/call', { name: 'slow_required', arguments: { seconds: 600 }, task: { ttl: 120000 } });
    const ids = [short, long].map(r => r.result?.task?.taskId);
    check('tasks-created', ids.every(Boolean), { short: brief(short), long: brief(long) });
    writeFileSync(opt.state, JSON.stringify({ session, short: ids[0], long: ids[1] }));
}

async function afterRestart() {
    const { session, short, long } = JSON.parse(readFileSync(opt.state, 'utf8'));
    const tools = await rpc(session, 'tools/list');
    check('session-known-after-kill-9', tools.http === 200 && tools.result?.tools?.some(t => t.name === 'slow_compute'), brief(tools));
    const got = await rpc(session, 'tasks/get', { taskId: long });
    check('tasks-get-after-restart', got.result?.taskId === long && got.result?.status === 'working', brief(got));
    const list = await rpc(session, 'tasks/list');
    const listed = (list.result?.tasks ?? []).map(t => t.taskId);
    check('tasks-list-after-restart', listed.includes(short) && listed.includes(long), brief(list));
    const cancel = await rpc(session, 'tasks/cancel', { taskId: long });
    check('tasks-cancel-after-restart', cancel.result?.status === 'cancelled', brief(cancel));
    const res = await rpc(session, 'tasks/result', { taskId: short }, 60000);
    const text = res.result?.content?.[0]?.text ?? '';
    check('tasks-result-after-restart', text.startsWith('slow_compute(held-restart) done'), brief(res));
    const del = await fetch(url, { method: 'DELETE', headers: { 'mcp-session-id': session, 'mcp-protocol-version': V } });
    check('delete-ends-the-session', del.status === 200, del.status);
    const gone = await rpc(session, 'tools/list');
    check('ended-session-404', gone.http === 404 && gone.error?.code === -32001, brief(gone));
}

const phases = { 'before-restart': beforeRestart, 'after-restart': afterRestart };
try {
    if (!phases[opt.phase] || !opt.state || !url) throw new Error('usage: held-restart.mjs URL --phase before-restart|after-restart --state FILE');
    await phases[opt.phase]();
} catch (error) {
    check(`${opt.phase || 'phase'}-ran`, false, error?.stack ?? String(error));
}
const passed = checks.filter(c => c.ok).length;
console.log(`${opt.label} ${opt.phase}: ${passed}/${checks.length} passed`);
process.exit(passed === checks.length && checks.length ? 0 : 1);
