#!/usr/bin/env node
// A client WITHOUT capabilities.tasks calls a tool whose taskSupport is "required", with the
// TypeScript SDK 1.32.2 `callTool` (no params.task), and reports what it got.
//
//   node upgrade-client.mjs URL TOOL ARGS_JSON [--expect result|error] [--elicit accept|none]
//
// Prints one JSON line {ok, isError, text, progress:[...], elicitations:n, error?} and exits 0 when
// the outcome matches --expect (default: a non-error result).

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { parseArgs } from './lib.mjs';

const opts = parseArgs(process.argv.slice(2), { _: [], expect: 'result', elicit: 'none' });
const [url, tool, argsJson] = opts._;
const capabilities = opts.elicit === 'accept' ? { elicitation: {} } : {};
const client = new Client({ name: 'taskgate-upgrade-probe', version: '1.0.0' }, { capabilities });
let elicitations = 0;
if (opts.elicit === 'accept') {
    client.setRequestHandler(ElicitRequestSchema, async (req) => {
        elicitations += 1;
        const props = req.params.requestedSchema?.properties ?? {};
        const content = {};
        for (const [k, s] of Object.entries(props)) {
            content[k] = s.enum ? s.enum[0] : s.type === 'boolean' ? true : s.type === 'number' || s.type === 'integer' ? 1 : 'x';
        }
        return { action: 'accept', content };
    });
}
const progress = [];
const out = { url, tool };
try {
    await client.connect(new StreamableHTTPClientTransport(new URL(url)));
    const result = await client.callTool(
        { name: tool, arguments: JSON.parse(argsJson ?? '{}') },
        undefined,
        { onprogress: (p) => progress.push(p), timeout: 120000, resetTimeoutOnProgress: true },
    );
    out.isError = !!result.isError;
    out.text = (result.content ?? []).map((c) => c.text ?? '').join('\n').slice(0, 300);
} catch (e) {
    out.error = { code: e.code, message: String(e.message ?? e) };
}
out.progress = progress.map((p) => p.message ?? p.progress);
out.elicitations = elicitations;
const gotResult = !out.error && !out.isError;
out.ok = opts.expect === 'result' ? gotResult : !gotResult;
console.log(JSON.stringify(out));
await client.close().catch(() => {});
process.exit(out.ok ? 0 : 1);
