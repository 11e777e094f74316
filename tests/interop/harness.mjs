#!/usr/bin/env node
// Helpers for run.sh (plain ESM, node:* only, so it runs before `npm ci` too).
//
//   node harness.mjs free-port
//       Binds a free 127.0.0.1 port below the ephemeral range (within INTEROP_PORT_RANGE=FROM-TO
//       when set), prints it, releases it (for peers that cannot announce a port 0 bind).
//   node harness.mjs json-field FILE PATH
//       Prints the value at dotted PATH of the JSON document on FILE's first line ("" if absent).
//   node harness.mjs conformance --scenarios FILE --expected FILE --direct-log F --direct-dir D
//                                [--via-log F --via-dir D] [--check-level strict|report]
//       Compares conformance-suite runs: the direct pass set against the expected-failures file, and
//       the pass set through the gateway against the direct one (plus, unless --check-level report,
//       the status of every SUCCESS/FAILURE/WARNING check). Prints a report; exit 1 on a mismatch.
//   node harness.mjs tasks --label L --direct FILE [--via FILE] [--same KEY,...]
//       Reads client summaries (task-client.mjs, py_task_client.py, sse-resume-check.mjs,
//       cancel-check.mjs), reports failed checks, notes where what was observed differs between the
//       direct run and the run through the gateway. Exit 1 when a run failed, progress got lost
//       through the gateway, or an `info` KEY named by --same differs (task ids scrubbed).
//   node harness.mjs upgrade --label L --direct FILE [--via FILE --admin HOST:PORT --upstream NAME
//                            --tool TOOL --status STATUS]
//       Reads upgrade-client.mjs / py_upgrade_client.py summaries: the direct run must have failed
//       as expected, the run through the upgrading gateway must have succeeded (both "ok"), and the
//       gateway's newest record for TOOL on NAME (GET /admin/tasks) must be origin "upgraded" with
//       STATUS. Prints a report; exit 1 otherwise.

import { createServer } from 'node:net';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

const [cmd, ...rest] = process.argv.slice(2);

function options(argv) {
    const out = {};
    for (let i = 0; i < argv.length; i += 2) {
        if (!argv[i].startsWith('--')) throw new Error(`unexpected argument ${argv[i]}`);
        out[argv[i].slice(2)] = argv[i + 1];
    }
    return out;
}

function firstJsonLine(file) {
    const line = readFileSync(file, 'utf8').split('\n').find(l => l.trim().startsWith('{'));
    if (!line) throw new Error(`${file}: no JSON line`);
    return JSON.parse(line);
}

// ---- conformance ---------------------------------------------------------------------------------

/** Reads the expected-failures file: `scenario  # reason` per line; a reason is required. */
function readExpected(file) {
    const expected = new Map();
    const problems = [];
    for (const [i, raw] of readFileSync(file, 'utf8').split('\n').entries()) {
        const line = raw.trim();
        if (!line || line.startsWith('#')) continue;
        const m = line.match(/^(\S+)\s+#\s*(\S.*)$/);
        if (!m) problems.push(`${file}:${i + 1}: want "scenario  # reason", got "${line}"`);
        else expected.set(m[1], m[2]);
    }
    return { expected, problems };
}

/**
 * One conformance run: scenario -> {passed, failedChecks, checks}. The pass/fail verdict comes from
 * the runner's SUMMARY lines (a scenario whose run threw has no checks.json); the check details come
 * from DIR/server-<scenario>-<timestamp>/checks.json.
 */
function readRun(logFile, dir, scenarios) {
    const log = existsSync(logFile) ? readFileSync(logFile, 'utf8') : '';
    const summary = log.slice(log.lastIndexOf('=== SUMMARY ==='));
    const run = new Map();
    for (const line of summary.split('\n')) {
        const m = line.match(/^([✓✗]) (\S+): (\d+) passed, (\d+) failed/);
        if (m) run.set(m[2], { passed: m[1] === '✓', checks: [], failedChecks: [] });
    }
    const dirs = existsSync(dir) ? readdirSync(dir) : [];
    for (const scenario of scenarios) {
        const entry = run.get(scenario) ?? { passed: false, checks: [], failedChecks: [], missing: true };
        run.set(scenario, entry);
        const sub = dirs.filter(d => d.startsWith(`server-${scenario}-`) && /\d{4}-\d\d-\d\dT/.test(d.slice(`server-${scenario}-`.length))).sort().at(-1);
        if (!sub) continue;
        try {
            entry.checks = JSON.parse(readFileSync(join(dir, sub, 'checks.json'), 'utf8'));
        } catch {
            continue;
        }
        entry.failedChecks = entry.checks.filter(c => c.status === 'FAILURE').map(c => `${c.id}: ${c.errorMessage ?? c.description}`);
    }
    return run;
}

function tally(run) {
    let passed = 0, failed = 0, checksOk = 0, checksFailed = 0, warnings = 0;
    for (const e of run.values()) {
        e.passed ? passed++ : failed++;
        for (const c of e.checks) {
            if (c.status === 'SUCCESS') checksOk++;
            else if (c.status === 'FAILURE') checksFailed++;
            else if (c.status === 'WARNING') warnings++;
        }
    }
    return { passed, failed, checksOk, checksFailed, warnings };
}

/** Non-INFO check statuses keyed "scenario/check-id#n" (ids repeat within a scenario). */
function checkStatuses(run) {
    const out = new Map();
    for (const [scenario, e] of run) {
        const seen = new Map();
        for (const c of e.checks) {
            if (c.status === 'INFO') continue;
            const n = (seen.get(c.id) ?? 0) + 1;
            seen.set(c.id, n);
            out.set(`${scenario}/${c.id}${n > 1 ? `#${n}` : ''}`, { status: c.status, message: c.errorMessage });
        }
    }
    return out;
}

function conformance(o) {
    const scenarios = readFileSync(o.scenarios, 'utf8').split('\n').map(l => l.match(/^\s*-\s*(\S+)/)?.[1]).filter(Boolean);
    if (scenarios.length === 0) {
        console.log(`FAIL conformance: no scenarios listed in ${o.scenarios}`);
        return 1;
    }
    const { expected, problems } = readExpected(o.expected);
    let bad = problems.length;
    problems.forEach(p => console.log(`FAIL ${p}`));
    for (const name of expected.keys()) {
        if (!scenarios.includes(name)) {
            console.log(`FAIL expected-failures lists "${name}", which is not a server scenario of this conformance version`);
            bad++;
        }
    }

    const direct = readRun(o['direct-log'], o['direct-dir'], scenarios);
    const t = tally(direct);
    console.log(`conformance direct:  ${t.passed}/${scenarios.length} scenarios passed, ${t.failed} failed (checks: ${t.checksOk} ok, ${t.checksFailed} failed, ${t.warnings} warnings)`);
    for (const [name, e] of direct) {
        if (!e.passed && !expected.has(name)) {
            console.log(`FAIL direct: ${name} failed and is not in ${o.expected}${e.missing ? ' (did not run)' : ''}: ${e.failedChecks.join('; ')}`);
            bad++;
        }
        if (e.passed && expected.has(name)) {
            console.log(`FAIL direct: ${name} passes but is listed in ${o.expected} (${expected.get(name)}): remove it`);
            bad++;
        }
        if (!e.passed && expected.has(name)) console.log(`  expected failure: ${name} (${expected.get(name)})`);
    }

    if (o['via-log']) {
        const via = readRun(o['via-log'], o['via-dir'], scenarios);
        const v = tally(via);
        console.log(`conformance via gateway: ${v.passed}/${scenarios.length} scenarios passed, ${v.failed} failed (checks: ${v.checksOk} ok, ${v.checksFailed} failed, ${v.warnings} warnings)`);
        for (const name of scenarios) {
            const d = direct.get(name), g = via.get(name);
            if (d.passed !== g.passed) {
                bad++;
                console.log(
                    `FAIL pass-set: ${name} ${d.passed ? 'passes' : 'fails'} direct but ${g.passed ? 'passes' : 'fails'} through the gateway` +
                        (g.failedChecks.length ? `: ${g.failedChecks.join('; ')}` : g.missing ? ' (did not run)' : '')
                );
            }
        }
        const ds = checkStatuses(direct), gs = checkStatuses(via);
        const keys = new Set([...ds.keys(), ...gs.keys()]);
        let diffs = 0;
        for (const k of [...keys].sort()) {
            const a = ds.get(k)?.status ?? 'absent', b = gs.get(k)?.status ?? 'absent';
            if (a === b) continue;
            diffs++;
            const line = `check-level: ${k} is ${a} direct, ${b} through the gateway${gs.get(k)?.message ? `: ${gs.get(k).message}` : ''}`;
            if (o['check-level'] === 'report') console.log(`  note ${line}`);
            else {
                console.log(`FAIL ${line}`);
                bad++;
            }
        }
        if (diffs === 0) console.log('  every SUCCESS/FAILURE/WARNING check has the same status direct and through the gateway');
    }
    return bad ? 1 : 0;
}

// ---- tasks --------------------------------------------------------------------------------------

function readSummary(file) {
    try {
        return JSON.parse(readFileSync(file, 'utf8'));
    } catch (error) {
        return { ok: false, failed: [`no summary (${error.message})`], checks: [], observed: {}, info: {} };
    }
}

function tasks(o) {
    let bad = 0;
    const show = (how, s) => {
        const n = s.checks?.length ?? 0;
        if (s.ok) console.log(`PASS ${o.label} ${how}: ${n} checks in ${s.ms} ms`);
        else {
            bad++;
            console.log(`FAIL ${o.label} ${how}: ${s.failed.join(', ')}`);
            for (const c of s.checks ?? []) if (!c.ok) console.log(`     ${c.name}: ${JSON.stringify(c.detail)}`.slice(0, 600));
        }
    };
    const direct = readSummary(o.direct);
    show('direct', direct);
    if (!o.via) return bad ? 1 : 0;
    const via = readSummary(o.via);
    show('via gateway', via);

    const dp = direct.observed?.progressValues?.length ?? 0, gp = via.observed?.progressValues?.length ?? 0;
    if (dp > 0 && gp === 0) {
        bad++;
        console.log(`FAIL ${o.label} progress: ${dp} progress notifications direct, none through the gateway`);
    } else if (gp < dp) console.log(`  note ${o.label} progress: ${dp} direct, ${gp} through the gateway`);
    const dn = direct.observed?.taskStatusNotifications?.length ?? 0, gn = via.observed?.taskStatusNotifications?.length ?? 0;
    if (gn !== dn) console.log(`  note ${o.label} notifications/tasks/status: ${dn} direct, ${gn} through the gateway`);
    for (const key of new Set([...Object.keys(direct.observed ?? {}), ...Object.keys(via.observed ?? {})])) {
        if (key === 'progressValues' || key === 'taskStatusNotifications') continue;
        const a = JSON.stringify(direct.observed?.[key]), b = JSON.stringify(via.observed?.[key]);
        if (a !== b) console.log(`  note ${o.label} ${key}: ${a} direct, ${b} through the gateway`);
    }
    const ran = s => new Set((s.checks ?? []).map(c => c.name));
    const [dr, gr] = [ran(direct), ran(via)];
    const onlyDirect = [...dr].filter(n => !gr.has(n)), onlyVia = [...gr].filter(n => !dr.has(n));
    if (onlyDirect.length) console.log(`  note ${o.label} checks run direct only: ${onlyDirect.join(', ')}`);
    if (onlyVia.length) console.log(`  note ${o.label} checks run through the gateway only: ${onlyVia.join(', ')}`);
    const same = new Set((o.same ?? '').split(',').filter(Boolean));
    for (const key of same) {
        const a = JSON.stringify(scrub(direct.info?.[key])), b = JSON.stringify(scrub(via.info?.[key]));
        if (a === undefined || a !== b) {
            bad++;
            console.log(`FAIL ${o.label} ${key} must be the same: ${a} direct, ${b} through the gateway`);
        } else console.log(`PASS ${o.label} ${key} the same direct and through the gateway: ${a}`.slice(0, 300));
    }
    for (const key of new Set([...Object.keys(direct.info ?? {}), ...Object.keys(via.info ?? {})])) {
        if (same.has(key)) continue;
        if (key === 'sessionId' || key === 'resultOfCancelled' || key === 'crossSessionGet' || key === 'requiredWithoutTask') {
            const a = JSON.stringify(scrub(direct.info?.[key])), b = JSON.stringify(scrub(via.info?.[key]));
            if (a !== b) console.log(`  note ${o.label} ${key}: ${a} direct, ${b} through the gateway`);
        } else if (JSON.stringify(direct.info?.[key]) !== JSON.stringify(via.info?.[key])) {
            console.log(`  note ${o.label} ${key}: ${JSON.stringify(direct.info?.[key])} direct, ${JSON.stringify(via.info?.[key])} through the gateway`);
        }
    }
    return bad ? 1 : 0;
}

/** Drops task ids from messages so direct and gateway runs compare. */
function scrub(v) {
    return v === undefined ? v : JSON.parse(JSON.stringify(v).replace(/[0-9a-f]{32}|[0-9a-f-]{36}/g, 'ID'));
}

// ---- upgrade ------------------------------------------------------------------------------------

async function upgrade(o) {
    let bad = 0;
    const brief = s =>
        s.error ? `error ${s.error.code ?? ''} ${s.error.message}` : `${s.isError ? 'isError' : 'result'}: ${JSON.stringify((s.text ?? '').split('\n')[0].slice(0, 90))}`;
    const direct = readSummary(o.direct);
    if (direct.ok) console.log(`PASS ${o.label} direct: fails as expected (${brief(direct)}; taskSupport seen ${direct.taskSupportSeen ?? 'not listed'})`);
    else {
        bad++;
        console.log(`FAIL ${o.label} direct: ${(direct.problems ?? direct.failed ?? []).join('; ')} (${brief(direct)})`);
    }
    if (!o.via) return bad ? 1 : 0;
    const via = readSummary(o.via);
    const facts = `${brief(via)}; taskSupport seen ${via.taskSupportSeen ?? 'not listed'}; ${via.progress?.length ?? 0} progress (first after ${via.firstProgressMs ?? '-'} ms); ${via.elicitations ?? 0} elicitations; ${via.ms} ms`;
    if (via.ok) console.log(`PASS ${o.label} via gateway: ${facts}`);
    else {
        bad++;
        console.log(`FAIL ${o.label} via gateway: ${(via.problems ?? via.failed ?? []).join('; ')} (${facts})`);
    }
    if ((via.progress ?? []).length) console.log(`     progress: ${via.progress.join(' | ').slice(0, 400)}`);
    // 2025-11-25 progress: "The progress value MUST increase with each notification" (on one token).
    const values = (via.progress ?? []).map(p => parseFloat(p));
    const down = values.findIndex((v, i) => i > 0 && !(v > values[i - 1]));
    if (down > 0) console.log(`  note ${o.label} progress values do not increase: ${values[down - 1]} then ${values[down]} (${values.join(', ')})`);
    if (o.admin) {
        let records = [];
        try {
            const r = await fetch(`http://${o.admin}/admin/tasks?upstream=${encodeURIComponent(o.upstream)}`);
            records = (await r.json()).tasks ?? [];
        } catch (error) {
            console.log(`FAIL ${o.label} admin: ${error.message}`);
            return 1;
        }
        const rec = records.find(r => r.tool === o.tool && r.origin === 'upgraded');
        if (!rec) {
            bad++;
            console.log(`FAIL ${o.label} registry: no upgraded record for ${o.tool} on ${o.upstream}`);
        } else if (rec.status !== o.status) {
            bad++;
            console.log(`FAIL ${o.label} registry: newest upgraded ${o.tool} record is ${rec.status}, want ${o.status}`);
        } else console.log(`PASS ${o.label} registry: task ${rec.task_id} origin upgraded, ${rec.status}`);
    }
    return bad ? 1 : 0;
}

// ---- misc ---------------------------------------------------------------------------------------

switch (cmd) {
    case 'free-port': {
        // Below the ephemeral range, so no outgoing connection's local port takes it between
        // this check and the peer's bind (tests/common/mod.rs, free_port).
        let low = 32768;
        try {
            low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || low;
        } catch {}
        // INTEROP_PORT_RANGE=FROM-TO (run.sh gives each script running at the same time a range
        // of its own, so two of them never pick the same port between a check and a bind).
        let [from, to] = [10000, low];
        const range = /^(\d+)-(\d+)$/.exec(process.env.INTEROP_PORT_RANGE ?? '');
        if (range) [from, to] = [Number(range[1]), Math.min(Number(range[2]), low)];
        const tryPort = (left) => {
            const port = from + Math.floor(Math.random() * Math.max(1, to - from));
            const srv = createServer();
            srv.once('error', () => (left > 0 ? tryPort(left - 1) : process.exit(1)));
            srv.listen(port, '127.0.0.1', () => srv.close(() => console.log(port)));
        };
        tryPort(200);
        break;
    }
    case 'json-field': {
        const [file, path] = rest;
        let v = firstJsonLine(file);
        for (const k of path.split('.')) v = v?.[k];
        console.log(v ?? '');
        break;
    }
    case 'conformance':
        process.exit(conformance(options(rest)));
        break;
    case 'tasks':
        process.exit(tasks(options(rest)));
        break;
    case 'upgrade':
        process.exit(await upgrade(options(rest)));
        break;
    default:
        console.error('usage: harness.mjs free-port | json-field FILE PATH | conformance ... | tasks ... | upgrade ...');
        process.exit(2);
}
