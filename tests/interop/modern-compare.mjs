#!/usr/bin/env node
// Comparisons for modern.sh (plain ESM, node:* only): direct runs against the FastMCP 4 fixture
// and the same runs through taskgate must give the same result check by check.
//
//   node modern-compare.mjs conformance --scenarios FILE --expected FILE --direct-log F --direct-dir D
//        [--via-log F --via-dir D --route NAME] [--gateway-fixes s1,s2] [--level strict|report]
//        [--scenario-prefix P]   (only the scenarios whose name starts with P, e.g. tasks-)
//     Conformance 0.2.0-alpha.12 runs (`=== SUMMARY ===` lines of the log; checks.json per scenario
//     under D). Direct: the failing scenarios must be exactly those of the expected-failures file
//     (`scenario  # reason`). Through the gateway: every scenario must pass or fail as direct, and
//     every non-INFO check (keyed scenario/check-id#n) must have the same status; a scenario named
//     in --gateway-fixes may pass through the gateway where it fails direct (the gateway itself
//     fixes it, e.g. Host validation) and its checks may then go FAILURE -> SUCCESS. Prints totals,
//     the tasks-* tally and every differing check by name.
//
//   node modern-compare.mjs clients --label L --direct FILE [--via FILE --route NAME] [--level ...]
//     Client summaries ({checks:[{name, ok, detail}]}, modern-raw-client.mjs and
//     modern_fastmcp_client.py): direct must pass every check; through the gateway every check must
//     have the direct outcome.
//
// Exit 1 on a mismatch (with --level report, only on a direct failure).

import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

const [cmd, ...rest] = process.argv.slice(2);
const o = {};
for (let i = 0; i < rest.length; i += 2) o[rest[i].replace(/^--/, '')] = rest[i + 1];
const strict = (o.level ?? 'strict') === 'strict';

function readRun(logFile, dir, scenarios) {
    const log = existsSync(logFile) ? readFileSync(logFile, 'utf8') : '';
    const summary = log.slice(log.lastIndexOf('=== SUMMARY ==='));
    const run = new Map();
    for (const line of summary.split('\n')) {
        const m = line.match(/^([✓✗]) (\S+): (\d+) passed, (\d+) failed/);
        if (m && scenarios.includes(m[2])) run.set(m[2], { passed: m[1] === '✓', checks: [] });
    }
    const dirs = existsSync(dir) ? readdirSync(dir) : [];
    for (const scenario of scenarios) {
        const entry = run.get(scenario) ?? { passed: false, checks: [], missing: true };
        run.set(scenario, entry);
        const sub = dirs
            .filter(d => d.startsWith(`server-${scenario}-`) && /^\d{4}-\d\d-\d\dT/.test(d.slice(`server-${scenario}-`.length)))
            .sort()
            .at(-1);
        if (!sub) continue;
        try {
            entry.checks = JSON.parse(readFileSync(join(dir, sub, 'checks.json'), 'utf8'));
        } catch {}
    }
    return run;
}

function statuses(run) {
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

function tally(run, filter = () => true) {
    let scenarios = 0, passed = 0, ok = 0, failed = 0, other = 0;
    for (const [name, e] of run) {
        if (!filter(name)) continue;
        scenarios++;
        if (e.passed) passed++;
        for (const c of e.checks) {
            if (c.status === 'SUCCESS') ok++;
            else if (c.status === 'FAILURE') failed++;
            else if (c.status !== 'INFO') other++;
        }
    }
    return `${passed}/${scenarios} scenarios passed; checks ${ok} ok, ${failed} failed${other ? `, ${other} other` : ''}`;
}

function conformance() {
    const scenarios = readFileSync(o.scenarios, 'utf8')
        .split('\n')
        .map(l => l.match(/^\s*-\s*(\S+)/)?.[1])
        .filter(Boolean)
        .filter(name => name.startsWith(o['scenario-prefix'] ?? ''));
    if (!scenarios.length) {
        console.log(`FAIL no scenarios listed in ${o.scenarios}`);
        return 1;
    }
    const expected = new Map();
    let bad = 0, directBad = 0;
    for (const raw of readFileSync(o.expected, 'utf8').split('\n')) {
        const line = raw.trim();
        if (!line || line.startsWith('#')) continue;
        const m = line.match(/^(\S+)\s+#\s*(\S.*)$/);
        if (!m) {
            console.log(`FAIL ${o.expected}: want "scenario  # reason", got "${line}"`);
            directBad++;
        } else expected.set(m[1], m[2]);
    }
    const isTasks = n => n.startsWith('tasks-');
    const direct = readRun(o['direct-log'], o['direct-dir'], scenarios);
    const what = `conformance-next${o.upstream ? ` (${o.upstream})` : ''}`;
    console.log(`${what} direct: ${tally(direct)}`);
    console.log(`  tasks-* direct: ${tally(direct, isTasks)}`);
    for (const [name, e] of direct) {
        if (!e.passed && !expected.has(name)) {
            const why = e.checks.filter(c => c.status === 'FAILURE').map(c => `${c.id}: ${c.errorMessage ?? ''}`.slice(0, 200));
            console.log(`FAIL direct: ${name} fails and is not in ${o.expected}${e.missing ? ' (did not run)' : ''}: ${why.join('; ')}`);
            directBad++;
        }
        if (e.passed && expected.has(name)) {
            console.log(`FAIL direct: ${name} passes but is listed in ${o.expected}: remove it`);
            directBad++;
        }
    }
    for (const name of expected.keys()) {
        if (!scenarios.includes(name)) {
            console.log(`FAIL ${o.expected} lists ${name}, not a server scenario of this version`);
            directBad++;
        }
    }
    if (o['via-log']) {
        const route = o.route ?? 'via';
        const fixes = new Set((o['gateway-fixes'] ?? '').split(',').filter(Boolean));
        const via = readRun(o['via-log'], o['via-dir'], scenarios);
        console.log(`${what} ${route}: ${tally(via)}`);
        console.log(`  tasks-* ${route}: ${tally(via, isTasks)}`);
        const say = line => {
            if (strict) {
                console.log(`FAIL ${line}`);
                bad++;
            } else console.log(`  note ${line}`);
        };
        for (const name of scenarios) {
            const d = direct.get(name), g = via.get(name);
            if (d.passed === g.passed) continue;
            if (fixes.has(name) && !d.passed && g.passed) {
                console.log(`  gateway fix: ${name} fails direct and passes ${route} (listed in --gateway-fixes)`);
                continue;
            }
            say(`${route} scenario ${name}: ${d.passed ? 'passes' : 'fails'} direct, ${g.passed ? 'passes' : 'fails'} ${route}${g.missing ? ' (did not run)' : ''}`);
        }
        const ds = statuses(direct), gs = statuses(via);
        let diffs = 0;
        for (const k of [...new Set([...ds.keys(), ...gs.keys()])].sort()) {
            const a = ds.get(k)?.status ?? 'absent', b = gs.get(k)?.status ?? 'absent';
            if (a === b) continue;
            if (fixes.has(k.split('/')[0]) && a === 'FAILURE' && b === 'SUCCESS') continue;
            diffs++;
            say(`${route} check ${k}: ${a} direct, ${b} ${route}${gs.get(k)?.message ? `: ${String(gs.get(k).message).slice(0, 240)}` : ''}`);
        }
        console.log(diffs ? `  ${diffs} check(s) differ between direct and ${route}` : `  every non-INFO check has the same status direct and ${route}`);
    }
    return directBad || bad ? 1 : 0;
}

function readSummary(file) {
    try {
        return JSON.parse(readFileSync(file, 'utf8'));
    } catch (error) {
        return { ok: false, checks: [], crashed: `no summary in ${file} (${error.message})` };
    }
}

function clients() {
    let bad = 0, directBad = 0;
    const d = readSummary(o.direct);
    const dn = d.checks.filter(c => c.ok).length;
    console.log(`${o.label} direct: ${dn}/${d.checks.length} passed${d.crashed ? ` (crashed: ${d.crashed})` : ''}`);
    for (const c of d.checks.filter(c => !c.ok)) console.log(`FAIL ${o.label} direct ${c.name}: ${c.detail}`);
    if (!d.ok || !d.checks.length) directBad++;
    if (o.via) {
        const route = o.route ?? 'via';
        const g = readSummary(o.via);
        const gn = g.checks.filter(c => c.ok).length;
        console.log(`${o.label} ${route}: ${gn}/${g.checks.length} passed${g.crashed ? ` (crashed: ${g.crashed})` : ''}`);
        const gm = new Map(g.checks.map(c => [c.name, c]));
        const differ = [];
        for (const c of d.checks) {
            const v = gm.get(c.name);
            if (v?.ok === c.ok) continue;
            differ.push(c.name);
            const line = `${o.label} ${route} ${c.name}: ${c.ok ? 'passes' : 'fails'} direct, ${v ? (v.ok ? 'passes' : 'fails') : 'absent'} ${route}${v?.detail ? `: ${v.detail.slice(0, 240)}` : ''}`;
            if (strict) {
                console.log(`FAIL ${line}`);
                bad++;
            } else console.log(`  note ${line}`);
        }
        for (const v of g.checks) if (!d.checks.some(c => c.name === v.name)) differ.push(`${v.name} (only ${route})`);
        if (g.crashed || g.checks.length !== d.checks.length) {
            if (strict) bad++;
            console.log(`${strict ? 'FAIL' : '  note'} ${o.label} ${route}: ${g.checks.length} checks ran, ${d.checks.length} direct`);
        }
        console.log(differ.length ? `  ${o.label} ${route} differs from direct in: ${differ.join(', ')}` : `  ${o.label}: ${route} equals direct check by check`);
    }
    return directBad || bad ? 1 : 0;
}

const modes = { conformance, clients };
if (!modes[cmd]) {
    console.error(`usage: modern-compare.mjs ${Object.keys(modes).join('|')} ...`);
    process.exit(2);
}
process.exit(modes[cmd]());
