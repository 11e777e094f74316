#!/usr/bin/env node
// The TypeScript SDK (1.32.2) client side of the OAuth run: it reaches a task server through
// taskgate with tokens from the real oidc-provider, using the SDK's own OAuth support:
// ClientCredentialsProvider (client_credentials, non-interactive) with discovery of taskgate's
// protected-resource metadata from the 401 (RFC 9728), then the authorization server's metadata.
//
//   node client.mjs --url http://127.0.0.1:GW/mcp --issuer http://127.0.0.1:IDP
//
// Prints a JSON summary; exits 0 only when every check passed.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ClientCredentialsProvider } from '@modelcontextprotocol/sdk/client/auth-extensions.js';
import { CallToolResultSchema, CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';

const arg = name => process.argv[process.argv.indexOf(`--${name}`) + 1];
const URL_ = new URL(arg('url'));
const ISSUER = arg('issuer');
const req = { timeout: 15000 };
const checks = [];
const check = (name, ok, detail) => checks.push({ name, ok: !!ok, ...(detail === undefined ? {} : { detail }) });

async function connect(id) {
    const authProvider = new ClientCredentialsProvider({ clientId: id, clientSecret: `${id}-secret`, expectedIssuer: ISSUER, scope: 'mcp' });
    const client = new Client({ name: `oauth-${id}`, version: '1.0.0' }, { capabilities: {} });
    await client.connect(new StreamableHTTPClientTransport(URL_, { authProvider }));
    return { client, authProvider };
}

async function taskFlow(client) {
    const created = await client.request(
        { method: 'tools/call', params: { name: 'fast_task', arguments: { text: 'oauth' }, task: { ttl: 60000 } } },
        CreateTaskResultSchema,
        req
    );
    const taskId = created.task.taskId;
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema, req);
    return { taskId, result };
}

try {
    // Without credentials: 401 with the metadata URL, and the metadata names the issuer.
    const bare = await fetch(URL_, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: '{}' });
    const challenge = bare.headers.get('www-authenticate') ?? '';
    check('401 without a token', bare.status === 401, bare.status);
    const metaUrl = /resource_metadata="([^"]+)"/.exec(challenge)?.[1];
    check('challenge names resource_metadata', metaUrl, challenge);
    const meta = await (await fetch(metaUrl)).json();
    check('metadata names the issuer', meta.authorization_servers?.[0] === ISSUER, meta);

    const alice = await connect('alice');
    const token = alice.authProvider.tokens()?.access_token ?? '';
    const claims = JSON.parse(Buffer.from(token.split('.')[1] ?? '', 'base64url').toString() || '{}');
    check('token is a JWT for taskgate', claims.aud === URL_.href && claims.iss === ISSUER, claims);
    const tools = await alice.client.listTools(undefined, req);
    check('tools/list through taskgate', tools.tools.some(t => t.name === 'fast_task'));
    const { taskId, result } = await taskFlow(alice.client);
    check('task created and its result read', result.content?.length > 0, result);

    const bob = await connect('bob');
    const theirs = await bob.client.experimental.tasks.getTask(taskId, req).then(() => 'visible', e => e.code);
    check("bob cannot see alice's task", theirs === -32602, theirs);
    const alice2 = await connect('alice');
    const again = await alice2.client.experimental.tasks.getTask(taskId, req);
    check('alice sees it from a new session', again.taskId === taskId, again.status);
    for (const c of [alice.client, bob.client, alice2.client]) await c.close();
} catch (e) {
    check('no exception', false, String(e?.stack ?? e));
}
const failed = checks.filter(c => !c.ok);
console.log(JSON.stringify({ checks }, null, 1));
console.log(`oauth: ${checks.length - failed.length} passed, ${failed.length} failed`);
process.exit(failed.length ? 1 : 0);
