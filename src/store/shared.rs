//! What a store shared by several taskgate processes (a tier of replicas on PostgreSQL) adds to
//! [`super::TaskStore`]: the cross-replica single-flight `tasks/cancel` claim and the outcome it
//! leaves for the replicas that waited. An embedded store (sled, one process) never needs them:
//! the `cancel` layer's in-process single flight is enough there.

use crate::mcp::task::TaskStatus;
use std::time::Duration;

/// Added to an upstream's `timeout_ms` to make the lease of a cross-replica cancel claim: the
/// time to store the outcome after the upstream answered (or timed out).
pub const CANCEL_LEASE_MARGIN: Duration = Duration::from_secs(5);

/// The lease of a cancel claim on an upstream whose exchanges `timeout_ms` bounds: the whole
/// forwarded `tasks/cancel` ends within `upstream_timeout` (answered or timed out), so a claim
/// that outlives it by [`CANCEL_LEASE_MARGIN`] is never taken over while a slow upstream is still
/// answering it (which would send that cancel twice); a replica that died while forwarding
/// holds it no longer than that.
pub fn cancel_lease(upstream_timeout: Duration) -> Duration {
    upstream_timeout.saturating_add(CANCEL_LEASE_MARGIN)
}

/// What [`super::TaskStore::claim_cancel`] decided for one `tasks/cancel`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelClaim {
    /// This process sends the cancel upstream, as claim `generation`; it must then call
    /// [`super::TaskStore::finish_cancel`] with the outcome.
    Forward {
        /// The claim's number for this task (1 for the first cancel).
        generation: i64,
    },
    /// Another process's claim lapsed without an outcome (it died while forwarding, or its
    /// renewals did not reach the store): this process forwards now, as claim `generation`,
    /// and must call [`super::TaskStore::finish_cancel`] like [`CancelClaim::Forward`]'s. The
    /// lapsed claim's cancel may have reached the upstream: read the task's state there first.
    TakeOver {
        /// The claim's number for this task (the lapsed one's plus 1).
        generation: i64,
    },
    /// Another process is sending cancel `generation` upstream: wait for its outcome with
    /// [`super::TaskStore::cancel_outcome`].
    Wait {
        /// The claim being waited for.
        generation: i64,
    },
    /// The task is terminal (with this status): answered without the upstream.
    Terminal(TaskStatus),
    /// 2026-07-28: a cancel of this task was already acknowledged by the upstream: the ack is
    /// all any later caller gets (one upstream cancel per task).
    Acknowledged,
}

/// Where the cancel claim a process waits on stands ([`super::TaskStore::cancel_outcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelProgress {
    /// Its forwarding process holds it, within its lease.
    InFlight,
    /// It lapsed without an outcome (its process died, or could not renew it), or a newer
    /// claim that is still in flight replaced it: claim the cancel again
    /// ([`super::TaskStore::claim_cancel`]).
    Lapsed,
    /// Its outcome, or the outcome of the newer claim that took it over.
    Done(SharedCancelOutcome),
}

/// The upstream's answer to a forwarded `tasks/cancel`, as other replicas read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedCancelOutcome {
    /// A JSON-RPC result: its `result` JSON text.
    Result(String),
    /// A JSON-RPC error: its `error` JSON text.
    Error(String),
    /// The forwarding replica got no JSON-RPC answer (HTTP error, unreachable): why.
    Failed(String),
    /// The forwarding replica took over a lapsed claim and found the task terminal upstream
    /// (with this status) before sending anything: each waiter answers a cancel of a terminal
    /// task in its own era.
    Terminal(TaskStatus),
}

impl SharedCancelOutcome {
    /// The stored form: one tag byte (`r`, `e`, `f`, `t`) and the text (for `t`, the status).
    pub fn encode(&self) -> String {
        match self {
            SharedCancelOutcome::Result(t) => format!("r{t}"),
            SharedCancelOutcome::Error(t) => format!("e{t}"),
            SharedCancelOutcome::Failed(t) => format!("f{t}"),
            SharedCancelOutcome::Terminal(s) => format!("t{}", s.as_str()),
        }
    }

    /// Reads [`SharedCancelOutcome::encode`]'s form; anything else is a failure.
    pub fn decode(s: &str) -> SharedCancelOutcome {
        match s.split_at_checked(1) {
            Some(("r", t)) => SharedCancelOutcome::Result(t.to_string()),
            Some(("e", t)) => SharedCancelOutcome::Error(t.to_string()),
            Some(("t", t)) => match TaskStatus::parse(t).filter(|s| s.is_terminal()) {
                Some(s) => SharedCancelOutcome::Terminal(s),
                None => SharedCancelOutcome::Failed(format!("unknown terminal status {t:?}")),
            },
            Some((_, t)) => SharedCancelOutcome::Failed(t.to_string()),
            None => SharedCancelOutcome::Failed("empty cancel outcome".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lease outlives the forwarded cancel it covers, whatever the upstream's timeout.
    #[test]
    fn cancel_lease_outlives_the_upstream_timeout() {
        for ms in [1, 1_000, 30_000, 120_000, 300_000] {
            let timeout = Duration::from_millis(ms);
            assert_eq!(cancel_lease(timeout), timeout + CANCEL_LEASE_MARGIN);
        }
        assert_eq!(cancel_lease(Duration::MAX), Duration::MAX);
    }

    /// The stored cancel outcome round-trips; anything else reads as a failure.
    #[test]
    fn cancel_outcome_round_trips() {
        for o in [
            SharedCancelOutcome::Result(r#"{"resultType":"complete"}"#.into()),
            SharedCancelOutcome::Error(r#"{"code":-32602,"message":"x"}"#.into()),
            SharedCancelOutcome::Failed("HTTP 502".into()),
            SharedCancelOutcome::Terminal(TaskStatus::Cancelled),
            SharedCancelOutcome::Terminal(TaskStatus::Completed),
        ] {
            assert_eq!(SharedCancelOutcome::decode(&o.encode()), o);
        }
        assert!(matches!(
            SharedCancelOutcome::decode(""),
            SharedCancelOutcome::Failed(_)
        ));
    }
}
