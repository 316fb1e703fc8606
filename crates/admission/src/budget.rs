//! A per-source budget of failed proofs (a wrong token, wrong iperf3
//! credentials), so a guesser is slowed down to a few tries a second
//! however many connections it opens.
//!
//! Each source ([`SourceKey`]) has a bucket of `burst` tokens that refills
//! at `per_second`. Before a proof is checked the handshake takes a token
//! ([`ProofBudget::turn`]), waiting for one if the bucket is empty; a
//! proof that holds gives it back ([`ProofTurn::passed`]), one that fails
//! keeps it spent. So honest clients never wait (their tokens come back),
//! a guesser gets `burst` tries at once and then `per_second`, and
//! parallel connections from one source share the same bucket. A source
//! whose bucket is full needs no entry, so the table holds only sources
//! that failed recently, at most [`MAX_SOURCES`] of them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::pending::SourceKey;

/// Sources with a bucket that is not full, at most; past it the one left
/// alone longest is forgotten (it starts full again). 4,096 entries are a
/// few hundred KiB.
pub const MAX_SOURCES: usize = 4096;

/// How a port limits failed proofs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProofLimits {
    /// Failed proofs a source may have at once.
    pub burst: u32,
    /// Failed proofs a source may have per second after that.
    pub per_second: f64,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The budgets of a port's sources; share it (Arc) with the handshakes.
pub struct ProofBudget {
    limits: ProofLimits,
    buckets: Mutex<HashMap<SourceKey, Bucket>>,
}

/// A proof's turn: one token taken from its source's bucket. Dropped
/// without [`ProofTurn::passed`], it stays spent (the proof failed).
pub struct ProofTurn {
    budget: Arc<ProofBudget>,
    source: SourceKey,
}

impl ProofTurn {
    /// The proof held: the token goes back.
    pub fn passed(self) {
        self.budget.refund(self.source);
    }
}

/// Longest sleep between looks at a bucket while waiting for a token.
const WAIT_STEP: Duration = Duration::from_millis(50);

impl ProofBudget {
    pub fn new(limits: ProofLimits) -> Arc<ProofBudget> {
        Arc::new(ProofBudget {
            limits: ProofLimits {
                burst: limits.burst.max(1),
                per_second: limits.per_second.max(0.001),
            },
            buckets: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SourceKey, Bucket>> {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refilled(&self, b: &Bucket, now: Instant) -> f64 {
        let grown = now.saturating_duration_since(b.at).as_secs_f64() * self.limits.per_second;
        (b.tokens + grown).min(f64::from(self.limits.burst))
    }

    /// Takes a token for a proof from `ip` if one is there; else how long
    /// until one is.
    fn try_take(&self, source: SourceKey, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.lock();
        let burst = f64::from(self.limits.burst);
        let tokens = match buckets.get(&source) {
            Some(b) => self.refilled(b, now),
            None => burst,
        };
        if tokens < 1.0 {
            let missing = (1.0 - tokens) / self.limits.per_second;
            return Err(Duration::from_secs_f64(missing));
        }
        if buckets.len() >= MAX_SOURCES && !buckets.contains_key(&source) {
            self.make_room(&mut buckets, now);
        }
        buckets.insert(
            source,
            Bucket {
                tokens: tokens - 1.0,
                at: now,
            },
        );
        Ok(())
    }

    /// Forgets full buckets, then, if still at the bound, the bucket left
    /// alone longest.
    fn make_room(&self, buckets: &mut HashMap<SourceKey, Bucket>, now: Instant) {
        let burst = f64::from(self.limits.burst);
        buckets.retain(|_, b| self.refilled(b, now) < burst);
        if buckets.len() >= MAX_SOURCES {
            if let Some(oldest) = buckets.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| *k) {
                buckets.remove(&oldest);
            }
        }
    }

    fn refund(&self, source: SourceKey) {
        let now = Instant::now();
        let mut buckets = self.lock();
        if let Some(b) = buckets.get_mut(&source) {
            let tokens = self.refilled(b, now) + 1.0;
            if tokens >= f64::from(self.limits.burst) {
                buckets.remove(&source);
            } else {
                *b = Bucket { tokens, at: now };
            }
        }
    }

    /// Whether a proof from `ip` would have to wait for a token now (its
    /// source's bucket is empty); takes nothing.
    pub fn would_wait(&self, ip: IpAddr) -> bool {
        let buckets = self.lock();
        buckets
            .get(&SourceKey::of(ip))
            .is_some_and(|b| self.refilled(b, Instant::now()) < 1.0)
    }

    /// Waits until `ip`'s source may have a proof checked, or `until`
    /// passes (None: the handshake ran out of time while slowed down).
    pub fn turn(self: &Arc<Self>, ip: IpAddr, until: Instant) -> Option<ProofTurn> {
        let source = SourceKey::of(ip);
        loop {
            let now = Instant::now();
            match self.try_take(source, now) {
                Ok(()) => {
                    return Some(ProofTurn {
                        budget: self.clone(),
                        source,
                    })
                }
                Err(_) if now >= until => return None,
                Err(wait) => {
                    let wait = wait.min(WAIT_STEP).min(until - now);
                    std::thread::sleep(wait.max(Duration::from_millis(1)));
                }
            }
        }
    }

    /// Sources with a bucket that is not full.
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn failures_spend_the_burst_then_wait_and_passes_cost_nothing() {
        let budget = ProofBudget::new(ProofLimits {
            burst: 3,
            per_second: 20.0,
        });
        let far = Instant::now() + Duration::from_secs(10);
        // Honest clients give their tokens back: any number, no wait.
        for _ in 0..10 {
            budget.turn(ip("10.0.0.1"), far).unwrap().passed();
        }
        assert_eq!(budget.tracked(), 0);
        // A guesser: three at once, then one per 50 ms.
        let start = Instant::now();
        for _ in 0..3 {
            drop(budget.turn(ip("10.0.0.2"), far).unwrap());
        }
        assert!(start.elapsed() < Duration::from_millis(30));
        for _ in 0..4 {
            drop(budget.turn(ip("10.0.0.2"), far).unwrap());
        }
        assert!(
            start.elapsed() >= Duration::from_millis(190),
            "{:?}",
            start.elapsed()
        );
        // Another source is not slowed down by it.
        let other = Instant::now();
        drop(budget.turn(ip("10.0.0.3"), far).unwrap());
        assert!(other.elapsed() < Duration::from_millis(30));
        // Out of time while slowed down.
        let soon = Instant::now() + Duration::from_millis(10);
        assert!(budget.turn(ip("10.0.0.2"), soon).is_none());
    }

    #[test]
    fn the_table_of_sources_is_bounded() {
        let budget = ProofBudget::new(ProofLimits {
            burst: 1,
            per_second: 0.001,
        });
        let far = Instant::now() + Duration::from_secs(1);
        for i in 0..(MAX_SOURCES as u32 + 100) {
            let v4 = std::net::Ipv4Addr::from(0x0a00_0000 + i);
            drop(budget.turn(IpAddr::V4(v4), far).unwrap());
        }
        assert!(budget.tracked() <= MAX_SOURCES, "{}", budget.tracked());
    }
}
