//! The request series of one upstream, resolved once at start-up.
//!
//! `taskgate_requests_total{upstream,method,outcome}` and
//! `taskgate_request_duration_seconds{upstream,method}` are recorded on every request. Through
//! `with_label_values` each record hashed the label values and looked the series up under the
//! vector's lock: about 240 instructions each, two per request (benches/profile.sh small,
//! issue 15). Here the handles are resolved once per upstream, and a record is an index into a
//! table by the label enums' positions.

use super::{McpMethod, Metrics, RequestOutcome};
use prometheus::{Histogram, IntCounter};

/// The request series of one upstream (see the module doc). Cloning shares the series.
#[derive(Clone)]
pub struct RequestSeries {
    /// `taskgate_requests_total`, indexed `method * OUTCOMES + outcome`.
    requests: Vec<IntCounter>,
    /// `taskgate_request_duration_seconds`, indexed by method.
    durations: Vec<Histogram>,
}

const OUTCOMES: usize = RequestOutcome::ALL.len();

impl RequestSeries {
    /// Resolves every (method, outcome) series of `upstream`.
    pub(super) fn new(metrics: &Metrics, upstream: &str) -> RequestSeries {
        let mut requests = Vec::with_capacity(McpMethod::ALL.len() * OUTCOMES);
        let mut durations = Vec::with_capacity(McpMethod::ALL.len());
        for (m, method) in McpMethod::ALL.iter().enumerate() {
            debug_assert_eq!(m, *method as usize);
            for (o, outcome) in RequestOutcome::ALL.iter().enumerate() {
                debug_assert_eq!(o, *outcome as usize);
                requests.push(metrics.requests_total.with_label_values(&[
                    upstream,
                    method.as_str(),
                    outcome.as_str(),
                ]));
            }
            durations.push(
                metrics
                    .request_duration_seconds
                    .with_label_values(&[upstream, method.as_str()]),
            );
        }
        RequestSeries {
            requests,
            durations,
        }
    }

    /// One client request and how it ended (`taskgate_requests_total`).
    pub fn request(&self, method: McpMethod, outcome: RequestOutcome) {
        self.requests[method as usize * OUTCOMES + outcome as usize].inc();
    }

    /// Time from a request to its reply's headers, in seconds
    /// (`taskgate_request_duration_seconds`).
    pub fn duration(&self, method: McpMethod, seconds: f64) {
        self.durations[method as usize].observe(seconds);
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
