#!/usr/bin/env node
// A raw 2026-07-28 wire client (fetch only, no SDK): the tasks extension flows against
// modern_task_server.py, direct or through a gateway.
//
//   node modern-raw-client.mjs URL [--label L] [--json FILE] [--bearer TOKEN] [--timeout-ms N]
//
// Every request is a stateless 2026-07-28 POST (MCP-Protocol-Version, Mcp-Method, Mcp-Name headers;
// protocolVersion and clientCapabilities in params._meta; no initialize, no session). Prints one
// line per check (`PASS name` / `FAIL name: why`), then `N/M passed`; exit 0 only when all passed.
// --json FILE writes {label, ok, checks:[{name, ok, detail}], ms}: run.sh compares the direct and
// the through-gateway runs check by check.

const argv = process.argv.slice(2);
const opt = { label: 'raw', json: '', bearer: '', 'timeout-ms': '15000' };
let url = '';
for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[++i];
    else url = argv[i];
}
if (!url) {
    console.error('usage: modern-raw-client.mjs URL [--label L] [--json FILE] [--bearer TOKEN]');
    process.exit(2);
}
const TIMEOUT = Number(opt['timeout-ms']);
const EXT = 'io.modelcontextprotocol/tasks';
const VERSION = '2026-07-28';
const WITH_EXT = { extensions: { [EXT]: {} } };
const NO_EXT = {};
const TERMINAL = ['completed', 'failed', 'cancelled'];
const sleep = ms => new Promise(r => setTimeout(r, ms));

let nextId = 1;
/** One POST. Returns {http, body, result, error}. `caps` = clientCapabilities; `name` = Mcp-Name. */
async function rpc(method, params = {}, { caps = WITH_EXT, name, headers = {} } = {}) {
    const body = {
        jsonrpc: '2.0',
        id: nextId++,
        method,
        params: {
            ...params,
            _meta: { 'io.modelcontextprotocol/protocolVersion': VERSION, 'io.modelcontextprotocol/clientCapabilities': caps },
        },
    };
    const h = {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': VERSION,
        'mcp-method': method,
        ...headers,
    };
    const routed = name ?? params.taskId ?? params.name;
    if (routed !== undefined && routed !== null && routed !== '') h['mcp-name'] = routed;
    if (opt.bearer) h.authorization = `Bearer ${opt.bearer}`;
    const res = await fetch(url, { method: 'POST', headers: h, body: JSON.stringify(body), signal: AbortSignal.timeout(TIMEOUT) });
    const text = await res.text();
    let msg;
    if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
        // The response on an SSE stream: the last data line that answers our id.
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
            msg = { raw: text };
        }
    }
    return { http: res.status, body: msg, result: msg?.result, error: msg?.error };
}

const checks = [];
function check(name, ok, detail = '') {
    checks.push({ name, ok: Boolean(ok), detail: ok ? '' : String(detail) });
    console.log(ok ? `PASS ${name}` : `FAIL ${name}: ${detail}`);
}
const show = r => JSON.stringify(r.body ?? null).slice(0, 600) + ` (HTTP ${r.http})`;
const ENVELOPE = ['taskId', 'status', 'result', 'error', 'inputRequests'];

async function poll(taskId, until = s => TERMINAL.includes(s), ms = 20000) {
    const end = Date.now() + ms;
    let last;
    while (Date.now() < end) {
        last = await rpc('tasks/get', { taskId });
        if (!last.result || until(last.result.status, last.result)) return last;
        await sleep(150);
    }
    return last;
}
async function create(name, args) {
    const r = await rpc('tools/call', { name, arguments: args });
    return { r, taskId: r.result?.resultType === 'task' ? r.result.taskId : undefined };
}

async function main() {
    const t0 = Date.now();

    // -- discovery and plain calls
    const disc = await rpc('server/discover', {});
    check('discover-advertises-tasks-extension', disc.result?.capabilities?.extensions?.[EXT] !== undefined && !disc.result?.capabilities?.tasks, show(disc));

    const greet = await rpc('tools/call', { name: 'greet', arguments: { name: 'raw' } });
    check(
        'sync-tool-plain-result',
        greet.result?.resultType === 'complete' && !('taskId' in (greet.result ?? {})) && greet.result?.content?.[0]?.text === 'Hello, raw!',
        show(greet)
    );

    const plain = await rpc('tools/call', { name: 'slow_compute', arguments: { seconds: 0, label: 'no-ext' } }, { caps: NO_EXT });
    check('optional-tool-without-extension-runs-inline', plain.result?.resultType === 'complete' && Array.isArray(plain.result?.content), show(plain));

    const req = await rpc('tools/call', { name: 'failing_job', arguments: {} }, { caps: NO_EXT });
    check('required-tool-without-extension-32021', req.error?.code === -32021, show(req));
    check('required-tool-without-extension-http-400', req.http === 400, show(req));
    check('required-tool-32021-names-extension', req.error?.data?.requiredCapabilities?.extensions?.[EXT] !== undefined, show(req));

    // -- create, get, poll
    const { r: created, taskId } = await create('slow_compute', { seconds: 1, label: 'raw-create' });
    const c = created.result ?? {};
    check(
        'create-flat-task-result',
        c.resultType === 'task' && typeof c.taskId === 'string' && c.status && !('task' in c) && c.createdAt && c.lastUpdatedAt && 'ttlMs' in c,
        show(created)
    );
    check('create-no-legacy-fields', !('ttl' in c) && !('pollInterval' in c) && !('result' in c) && !('error' in c), show(created));

    const first = taskId ? await rpc('tasks/get', { taskId }) : { body: 'no task' };
    check('get-right-after-create-resolves', first.result?.taskId === taskId && first.result?.resultType === 'complete', show(first));
    check('get-working-has-no-payload', first.result && !['completed', 'failed'].includes(first.result.status) ? !('result' in first.result) : false, show(first));

    const done = taskId ? await poll(taskId) : { body: 'no task' };
    check('poll-to-completed', done.result?.status === 'completed', show(done));
    check('completed-inlines-result', /raw-create/.test(done.result?.result?.content?.[0]?.text ?? ''), show(done));
    const again = taskId ? await rpc('tasks/get', { taskId }) : { body: 'no task' };
    check('get-terminal-again-same-result', JSON.stringify(again.result?.result) === JSON.stringify(done.result?.result) && again.result?.status === 'completed', show(again));

    // -- the 2026 gates on tasks/*
    const unknown = await rpc('tasks/get', { taskId: 'raw-client-unknown-task-id' });
    check('get-unknown-task-32602', unknown.error?.code === -32602, show(unknown));
    check('get-unknown-task-http-400', unknown.http === 400, show(unknown));
    const noExt = taskId ? await rpc('tasks/get', { taskId }, { caps: NO_EXT }) : { body: 'no task' };
    check('get-without-extension-32021', noExt.error?.code === -32021, show(noExt));
    check('get-without-extension-http-400', noExt.http === 400, show(noExt));
    const mismatch = taskId ? await rpc('tasks/get', { taskId }, { name: 'not-the-task-id' }) : { body: 'no task' };
    check('get-mcp-name-mismatch-32020', mismatch.error?.code === -32020, show(mismatch));
    check('get-mcp-name-mismatch-http-400', mismatch.http === 400, show(mismatch));
    // fastmcp.Client 4.1.4 sends tasks/get and tasks/cancel without Mcp-Name; FastMCP (and the
    // conformance suite) accept that and reject only a mismatch.
    const noName = taskId ? await rpc('tasks/get', { taskId }, { name: '' }) : { body: 'no task' };
    check('get-without-mcp-name-accepted', noName.result?.taskId === taskId, show(noName));
    const result = taskId ? await rpc('tasks/result', { taskId }) : { body: 'no task' };
    check('tasks-result-removed-32601', result.error?.code === -32601, show(result));
    check('tasks-result-removed-http-404', result.http === 404, show(result));
    const list = await rpc('tasks/list', {});
    check('tasks-list-removed-32601', list.error?.code === -32601, show(list));
    check('tasks-list-removed-http-404', list.http === 404, show(list));

    // -- tool error vs protocol error
    const fj = await create('failing_job', {});
    const fjDone = fj.taskId ? await poll(fj.taskId) : { body: 'no task' };
    check('tool-error-completed-iserror', fjDone.result?.status === 'completed' && fjDone.result?.result?.isError === true, show(fjDone));
    const pe = await create('protocol_error_job', {});
    const peDone = pe.taskId ? await poll(pe.taskId) : { body: 'no task' };
    check(
        'protocol-error-failed-with-error',
        peDone.result?.status === 'failed' && typeof peDone.result?.error?.code === 'number' && typeof peDone.result?.error?.message === 'string' && !('result' in peDone.result),
        show(peDone)
    );

    // -- input_required answered through tasks/update
    const cd = await create('confirm_delete', { filename: 'raw.txt' });
    const cdInput = cd.taskId ? await poll(cd.taskId, s => s === 'input_required' || TERMINAL.includes(s), 10000) : { body: 'no task' };
    const keys = Object.keys(cdInput.result?.inputRequests ?? {});
    check(
        'input-required-carries-elicitation',
        cdInput.result?.status === 'input_required' && keys.length === 1 && cdInput.result.inputRequests[keys[0]]?.method === 'elicitation/create',
        show(cdInput)
    );
    const updMismatch = cd.taskId ? await rpc('tasks/update', { taskId: cd.taskId, inputResponses: {} }, { name: 'not-the-task-id' }) : { body: 'no task' };
    check('update-mcp-name-mismatch-32020', updMismatch.error?.code === -32020 && updMismatch.http === 400, show(updMismatch));
    const ack = cd.taskId
        ? await rpc('tasks/update', { taskId: cd.taskId, inputResponses: Object.fromEntries(keys.map(k => [k, { action: 'accept', content: { confirm: true } }])) })
        : { body: 'no task' };
    check('update-ack-empty', ack.result?.resultType === 'complete' && ENVELOPE.every(f => !(f in ack.result)), show(ack));
    const cdDone = cd.taskId ? await poll(cd.taskId) : { body: 'no task' };
    check('update-resumes-to-completed', cdDone.result?.status === 'completed' && /confirm/.test(cdDone.result?.result?.content?.[0]?.text ?? ''), show(cdDone));

    const mi = await create('multi_input', {});
    const miInput = mi.taskId ? await poll(mi.taskId, (s, r) => TERMINAL.includes(s) || Object.keys(r.inputRequests ?? {}).length >= 2, 10000) : { body: 'no task' };
    const miKeys = Object.keys(miInput.result?.inputRequests ?? {});
    let partialOk = false, partialDetail = show(miInput);
    if (miKeys.length >= 2) {
        await rpc('tasks/update', { taskId: mi.taskId, inputResponses: { [miKeys[0]]: { action: 'accept', content: { name: 'one', confirm: true } } } });
        const after = await rpc('tasks/get', { taskId: mi.taskId });
        const left = Object.keys(after.result?.inputRequests ?? {});
        partialOk = after.result?.status === 'input_required' && left.includes(miKeys[1]) && !left.includes(miKeys[0]);
        partialDetail = show(after);
        await rpc('tasks/update', { taskId: mi.taskId, inputResponses: { [miKeys[1]]: { action: 'accept', content: { name: 'two', confirm: true } } } });
    }
    check('update-partial-keeps-input-required', partialOk, partialDetail);
    const miDone = mi.taskId ? await poll(mi.taskId) : { body: 'no task' };
    check('update-all-answers-completes', miDone.result?.status === 'completed' && ['one', 'two'].every(w => (miDone.result?.result?.content?.[0]?.text ?? '').includes(w)), show(miDone));

    // -- cancel
    const long = await create('slow_compute', { seconds: 60, label: 'raw-cancel' });
    const cAck = long.taskId ? await rpc('tasks/cancel', { taskId: long.taskId }) : { body: 'no task' };
    check('cancel-ack-empty', cAck.result?.resultType === 'complete' && ENVELOPE.every(f => !(f in cAck.result)), show(cAck));
    const cDone = long.taskId ? await poll(long.taskId, undefined, 10000) : { body: 'no task' };
    check('cancel-settles-cancelled', cDone.result?.status === 'cancelled', show(cDone));
    const termAck = taskId ? await rpc('tasks/cancel', { taskId }) : { body: 'no task' };
    check('cancel-terminal-task-ack', termAck.result?.resultType === 'complete' && ENVELOPE.every(f => !(f in termAck.result)), show(termAck));
    const stillDone = taskId ? await rpc('tasks/get', { taskId }) : { body: 'no task' };
    check('cancel-terminal-task-stays-completed', stillDone.result?.status === 'completed', show(stillDone));
    const cUnknown = await rpc('tasks/cancel', { taskId: 'raw-client-unknown-task-id' });
    check('cancel-unknown-task-32602', cUnknown.error?.code === -32602, show(cUnknown));
    check('cancel-unknown-task-http-400', cUnknown.http === 400, show(cUnknown));
    const cNoExt = long.taskId ? await rpc('tasks/cancel', { taskId: long.taskId }, { caps: NO_EXT }) : { body: 'no task' };
    check('cancel-without-extension-32021-http-400', cNoExt.error?.code === -32021 && cNoExt.http === 400, show(cNoExt));

    const passed = checks.filter(c => c.ok).length;
    console.log(`${opt.label}: ${passed}/${checks.length} passed`);
    if (opt.json) {
        const { writeFileSync } = await import('node:fs');
        writeFileSync(opt.json, JSON.stringify({ label: opt.label, ok: passed === checks.length, checks, ms: Date.now() - t0 }, null, 1));
    }
    process.exit(passed === checks.length ? 0 : 1);
}

main().catch(async error => {
    console.log(`FAIL ${opt.label}: ${error?.stack ?? error}`);
    if (opt.json) {
        const { writeFileSync } = await import('node:fs');
        writeFileSync(opt.json, JSON.stringify({ label: opt.label, ok: false, checks, crashed: String(error), ms: 0 }, null, 1));
    }
    process.exit(1);
});
