//! Reading the admin API and `/metrics`.

use super::*;

// =============================================================================================
// Admin and metrics
// =============================================================================================

/// GETs an admin path; returns (status, JSON body).
pub async fn admin_json(admin: SocketAddr, path: &str) -> (u16, Value) {
    let r = Req::get(&format!("http://{admin}{path}")).send().await;
    let s = r.status();
    let text = r.text().await;
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (s, v)
}

/// The `/metrics` text.
pub async fn scrape(admin: SocketAddr) -> String {
    let r = Req::get(&format!("http://{admin}/metrics")).send().await;
    assert_eq!(r.status(), 200);
    r.text().await
}

/// The sum of every sample named `name` whose labels include all of `labels` (0 when none).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut sum = 0.0;
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let (n, label_text) = match series.find('{') {
            Some(i) => (&series[..i], &series[i + 1..series.len() - 1]),
            None => (series, ""),
        };
        if n != name {
            continue;
        }
        let have: Vec<(String, String)> = label_text
            .split("\",")
            .filter(|p| !p.is_empty())
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                Some((k.trim().to_string(), v.trim_matches('"').to_string()))
            })
            .collect();
        if labels
            .iter()
            .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
        {
            sum += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    sum
}

/// `taskgate_upgraded_calls_total{outcome}` summed over upstreams.
pub fn upgraded(m: &str, outcome: &str) -> f64 {
    metric(m, "taskgate_upgraded_calls_total", &[("outcome", outcome)])
}

/// The audit event names of `/admin/tasks/default/<taskId>`.
pub async fn audit_events(tg: &Tg, task_id: &str) -> (Value, Vec<String>) {
    let (s, d) = tg.admin(&format!("/admin/tasks/default/{task_id}")).await;
    assert_eq!(s, 200, "{d}");
    let names = d["audit"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| e["event"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    (d, names)
}

/// p-th percentile (0..=100) of sorted durations, in ms.
pub fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}
