//! The failed-credential throttle: a failure budget per source address (`docs/protocol.md`,
//! "Credentials and planes").
//!
//! Every presented credential that does not open the door (unknown, expired, revoked, of the other
//! plane) spends one failure from its source's budget of [`DoorsConfig::credential_failure_burst`]
//! (`crate::config::DoorsConfig`), which refills at
//! [`DoorsConfig::credential_failures_per_minute`]. While a source's budget is spent, its
//! credentials are refused 429 `rate_limited` with `Retry-After` *before* they are looked up, so
//! the answer says nothing about the token; the one exception is a credential that already
//! succeeded from that source (up to [`GOOD_PER_SOURCE`] are remembered), so a client that shares
//! an address with a guesser keeps working.
//!
//! A source is an IPv4 address, or an IPv6 /64 (one host commonly holds a whole /64). The table
//! holds at most [`SOURCES_BOUND`] sources: when it is full, sources whose budget is whole again are
//! forgotten, and should none be, new sources share one overflow budget. Time is the server clock
//! ([`crate::clock::Clock`]), in milliseconds.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use nexus_proto::Refusal;

/// The most sources the throttle remembers at once.
pub const SOURCES_BOUND: usize = 65_536;
/// The most credentials remembered per source as having succeeded from it.
pub const GOOD_PER_SOURCE: usize = 4;

/// Where a request came from, as the throttle keys it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 address (an IPv4-mapped IPv6 address included).
    V4([u8; 4]),
    /// The first 64 bits of an IPv6 address.
    V6Prefix(u64),
    /// Every source that arrived while the table was full.
    Overflow,
}

impl Source {
    /// The source of a peer address.
    pub fn of(address: IpAddr) -> Source {
        match address {
            IpAddr::V4(v4) => Source::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.octets()),
                None => Source::V6Prefix((v6.to_bits() >> 64) as u64),
            },
        }
    }
}

#[derive(Debug, Default)]
struct Entry {
    /// When the budget is whole again (GCRA's theoretical arrival time), in ms.
    whole_at: i64,
    /// Digests of credentials that succeeded from this source, newest last.
    good: Vec<String>,
}

/// The verdict before a credential is looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Look the credential up.
    Check,
    /// Refuse it unread: the source's budget is spent.
    Refuse(Refusal),
}

/// The per-source failure budgets.
#[derive(Debug)]
pub struct CredentialThrottle {
    /// Failures a source may make at once.
    burst: i64,
    /// Milliseconds for one failure to refill.
    refill_ms: i64,
    sources: Mutex<HashMap<Source, Entry>>,
}

impl CredentialThrottle {
    /// A throttle that allows `burst` failures at once and refills `per_minute` a minute (both at
    /// least 1).
    pub fn new(burst: u32, per_minute: u32) -> CredentialThrottle {
        CredentialThrottle {
            burst: i64::from(burst.max(1)),
            refill_ms: 60_000 / i64::from(per_minute.max(1)),
            sources: Mutex::new(HashMap::new()),
        }
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, HashMap<Source, Entry>> {
        self.sources.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a credential with `digest` from `source` may be looked up at `now` (ms).
    pub fn gate(&self, source: Source, digest: &str, now: i64) -> Gate {
        let sources = self.sources();
        let Some(entry) = sources.get(&source) else { return Gate::Check };
        let debt = entry.whole_at.saturating_sub(now);
        // Room for one more failure is a debt of at most `burst - 1` refills.
        if debt <= (self.burst - 1) * self.refill_ms || entry.good.iter().any(|good| good == digest) {
            return Gate::Check;
        }
        // One failure's worth refills first.
        let wait_ms = debt - (self.burst - 1) * self.refill_ms;
        let seconds = u64::try_from(wait_ms).unwrap_or(0).div_ceil(1_000).max(1);
        Gate::Refuse(Refusal {
            message: format!(
                "too many failed credentials from this address; retry after {seconds} s with a valid credential"
            ),
            ..Refusal::rate_limited(seconds)
        })
    }

    /// Spends one failure from `source`'s budget at `now` (ms).
    pub fn failed(&self, source: Source, now: i64) {
        let mut sources = self.sources();
        let source = Self::room_for(&mut sources, source, now);
        let entry = sources.entry(source).or_default();
        entry.whole_at = entry.whole_at.max(now) + self.refill_ms;
    }

    /// Remembers that the credential with `digest` succeeded from `source`.
    pub fn succeeded(&self, source: Source, digest: &str, now: i64) {
        let mut sources = self.sources();
        let source = Self::room_for(&mut sources, source, now);
        let entry = sources.entry(source).or_default();
        if entry.good.iter().any(|good| good == digest) {
            return;
        }
        if entry.good.len() >= GOOD_PER_SOURCE {
            entry.good.remove(0);
        }
        entry.good.push(digest.to_owned());
    }

    /// The key `source` is kept under: itself, or [`Source::Overflow`] when the table is full of
    /// sources that still owe failures.
    fn room_for(sources: &mut HashMap<Source, Entry>, source: Source, now: i64) -> Source {
        if sources.contains_key(&source) || sources.len() < SOURCES_BOUND {
            return source;
        }
        sources.retain(|_, entry| entry.whole_at > now);
        if sources.len() < SOURCES_BOUND { source } else { Source::Overflow }
    }

    /// How many sources are remembered now.
    pub fn len(&self) -> usize {
        self.sources().len()
    }

    /// Whether no source is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use nexus_proto::ErrorCode;

    use super::*;

    const HOME: Source = Source::V4([10, 0, 0, 1]);

    fn refused(gate: Gate) -> Refusal {
        match gate {
            Gate::Refuse(refusal) => refusal,
            Gate::Check => panic!("expected a refusal"),
        }
    }

    #[test]
    fn a_spent_budget_refuses_unread_until_it_refills() {
        // Three failures at once, one back every 20 s.
        let throttle = CredentialThrottle::new(3, 3);
        for _ in 0..3 {
            assert_eq!(throttle.gate(HOME, "bad", 0), Gate::Check);
            throttle.failed(HOME, 0);
        }
        let refusal = refused(throttle.gate(HOME, "bad", 0));
        assert_eq!((refusal.code, refusal.retry_after), (ErrorCode::RateLimited, Some(20)));
        assert_eq!(refused(throttle.gate(HOME, "other", 19_999)).retry_after, Some(1));
        assert_eq!(throttle.gate(HOME, "bad", 20_000), Gate::Check, "one failure refilled");
        throttle.failed(HOME, 20_000);
        assert!(matches!(throttle.gate(HOME, "bad", 20_000), Gate::Refuse(_)));
        // Another source has its own budget.
        assert_eq!(throttle.gate(Source::V4([10, 0, 0, 2]), "bad", 0), Gate::Check);
    }

    #[test]
    fn a_credential_that_succeeded_from_the_source_is_still_checked() {
        let throttle = CredentialThrottle::new(1, 1);
        throttle.succeeded(HOME, "good", 0);
        throttle.failed(HOME, 0);
        assert!(matches!(throttle.gate(HOME, "guess", 0), Gate::Refuse(_)));
        assert_eq!(throttle.gate(HOME, "good", 0), Gate::Check);
    }

    #[test]
    fn sources_are_v4_addresses_and_v6_prefixes() {
        let a: IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().expect("ip");
        let c: IpAddr = "2001:db8:1:3::1".parse().expect("ip");
        assert_eq!(Source::of(a), Source::of(b));
        assert_ne!(Source::of(a), Source::of(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
        assert_eq!(Source::of(mapped), HOME);
    }

    #[test]
    fn the_table_is_bounded() {
        let throttle = CredentialThrottle::new(1, 60);
        for n in 0..(SOURCES_BOUND as u64 + 10) {
            throttle.failed(Source::V6Prefix(n), 0);
        }
        assert_eq!(throttle.len(), SOURCES_BOUND + 1, "the rest share the overflow budget");
        assert!(matches!(throttle.gate(Source::Overflow, "x", 0), Gate::Refuse(_)));
        // Once budgets are whole again, their sources make room.
        throttle.failed(Source::V6Prefix(u64::MAX), 20_000);
        assert_eq!(throttle.len(), 1);
    }
}
