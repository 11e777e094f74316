//! Terminal status reports a shared store refused, kept and applied again.
//!
//! An upstream-owned task (the upstream runs it; taskgate records what passes through) that
//! ends while PostgreSQL is out of reach: the answer or notification saying so passes through
//! to the client, which stops polling at a terminal status, and the record's write is refused.
//! Nothing else would write it: the record stayed `working` until its ttl (`tasks/list`
//! said so) and held one of its owner's `tasks.max_live_tasks_per_owner` slots. So
//! `Registry::apply_status` keeps such a report here ([`super::OnRefusal::Keep`]: every
//! caller but a gateway task's final write, which retries itself), as
//! `Registry::apply_result_payload` keeps the end a 2025-11-25 `tasks/result` payload says
//! (`completed`, or `failed` for an `isError` result; the payload itself is not kept: a later
//! `tasks/result` goes upstream), and one task of the
//! registry ([`Registry::retry_refused_reports`]) applies it again, with backoff
//! ([`super::FinalWriteBackoff`]), until the store takes it, the record is gone or expired, or
//! the process stops (a graceful stop's drain waits for them, and logs at warn how many were
//! left at its end). Applying it again is safe: a report is idempotent, and the status
//! machine never overwrites a terminal status; a record that ended otherwise meanwhile (a
//! cancel) is left as it is, and no late result is counted for it (the report came first).
//! The transition is audited and counted once, when it is written.
//!
//! Only on a shared store: sled refuses a write when its disk is full, which waiting does not
//! mend (logged and counted, as before). Bounded: one report per task (the latest terminal
//! one; a result or error an earlier one carried for the same status is kept with it), at
//! most [`MAX_KEPT_REPORTS`] and [`MAX_KEPT_BYTES`] of them; past the bound a report is not
//! kept (logged at warn once until the set empties again, and counted as every refused write).
//! At most [`REPORTS_PER_TICK`] are applied per round, one store job each, so a long outage's
//! backlog never holds back the store work of requests. The common case (the store takes the
//! write) touches none of this: no lock, no allocation.

use super::status::{Report, Write};
use super::{FinalWriteBackoff, Registry};
use crate::mcp::task::{now_ms, TaskStatus};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most terminal reports kept to be applied again (as many as call leases kept to be ended
/// again, `leases::MAX_UNENDED`).
pub const MAX_KEPT_REPORTS: usize = 65_536;
/// Most bytes of kept reports (their results, errors and texts, and 256 bytes each for the
/// entry).
pub const MAX_KEPT_BYTES: usize = 64 << 20;
/// Kept reports applied again per round at most (two store calls each: the record read, then
/// the update).
pub const REPORTS_PER_TICK: usize = 64;
/// How often the retry task, with nothing kept, looks whether the registry is still there.
const IDLE_CHECK: Duration = Duration::from_secs(5);
/// What a kept report costs beyond its strings: the entry, its key in the queue, the map's
/// slot (an estimate, in bytes).
const ENTRY_BYTES: usize = 256;

type Key = (String, String);

/// One kept report.
struct Kept {
    report: Report,
    source: &'static str,
    /// The writes of it the store refused so far.
    tries: u32,
    /// What it counts against [`MAX_KEPT_BYTES`].
    bytes: usize,
    /// Which keeping this is: a newer report kept while this one was being applied replaces it,
    /// and is applied in its turn.
    seq: u64,
}

#[derive(Default)]
struct Held {
    reports: HashMap<Key, Kept>,
    /// The keys of `reports` in the order they are tried: a refused one goes to the back, so
    /// one the store refuses for a reason of its own does not hold back the others.
    queue: VecDeque<Key>,
    bytes: usize,
    next_seq: u64,
    /// The bound was met (and logged) since the set was last empty.
    full_logged: bool,
}

/// The kept reports (see the module docs).
pub(super) struct RefusedReports {
    held: Mutex<Held>,
    /// Woken when a report is kept.
    wake: Arc<tokio::sync::Notify>,
    /// Woken when the last kept report is done with (a graceful stop's drain waits for it).
    emptied: tokio::sync::Notify,
    /// The retry task was started.
    started: AtomicBool,
    max_reports: usize,
    max_bytes: usize,
}

impl Default for RefusedReports {
    fn default() -> Self {
        RefusedReports::with_bounds(MAX_KEPT_REPORTS, MAX_KEPT_BYTES)
    }
}

/// What applying a kept report again came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Again {
    /// Written (or nothing left to change); `true`: it made the record terminal just now.
    Written(bool),
    /// The record is gone (swept).
    Gone,
    /// The record's ttl is over: given up.
    Expired,
    /// The record ended otherwise meanwhile (a cancel): left as it is.
    EndedOtherwise(TaskStatus),
    /// The store refused the read or the write again (counted and logged).
    Refused,
    /// The store is closing (a graceful stop).
    Closed,
}

/// What one round came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Round {
    /// Nothing was refused (the round's reports are written, or done with).
    Took,
    /// The store refused one: the rest wait for the next round.
    Refused,
    /// The store is closing: the retries end.
    Closing,
}

impl RefusedReports {
    fn with_bounds(max_reports: usize, max_bytes: usize) -> RefusedReports {
        RefusedReports {
            held: Mutex::default(),
            wake: Arc::default(),
            emptied: tokio::sync::Notify::new(),
            started: AtomicBool::new(false),
            max_reports,
            max_bytes,
        }
    }

    /// How many reports are kept.
    pub(super) fn len(&self) -> usize {
        self.held.lock().reports.len()
    }

    /// Keeps `report` about `(upstream, task_id)` (replacing the one kept for it, whose result
    /// or error it keeps when it carries none for the same status); `false` past the bound
    /// (logged at warn once until the set empties).
    fn keep(
        &self,
        upstream: &str,
        task_id: &str,
        mut report: Report,
        source: &'static str,
    ) -> bool {
        let key = (upstream.to_string(), task_id.to_string());
        let mut held = self.held.lock();
        let (replaced, tries) = match held.reports.get(&key) {
            Some(old) => {
                if old.report.status == report.status {
                    if report.result.is_none() {
                        report.result.clone_from(&old.report.result);
                    }
                    if report.error.is_none() {
                        report.error.clone_from(&old.report.error);
                    }
                }
                (Some(old.bytes), old.tries)
            }
            None => (None, 0),
        };
        let len = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        let bytes = ENTRY_BYTES
            + 2 * (upstream.len() + task_id.len())
            + len(&report.message)
            + len(&report.updated_at)
            + len(&report.result)
            + len(&report.error);
        let count = held.reports.len() - usize::from(replaced.is_some());
        let total = held.bytes - replaced.unwrap_or(0) + bytes;
        if count >= self.max_reports || total > self.max_bytes {
            if !std::mem::replace(&mut held.full_logged, true) {
                tracing::warn!(
                    upstream,
                    task_id,
                    kept = held.reports.len(),
                    max = self.max_reports,
                    max_bytes = self.max_bytes,
                    "a terminal status the task store refused is not kept to be written again: too many others wait already (this is logged once until they are written); the record stays as it is until its ttl"
                );
            }
            return false;
        }
        held.next_seq += 1;
        let seq = held.next_seq;
        held.bytes = total;
        if replaced.is_none() {
            held.queue.push_back(key.clone());
        }
        let kept = Kept {
            report,
            source,
            tries: tries + 1,
            bytes,
            seq,
        };
        held.reports.insert(key, kept);
        drop(held);
        self.wake.notify_one();
        true
    }

    /// Up to [`REPORTS_PER_TICK`] kept reports, taken off the front of the queue (the map
    /// keeps them until they are done with): key, keeping, a copy of the report, source.
    fn batch(&self) -> Vec<(Key, u64, Report, &'static str)> {
        let mut held = self.held.lock();
        let n = held.queue.len().min(REPORTS_PER_TICK);
        let mut batch = Vec::with_capacity(n);
        for _ in 0..n {
            let Some(key) = held.queue.pop_front() else {
                break;
            };
            if let Some(k) = held.reports.get(&key) {
                let (seq, report, source) = (k.seq, k.report.clone(), k.source);
                batch.push((key, seq, report, source));
            }
        }
        batch
    }

    /// The report of `key` (keeping `seq`) was refused again: it goes to the back of the
    /// queue, after `untried` (the round's others, back at the front in their order). Returns
    /// its refused writes so far.
    fn refused(&self, key: Key, seq: u64, untried: Vec<Key>) -> u32 {
        let mut held = self.held.lock();
        for k in untried.into_iter().rev() {
            held.queue.push_front(k);
        }
        let tries = match held.reports.get_mut(&key) {
            Some(k) => {
                if k.seq == seq {
                    k.tries += 1;
                }
                k.tries
            }
            None => return 0,
        };
        held.queue.push_back(key);
        tries
    }

    /// The report of `key` (keeping `seq`) is done with: forgotten, unless a newer one was kept
    /// meanwhile (queued again, applied in its turn). Returns its refused writes.
    fn done(&self, key: Key, seq: u64) -> u32 {
        let mut held = self.held.lock();
        let Some(k) = held.reports.get(&key) else {
            return 0;
        };
        let tries = k.tries;
        if k.seq != seq {
            held.queue.push_back(key);
            return tries;
        }
        if let Some(k) = held.reports.remove(&key) {
            held.bytes -= k.bytes;
        }
        if held.reports.is_empty() {
            held.full_logged = false;
            self.emptied.notify_waiters();
        }
        tries
    }
}

impl Registry {
    /// A terminal `report` about `(upstream, task_id)` that the store refused: kept to be
    /// applied again when the store is shared (see the module docs); on sled (a full disk)
    /// only counted and logged, as before.
    pub(super) fn keep_refused(
        &self,
        upstream: &str,
        task_id: &str,
        report: Report,
        source: &'static str,
    ) {
        if !report.status.is_terminal() || !self.store.shared() {
            return;
        }
        let status = report.status;
        if self.refused.keep(upstream, task_id, report, source) {
            tracing::debug!(
                upstream,
                task_id,
                status = status.as_str(),
                source,
                "a terminal status the task store refused is kept: written again once the store answers"
            );
        }
    }

    /// Starts the task that applies again the terminal reports a shared store refused (see
    /// the module docs); it ends with the registry, or when the store closes. Does nothing on
    /// a store not shared, or when already started.
    ///
    /// Why a task of its own, started with the registry's other background work, and not a
    /// part of that work: the sweep runs every `tasks.sweep_interval_ms` (a minute by
    /// default), far too seldom to free a slot soon after the store is back; the lease poll
    /// is the call leases' (it runs only where the store keeps leases, and its round must
    /// stay short to renew within the lapse). Nor a task spawned on the first refusal: the
    /// refusal is seen on the registry's store threads, whose runtime is never driven, so a
    /// task spawned there would never run. The task sleeps on a notification while nothing is
    /// kept: it costs nothing until a write is refused.
    pub fn retry_refused_reports(self: &Arc<Self>) {
        if !self.store.shared() || self.refused.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(self);
        let wake = self.refused.wake.clone();
        tokio::spawn(async move {
            let mut backoff = FinalWriteBackoff::default();
            loop {
                let Some(registry) = weak.upgrade() else {
                    return;
                };
                if registry.refused.len() == 0 {
                    drop(registry);
                    let _ = tokio::time::timeout(IDLE_CHECK, wake.notified()).await;
                    continue;
                }
                drop(registry);
                // Also the pause between two rounds of a backlog the store takes.
                tokio::time::sleep(backoff.next_wait()).await;
                let Some(registry) = weak.upgrade() else {
                    return;
                };
                match registry.apply_kept_reports().await {
                    Round::Took => backoff.reset(),
                    Round::Refused => {}
                    Round::Closing => return,
                }
            }
        });
    }

    /// How many terminal reports the store refused wait to be applied again.
    pub fn refused_reports_kept(&self) -> usize {
        self.refused.len()
    }

    /// Returns once no terminal report the store refused waits to be applied again (at once
    /// when none does): a graceful stop's drain waits for it, within `gateway.drain_timeout_ms`,
    /// as for the final writes the layers retry.
    pub async fn refused_reports_written(&self) {
        loop {
            let emptied = self.refused.emptied.notified();
            tokio::pin!(emptied);
            // Registered before the count is read: a set emptied in between still wakes it.
            emptied.as_mut().enable();
            if self.refused.len() == 0 {
                return;
            }
            emptied.await;
        }
    }

    /// One round: up to [`REPORTS_PER_TICK`] kept reports applied again, one store job each,
    /// until the store refuses one.
    pub(super) async fn apply_kept_reports(self: &Arc<Self>) -> Round {
        let mut batch = self.refused.batch().into_iter();
        while let Some((key, seq, report, source)) = batch.next() {
            let status = report.status;
            let (up, id) = key.clone();
            let again = self
                .try_off_runtime(move |r| r.apply_kept_now(&up, &id, report, source))
                .await
                .unwrap_or_else(|e| {
                    // Not run (the store threads busy, or stopping): as a refusal.
                    if e.is_closed() {
                        Again::Closed
                    } else {
                        Again::Refused
                    }
                });
            let (upstream, task_id) = (key.0.as_str(), key.1.as_str());
            match again {
                Again::Refused | Again::Closed => {
                    let untried = batch.map(|(k, ..)| k).collect();
                    self.refused.refused(key, seq, untried);
                    return if again == Again::Closed {
                        Round::Closing
                    } else {
                        Round::Refused
                    };
                }
                Again::Written(terminal_now) => {
                    if terminal_now {
                        if let Err(e) = self.store.sync().await {
                            self.write_failed(&e, "a terminal status could not be made durable");
                        }
                    }
                    let refused = self.refused.done(key.clone(), seq);
                    tracing::info!(
                        upstream,
                        task_id,
                        status = status.as_str(),
                        source,
                        tries = refused + 1,
                        "a terminal status the task store refused was written once it answered"
                    );
                }
                Again::Gone => {
                    self.refused.done(key.clone(), seq);
                    tracing::debug!(
                        upstream,
                        task_id,
                        "a kept terminal status was not written: its record is gone"
                    );
                }
                Again::Expired => {
                    let refused = self.refused.done(key.clone(), seq);
                    tracing::warn!(
                        upstream,
                        task_id,
                        status = status.as_str(),
                        tries = refused,
                        "a terminal status the task store refused is given up: the task's ttl ended before the store took it"
                    );
                }
                Again::EndedOtherwise(recorded) => {
                    self.refused.done(key.clone(), seq);
                    tracing::info!(
                        upstream,
                        task_id,
                        status = status.as_str(),
                        recorded = recorded.as_str(),
                        "a kept terminal status was not written: the task ended otherwise meanwhile"
                    );
                }
            }
        }
        Round::Took
    }

    /// Applies a kept report again (on a store thread): read first, so a record gone, expired
    /// or ended otherwise meanwhile is left as it is (a cancel recorded meanwhile: no late
    /// result counted for a report that came before it).
    fn apply_kept_now(
        &self,
        upstream: &str,
        task_id: &str,
        report: Report,
        source: &'static str,
    ) -> Again {
        match self.store.get(upstream, task_id) {
            Err(e) => {
                // A read, not a write: logged, not counted in
                // `taskgate_store_write_failures_total` (the refused write was, when kept).
                crate::store::log_failure(&e, "task store read failed");
                return if e.is_closed() {
                    Again::Closed
                } else {
                    Again::Refused
                };
            }
            Ok(None) => return Again::Gone,
            Ok(Some(r)) if r.is_expired(now_ms()) => return Again::Expired,
            Ok(Some(r)) if r.status.is_terminal() && r.status != report.status => {
                return Again::EndedOtherwise(r.status)
            }
            Ok(Some(_)) => {}
        }
        match self.apply_report(upstream, task_id, report, source) {
            Write::Applied((_, terminal_now)) => Again::Written(terminal_now),
            Write::Unknown => Again::Gone,
            Write::Refused { closed: true, .. } => Again::Closed,
            Write::Refused { .. } => Again::Refused,
        }
    }
}

#[cfg(test)]
#[path = "refused_tests.rs"]
mod tests;
