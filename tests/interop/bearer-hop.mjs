#!/usr/bin/env node
// A header-adding hop for clients that cannot send headers (the conformance CLI): listens on
// 127.0.0.1, adds `Authorization: Bearer TOKEN` to every request and forwards it to TARGET
// (scheme://host:port; the request path is kept), streaming both bodies (SSE passes through as it
// comes). node:* only.
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

const server = http.createServer((req, res) => {
    // Host and Origin pass as the client sent them: the hop is meant to be invisible (a gateway's Host/Origin
    // checks then see what they would see without it).
    const headers = { ...req.headers, authorization: `Bearer ${opt.token}` };
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
    console.log(JSON.stringify({ listening: `http://127.0.0.1:${port}`, port, target: opt.target }));
});
for (const sig of ['SIGTERM', 'SIGINT']) {
    process.on(sig, () => {
        server.close();
        server.closeAllConnections?.();
        setTimeout(() => process.exit(0), 200).unref();
    });
}
