//! The request series of one upstream, each resolved once.
//!
//! `taskgate_requests_total{upstream,method,outcome}` and
//! `taskgate_request_duration_seconds{upstream,method}` are recorded on every request. Through
//! `with_label_values` each record hashed the label values and looked the series up under the
//! vector's lock: about 240 instructions each, two per request (benches/profile.sh small,
//! issue 15). Here each series is resolved on its first record and kept in a slot indexed by
//! the label enums' positions. Resolved lazily, not up front: a series appears on `/metrics`
//! with its first request, as before (only `tools/call`'s are created at 0 at start-up, see
//! `Metrics::precreate`; all of them would be ~750 series per upstream).

use super::{McpMethod, Metrics, RequestOutcome};
use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};
use std::sync::{Arc, OnceLock};

/// The request series of one upstream (see the module doc). Cloning shares the slots.
#[derive(Clone)]
pub struct RequestSeries(Arc<Slots>);

struct Slots {
    upstream: Arc<str>,
    requests_total: IntCounterVec,
    durations: HistogramVec,
    /// `taskgate_requests_total`, indexed `method * OUTCOMES + outcome`.
    requests: Box<[OnceLock<IntCounter>]>,
    /// `taskgate_request_duration_seconds`, indexed by method.
    seconds: Box<[OnceLock<Histogram>]>,
}

const OUTCOMES: usize = RequestOutcome::ALL.len();

impl RequestSeries {
    /// Empty slots for `upstream`'s series.
    pub(super) fn new(metrics: &Metrics, upstream: &str) -> RequestSeries {
        let methods = McpMethod::ALL.len();
        RequestSeries(Arc::new(Slots {
            upstream: upstream.into(),
            requests_total: metrics.requests_total.clone(),
            durations: metrics.request_duration_seconds.clone(),
            requests: (0..methods * OUTCOMES).map(|_| OnceLock::new()).collect(),
            seconds: (0..methods).map(|_| OnceLock::new()).collect(),
        }))
    }

    /// One client request and how it ended (`taskgate_requests_total`).
    pub fn request(&self, method: McpMethod, outcome: RequestOutcome) {
        let s = &self.0;
        s.requests[method as usize * OUTCOMES + outcome as usize]
            .get_or_init(|| {
                s.requests_total.with_label_values(&[
                    s.upstream.as_ref(),
                    method.as_str(),
                    outcome.as_str(),
                ])
            })
            .inc();
    }

    /// Time from a request to its reply's headers, in seconds
    /// (`taskgate_request_duration_seconds`).
    pub fn duration(&self, method: McpMethod, seconds: f64) {
        let s = &self.0;
        s.seconds[method as usize]
            .get_or_init(|| {
                s.durations
                    .with_label_values(&[s.upstream.as_ref(), method.as_str()])
            })
            .observe(seconds);
    }
}

impl Metrics {
    /// The request series of `upstream`, for recording without a label look-up per request.
    pub fn request_series(&self, upstream: &str) -> RequestSeries {
        RequestSeries::new(self, upstream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_appears_with_its_first_record_not_before() {
        let metrics = Metrics::new(&["a".to_string()]);
        let series = metrics.request_series("a");
        let ping = "method=\"ping\"";
        assert!(!String::from_utf8(metrics.encode()).unwrap().contains(ping));
        series.request(McpMethod::Ping, RequestOutcome::Ok);
        series.duration(McpMethod::Ping, 0.5);
        let text = String::from_utf8(metrics.encode()).unwrap();
        assert!(
            text.contains(
                "taskgate_requests_total{method=\"ping\",outcome=\"ok\",upstream=\"a\"} 1"
            ),
            "{text}"
        );
        assert!(
            !text.contains("method=\"ping\",outcome=\"timeout\""),
            "{text}"
        );
        assert!(
            text.contains(
                "taskgate_request_duration_seconds_count{method=\"ping\",upstream=\"a\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn each_method_and_outcome_records_into_its_own_series() {
        let metrics = Metrics::new(&["a".to_string(), "b".to_string()]);
        let series = metrics.request_series("b");
        for (i, method) in McpMethod::ALL.iter().enumerate() {
            for (j, outcome) in RequestOutcome::ALL.iter().enumerate() {
                for _ in 0..(1 + i * OUTCOMES + j) {
                    series.request(*method, *outcome);
                }
            }
            series.duration(*method, 0.25 * (i + 1) as f64);
        }
        for (i, method) in McpMethod::ALL.iter().enumerate() {
            for (j, outcome) in RequestOutcome::ALL.iter().enumerate() {
                let labels = [method.as_str(), outcome.as_str()];
                let got = |upstream: &str| {
                    metrics
                        .requests_total
                        .with_label_values(&[upstream, labels[0], labels[1]])
                        .get()
                };
                assert_eq!(got("b"), (1 + i * OUTCOMES + j) as u64, "{labels:?}");
                assert_eq!(got("a"), 0, "{labels:?}");
            }
            let h = metrics
                .request_duration_seconds
                .with_label_values(&["b", method.as_str()]);
            assert_eq!(h.get_sample_count(), 1, "{method:?}");
            assert_eq!(h.get_sample_sum(), 0.25 * (i + 1) as f64, "{method:?}");
        }
    }
}
