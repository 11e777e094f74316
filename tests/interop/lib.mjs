// Shared helpers for the interop fixture servers and clients (plain ESM, no build step).

import { randomUUID } from 'node:crypto';

/**
 * Parses `--key value` / `--key=value` / `--flag` arguments into an object.
 * Values given in `defaults` fix the accepted keys; an unknown key is an error.
 */
export function parseArgs(argv, defaults) {
    const out = { ...defaults };
    for (let i = 0; i < argv.length; i++) {
        const arg = argv[i];
        if (!arg.startsWith('--')) {
            if (out._ === undefined) throw new Error(`unexpected argument: ${arg}`);
            out._.push(arg);
            continue;
        }
        let [key, value] = arg.slice(2).split(/=(.*)/s, 2);
        if (!(key in defaults)) throw new Error(`unknown option --${key}`);
        if (value === undefined) {
            if (typeof defaults[key] === 'boolean') value = 'true';
            else if (i + 1 < argv.length) value = argv[++i];
            else throw new Error(`option --${key} needs a value`);
        }
        out[key] = typeof defaults[key] === 'number' ? Number(value) : typeof defaults[key] === 'boolean' ? value === 'true' : value;
    }
    return out;
}

/**
 * Event store for SSE resumability (SEP-1699): keeps every event of every stream of one
 * session in memory, so a client that reconnects with `Last-Event-ID` gets the events of
 * that stream (and only that stream) after the given id.
 */
export class MemoryEventStore {
    constructor() {
        /** eventId -> {streamId, message}; insertion order is event order */
        this.events = new Map();
        this.seq = 0;
    }
    async storeEvent(streamId, message) {
        const eventId = `${streamId}_${String(++this.seq).padStart(8, '0')}`;
        this.events.set(eventId, { streamId, message });
        return eventId;
    }
    async getStreamIdForEventId(eventId) {
        return this.events.get(eventId)?.streamId;
    }
    async replayEventsAfter(lastEventId, { send }) {
        const start = this.events.get(lastEventId);
        if (!start) return '';
        let after = false;
        for (const [eventId, { streamId, message }] of this.events) {
            if (eventId === lastEventId) {
                after = true;
                continue;
            }
            // The priming event is stored as `{}`: nothing to replay for it.
            if (after && streamId === start.streamId && Object.keys(message).length > 0) await send(eventId, message);
        }
        return start.streamId;
    }
}

/**
 * Binds an http.Server (or express app) to 127.0.0.1:port (0 = any free port) and prints
 * exactly one line `{"listening":"http://127.0.0.1:PORT/mcp", ...extra}` to stdout once bound.
 * SIGTERM/SIGINT close the server and exit 0.
 */
export function listenAndAnnounce(appOrServer, port, extra = {}, onShutdown = async () => {}) {
    return new Promise((resolve, reject) => {
        const server = appOrServer.listen(port, '127.0.0.1', () => {
            const addr = server.address();
            process.stdout.write(JSON.stringify({ listening: `http://127.0.0.1:${addr.port}/mcp`, port: addr.port, ...extra }) + '\n');
            resolve(server);
        });
        server.on('error', reject);
        const stop = async signal => {
            // Logged so that a run whose fixture vanished shows who ended it (run.sh, or someone else).
            console.error(`[pid ${process.pid}] ${signal} received: shutting down`);
            try {
                await onShutdown();
            } catch {
                // shutting down anyway
            }
            server.closeAllConnections?.();
            server.close(() => process.exit(0));
            setTimeout(() => process.exit(0), 2000).unref();
        };
        process.once('SIGTERM', stop);
        process.once('SIGINT', stop);
    });
}

/** Writes a JSON-RPC error body with an HTTP status (id null: the request id is unknown). */
export function sendJsonRpcHttpError(res, status, code, message) {
    res.status(status).json({ jsonrpc: '2.0', error: { code, message }, id: null });
}

export const newSessionId = () => randomUUID();

export const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

/** Rejects after `ms` with an error naming `what`, unless `promise` settles first. */
export function withTimeout(promise, ms, what) {
    let timer;
    return Promise.race([
        promise.finally(() => clearTimeout(timer)),
        new Promise((_, reject) => {
            timer = setTimeout(() => reject(new Error(`timeout after ${ms} ms: ${what}`)), ms);
        })
    ]);
}
