#!/usr/bin/env node
// A header-adding hop for clients that cannot send headers (the conformance CLI): listens on
// 127.0.0.1, adds `Authorization: Bearer TOKEN` to every request and forwards it to TARGET
// (scheme://host:port; the request path is kept), streaming both bodies (SSE passes through as it
// comes). A Host/Origin naming the hop is rewritten to the target's port. node:* only.
//
//   node bearer-hop.mjs --target http://127.0.0.1:PORT --token TOKEN [--port 0]
//
// Prints {"listening":"http://127.0.0.1:PORT","port":PORT,"target":...} once bound. An existing
// Authorization header is replaced. Stops on SIGTERM/SIGINT.
import http from 'node:http';

const argv = process.argv.slice(2);
const opt = { port: '0' };
for (let i = 0; i < argv.length; i += 2) opt[argv[i].replace(/^--/, '')] = argv[i + 1];
if (!opt.target || !opt.token) {
    console.error('usage: bearer-hop.mjs --target URL --token TOKEN [--port N]');
    process.exit(2);
}
const target = new URL(opt.target);
let ownPort = 0;

const server = http.createServer((req, res) => {
    // The hop is meant to be invisible: a Host (and Origin) naming the hop itself is rewritten to the
    // same host name at the target's port, as if the client had connected to the target; any other
    // Host or Origin (say a DNS-rebinding probe's) passes unchanged, so the target's checks see it.
    const headers = { ...req.headers, authorization: `Bearer ${opt.token}` };
    const mine = /^(127\.0\.0\.1|localhost|\[::1\]):(\d+)$/;
    const hostMatch = String(req.headers.host ?? '').match(mine);
    if (hostMatch && Number(hostMatch[2]) === ownPort) headers.host = `${hostMatch[1]}:${target.port}`;
    const originMatch = String(req.headers.origin ?? '').match(/^http:\/\/(127\.0\.0\.1|localhost|\[::1\]):(\d+)$/);
    if (originMatch && Number(originMatch[2]) === ownPort) headers.origin = `http://${originMatch[1]}:${target.port}`;
    const up = http.request(
        { hostname: target.hostname, port: target.port, path: req.url, method: req.method, headers },
        upRes => {
            res.writeHead(upRes.statusCode ?? 502, upRes.headers);
            res.flushHeaders();
            upRes.pipe(res);
        }
    );
    up.setTimeout(300_000, () => up.destroy(new Error('upstream timeout')));
    up.on('error', error => {
        if (!res.headersSent) {
            res.writeHead(502, { 'content-type': 'text/plain' });
            res.end(`bearer-hop: ${error.message}`);
        } else res.destroy();
    });
    // The client going away ends the upstream request too (a closed SSE stream is a cancel in 2026).
    res.on('close', () => {
        if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
});
server.keepAliveTimeout = 5000;
server.listen(Number(opt.port), '127.0.0.1', () => {
    const { port } = server.address();
    ownPort = port;
    console.log(JSON.stringify({ listening: `http://127.0.0.1:${port}`, port, target: opt.target }));
});
for (const sig of ['SIGTERM', 'SIGINT']) {
    process.on(sig, () => {
        server.close();
        server.closeAllConnections?.();
        setTimeout(() => process.exit(0), 200).unref();
    });
}
