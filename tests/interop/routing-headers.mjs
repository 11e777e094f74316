#!/usr/bin/env node
// Routing headers through taskgate against a real 2026-07-28 server (issue 37, items 1 and 2):
// modern_task_server.py (FastMCP 4.1.4 + fastmcp-tasks 4.1.4), which logs every request it receives
// with its Mcp-Method/Mcp-Name headers (GET /requests).
//
//   node routing-headers.mjs URL --direct URL --requests URL [--label L] [--json FILE]
//
// URL is taskgate's route to the fixture (http://GW/mcp/modern), --direct the fixture itself,
// --requests its request log. Checks:
//   - requests whose Mcp-Method/Mcp-Name disagree with the body get HTTP 400 with -32020 from
//     taskgate and never reach the server (its log has none of them, and the task a mismatched
//     tasks/cancel would have hit is still `working` when the server itself is asked; FastMCP
//     4.1.4 refuses these itself with the same code, so only its log shows who answered): a tools/call
//     whose Mcp-Name names another tool, a tasks/get whose Mcp-Name names another (real) task, an
//     Mcp-Method naming another method (tasks/get sent as tasks/cancel, tools/call as tools/list),
//     a malformed base64 Mcp-Name (=?base64?...?= that does not decode);
//   - the same requests with agreeing headers pass (so the refusals are about the headers);
//   - a tasks/get without Mcp-Name (as fastmcp.Client 4.1.4 sends it) works, and the server
//     received it with Mcp-Method and Mcp-Name (the taskId) set from the body.
// Then, as notes only: what taskgate does with a tools/call without Mcp-Name, and what the server
// answers to that and to the mismatched requests when they are sent to it directly.
// Prints PASS/FAIL per check and `N/M passed`; exit 0 only when all passed.

import { writeFileSync } from 'node:fs';

const argv = process.argv.slice(2);
const opt = { direct: '', requests: '', label: 'routing-headers', json: '' };
let url = '';
for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[++i];
    else url = argv[i];
}
const EXT = 'io.modelcontextprotocol/tasks';
const V = '2026-07-28';
const b64 = s => Buffer.from(s, 'utf8').toString('base64');
let nextId = 1;

/**
 * One 2026-07-28 request. `headers` overrides the routing headers taken from the body
 * (Mcp-Method = method, Mcp-Name = params.name or params.taskId); a value of null leaves one out.
 */
async function rpc(target, method, params, headers = {}) {
    const body = {
        jsonrpc: '2.0',
        id: nextId++,
        method,
        params: { ...params, _meta: { 'io.modelcontextprotocol/protocolVersion': V, 'io.modelcontextprotocol/clientCapabilities': { extensions: { [EXT]: {} } } } },
    };
    const h = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': V, 'mcp-method': method };
    const name = params.name ?? params.taskId;
    if (name !== undefined) h['mcp-name'] = name;
    for (const [k, v] of Object.entries(headers)) {
        if (v === null) delete h[k];
        else h[k] = v;
    }
    const res = await fetch(target, { method: 'POST', headers: h, body: JSON.stringify(body), signal: AbortSignal.timeout(30000) });
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
    return { http: res.status, result: msg?.result, error: msg?.error };
}
const brief = r => ({ http: r.http, result: r.result && (r.result.status ?? r.result.resultType), text: r.result?.content?.[0]?.text, error: r.error && { code: r.error.code, message: String(r.error.message).slice(0, 120) } });
const log = async () => (await fetch(opt.requests, { signal: AbortSignal.timeout(10000) })).json();

const checks = [];
function check(name, ok, detail = '') {
    checks.push({ name, ok: Boolean(ok), detail: ok ? '' : JSON.stringify(detail).slice(0, 500) });
    console.log(ok ? `PASS ${name}` : `FAIL ${name}: ${checks.at(-1).detail}`);
}
const note = (name, what) => console.log(`  note ${name}: ${JSON.stringify(what).slice(0, 600)}`);

async function createTask(target, label) {
    const r = await rpc(target, 'tools/call', { name: 'slow_compute', arguments: { seconds: 60, label } });
    return r.result?.resultType === 'task' ? r.result.taskId : undefined;
}

async function main() {
    const t1 = await createTask(url, 'routing-t1');
    const t2 = await createTask(url, 'routing-t2');
    check('tasks-created-through-taskgate', t1 && t2, { t1, t2 });
    if (!t1 || !t2) return;

    // Each mismatch: [check name, method, params, header overrides]. The greet calls carry a
    // unique argument, so the server's log shows whether any of them arrived.
    const mismatches = [
        ['tools-call-mcp-name-names-another-tool', 'tools/call', { name: 'greet', arguments: { name: 'routing-mismatch-1' } }, { 'mcp-name': 'slow_compute' }],
        ['tasks-get-mcp-name-names-another-task', 'tasks/get', { taskId: t1 }, { 'mcp-name': t2 }],
        ['tasks-cancel-mcp-name-names-another-task', 'tasks/cancel', { taskId: t1 }, { 'mcp-name': t2 }],
        ['mcp-method-names-another-method-tasks', 'tasks/get', { taskId: t1 }, { 'mcp-method': 'tasks/cancel' }],
        ['mcp-method-names-another-method-tools', 'tools/call', { name: 'greet', arguments: { name: 'routing-mismatch-2' } }, { 'mcp-method': 'tools/list' }],
        ['malformed-base64-mcp-name-tasks', 'tasks/cancel', { taskId: t1 }, { 'mcp-name': '=?base64?not base64!?=' }],
        ['malformed-base64-mcp-name-tools', 'tools/call', { name: 'greet', arguments: { name: 'routing-mismatch-3' } }, { 'mcp-name': '=?base64?Z3JlZXQ?!?=' }],
    ];
    // Per request: taskgate's answer, and what reached the server meanwhile (taskgate answers a
    // request only after deciding it; a forwarded one is answered by the server, which refuses
    // these itself with the same code: only its log tells the two apart).
    const reached = (entries, params) =>
        entries.filter(m => [t1, t2].includes(m.name) || (m.method === 'tools/call' && m.arguments?.name === params.arguments?.name) || m.method === 'tools/list');
    for (const [name, method, params, headers] of mismatches) {
        const before = (await log()).length;
        const r = await rpc(url, method, params, headers);
        const leaked = reached((await log()).slice(before), params);
        check(`${name}-refused-at-taskgate`, r.http === 400 && r.error?.code === -32020 && leaked.length === 0, { answer: brief(r), reachedServer: leaked });
    }
    const still = await rpc(opt.direct, 'tasks/get', { taskId: t1 });
    check('task-untouched-server-says-working', still.result?.status === 'working', brief(still));

    // The same requests with headers that agree pass, as does the spec's base64 form of a name.
    const ok1 = await rpc(url, 'tools/call', { name: 'greet', arguments: { name: 'routing-ok' } });
    check('tools-call-agreeing-headers-pass', ok1.http === 200 && ok1.result?.content?.[0]?.text === 'Hello, routing-ok!', brief(ok1));
    const ok2 = await rpc(url, 'tasks/get', { taskId: t1 });
    check('tasks-get-agreeing-headers-pass', ok2.http === 200 && ok2.result?.status === 'working', brief(ok2));
    const ok3 = await rpc(url, 'tasks/get', { taskId: t1 }, { 'mcp-name': `=?base64?${b64(t1)}?=` });
    check('tasks-get-base64-mcp-name-of-the-task-passes', ok3.http === 200 && ok3.result?.status === 'working', brief(ok3));

    // Without Mcp-Name (fastmcp.Client 4.1.4 sends tasks/* so): served, and the upstream leg
    // carries the headers the spec requires.
    const mark = (await log()).length;
    const bare = await rpc(url, 'tasks/get', { taskId: t1 }, { 'mcp-name': null });
    check('tasks-get-without-mcp-name-works', bare.http === 200 && bare.result?.status === 'working', brief(bare));
    const seen = (await log()).slice(mark);
    const get = seen.find(m => m.method === 'tasks/get' && m.name === t1);
    check('upstream-tasks-get-carries-mcp-name', get?.mcpName === t1 && get?.mcpMethod === 'tasks/get', { received: get ?? seen });
    // A tools/call without Mcp-Name: the spec (and FastMCP directly) refuses it; only the tasks/*
    // omission is fastmcp.Client's, so this is recorded, not required.
    const before = (await log()).length;
    const bareCall = await rpc(url, 'tools/call', { name: 'greet', arguments: { name: 'routing-bare' } }, { 'mcp-name': null });
    const call = (await log()).slice(before).find(m => m.method === 'tools/call' && m.arguments?.name === 'routing-bare');
    note('tools/call without Mcp-Name through taskgate', { answer: brief(bareCall), upstreamGot: call ? { mcpMethod: call.mcpMethod, mcpName: call.mcpName } : 'nothing' });

    // For the record: what the server itself does with the mismatched requests (a task of its
    // own, created directly, so taskgate's tasks stay as they are).
    const d1 = await createTask(opt.direct, 'routing-direct-1');
    const d2 = await createTask(opt.direct, 'routing-direct-2');
    const direct = {};
    for (const [name, method, params, headers] of mismatches) {
        const swap = v => (v === t1 ? d1 : v === t2 ? d2 : v);
        const p = params.taskId ? { taskId: swap(params.taskId) } : params;
        const h = Object.fromEntries(Object.entries(headers).map(([k, v]) => [k, swap(v)]));
        const r = await rpc(opt.direct, method, p, h);
        (direct[`HTTP ${r.http} ${r.error?.code ?? r.result?.status ?? r.result?.resultType}`] ??= []).push(name);
    }
    note('the same mismatches sent to the server directly', direct);
    note('tools/call without Mcp-Name sent to the server directly', brief(await rpc(opt.direct, 'tools/call', { name: 'greet', arguments: { name: 'routing-bare' } }, { 'mcp-name': null })));
    for (const t of [t1, t2]) await rpc(url, 'tasks/cancel', { taskId: t });
    for (const t of [d1, d2]) if (t) await rpc(opt.direct, 'tasks/cancel', { taskId: t });
}

try {
    if (!url || !opt.direct || !opt.requests) throw new Error('usage: routing-headers.mjs URL --direct URL --requests URL');
    await main();
} catch (error) {
    check('ran', false, error?.stack ?? String(error));
}
const passed = checks.filter(c => c.ok).length;
console.log(`${opt.label}: ${passed}/${checks.length} passed`);
if (opt.json) writeFileSync(opt.json, JSON.stringify({ label: opt.label, passed, total: checks.length, checks }, null, 1));
process.exit(passed === checks.length && checks.length ? 0 : 1);
