//! `[limits]`: per-principal request rate and concurrency at the edge, after authentication and
//! before anything else of the request is looked at.
//!
//! - Rate: a token bucket per principal (GCRA, `governor`): `requests_per_second` sustained,
//!   `burst` at once. Every request counts (POST, GET, DELETE).
//! - Concurrency: at most `max_in_flight` POST requests per principal whose answers are not yet
//!   complete (an SSE answer counts until its stream ends). GET streams are not counted: they are
//!   long-lived listeners, not work.
//!
//! Over a limit the edge answers HTTP 429 with `Retry-After` (RFC 9110 §10.2.3, whole seconds,
//! at least 1) and a JSON-RPC error body, and counts `taskgate_http_rejections_total{reason}`
//! (`rate_limit` or `in_flight`). The key is the [`Principal`]: with `[auth] mode = "none"` every
//! caller shares [`Principal::Anonymous`].

use crate::config::LimitsConfig;
use crate::exchange::Principal;
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How many rate checks pass between two sweeps of idle buckets (bounds the key table).
const SWEEP_EVERY: u64 = 4096;

/// Why a request was refused by [`Limiter::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// The principal's request rate is exceeded; a request may succeed after this wait.
    Rate(Duration),
    /// The principal already has `max_in_flight` requests in flight.
    InFlight,
}

impl Over {
    /// The `Retry-After` value in whole seconds (at least 1).
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            Over::Rate(d) => d.as_millis().div_ceil(1000).max(1) as u64,
            Over::InFlight => 1,
        }
    }

    /// A one-line explanation for the JSON-RPC error body.
    pub fn message(&self) -> String {
        match self {
            Over::Rate(_) => format!(
                "Too Many Requests: this principal's request rate limit is exceeded (limits.requests_per_second); retry after {} s",
                self.retry_after_secs()
            ),
            Over::InFlight => "Too Many Requests: this principal has limits.max_in_flight requests in flight".into(),
        }
    }
}

/// The per-principal limits of `[limits]`.
pub struct Limiter {
    rate: Option<DefaultKeyedRateLimiter<Principal>>,
    checks: AtomicU64,
    max_in_flight: Option<u32>,
    in_flight: Mutex<HashMap<Principal, u32>>,
}

/// A slot of a request in flight; dropping it frees the slot.
pub struct Permit {
    owner: Option<(Arc<Limiter>, Principal)>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some((limiter, principal)) = self.owner.take() {
            let mut table = limiter.in_flight.lock();
            if let Some(n) = table.get_mut(&principal) {
                *n -= 1;
                if *n == 0 {
                    table.remove(&principal);
                }
            }
        }
    }
}

impl Limiter {
    /// From a validated `[limits]`; `None` when no limit is configured.
    pub fn new(config: &LimitsConfig) -> Option<Arc<Limiter>> {
        let rate = config
            .requests_per_second
            .and_then(NonZeroU32::new)
            .map(|rps| {
                let burst = config.burst.and_then(NonZeroU32::new).unwrap_or(rps);
                RateLimiter::keyed(Quota::per_second(rps).allow_burst(burst))
            });
        if rate.is_none() && config.max_in_flight.is_none() {
            return None;
        }
        Some(Arc::new(Limiter {
            rate,
            checks: AtomicU64::new(0),
            max_in_flight: config.max_in_flight,
            in_flight: Mutex::new(HashMap::new()),
        }))
    }

    /// Counts one request of `principal` against its rate and, when `in_flight`, takes one of
    /// its in-flight slots (held by the returned [`Permit`]).
    pub fn admit(self: &Arc<Self>, principal: &Principal, in_flight: bool) -> Result<Permit, Over> {
        if let Some(rate) = &self.rate {
            if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
                rate.retain_recent();
            }
            if let Err(not_until) = rate.check_key(principal) {
                return Err(Over::Rate(not_until.wait_time_from(rate.clock().now())));
            }
        }
        let (Some(max), true) = (self.max_in_flight, in_flight) else {
            return Ok(Permit { owner: None });
        };
        let mut table = self.in_flight.lock();
        let n = table.entry(principal.clone()).or_insert(0);
        if *n >= max {
            return Err(Over::InFlight);
        }
        *n += 1;
        Ok(Permit {
            owner: Some((self.clone(), principal.clone())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(rps: Option<u32>, burst: Option<u32>, max: Option<u32>) -> Arc<Limiter> {
        Limiter::new(&LimitsConfig {
            requests_per_second: rps,
            burst,
            max_in_flight: max,
        })
        .unwrap()
    }

    #[test]
    fn burst_then_refused_with_a_wait_per_principal() {
        let l = limiter(Some(1), Some(2), None);
        let a = Principal::Token("a".into());
        assert!(l.admit(&a, true).is_ok());
        assert!(l.admit(&a, true).is_ok());
        let over = l.admit(&a, true).err().unwrap();
        assert!(matches!(over, Over::Rate(d) if d <= Duration::from_secs(1)));
        assert_eq!(over.retry_after_secs(), 1);
        assert!(l.admit(&Principal::Token("b".into()), true).is_ok());
    }

    #[test]
    fn in_flight_slots_are_freed_on_drop() {
        let l = limiter(None, None, Some(1));
        let a = Principal::Token("a".into());
        let held = l.admit(&a, true).unwrap();
        assert_eq!(l.admit(&a, true).err(), Some(Over::InFlight));
        assert!(l.admit(&a, false).is_ok(), "GET streams are not counted");
        drop(held);
        assert!(l.admit(&a, true).is_ok());
        assert!(l.in_flight.lock().is_empty());
    }
}
