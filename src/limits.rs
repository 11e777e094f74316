//! `[limits]`: per-principal request rate and concurrency at the edge, after authentication and
//! before anything else of the request is looked at, and the bound on failed authentications
//! per client address before it.
//!
//! - Rate: a token bucket per principal (GCRA, `governor`): `requests_per_second` sustained,
//!   `burst` at once. Every request counts (POST, GET, DELETE).
//! - Concurrency: at most `max_in_flight` POST requests per principal whose answers are not yet
//!   complete (an SSE answer counts until its stream ends).
//! - GET streams: at most `max_get_streams` (default 64) open at once per [`Tenant`] over all
//!   upstreams, counted from before the GET goes upstream until its stream ends: one principal
//!   cannot hold every pooled upstream connection (1,024 per upstream) or every edge
//!   connection (`gateway.max_connections`) with long-lived listeners.
//! - Failed authentications: a token bucket per client address (an IPv6 address by its /64)
//!   of `auth_failures_per_minute` (default 60) and `auth_failures_burst` (default 20) over
//!   invalid tokens only (a missing token costs no check). An address past it gets 429 for
//!   every request, without a token check, until one more failure would fit: a flood of bad
//!   JWTs costs at most that many signature checks per address. Behind a reverse proxy every
//!   client shares the proxy's address unless the proxy is in `gateway.trusted_proxies`
//!   (then its `X-Forwarded-For` or `Forwarded` names the client: `http::client_addr`).
//!
//! Over a limit the edge answers HTTP 429 with `Retry-After` (RFC 9110 §10.2.3, whole seconds,
//! at least 1) and a JSON-RPC error body, and counts `taskgate_http_rejections_total{reason}`
//! (`rate_limit`, `in_flight`, `get_streams` or `auth_failures`). The rate and in-flight limits
//! key on the [`Principal`]: with `[auth] mode = "none"` every caller shares
//! [`Principal::Anonymous`]; the GET-stream cap keys on the [`Tenant`] (the principal, else the
//! client's address).

use crate::config::{
    LimitsConfig, DEFAULT_AUTH_FAILURES_BURST, DEFAULT_AUTH_FAILURES_PER_MINUTE,
    DEFAULT_MAX_GET_STREAMS,
};
use crate::exchange::{Principal, Tenant};
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many rate checks pass between two sweeps of idle buckets (bounds the key table).
const SWEEP_EVERY: u64 = 4096;
/// Most client addresses refused for failed authentications at once (the table of
/// [`Limiter::auth_failed`]); past it, expired entries are dropped first, then new addresses
/// are not added (each of their failures is still counted by the bucket).
pub const MAX_BLOCKED_ADDRESSES: usize = 65_536;

/// Why a request was refused by [`Limiter::admit`], [`Limiter::open_stream`] or
/// [`Limiter::auth_blocked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// The principal's request rate is exceeded; a request may succeed after this wait.
    Rate(Duration),
    /// The principal already has `max_in_flight` requests in flight.
    InFlight,
    /// The principal (or address) already holds `max_get_streams` GET streams open.
    GetStreams,
    /// The client address caused too many failed authentications; this long until the next.
    AuthFailures(Duration),
}

impl Over {
    /// The `Retry-After` value in whole seconds (at least 1).
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            Over::Rate(d) | Over::AuthFailures(d) => d.as_millis().div_ceil(1000).max(1) as u64,
            Over::InFlight | Over::GetStreams => 1,
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
            Over::GetStreams => "Too Many Requests: this principal holds limits.max_get_streams GET streams open; close one first".into(),
            Over::AuthFailures(_) => format!(
                "Too Many Requests: too many failed authentications from this address (limits.auth_failures_per_minute); retry after {} s",
                self.retry_after_secs()
            ),
        }
    }
}

/// Counts per key, each at most a maximum (entries at zero are removed).
struct Counts<K> {
    max: u32,
    table: Mutex<HashMap<K, u32>>,
}

impl<K: Hash + Eq + Clone> Counts<K> {
    fn new(max: u32) -> Counts<K> {
        Counts {
            max,
            table: Mutex::new(HashMap::new()),
        }
    }

    fn take(&self, key: &K) -> bool {
        let mut table = self.table.lock();
        let n = table.entry(key.clone()).or_insert(0);
        if *n >= self.max {
            return false;
        }
        *n += 1;
        true
    }

    fn give_back(&self, key: &K) {
        let mut table = self.table.lock();
        if let Some(n) = table.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                table.remove(key);
            }
        }
    }
}

/// The failed-authentication bound (see the module docs).
struct AuthFailures {
    rate: DefaultKeyedRateLimiter<IpAddr>,
    checks: AtomicU64,
    /// Addresses over the bound, until when.
    blocked: Mutex<HashMap<IpAddr, Instant>>,
}

/// The per-principal limits of `[limits]`.
pub struct Limiter {
    rate: Option<DefaultKeyedRateLimiter<Principal>>,
    checks: AtomicU64,
    in_flight: Option<Counts<Principal>>,
    streams: Counts<Tenant>,
    auth: Option<AuthFailures>,
}

/// What a [`Permit`] holds.
enum Held {
    InFlight(Principal),
    Stream(Tenant),
}

/// A slot of a request in flight or of an open GET stream; dropping it frees the slot.
pub struct Permit {
    owner: Option<(Arc<Limiter>, Held)>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        match self.owner.take() {
            Some((limiter, Held::InFlight(p))) => {
                if let Some(c) = &limiter.in_flight {
                    c.give_back(&p);
                }
            }
            Some((limiter, Held::Stream(t))) => limiter.streams.give_back(&t),
            None => {}
        }
    }
}

/// The key of a client address in the failed-authentication table (IPv6: its /64).
fn address_key(addr: IpAddr) -> IpAddr {
    match Tenant::of_addr(addr) {
        Tenant::Address(a) => a,
        _ => addr,
    }
}

impl Limiter {
    /// From a validated `[limits]` (the GET-stream cap and the failed-authentication bound have
    /// defaults, so there is always a limiter).
    pub fn new(config: &LimitsConfig) -> Arc<Limiter> {
        let rate = config
            .requests_per_second
            .and_then(NonZeroU32::new)
            .map(|rps| {
                let burst = config.burst.and_then(NonZeroU32::new).unwrap_or(rps);
                RateLimiter::keyed(Quota::per_second(rps).allow_burst(burst))
            });
        let per_minute = config
            .auth_failures_per_minute
            .unwrap_or(DEFAULT_AUTH_FAILURES_PER_MINUTE);
        let auth = NonZeroU32::new(per_minute).map(|per_minute| {
            let burst = config
                .auth_failures_burst
                .and_then(NonZeroU32::new)
                .or(NonZeroU32::new(DEFAULT_AUTH_FAILURES_BURST))
                .expect("a non-zero default");
            AuthFailures {
                rate: RateLimiter::keyed(Quota::per_minute(per_minute).allow_burst(burst)),
                checks: AtomicU64::new(0),
                blocked: Mutex::new(HashMap::new()),
            }
        });
        Arc::new(Limiter {
            rate,
            checks: AtomicU64::new(0),
            in_flight: config.max_in_flight.map(Counts::new),
            streams: Counts::new(config.max_get_streams.unwrap_or(DEFAULT_MAX_GET_STREAMS)),
            auth,
        })
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
        let (Some(counts), true) = (&self.in_flight, in_flight) else {
            return Ok(Permit { owner: None });
        };
        if !counts.take(principal) {
            return Err(Over::InFlight);
        }
        Ok(Permit {
            owner: Some((self.clone(), Held::InFlight(principal.clone()))),
        })
    }

    /// Takes one of `tenant`'s GET-stream slots (`limits.max_get_streams`), held by the
    /// returned [`Permit`] until the stream ends; [`Over::GetStreams`] when it has none left.
    pub fn open_stream(self: &Arc<Self>, tenant: &Tenant) -> Result<Permit, Over> {
        if !self.streams.take(tenant) {
            return Err(Over::GetStreams);
        }
        Ok(Permit {
            owner: Some((self.clone(), Held::Stream(tenant.clone()))),
        })
    }

    /// GET streams `tenant` holds open now.
    pub fn open_streams(&self, tenant: &Tenant) -> u32 {
        self.streams.table.lock().get(tenant).copied().unwrap_or(0)
    }

    /// [`Over::AuthFailures`] when `addr` is refused for failed authentications now (checked
    /// before its token is: no signature check is made for it).
    pub fn auth_blocked(&self, addr: IpAddr) -> Option<Over> {
        let auth = self.auth.as_ref()?;
        let key = address_key(addr);
        let mut blocked = auth.blocked.lock();
        let until = *blocked.get(&key)?;
        match until.checked_duration_since(Instant::now()) {
            Some(wait) if !wait.is_zero() => Some(Over::AuthFailures(wait)),
            _ => {
                blocked.remove(&key);
                None
            }
        }
    }

    /// Counts a failed authentication (an invalid token) from `addr`; past the bound the
    /// address is refused until one more failure would fit (see [`Limiter::auth_blocked`]).
    pub fn auth_failed(&self, addr: IpAddr) {
        let Some(auth) = &self.auth else {
            return;
        };
        if auth.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            auth.rate.retain_recent();
        }
        let key = address_key(addr);
        let Err(not_until) = auth.rate.check_key(&key) else {
            return;
        };
        let until = Instant::now() + not_until.wait_time_from(auth.rate.clock().now());
        let mut blocked = auth.blocked.lock();
        if blocked.len() >= MAX_BLOCKED_ADDRESSES && !blocked.contains_key(&key) {
            let now = Instant::now();
            blocked.retain(|_, t| *t > now);
            if blocked.len() >= MAX_BLOCKED_ADDRESSES {
                return;
            }
        }
        blocked.insert(key, until);
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
            ..LimitsConfig::default()
        })
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
        assert!(l.in_flight.as_ref().unwrap().table.lock().is_empty());
    }

    #[test]
    fn get_streams_are_capped_per_tenant_and_freed_on_drop() {
        let l = Limiter::new(&LimitsConfig {
            max_get_streams: Some(2),
            ..LimitsConfig::default()
        });
        let alice = Tenant::Principal("alice".into());
        let bob = Tenant::Principal("bob".into());
        let one = l.open_stream(&alice).unwrap();
        let _two = l.open_stream(&alice).unwrap();
        assert_eq!(l.open_stream(&alice).err(), Some(Over::GetStreams));
        assert_eq!(Over::GetStreams.retry_after_secs(), 1);
        assert!(l.open_stream(&bob).is_ok(), "bob has his own slots");
        drop(one);
        assert_eq!(l.open_streams(&alice), 1);
        assert!(l.open_stream(&alice).is_ok());
        // Without a principal, callers count by address (an IPv6 host by its /64).
        let a = Tenant::of_addr("2001:db8::1".parse().unwrap());
        let b = Tenant::of_addr("2001:db8::2".parse().unwrap());
        assert_eq!(a, b);
        let c = Tenant::of_addr("::ffff:10.0.0.1".parse().unwrap());
        assert_eq!(c, Tenant::Address("10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn failed_authentications_are_bounded_per_address() {
        let l = Limiter::new(&LimitsConfig {
            auth_failures_per_minute: Some(1),
            auth_failures_burst: Some(3),
            ..LimitsConfig::default()
        });
        let bad: IpAddr = "192.0.2.7".parse().unwrap();
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(l.auth_blocked(bad), None);
            l.auth_failed(bad);
        }
        assert_eq!(l.auth_blocked(bad), None, "the burst is not exceeded yet");
        l.auth_failed(bad);
        let over = l.auth_blocked(bad).expect("refused past the burst");
        assert!(matches!(over, Over::AuthFailures(d) if d <= Duration::from_secs(60)));
        assert!((1..=60).contains(&over.retry_after_secs()));
        assert_eq!(
            l.auth_blocked(other),
            None,
            "another address is not refused"
        );
        let off = Limiter::new(&LimitsConfig {
            auth_failures_per_minute: Some(0),
            ..LimitsConfig::default()
        });
        for _ in 0..100 {
            off.auth_failed(bad);
        }
        assert_eq!(off.auth_blocked(bad), None, "0 turns the bound off");
    }
}
