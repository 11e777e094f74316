//! The counters of task facts: cancels, the two audit facts of a cancel, late results, upgrades
//! and the era bridge's refusals and MRTR rounds (each names its metric).

use super::*;

impl Metrics {
    /// `taskgate_cancel_requests_total`.
    pub fn cancel_request(&self, upstream: &str, outcome: CancelOutcome) {
        self.cancel_requests_total
            .with_label_values(&[upstream, outcome.as_str()])
            .inc();
    }
    /// Audit fact "status cancelled" (`taskgate_tasks_cancelled_total`).
    pub fn task_cancelled(&self, upstream: &str) {
        self.tasks_cancelled_total
            .with_label_values(&[upstream])
            .inc();
    }
    /// Audit fact "resources released" (`taskgate_task_resources_released_total`).
    pub fn task_released(&self, upstream: &str, reason: ReleaseReason) {
        self.task_resources_released_total
            .with_label_values(&[upstream, reason.as_str()])
            .inc();
    }
    /// `taskgate_task_late_results_total`.
    pub fn task_late_result(&self, upstream: &str) {
        self.task_late_results_total
            .with_label_values(&[upstream])
            .inc();
    }
    /// `taskgate_task_activity_after_cancel_total`.
    pub fn task_activity_after_cancel(&self, upstream: &str) {
        self.task_activity_after_cancel_total
            .with_label_values(&[upstream])
            .inc();
    }
    /// `taskgate_upgraded_calls_total`.
    pub fn upgraded_call(&self, upstream: &str, outcome: UpgradeOutcome) {
        self.upgraded_calls_total
            .with_label_values(&[upstream, outcome.as_str()])
            .inc();
    }
    /// `taskgate_bridge_input_refused_total`.
    pub fn bridge_input_refused(&self, upstream: &str, reason: InputRefusal) {
        self.bridge_input_refused_total
            .with_label_values(&[upstream, reason.as_str()])
            .inc();
    }
    /// `taskgate_bridge_mrtr_total`; an exchange ended because an input request could not be
    /// relayed (the client lacks its capability, too many keys, the client answered it with an
    /// error) counts in `taskgate_bridge_input_refused_total` too, with the reason a bridged
    /// task's refusal has: that counter is every input request the bridge did not relay.
    pub fn bridge_mrtr(&self, upstream: &str, outcome: MrtrOutcome) {
        self.bridge_mrtr_total
            .with_label_values(&[upstream, outcome.as_str()])
            .inc();
        let refusal = match outcome {
            MrtrOutcome::RefusedCapability => Some(InputRefusal::Capability),
            MrtrOutcome::TooManyKeys => Some(InputRefusal::TooManyKeys),
            MrtrOutcome::ClientError => Some(InputRefusal::ClientError),
            MrtrOutcome::Completed
            | MrtrOutcome::TooManyRounds
            | MrtrOutcome::Timeout
            | MrtrOutcome::Disconnected
            | MrtrOutcome::UpstreamError => None,
        };
        if let Some(reason) = refusal {
            self.bridge_input_refused(upstream, reason);
        }
    }
    /// `taskgate_bridge_mrtr_rounds_total`.
    pub fn bridge_mrtr_round(&self, upstream: &str) {
        self.bridge_mrtr_rounds_total
            .with_label_values(&[upstream])
            .inc();
    }
    /// `taskgate_cancelled_notifications_dropped_total`.
    pub fn cancelled_notification_dropped(&self, upstream: &str, reason: DropReason) {
        self.cancelled_notifications_dropped_total
            .with_label_values(&[upstream, reason.as_str()])
            .inc();
    }
}
