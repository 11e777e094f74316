#!/usr/bin/env node
// A real authorization server for the OAuth run: oidc-provider (pinned in package.json) on a
// loopback port, with the client_credentials grant and resource indicators (RFC 8707), issuing
// RS256-signed JWT access tokens (RFC 9068) for one resource: taskgate's MCP endpoint.
//
//   node idp.mjs --resource http://127.0.0.1:PORT/mcp
//
// Clients: alice/alice-secret and bob/bob-secret (client_secret_basic, scope "mcp").
// Prints one line `{"issuer":"http://127.0.0.1:PORT"}` on stdout once listening; stops on
// SIGTERM/SIGINT (run.sh sends it on exit).
import http from 'node:http';
import { generateKeyPair, exportJWK } from 'jose';
import Provider, { errors } from 'oidc-provider';

const at = process.argv.indexOf('--resource');
const RESOURCE = at > 0 ? process.argv[at + 1] : undefined;
if (!RESOURCE) {
    console.error('usage: idp.mjs --resource URL');
    process.exit(2);
}

const server = http.createServer();
await new Promise(resolve => server.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const { privateKey } = await generateKeyPair('RS256', { extractable: true });
const jwk = { ...(await exportJWK(privateKey)), kid: 'run-key-1', alg: 'RS256', use: 'sig' };
const client = id => ({
    client_id: id,
    client_secret: `${id}-secret`,
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
    token_endpoint_auth_method: 'client_secret_basic',
    scope: 'mcp'
});

const provider = new Provider(issuer, {
    clients: [client('alice'), client('bob')],
    jwks: { keys: [jwk] },
    scopes: ['mcp'],
    features: {
        devInteractions: { enabled: false },
        clientCredentials: { enabled: true },
        resourceIndicators: {
            enabled: true,
            defaultResource: () => RESOURCE,
            useGrantedResource: () => true,
            getResourceServerInfo(ctx, resourceIndicator) {
                if (resourceIndicator !== RESOURCE) throw new errors.InvalidTarget();
                return { scope: 'mcp', audience: RESOURCE, accessTokenTTL: 300, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } } };
            }
        }
    }
});
provider.on('server_error', (ctx, err) => console.error('idp server_error', err));
server.on('request', provider.callback());
process.stdout.write(JSON.stringify({ issuer }) + '\n');

const stop = () => {
    server.closeAllConnections?.();
    server.close(() => process.exit(0));
    setTimeout(() => process.exit(0), 1000).unref();
};
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
