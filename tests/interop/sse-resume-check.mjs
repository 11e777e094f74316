#!/usr/bin/env node
// SSE resumability check (2025-11-25 Streamable HTTP, SEP-1699) against conformance-server.mjs,
// directly or through a gateway. The conformance suite's server-sse-polling scenario sends
// `MCP-Protocol-Version: 2025-03-26`, so the SDK server neither primes nor closes its stream there
// and resumption is never exercised; this check does it with 2025-11-25.
//
//   node sse-resume-check.mjs URL [--label NAME] [--timeout-ms 20000]
//
// 1. initialize + notifications/initialized (raw fetch, protocol 2025-11-25);
// 2. POST tools/call test_reconnection: the server primes the SSE stream (event id, empty data,
//    retry) and closes it before the result;
// 3. GET with Last-Event-ID = the last id seen: the result must arrive there.
// Hard checks: the result arrives (on the POST stream or after resuming), and if the POST stream
// ended without it, it carried an event id to resume from. What the stream looked like (priming,
// retry, closed early) is recorded under `observed` for comparison with a direct run.
// Prints a JSON summary like task-client.mjs; exit 0 only when every check passed.

import { parseArgs, withTimeout } from './lib.mjs';

const opts = parseArgs(process.argv.slice(2), { _: [], label: '', 'timeout-ms': 20000, trace: false });
const url = opts._[0];
if (!url) {
    console.error('usage: node sse-resume-check.mjs URL [--label NAME] [--timeout-ms N]');
    process.exit(2);
}
const VERSION = '2025-11-25';
const checks = [];
const observed = {};
const check = (name, ok, detail) => checks.push({ name, ok: !!ok, ...(detail === undefined ? {} : { detail }) });

/** Parses an SSE body into events {id, event, data, retry}; stops at `until(event)` or end of stream. */
async function readEvents(response, until, ms) {
    const events = [];
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    let current = {};
    const timer = setTimeout(() => reader.cancel().catch(() => {}), ms);
    try {
        for (;;) {
            const { value, done } = await reader.read();
            if (done) return { events, ended: true };
            buffer += value;
            let nl;
            while ((nl = buffer.search(/\r?\n/)) >= 0) {
                const line = buffer.slice(0, nl);
                buffer = buffer.slice(nl + (buffer[nl] === '\r' ? 2 : 1));
                if (line === '') {
                    if (Object.keys(current).length) {
                        events.push(current);
                        if (until(current)) {
                            await reader.cancel().catch(() => {});
                            return { events, ended: false };
                        }
                    }
                    current = {};
                    continue;
                }
                if (line.startsWith(':')) continue;
                const colon = line.indexOf(':');
                const field = colon < 0 ? line : line.slice(0, colon);
                const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
                if (field === 'data') current.data = current.data === undefined ? val : `${current.data}\n${val}`;
                else if (field === 'id' || field === 'event' || field === 'retry') current[field] = val;
            }
        }
    } catch (error) {
        return { events, ended: false, error: error.message };
    } finally {
        clearTimeout(timer);
    }
}

const isResult = id => e => {
    try {
        const m = JSON.parse(e.data ?? '');
        return m.id === id && ('result' in m || 'error' in m);
    } catch {
        return false;
    }
};

async function run() {
    const base = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
    const init = await fetch(url, {
        method: 'POST',
        headers: base,
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: VERSION, capabilities: {}, clientInfo: { name: 'sse-resume-check', version: '1.0.0' } } })
    });
    const sessionId = init.headers.get('mcp-session-id');
    await init.arrayBuffer();
    if (!check('initialize', init.ok && sessionId, { status: init.status, sessionId: sessionId ? 'present' : 'absent' })) return;
    const headers = { ...base, 'mcp-session-id': sessionId, 'mcp-protocol-version': VERSION };
    const note = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) });
    await note.arrayBuffer();
    check('initialized-accepted', note.status === 202, { status: note.status });

    const post = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'test_reconnection', arguments: {} } }) });
    const contentType = post.headers.get('content-type') ?? '';
    observed.postContentType = contentType.split(';')[0];
    if (!contentType.includes('text/event-stream')) {
        const body = await post.text();
        check('result-delivered', post.ok && isResult(2)({ data: body }), { status: post.status, contentType, body: body.slice(0, 300) });
        return;
    }
    const first = await readEvents(post, isResult(2), 10000);
    const ids = first.events.filter(e => e.id !== undefined).map(e => e.id);
    observed.primingFirst = first.events[0]?.id !== undefined && (first.events[0]?.data ?? '').trim() === '';
    observed.retryField = first.events.some(e => e.retry !== undefined);
    observed.postStreamClosedBeforeResult = !first.events.some(isResult(2));
    observed.postEvents = first.events.length;
    if (!observed.postStreamClosedBeforeResult) {
        check('result-delivered', true, { on: 'POST stream' });
        return;
    }
    if (!check('post-stream-resumable', ids.length > 0, { events: first.events, ended: first.ended, error: first.error })) return;

    const retry = Number(first.events.find(e => e.retry !== undefined)?.retry ?? 0);
    await new Promise(resolve => setTimeout(resolve, Math.min(retry, 2000)));
    const lastEventId = ids.at(-1);
    const get = await fetch(url, { method: 'GET', headers: { accept: 'text/event-stream', 'mcp-session-id': sessionId, 'mcp-protocol-version': VERSION, 'last-event-id': lastEventId } });
    observed.resumeStatus = get.status;
    if (!get.ok) {
        check('result-delivered', false, { on: 'GET with Last-Event-ID', status: get.status, body: (await get.text()).slice(0, 300) });
        return;
    }
    const resumed = await readEvents(get, isResult(2), 5000);
    const result = resumed.events.find(isResult(2));
    check('result-delivered', result && JSON.parse(result.data).result?.content?.[0]?.text === 'Reconnection test completed', {
        on: 'GET with Last-Event-ID',
        lastEventId,
        events: resumed.events
    });

    const del = await fetch(url, { method: 'DELETE', headers: { 'mcp-session-id': sessionId, 'mcp-protocol-version': VERSION } });
    await del.arrayBuffer();
}

const started = Date.now();
try {
    await withTimeout(run(), opts['timeout-ms'], 'SSE resume check');
} catch (error) {
    check('finished', false, { error: error.message });
}
const failed = checks.filter(c => !c.ok).map(c => c.name);
const summary = { label: opts.label || undefined, url, ok: failed.length === 0 && checks.length > 0, passed: checks.length - failed.length, failed, ms: Date.now() - started, observed, info: {}, checks };
process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
if (!summary.ok) console.error(`sse-resume-check${opts.label ? ` [${opts.label}]` : ''}: FAILED checks: ${failed.join(', ')}`);
process.exit(summary.ok ? 0 : 1);
