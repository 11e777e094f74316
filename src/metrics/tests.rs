//! The metric contract: names, types and pre-created series.

use super::*;

/// The exposed metric names and types: the contract with `deploy/` (rules, dashboard,
/// `deploy/testdata/metrics-contract-sample.txt`). Change it only together with them.
const CONTRACT: &[(&str, &str)] = &[
    ("taskgate_bridge_input_refused_total", "counter"),
    ("taskgate_bridge_mrtr_rounds_total", "counter"),
    ("taskgate_bridge_mrtr_total", "counter"),
    ("taskgate_cancel_requests_total", "counter"),
    ("taskgate_cancel_to_cancelled_seconds", "histogram"),
    ("taskgate_cancelled_notifications_dropped_total", "counter"),
    ("taskgate_cancelled_to_released_seconds", "histogram"),
    ("taskgate_http_rejections_total", "counter"),
    ("taskgate_local_answers_total", "counter"),
    ("taskgate_request_duration_seconds", "histogram"),
    ("taskgate_requests_total", "counter"),
    ("taskgate_sse_streams_open", "gauge"),
    ("taskgate_store_failed", "gauge"),
    ("taskgate_store_write_duration_seconds", "histogram"),
    ("taskgate_store_write_failures_total", "counter"),
    ("taskgate_task_activity_after_cancel_total", "counter"),
    ("taskgate_task_creation_refused_total", "counter"),
    ("taskgate_task_late_results_total", "counter"),
    ("taskgate_task_lookups_rejected_total", "counter"),
    ("taskgate_task_resources_released_total", "counter"),
    ("taskgate_task_status_transitions_total", "counter"),
    ("taskgate_task_terminal_rewrites_total", "counter"),
    ("taskgate_tasks", "gauge"),
    ("taskgate_tasks_cancelled_total", "counter"),
    ("taskgate_tasks_cancelled_unreleased", "gauge"),
    ("taskgate_tasks_created_total", "counter"),
    ("taskgate_tasks_expired_total", "counter"),
    ("taskgate_trace_export_failures_total", "counter"),
    ("taskgate_trace_spans_dropped_total", "counter"),
    ("taskgate_unrecorded_task_cancels_total", "counter"),
    ("taskgate_upgrade_kept_followers", "gauge"),
    ("taskgate_upgraded_calls_total", "counter"),
    ("taskgate_upstream_errors_total", "counter"),
    ("taskgate_upstream_oversize_total", "counter"),
    ("taskgate_upstream_restarts_total", "counter"),
];

fn scrape(upstreams: &[&str]) -> String {
    let ups: Vec<String> = upstreams.iter().map(|u| u.to_string()).collect();
    String::from_utf8(Metrics::new(&ups).encode()).expect("utf-8")
}

/// The value of the one sample `name{labels}` (labels in any order, all of them given).
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let mut found = text.lines().filter_map(|l| {
        let (series, v) = l.rsplit_once(' ')?;
        let rest = series.strip_prefix(name)?;
        let inner = rest.strip_prefix('{')?.strip_suffix('}')?;
        let mut have: Vec<&str> = inner.split(',').collect();
        have.sort_unstable();
        let mut want: Vec<&str> = want.iter().map(String::as_str).collect();
        want.sort_unstable();
        (have == want).then(|| v.parse().expect("a number"))
    });
    let first = found.next();
    assert!(found.next().is_none(), "two samples {name}{labels:?}");
    first
}

fn assert_zero(text: &str, name: &str, labels: &[(&str, &str)]) {
    assert_eq!(
        value(text, name, labels),
        Some(0.0),
        "{name}{labels:?} not pre-created"
    );
}

/// `{upstream=up, label=v}` exists at 0 for every `v` of `L`.
fn assert_all<L: Label>(text: &str, name: &str, label: &str, up: &str) {
    for v in L::ALL {
        assert_zero(text, name, &[("upstream", up), (label, v.as_str())]);
    }
}

#[test]
fn every_label_value_is_pre_created_at_start_up() {
    let text = scrape(&["a", "b"]);
    for r in RejectReason::ALL {
        assert_zero(
            &text,
            "taskgate_http_rejections_total",
            &[("reason", r.as_str())],
        );
    }
    for up in ["a", "b"] {
        for m in [McpMethod::ToolsCall] {
            let (u, m) = (("upstream", up), ("method", m.as_str()));
            assert_zero(&text, "taskgate_request_duration_seconds_count", &[u, m]);
            for o in RequestOutcome::ALL {
                assert_zero(
                    &text,
                    "taskgate_requests_total",
                    &[u, m, ("outcome", o.as_str())],
                );
            }
        }
        for (from, to) in [
            ("working", "input_required"),
            ("working", "completed"),
            ("working", "failed"),
            ("working", "cancelled"),
            ("input_required", "working"),
            ("input_required", "completed"),
            ("input_required", "failed"),
            ("input_required", "cancelled"),
        ] {
            let labels = [("upstream", up), ("from", from), ("to", to)];
            assert_zero(&text, "taskgate_task_status_transitions_total", &labels);
        }
        assert_all::<UpstreamErrorKind>(&text, "taskgate_upstream_errors_total", "kind", up);
        assert_all::<SseKind>(&text, "taskgate_sse_streams_open", "kind", up);
        assert_all::<TaskStatus>(&text, "taskgate_tasks", "status", up);
        assert_all::<Origin>(&text, "taskgate_tasks_created_total", "origin", up);
        let refused = "taskgate_task_creation_refused_total";
        assert_all::<CreationRefusal>(&text, refused, "reason", up);
        let lookups = "taskgate_task_lookups_rejected_total";
        assert_all::<TaskMethod>(&text, lookups, "method", up);
        assert_all::<CancelOutcome>(&text, "taskgate_cancel_requests_total", "outcome", up);
        let released = "taskgate_task_resources_released_total";
        assert_all::<ReleaseReason>(&text, released, "reason", up);
        assert_all::<UpgradeOutcome>(&text, "taskgate_upgraded_calls_total", "outcome", up);
        assert_all::<MrtrOutcome>(&text, "taskgate_bridge_mrtr_total", "outcome", up);
        let dropped = "taskgate_cancelled_notifications_dropped_total";
        assert_all::<DropReason>(&text, dropped, "reason", up);
        assert_all::<OversizeKind>(&text, "taskgate_upstream_oversize_total", "kind", up);
        let undo = "taskgate_unrecorded_task_cancels_total";
        assert_all::<UndoOutcome>(&text, undo, "outcome", up);
        for name in [
            "taskgate_task_terminal_rewrites_total",
            "taskgate_tasks_expired_total",
            "taskgate_tasks_cancelled_total",
            "taskgate_bridge_mrtr_rounds_total",
            "taskgate_task_late_results_total",
            "taskgate_task_activity_after_cancel_total",
        ] {
            assert_zero(&text, name, &[("upstream", up)]);
        }
    }
}

#[test]
fn label_values_are_the_documented_ones() {
    // The values dashboards, alert rules and tests/interop select on.
    let values = |all: &[&'static str]| all.join(" ");
    let s = |v: Vec<&'static str>| v.join(" ");
    assert_eq!(
        s(UpgradeOutcome::ALL.iter().map(|o| o.as_str()).collect()),
        values(&[
            "completed",
            "failed",
            "cancelled",
            "orphaned",
            "adopted",
            "upstream_error",
            "disconnected",
            "refused_capability",
            "not_a_task",
            "relay_overflow",
        ])
    );
    assert_eq!(
        s(CancelOutcome::ALL.iter().map(|o| o.as_str()).collect()),
        "forwarded deduplicated rejected_terminal acknowledged_terminal rejected_unknown upstream_error"
    );
    assert_eq!(
        s(RequestOutcome::ALL.iter().map(|o| o.as_str()).collect()),
        "ok local upstream_status unreachable timeout upstream_invalid rejected"
    );
    assert_eq!(McpMethod::of("tasks/update"), McpMethod::TasksUpdate);
    assert_eq!(McpMethod::of("server/discover"), McpMethod::ServerDiscover);
    assert_eq!(
        McpMethod::of("subscriptions/listen"),
        McpMethod::SubscriptionsListen
    );
    assert_eq!(McpMethod::of("tools/call"), McpMethod::ToolsCall);
    assert_eq!(McpMethod::of("tasks/list"), McpMethod::TasksList);
    assert_eq!(McpMethod::of("GET"), McpMethod::Other);
    assert_eq!(McpMethod::of("(error)"), McpMethod::Other);
    assert_eq!(McpMethod::of("x/y"), McpMethod::Other);
    assert_eq!(TaskMethod::parse("tasks/result"), Some(TaskMethod::Result));
    assert_eq!(TaskMethod::parse("tasks/list"), None);
}

#[test]
fn rendered_names_match_the_contract() {
    // With one upstream every family has a series, so every name is rendered.
    let text = scrape(&["a"]);
    let mut names: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    names.sort_unstable();
    assert_eq!(names, CONTRACT);
}

/// The values each label but `upstream` and `le` takes in a scrape's series, keyed by
/// (`key` of the series' name, label): the two checks below of the texts that list them.
fn label_values<'a>(
    text: &'a str,
    key: impl Fn(&'a str) -> &'a str,
) -> std::collections::BTreeMap<(String, String), std::collections::BTreeSet<String>> {
    let mut values: std::collections::BTreeMap<
        (String, String),
        std::collections::BTreeSet<String>,
    > = Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, rest)) = line.split_once('{') else {
            continue;
        };
        let labels = rest.split_once('}').unwrap().0;
        for pair in labels.split(',') {
            let (k, v) = pair.split_once('=').unwrap();
            if k != "upstream" && k != "le" {
                values
                    .entry((key(series).to_string(), k.to_string()))
                    .or_default()
                    .insert(v.trim_matches('"').to_string());
            }
        }
    }
    values
}

/// Whether `text` names `value` as a whole word (not inside a longer name).
fn names(text: &str, value: &str) -> bool {
    text.match_indices(value).any(|(i, _)| {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        !text[..i].ends_with(word) && !text[i + value.len()..].starts_with(word)
    })
}

/// A `# HELP` text that lists the values of one of its labels lists all of them: an operator
/// reading `/metrics` (or a dashboard's tooltip) learns the label's values from it. Two said
/// less than the series carry (`taskgate_tasks_created_total`: client, upgraded, without
/// bridged and gateway; `taskgate_upstream_errors_total`: connect, timeout, protocol, without
/// stream_reset and auth).
#[test]
fn a_help_text_that_lists_label_values_lists_them_all() {
    let text = scrape(&["a"]);
    let mut help = std::collections::BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').unwrap();
            help.insert(name.to_string(), h.to_string());
        }
    }
    let values = label_values(&text, |series| series);
    for ((name, label), vs) in &values {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| help.contains_key(*f)))
            .unwrap_or(name);
        let h = &help[family];
        let named: Vec<_> = vs.iter().filter(|v| names(h, v)).collect();
        if named.len() >= 2 {
            let missing: Vec<_> = vs.iter().filter(|v| !names(h, v)).collect();
            assert!(
                missing.is_empty(),
                "{name}: its HELP lists {label} values but not {missing:?}: {h}"
            );
        }
    }
}

/// The README's metrics section, where it lists the values of a series' label (the text from
/// the series' name to the next series' name), lists all of them, as its HELP text must (see
/// above): `taskgate_bridge_input_refused_total`'s reasons and `taskgate_bridge_mrtr_total`'s
/// outcomes left out `client_error` when it was added.
#[test]
fn the_readme_lists_every_value_of_a_label_it_lists() {
    let readme = include_str!("../../README.md");
    let text = scrape(&["a"]);
    let values = label_values(&text, |series| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| series.strip_suffix(s))
            .unwrap_or(series)
    });
    let mut missing = Vec::new();
    for ((family, label), vs) in &values {
        for opening in [format!("`{family}{{"), format!("`{family}`")] {
            for (at, _) in readme.match_indices(&opening) {
                let after = &readme[at + opening.len()..];
                let end = after.find("`taskgate_").unwrap_or(after.len());
                let end = after[..end].find("\n\n").unwrap_or(end);
                let segment = &after[..end];
                let named = vs.iter().filter(|v| names(segment, v)).count();
                if named >= 2 {
                    let left: Vec<_> = vs.iter().filter(|v| !names(segment, v)).collect();
                    if !left.is_empty() {
                        missing.push(format!("{family}{{{label}}}: {left:?}"));
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "README lists some values but not these: {missing:?}"
    );
}

/// `deploy/testdata/metrics-contract-sample.txt`, the exposition `deploy/metric_names.py`
/// checks the alert rules and the dashboard against (`deploy/check.sh`), is what `/metrics`
/// prints: every family's `# HELP` and `# TYPE` lines as rendered, every family there, and each
/// of its series one the registry renders (name and labels; values aside). Its HELP texts had
/// drifted from the registry's with nothing to notice. `TASKGATE_BLESS=1 cargo test --lib
/// contract_sample` rewrites its HELP and TYPE lines and adds the families it lacks (their
/// rendered series), keeping its other lines.
#[test]
fn the_contract_sample_is_what_metrics_prints() {
    const SAMPLE: &str = "deploy/testdata/metrics-contract-sample.txt";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(SAMPLE);
    let sample = std::fs::read_to_string(&path).expect("the contract sample");
    let text = scrape(&["default"]);
    let (rendered, series) = (families(&text), sample_series(&text));
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for line in sample.lines() {
        if let Some((kind, name)) = comment_family(line) {
            seen.insert(name.to_string());
            match rendered.get(name) {
                None => problems.push(format!("{name}: not a metric /metrics prints")),
                Some(f) if f.line(kind) != line => problems.push(format!(
                    "{name}: the sample's {kind} line\n    {line}\n  is not what /metrics prints\n    {}",
                    f.line(kind)
                )),
                Some(_) => {}
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let key = series_key(line);
            if !series.contains(&key) {
                problems.push(format!("a series /metrics does not print: {line}"));
            }
        }
    }
    for name in rendered.keys().filter(|n| !seen.contains(*n)) {
        problems.push(format!("{name}: missing from the sample"));
    }
    if problems.is_empty() {
        return;
    }
    if std::env::var("TASKGATE_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, blessed(&sample, &text)).expect("write the sample");
        return;
    }
    panic!(
        "{SAMPLE} is not what /metrics prints (TASKGATE_BLESS=1 cargo test --lib contract_sample \
         rewrites it):\n{}",
        problems.join("\n")
    );
}

/// One family of a scrape: its `# HELP` and `# TYPE` lines and its series lines, in order.
#[derive(Default)]
struct Family {
    help: String,
    ty: String,
    series: Vec<String>,
}

impl Family {
    fn line(&self, kind: &str) -> &str {
        if kind == "HELP" {
            &self.help
        } else {
            &self.ty
        }
    }
}

/// `("HELP" | "TYPE", name)` of a comment line naming a family.
fn comment_family(line: &str) -> Option<(&'static str, &str)> {
    for kind in ["HELP", "TYPE"] {
        if let Some(rest) = line.strip_prefix(&format!("# {kind} ")) {
            return rest.split(' ').next().map(|name| (kind, name));
        }
    }
    None
}

/// A series line's name and sorted label pairs (its value left out).
fn series_key(line: &str) -> String {
    let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
    match series.split_once('{') {
        Some((name, labels)) => {
            let mut pairs: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
            pairs.sort_unstable();
            format!("{name}{{{}}}", pairs.join(","))
        }
        None => series.to_string(),
    }
}

fn sample_series(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(series_key)
        .collect()
}

/// The families of a scrape by name (a histogram's `_bucket`/`_sum`/`_count` series in its own).
fn families(text: &str) -> std::collections::BTreeMap<String, Family> {
    let mut all: std::collections::BTreeMap<String, Family> = Default::default();
    let mut current = String::new();
    for line in text.lines() {
        if let Some((kind, name)) = comment_family(line) {
            current = name.to_string();
            let f = all.entry(current.clone()).or_default();
            if kind == "HELP" {
                f.help = line.to_string();
            } else {
                f.ty = line.to_string();
            }
        } else if !line.trim().is_empty() {
            all.entry(current.clone())
                .or_default()
                .series
                .push(line.to_string());
        }
    }
    all
}

/// `sample` with every family's HELP and TYPE lines as `text` renders them, the series lines
/// `text` does not render left out, and the families it lacked added at the end (all their
/// rendered series).
fn blessed(sample: &str, text: &str) -> String {
    let rendered = families(text);
    let series = sample_series(text);
    let mut out = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for line in sample.lines() {
        let kept = match comment_family(line) {
            Some((kind, name)) => rendered.get(name).map(|f| {
                seen.insert(name.to_string());
                f.line(kind).to_string()
            }),
            None if line.starts_with('#') || line.trim().is_empty() => Some(line.to_string()),
            None => series.contains(&series_key(line)).then(|| line.to_string()),
        };
        if let Some(line) = kept {
            out.push_str(&line);
            out.push('\n');
        }
    }
    let missing = rendered.iter().filter(|(n, _)| !seen.contains(*n));
    for (_, f) in missing {
        for line in [&f.help, &f.ty].into_iter().chain(&f.series) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The forward bridge's MRTR exchanges that end because an input request cannot be relayed (the
/// client lacks its capability, too many keys, the client answered it with an error) count in
/// `taskgate_bridge_input_refused_total` with the same reason as a bridged task's, besides
/// their `taskgate_bridge_mrtr_total` outcome: the README tells a user that counter is "input
/// requests not relayed". Before: only in `taskgate_bridge_mrtr_total`.
#[test]
fn an_mrtr_refusal_counts_as_an_input_refusal_too() {
    let m = Metrics::new(&["a".to_string()]);
    for outcome in MrtrOutcome::ALL {
        m.bridge_mrtr("a", *outcome);
    }
    let text = String::from_utf8(m.encode()).expect("utf-8");
    let refused = |reason: &str| {
        value(
            &text,
            "taskgate_bridge_input_refused_total",
            &[("upstream", "a"), ("reason", reason)],
        )
    };
    for reason in ["capability", "too_many_keys", "client_error"] {
        assert_eq!(refused(reason), Some(1.0), "{reason}");
    }
    assert_eq!(refused("undeclared"), Some(0.0));
}
