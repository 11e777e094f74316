#!/usr/bin/env node
// A raw 2026-07-28 wire client (fetch only, no SDK) against a 2025-11-25 task server: the
// TypeScript SDK 1.32.2 task server (task-server.mjs --mode stateful), direct or through taskgate
// (issue 33, the reverse bridge). Twelve steps, each one check:
//
//   node reverse-client.mjs URL [--label L] [--json FILE] [--bearer TOKEN] [--foreign-bearer TOKEN]
//                               [--timeout-ms N] [--skip-input] [--listen]
//
//    1 discover               server/discover answers, supportedVersions includes 2026-07-28
//    2 discover-extension     ... and offers io.modelcontextprotocol/tasks
//    3 tools-list             tools/list answers resultType "complete" with slow_task
//    4 plain-call             plain_echo answers resultType "complete" with its text
//    5 task-call              slow_task (taskSupport required) answers resultType "task", taskId, ttlMs,
//                             pollIntervalMs
//    6 poll-working           tasks/get answers the task (resultType "complete", a status)
//    7 poll-completed         polls reach "completed"
//    8 result-inline          the completed task carries its CallToolResult inline
//    9 failed-keeps-content   failing_task (a tool error) ends completed with isError and its content
//   10 cancel-ack             tasks/cancel of a working task answers {"resultType":"complete"}
//   11 cancelled              the cancelled task then reads "cancelled"
//   12 cancel-terminal-ack    tasks/cancel of a terminal task is acknowledged, not an error
// Beyond the twelve (printed apart):
//   input-update              ask_task goes input_required and asks on its tasks/result stream: the
//                             request shows in tasks/get inputRequests, tasks/update answers it, the
//                             task completes with the answer
//                             (--skip-input: not run, for a server without ask_task such as
//                             py_task_server.py)
//   foreign-refused           with --foreign-bearer: another principal's tasks/get and tasks/cancel of
//                             the step-5 task get -32602 (a gateway's owner binding)
//   listen-task               with --listen: subscriptions/listen naming a slow_task's id: the first
//                             event acknowledges the id, the task's end arrives as notifications/tasks
//                             (status completed, the result inline, the listen's id as its
//                             subscriptionId) before the listen is closed
//   listen-foreign            with --listen and --foreign-bearer: another principal's listen naming
//                             that task is acknowledged without it
//
// Every request is a stateless 2026-07-28 POST (MCP-Protocol-Version, Mcp-Method, Mcp-Name headers;
// protocolVersion and clientCapabilities (elicitation, the tasks extension) in params._meta; no initialize, no
// session). Prints `PASS name` / `FAIL name: why` per step, then `N/12 passed`; --json FILE writes
// {label, passed, total, failed:[names], checks:[{name, ok, detail}]}. Exit 0 only when all passed.

const argv = process.argv.slice(2);
const opt = { label: 'reverse', json: '', bearer: '', 'foreign-bearer': '', 'timeout-ms': '15000', 'skip-input': '', listen: '' };
let url = '';
for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--skip-input') opt['skip-input'] = '1';
    else if (argv[i] === '--listen') opt.listen = '1';
    else if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[++i];
    else url = argv[i];
}
if (!url) {
    console.error('usage: reverse-client.mjs URL [--label L] [--json FILE] [--bearer TOKEN]');
    process.exit(2);
}
const TIMEOUT = Number(opt['timeout-ms']);
const EXT = 'io.modelcontextprotocol/tasks';
const VERSION = '2026-07-28';
const TERMINAL = ['completed', 'failed', 'cancelled'];
const sleep = ms => new Promise(r => setTimeout(r, ms));

let nextId = 1;
/** One POST. Returns {http, result, error, raw}; never throws (a transport error is in `error`). */
async function rpc(method, params = {}, bearer = opt.bearer) {
    const body = {
        jsonrpc: '2.0',
        id: nextId++,
        method,
        params: {
            ...params,
            _meta: {
                'io.modelcontextprotocol/protocolVersion': VERSION,
                // `elicitation`: this client answers ask_task's elicitation (input-update); a
                // gateway shows a task's input request only to a client that declared it.
                'io.modelcontextprotocol/clientCapabilities': { elicitation: {}, extensions: { [EXT]: {} } },
            },
        },
    };
    const h = {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': VERSION,
        'mcp-method': method,
    };
    const routed = params.taskId ?? params.name;
    if (routed) h['mcp-name'] = routed;
    if (bearer) h.authorization = `Bearer ${bearer}`;
    try {
        const res = await fetch(url, { method: 'POST', headers: h, body: JSON.stringify(body), signal: AbortSignal.timeout(TIMEOUT) });
        const text = await res.text();
        let msg;
        if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
            for (const block of text.split(/\r?\n\r?\n/)) {
                const data = block.split(/\r?\n/).filter(l => l.startsWith('data:')).map(l => l.slice(5).trim()).join('\n');
                if (!data) continue;
                try {
                    const m = JSON.parse(data);
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
        return { http: res.status, result: msg?.result, error: msg?.error, raw: msg };
    } catch (e) {
        return { http: 0, error: { message: String(e) } };
    }
}
const show = r => JSON.stringify(r.error ?? r.result ?? r.raw ?? {}).slice(0, 300) + ` (HTTP ${r.http})`;

const checks = [];
function check(name, ok, detail = '', core = true) {
    checks.push({ name, ok: Boolean(ok), detail: ok ? '' : String(detail), core });
    console.log(ok ? `PASS ${name}` : `FAIL ${name}: ${detail}`);
}

/** Polls tasks/get until a terminal status (or the deadline); returns the last answer. */
async function untilTerminal(taskId, ms = 20000) {
    const end = Date.now() + ms;
    let last;
    while (Date.now() < end) {
        last = await rpc('tasks/get', { taskId });
        if (!last.result || TERMINAL.includes(last.result.status)) return last;
        await sleep(Math.min(Math.max(last.result.pollIntervalMs ?? 200, 50), 1000));
    }
    return last;
}

const started = Date.now();
// 1-2 discovery
const d = await rpc('server/discover');
check('discover', d.result?.supportedVersions?.includes(VERSION), show(d));
check('discover-extension', d.result?.capabilities?.extensions?.[EXT] !== undefined, show(d));
// 3 tools/list
const list = await rpc('tools/list');
check('tools-list', list.result?.resultType === 'complete' && list.result?.tools?.some(t => t.name === 'slow_task'), show(list));
// 4 plain call
const plain = await rpc('tools/call', { name: 'plain_echo', arguments: { text: 'hi' } });
check('plain-call', plain.result?.resultType === 'complete' && plain.result?.content?.[0]?.text === 'echo: hi', show(plain));
// 5-8 a task: created, polled, completed, its result inline
const created = await rpc('tools/call', { name: 'slow_task', arguments: { duration_ms: 600, steps: 3 } });
const c = created.result ?? {};
check('task-call', c.resultType === 'task' && typeof c.taskId === 'string' && 'ttlMs' in c && 'pollIntervalMs' in c && !('task' in c), show(created));
if (typeof c.taskId === 'string') {
    if (opt['foreign-bearer']) {
        const get = await rpc('tasks/get', { taskId: c.taskId }, opt['foreign-bearer']);
        const cancel = await rpc('tasks/cancel', { taskId: c.taskId }, opt['foreign-bearer']);
        check('foreign-refused', get.error?.code === -32602 && cancel.error?.code === -32602, `${show(get)} / ${show(cancel)}`, false);
    }
    const first = await rpc('tasks/get', { taskId: c.taskId });
    check('poll-working', first.result?.resultType === 'complete' && typeof first.result?.status === 'string', show(first));
    const done = await untilTerminal(c.taskId);
    check('poll-completed', done?.result?.status === 'completed', show(done ?? {}));
    const text = done?.result?.result?.content?.[0]?.text ?? '';
    check('result-inline', text.startsWith('slow_task done'), show(done ?? {}));
} else {
    for (const n of ['poll-working', 'poll-completed', 'result-inline']) check(n, false, 'no task was created');
}
// 9 a tool error keeps its content
const failing = await rpc('tools/call', { name: 'failing_task', arguments: {} });
if (failing.result?.resultType === 'task') {
    const done = await untilTerminal(failing.result.taskId);
    const r = done?.result ?? {};
    check('failed-keeps-content', r.status === 'completed' && r.result?.isError === true && (r.result?.content?.[0]?.text ?? '').includes('failed on purpose'), show(done ?? {}));
} else {
    check('failed-keeps-content', false, show(failing));
}
// 10-12 cancel
const long = await rpc('tools/call', { name: 'slow_task', arguments: { duration_ms: 60000, steps: 60 } });
if (long.result?.resultType === 'task') {
    const taskId = long.result.taskId;
    const cancel = await rpc('tasks/cancel', { taskId });
    check('cancel-ack', cancel.result?.resultType === 'complete' && !cancel.error, show(cancel));
    const after = await untilTerminal(taskId, 10000);
    check('cancelled', after?.result?.status === 'cancelled', show(after ?? {}));
    const again = await rpc('tasks/cancel', { taskId });
    check('cancel-terminal-ack', again.result?.resultType === 'complete' && !again.error, show(again));
} else {
    for (const n of ['cancel-ack', 'cancelled', 'cancel-terminal-ack']) check(n, false, show(long));
}

// input: an elicitation on the task's tasks/result stream, answered with tasks/update
const ask = opt['skip-input'] ? {} : await rpc('tools/call', { name: 'ask_task', arguments: { question: 'proceed?' } });
if (opt['skip-input']) {
    // no input step on this server
} else if (ask.result?.resultType === 'task') {
    const taskId = ask.result.taskId;
    const end = Date.now() + 10000;
    let asked;
    while (Date.now() < end) {
        asked = await rpc('tasks/get', { taskId });
        if (Object.keys(asked.result?.inputRequests ?? {}).length > 0 || TERMINAL.includes(asked.result?.status)) break;
        await sleep(100);
    }
    const [key, request] = Object.entries(asked?.result?.inputRequests ?? {})[0] ?? [];
    if (request?.method === 'elicitation/create') {
        const update = await rpc('tasks/update', { taskId, inputResponses: { [key]: { action: 'accept', content: { answer: 'yes' } } } });
        const done = await untilTerminal(taskId, 10000);
        const text = done?.result?.result?.content?.[0]?.text ?? '';
        check('input-update', update.result?.resultType === 'complete' && done?.result?.status === 'completed' && text.includes('accept'), `${show(update)} / ${show(done ?? {})}`, false);
    } else {
        check('input-update', false, show(asked ?? {}), false);
    }
} else {
    check('input-update', false, show(ask), false);
}

/**
 * Opens subscriptions/listen with `filter` and reads its SSE stream until `until(message)` holds (or,
 * with `until` null, until the acknowledgement) or `ms` pass; then closes it (2026-07-28: closing
 * the stream ends the listen). Returns {id, http, ack, hit, seen}.
 */
async function listenUntil(filter, until, ms, bearer = opt.bearer) {
    const id = nextId++;
    const body = {
        jsonrpc: '2.0', id, method: 'subscriptions/listen',
        params: {
            notifications: filter,
            _meta: {
                'io.modelcontextprotocol/protocolVersion': VERSION,
                'io.modelcontextprotocol/clientCapabilities': { extensions: { [EXT]: {} } },
            },
        },
    };
    const h = {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': VERSION,
        'mcp-method': 'subscriptions/listen',
    };
    if (bearer) h.authorization = `Bearer ${bearer}`;
    const out = { id, http: 0, ack: undefined, hit: undefined, seen: [] };
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), ms);
    try {
        const res = await fetch(url, { method: 'POST', headers: h, body: JSON.stringify(body), signal: ctl.signal });
        out.http = res.status;
        const reader = res.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += dec.decode(value, { stream: true });
            let m;
            while ((m = /\r?\n\r?\n/.exec(buf))) {
                const block = buf.slice(0, m.index);
                buf = buf.slice(m.index + m[0].length);
                const data = block.split(/\r?\n/).filter(l => l.startsWith('data:')).map(l => l.slice(5).trim()).join('\n');
                if (!data) continue;
                let msg;
                try { msg = JSON.parse(data); } catch { continue; }
                out.seen.push(msg.method ?? 'answer');
                if (msg.method === 'notifications/subscriptions/acknowledged') {
                    out.ack = msg;
                    if (until === null) { ctl.abort(); return out; }
                } else if (until && until(msg)) { out.hit = msg; ctl.abort(); return out; }
            }
        }
    } catch (e) {
        out.error = String(e);
    } finally {
        clearTimeout(timer);
    }
    return out;
}

// listen: a task's end as notifications/tasks on subscriptions/listen
if (opt.listen) {
    const t = await rpc('tools/call', { name: 'slow_task', arguments: { duration_ms: 1500, steps: 3 } });
    if (t.result?.resultType === 'task') {
        const taskId = t.result.taskId;
        if (opt['foreign-bearer']) {
            const foreign = await listenUntil({ taskIds: [taskId] }, null, 5000, opt['foreign-bearer']);
            check('listen-foreign', foreign.http === 200 && foreign.ack && !(foreign.ack.params?.notifications?.taskIds ?? []).includes(taskId), JSON.stringify(foreign).slice(0, 400), false);
        }
        const got = await listenUntil(
            { taskIds: [taskId] },
            m => m.method === 'notifications/tasks' && m.params?.taskId === taskId && TERMINAL.includes(m.params?.status),
            15000
        );
        const p = got.hit?.params ?? {};
        check(
            'listen-task',
            got.http === 200 && (got.ack?.params?.notifications?.taskIds ?? []).includes(taskId) && p.status === 'completed' &&
                (p.result?.content?.[0]?.text ?? '').startsWith('slow_task done') && p._meta?.['io.modelcontextprotocol/subscriptionId'] === got.id,
            JSON.stringify(got).slice(0, 400),
            false
        );
    } else {
        check('listen-task', false, show(t), false);
    }
}

const passed = checks.filter(x => x.ok).length;
const core = checks.filter(x => x.core);
console.log(`${opt.label}: ${passed}/${checks.length} passed (the 12 steps: ${core.filter(x => x.ok).length}/${core.length})`);
if (opt.json) {
    const fs = await import('node:fs');
    fs.writeFileSync(
        opt.json,
        JSON.stringify({ label: opt.label, passed, total: checks.length, failed: checks.filter(x => !x.ok).map(x => x.name), checks, ms: Date.now() - started }, null, 1)
    );
}
process.exit(passed === checks.length ? 0 : 1);
