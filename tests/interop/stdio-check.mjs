#!/usr/bin/env node
// Checks through taskgate that a stdio upstream (a `command` child) behaves as an MCP server and
// that taskgate supervises it, with the TypeScript SDK 1.32.2 client (stdio.sh).
//
//   node stdio-check.mjs everything URL                    server-everything in stdio mode:
//        tools/list, a plain `echo`, and `simulate-research-query` as a task to its end
//   node stdio-check.mjs killed URL ADMIN_URL PID_FILE      a 2025 task on task-server.mjs --mode
//        stdio, then the child (pid read from PID_FILE once the task runs) killed with SIGKILL:
//        the task is `failed` with a statusMessage naming the restart, /readyz turns green again
//        and the next call works (on a new child)
//
// Prints one JSON summary {label, ok, failed, checks} and exits 0 only when every check passed.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, CreateTaskResultSchema, GetTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { readFileSync } from 'node:fs';
import { sleep, withTimeout } from './lib.mjs';

const [mode, url, adminUrl, pidFile] = process.argv.slice(2);
const checks = [];
const check = (name, ok, detail) => checks.push({ name, ok: !!ok, ...(detail === undefined ? {} : { detail }) });

async function connect() {
    const client = new Client({ name: 'stdio-check', version: '1.0.0' }, { capabilities: {} });
    await withTimeout(client.connect(new StreamableHTTPClientTransport(new URL(url))), 15000, 'connect');
    return client;
}

/** Polls tasks/get until the task is terminal; errors (a child dying under the poll) are kept. */
async function untilTerminal(client, taskId, ms, errors = []) {
    const until = Date.now() + ms;
    for (;;) {
        try {
            const task = await client.request({ method: 'tasks/get', params: { taskId } }, GetTaskResultSchema);
            if (['completed', 'failed', 'cancelled'].includes(task.status) || Date.now() > until) return task;
        } catch (e) {
            errors.push(String(e?.message ?? e));
            if (Date.now() > until) throw e;
        }
        await sleep(200);
    }
}

async function everything() {
    const client = await connect();
    const tools = (await client.listTools()).tools.map(t => t.name);
    check('tools-listed', tools.includes('echo') && tools.includes('simulate-research-query'), tools);
    const echo = await client.callTool({ name: 'echo', arguments: { message: 'through taskgate' } });
    check('echo', JSON.stringify(echo.content).includes('through taskgate'), echo.content);
    const created = await client.request(
        { method: 'tools/call', params: { name: 'simulate-research-query', arguments: { topic: 'python' }, task: { ttl: 60000 } } },
        CreateTaskResultSchema
    );
    check('task-created', !!created.task?.taskId, created);
    const task = await untilTerminal(client, created.task.taskId, 60000);
    check('task-completed', task.status === 'completed', task);
    const result = await client.request({ method: 'tasks/result', params: { taskId: created.task.taskId } }, CallToolResultSchema);
    check('task-result', Array.isArray(result.content) && result.content.length > 0, result);
    await client.close();
}

async function killed() {
    const client = await connect();
    const created = await client.request(
        { method: 'tools/call', params: { name: 'slow_task', arguments: { duration_ms: 60000, steps: 60 }, task: { ttl: 120000 } } },
        CreateTaskResultSchema
    );
    const taskId = created.task?.taskId;
    check('task-created', !!taskId, created);
    const before = await client.request({ method: 'tasks/get', params: { taskId } }, GetTaskResultSchema);
    check('task-working', before.status === 'working', before);
    const pids = readFileSync(pidFile, 'utf8').trim().split(/\s+/).map(Number).filter(Boolean);
    check('child-known', pids.length === 1, pids);
    process.kill(pids[0], 'SIGKILL');
    const errors = [];
    const after = await untilTerminal(client, taskId, 15000, errors);
    check('task-failed', after.status === 'failed', after);
    // A poll that met the dying child was answered with an error naming the upstream.
    check('errors-name-the-upstream', errors.every(e => e.includes('ts-kill')), errors);
    check('status-message', /restarted/.test(after.statusMessage ?? ''), after.statusMessage);
    let ready = false;
    for (let i = 0; i < 100 && !ready; i++) {
        ready = (await fetch(`${adminUrl}/readyz`)).status === 200;
        if (!ready) await sleep(100);
    }
    check('ready-again', ready);
    // The old session is taskgate's and survives the restart; the child is new.
    const again = await client.callTool({ name: 'plain_echo', arguments: { text: 'after restart' } });
    check('next-call', JSON.stringify(again.content).includes('after restart'), again.content);
    await client.close();
}

try {
    if (mode === 'everything') await everything();
    else if (mode === 'killed') await killed();
    else throw new Error(`unknown mode ${mode}`);
} catch (e) {
    check('no-exception', false, String(e?.stack ?? e));
}
const failed = checks.filter(c => !c.ok).map(c => c.name);
console.log(JSON.stringify({ label: `stdio-${mode}`, ok: failed.length === 0, failed, checks }));
if (failed.length) console.error(`failed: ${failed.join(', ')}`);
process.exit(failed.length ? 1 : 0);
