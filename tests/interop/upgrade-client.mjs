#!/usr/bin/env node
// A client WITHOUT capabilities.tasks calls a tool whose taskSupport is "required", with the
// TypeScript SDK 1.32.2 `callTool` (no params.task), and reports what it got.
//
//   node upgrade-client.mjs URL TOOL ARGS_JSON [--expect result|error] [--elicit accept|none]
//        [--list=true|false] [--min-progress N] [--min-elicitations N] [--text REGEX]
//        [--error-text REGEX] [--label L]
//
// --list true (default) calls tools/list first, as an SDK user would; the SDK then refuses on its
// own to callTool a tool listed as "required" (so directly the call fails before it is sent);
// --list false sends the call without listing, so the server's own refusal is seen.
// --elicit accept declares capabilities.elicitation and accepts every elicitation with the first
// enum/oneOf value of each property.
// Prints one JSON line {label, ok, problems, isError, text, taskSupportSeen, progress:[...],
// elicitations, ms, firstProgressMs, error?} and exits 0 when the outcome matches --expect (and,
// for --expect result, the --min-* and --text conditions hold; for --expect error, the error
// message or isError text matches --error-text).

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { parseArgs } from './lib.mjs';

const opts = parseArgs(process.argv.slice(2), {
    _: [],
    expect: 'result',
    elicit: 'none',
    list: true,
    'min-progress': 0,
    'min-elicitations': 0,
    text: '',
    'error-text': '',
    label: ''
});
const [url, tool, argsJson] = opts._;
const capabilities = opts.elicit === 'accept' ? { elicitation: {} } : {};
const client = new Client({ name: 'taskgate-upgrade-probe', version: '1.0.0' }, { capabilities });
let elicitations = 0;
const start = Date.now();
if (opts.elicit === 'accept') {
    client.setRequestHandler(ElicitRequestSchema, async req => {
        elicitations += 1;
        const props = req.params.requestedSchema?.properties ?? {};
        const content = {};
        for (const [k, s] of Object.entries(props)) {
            content[k] = s.enum ? s.enum[0] : s.oneOf ? s.oneOf[0].const : s.type === 'boolean' ? true : s.type === 'number' || s.type === 'integer' ? 1 : 'x';
        }
        return { action: 'accept', content };
    });
}
const progress = [];
let firstProgressMs;
const out = { label: opts.label, url, tool, capabilities };
try {
    await client.connect(new StreamableHTTPClientTransport(new URL(url)));
    if (opts.list) {
        const { tools } = await client.listTools();
        out.taskSupportSeen = tools.find(t => t.name === tool)?.execution?.taskSupport ?? null;
    }
    const result = await client.callTool({ name: tool, arguments: JSON.parse(argsJson ?? '{}') }, undefined, {
        onprogress: p => {
            firstProgressMs ??= Date.now() - start;
            progress.push(p);
        },
        timeout: 120000,
        resetTimeoutOnProgress: true
    });
    out.isError = !!result.isError;
    out.text = (result.content ?? [])
        .map(c => c.text ?? '')
        .join('\n')
        .slice(0, 400);
} catch (e) {
    out.error = { code: e.code, message: String(e.message ?? e) };
}
out.ms = Date.now() - start;
out.firstProgressMs = firstProgressMs ?? null;
out.progress = progress.map(p => `${p.progress}${p.total !== undefined ? `/${p.total}` : ''}${p.message ? ` ${p.message}` : ''}`);
out.elicitations = elicitations;
const problems = [];
const gotResult = !out.error && !out.isError;
if (opts.expect === 'result') {
    if (!gotResult) problems.push(`expected a result, got ${out.error ? `error ${JSON.stringify(out.error)}` : `isError: ${out.text}`}`);
    if (progress.length < opts['min-progress']) problems.push(`expected at least ${opts['min-progress']} progress notifications, got ${progress.length}`);
    if (elicitations < opts['min-elicitations']) problems.push(`expected at least ${opts['min-elicitations']} elicitations, got ${elicitations}`);
    if (opts.text && !new RegExp(opts.text).test(out.text ?? '')) problems.push(`result text does not match /${opts.text}/`);
} else if (gotResult) problems.push(`expected the call to fail, got a result: ${out.text}`);
else if (opts['error-text'] && !new RegExp(opts['error-text']).test(out.error?.message ?? out.text ?? '')) {
    problems.push(`the failure does not match /${opts['error-text']}/`);
}
out.problems = problems;
out.ok = problems.length === 0;
console.log(JSON.stringify(out));
await client.close().catch(() => {});
process.exit(out.ok ? 0 : 1);
