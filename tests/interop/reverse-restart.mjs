#!/usr/bin/env node
// A captured input request answered across a restart of taskgate (issue 33, the reverse bridge):
// a raw 2026-07-28 client (fetch only) through taskgate on the TypeScript SDK 1.32.2 task server
// (task-server.mjs --mode stateful). reverse.sh runs the two phases around a kill -9 of taskgate:
//
//   node reverse-restart.mjs ask URL             ask_task; polls tasks/get until its
//                                                elicitation/create shows in inputRequests
//                                                (taskgate captured it on its tasks/result stream
//                                                and stored it in the task's record); prints
//                                                {"taskId","key"}
//   node reverse-restart.mjs answer URL TASK KEY after the restart: tasks/get answers
//                                                input_required with the same request under KEY
//                                                (from the record: the SDK sent it once and does
//                                                not send it again), tasks/update answers it (the
//                                                SDK takes the response by its id on any POST of
//                                                the session), the task completes with the answer;
//                                                a second answer to KEY is acked and goes nowhere
//
// Prints `PASS name` / `FAIL name: why` per check; exit 0 only when all passed.

const [phase, url, taskId, askKey] = process.argv.slice(2);
if (!['ask', 'answer'].includes(phase) || !url || (phase === 'answer' && !(taskId && askKey))) {
    console.error('usage: reverse-restart.mjs ask URL | answer URL TASK_ID KEY');
    process.exit(2);
}
const MODERN = '2026-07-28';
const META = {
    'io.modelcontextprotocol/protocolVersion': MODERN,
    'io.modelcontextprotocol/clientCapabilities': { extensions: { 'io.modelcontextprotocol/tasks': {} }, elicitation: {} }
};
let nextId = 1;
let failed = 0;

function check(name, ok, why) {
    if (ok) console.error(`PASS ${name}`);
    else {
        console.error(`FAIL ${name}: ${why}`);
        failed++;
    }
}

// One stateless 2026-07-28 POST; the JSON-RPC answer (from JSON or the SSE stream).
async function rpc(method, params, name) {
    const id = nextId++;
    const headers = {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': MODERN,
        'mcp-method': method
    };
    if (name) headers['mcp-name'] = name;
    const res = await fetch(url, {
        method: 'POST',
        headers,
        body: JSON.stringify({ jsonrpc: '2.0', id, method, params: { ...params, _meta: META } }),
        signal: AbortSignal.timeout(20000)
    });
    const text = await res.text();
    if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
        for (const line of text.split('\n')) {
            if (!line.startsWith('data:')) continue;
            try {
                const v = JSON.parse(line.slice(5));
                if (v.id === id) return v;
            } catch {}
        }
        return { error: { message: `no answer in the stream: ${text.slice(0, 300)}` } };
    }
    return JSON.parse(text);
}

const sleep = ms => new Promise(r => setTimeout(r, ms));

if (phase === 'ask') {
    const created = await rpc('tools/call', { name: 'ask_task', arguments: { question: 'Proceed?' } }, 'ask_task');
    const id = created.result?.taskId;
    check('ask-task-created', typeof id === 'string', JSON.stringify(created));
    if (!id) process.exit(1);
    let shown;
    const until = Date.now() + 10000;
    while (Date.now() < until) {
        const got = await rpc('tasks/get', { taskId: id }, id);
        const keys = Object.keys(got.result?.inputRequests ?? {});
        if (got.result?.status === 'input_required' && keys.length > 0) {
            shown = { key: keys[0], request: got.result.inputRequests[keys[0]] };
            break;
        }
        await sleep(200);
    }
    check(
        'input-captured',
        shown?.request?.method === 'elicitation/create',
        `no elicitation/create in inputRequests within 10 s: ${JSON.stringify(shown)}`
    );
    if (!shown) process.exit(1);
    console.log(JSON.stringify({ taskId: id, key: shown.key }));
    process.exit(failed ? 1 : 0);
}

const first = await rpc('tasks/get', { taskId }, taskId);
const r = first.result ?? {};
check('restart-input-required', r.status === 'input_required', JSON.stringify(first));
const shown = r.inputRequests?.[askKey];
check(
    'restart-input-shown',
    shown?.method === 'elicitation/create' && shown?.params?.message === 'Proceed?' && shown?.params?._meta === undefined,
    JSON.stringify(first)
);
const update = await rpc('tasks/update', { taskId, inputResponses: { [askKey]: { action: 'accept', content: { answer: 'yes' } } } }, taskId);
check('restart-update-acked', update.result?.resultType === 'complete', JSON.stringify(update));
let done;
const until = Date.now() + 10000;
while (Date.now() < until) {
    done = await rpc('tasks/get', { taskId }, taskId);
    if (['completed', 'failed', 'cancelled'].includes(done.result?.status)) break;
    await sleep(200);
}
const text = done?.result?.result?.content?.[0]?.text ?? '';
check(
    'restart-answered',
    done?.result?.status === 'completed' && text.includes('accept') && text.includes('yes'),
    JSON.stringify(done)
);
const again = await rpc('tasks/update', { taskId, inputResponses: { [askKey]: { action: 'decline' } } }, taskId);
check('restart-second-answer-acked', again.result?.resultType === 'complete', JSON.stringify(again));
console.error(failed ? `${failed} check(s) failed` : 'all passed');
process.exit(failed ? 1 : 0);
