#!/usr/bin/env node
// taskgate's own properties for 2026-07-28 tasks (issue 11), against modern_task_server.py behind
// taskgate, with the upstream's received tasks/* requests counted (the fixture's GET /received).
//
//   node modern-properties.mjs URL --admin HOST:PORT --received URL [--upstream modern]
//        [--token TOKEN_A [--token-b TOKEN_B]] [--phase all|before-restart|after-restart]
//        [--state FILE] [--label L] [--json FILE]
//
// URL is taskgate's route to the fixture (http://GW/mcp/modern). --phase before-restart creates a
// task and writes its id to --state; run.sh/modern.sh then kill -9s taskgate, starts it again and
// runs --phase after-restart, which checks that tasks/get of that task still resolves.
// Prints PASS/FAIL per check and `N/M passed`; exit 0 only when all passed.

import { readFileSync, writeFileSync } from 'node:fs';

const argv = process.argv.slice(2);
const opt = { upstream: 'modern', principal: 'alice', phase: 'all', label: 'properties', token: '', 'token-b': '', json: '', state: '' };
let url = '';
for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[++i];
    else url = argv[i];
}
const EXT = 'io.modelcontextprotocol/tasks';
const TERMINAL = ['completed', 'failed', 'cancelled'];
const sleep = ms => new Promise(r => setTimeout(r, ms));
let nextId = 1;

async function rpc(method, params = {}, token = opt.token, name = params.taskId ?? params.name) {
    const body = {
        jsonrpc: '2.0',
        id: nextId++,
        method,
        params: {
            ...params,
            _meta: { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': { extensions: { [EXT]: {} } } },
        },
    };
    const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2026-07-28', 'mcp-method': method };
    if (name) headers['mcp-name'] = name;
    if (token) headers.authorization = `Bearer ${token}`;
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
    return { http: res.status, body: msg, result: msg?.result, error: msg?.error };
}
async function received(method, taskId) {
    const r = await fetch(opt.received, { signal: AbortSignal.timeout(10000) });
    return (await r.json())[method]?.[taskId] ?? 0;
}
async function create(args, token = opt.token, name = 'slow_compute') {
    const r = await rpc('tools/call', { name, arguments: args }, token);
    return r.result?.resultType === 'task' ? r.result.taskId : undefined;
}
async function poll(taskId, until = s => TERMINAL.includes(s), ms = 20000) {
    const end = Date.now() + ms;
    let last;
    while (Date.now() < end) {
        last = await rpc('tasks/get', { taskId });
        if (!last.result || until(last.result.status)) return last;
        await sleep(150);
    }
    return last;
}

const checks = [];
function check(name, ok, detail = '') {
    checks.push({ name, ok: Boolean(ok), detail: ok ? '' : String(typeof detail === 'string' ? detail : JSON.stringify(detail)).slice(0, 400) });
    console.log(ok ? `PASS ${name}` : `FAIL ${name}: ${checks.at(-1).detail}`);
}
const brief = r => ({ http: r.http, result: r.result && { status: r.result.status, resultType: r.result.resultType }, error: r.error });

async function all() {
    // Records: a modern task is in /admin/tasks.
    const t1 = await create({ seconds: 1, label: 'props-admin' });
    check('create-task', Boolean(t1), 'slow_compute did not create a task');
    if (!t1) return;
    const list = await fetch(`http://${opt.admin}/admin/tasks?upstream=${encodeURIComponent(opt.upstream)}`).then(r => r.text()).catch(e => String(e));
    check('admin-tasks-lists-modern-task', list.includes(t1), list.slice(0, 300));
    const one = await fetch(`http://${opt.admin}/admin/tasks/${encodeURIComponent(opt.upstream)}/${encodeURIComponent(t1)}`).catch(e => ({ status: String(e) }));
    check('admin-task-record-exists', one.status === 200, `HTTP ${one.status}`);
    const rec = one.status === 200 ? await one.json().catch(() => null) : null;
    check('admin-record-era-modern', rec?.task?.era === 'modern' && rec?.task?.protocol_version === '2026-07-28', rec?.task ?? rec);
    // taskgate writes owners as `principal:<name>` (an `anonymous` owner without auth).
    if (opt.token) check('admin-record-owner-is-principal', new RegExp(`(^|:)${opt.principal}$`).test(String(rec?.task?.owner ?? '')), rec?.task ?? rec);

    // Terminal results from the registry: polls after the first terminal one are not forwarded.
    const done = await poll(t1);
    check('task-completes-through-taskgate', done.result?.status === 'completed', brief(done));
    const getsBefore = await received('tasks/get', t1);
    const later = [];
    for (let i = 0; i < 5; i++) later.push(await rpc('tasks/get', { taskId: t1 }));
    const getsAfter = await received('tasks/get', t1);
    check('terminal-polls-not-forwarded', done.result?.status === 'completed' && getsAfter === getsBefore, `upstream tasks/get for the task: ${getsBefore} -> ${getsAfter} over 5 polls after completion`);
    check(
        'terminal-polls-same-bytes',
        later.every(r => JSON.stringify(r.result?.result) === JSON.stringify(done.result?.result) && r.result?.status === 'completed'),
        later.map(brief)
    );

    // Cancel of a terminal task: ack, no upstream cancel.
    const ackTerminal = await rpc('tasks/cancel', { taskId: t1 });
    check('cancel-terminal-ack', ackTerminal.result?.resultType === 'complete' && !('status' in (ackTerminal.result ?? {})), brief(ackTerminal));
    const termCancels = await received('tasks/cancel', t1);
    check('cancel-terminal-not-forwarded', done.result?.status === 'completed' && ackTerminal.result?.resultType === 'complete' && termCancels === 0, `upstream saw ${termCancels} tasks/cancel for the completed task`);

    // Single-flight cancel: 200 concurrent identical cancels -> 1 upstream cancel, 200 acks.
    const t2 = await create({ seconds: 60, label: 'props-cancel-200' });
    if (t2) {
        const answers = await Promise.all(Array.from({ length: 200 }, () => rpc('tasks/cancel', { taskId: t2 }).catch(e => ({ error: String(e) }))));
        const acks = answers.filter(a => a.result?.resultType === 'complete').length;
        check('cancel-200-concurrent-all-acked', acks === 200, `${acks}/200 acks; first other: ${JSON.stringify(answers.find(a => a.result?.resultType !== 'complete')?.body ?? null)}`);
        const ups = await received('tasks/cancel', t2);
        check('cancel-200-concurrent-one-upstream-cancel', ups === 1, `upstream saw ${ups} tasks/cancel`);
        const settled = await poll(t2, undefined, 10000);
        check('cancel-200-settles-cancelled', settled.result?.status === 'cancelled', brief(settled));
        const r2 = await fetch(`http://${opt.admin}/admin/tasks/${encodeURIComponent(opt.upstream)}/${encodeURIComponent(t2)}`).then(r => r.json()).catch(e => ({ error: String(e) }));
        check(
            'cancel-record-requested-and-cancelled-apart',
            r2?.task?.status === 'cancelled' && r2.task.cancel_requested_at != null && r2.task.cancelled_at != null,
            r2?.task ?? r2
        );
    } else check('cancel-200-concurrent-all-acked', false, 'no task');

    // Ids taskgate never recorded are refused locally.
    const unknown = 'props-never-recorded-task-id';
    const u = await rpc('tasks/get', { taskId: unknown });
    const uSeen = await received('tasks/get', unknown);
    check('unknown-task-refused-locally', u.error?.code === -32602 && u.http === 400 && uSeen === 0, { answer: brief(u), upstreamSaw: uSeen });

    // Owner binding (bearer): principal B cannot reach A's task, and the upstream sees none of it.
    if (opt['token-b']) {
        const t3 = await create({ filename: 'props-owner.txt' }, opt.token, 'confirm_delete');
        if (!t3) return check('owner-task-created', false, 'confirm_delete did not create a task');
        await poll(t3, s => s === 'input_required' || TERMINAL.includes(s), 10000);
        const seen = async () => [await received('tasks/get', t3), await received('tasks/update', t3), await received('tasks/cancel', t3)];
        const before = await seen();
        const bGet = await rpc('tasks/get', { taskId: t3 }, opt['token-b']);
        const bUpd = await rpc('tasks/update', { taskId: t3, inputResponses: { confirm: { action: 'accept', content: { confirm: true } } } }, opt['token-b']);
        const bCan = await rpc('tasks/cancel', { taskId: t3 }, opt['token-b']);
        const after = await seen();
        check('foreign-get-32602', bGet.error?.code === -32602, brief(bGet));
        check('foreign-update-32602', bUpd.error?.code === -32602, brief(bUpd));
        check('foreign-cancel-32602', bCan.error?.code === -32602, brief(bCan));
        check('foreign-requests-not-forwarded', JSON.stringify(before) === JSON.stringify(after), `upstream get/update/cancel for the task: ${before} -> ${after}`);
        const aView = await rpc('tasks/get', { taskId: t3 });
        check('owner-task-untouched', aView.result?.status === 'input_required', brief(aView));
        await rpc('tasks/cancel', { taskId: t3 });
    }
}

async function beforeRestart() {
    const t = await create({ seconds: 1, label: 'props-restart' });
    check('restart-task-created', Boolean(t), 'no task');
    writeFileSync(opt.state, JSON.stringify({ taskId: t }));
}
async function afterRestart() {
    const { taskId } = JSON.parse(readFileSync(opt.state, 'utf8'));
    const r = await poll(taskId);
    check('get-after-kill-9-restart', r.result?.taskId === taskId && r.result?.status === 'completed', brief(r));
}

const t0 = Date.now();
const phases = { all, 'before-restart': beforeRestart, 'after-restart': afterRestart };
try {
    await phases[opt.phase]();
} catch (error) {
    check(`${opt.phase}-ran`, false, error?.stack ?? String(error));
}
const passed = checks.filter(c => c.ok).length;
console.log(`${opt.label}: ${passed}/${checks.length} passed`);
if (opt.json) writeFileSync(opt.json, JSON.stringify({ label: opt.label, ok: passed === checks.length, checks, ms: Date.now() - t0 }, null, 1));
process.exit(passed === checks.length && checks.length ? 0 : 1);
