//! The scarce slots a port gives admitted connections (the engine's
//! sessions, its iperf3 tests), with a share per source: a source holds at
//! most `per_source` of the `capacity` slots, so one client (or one
//! stranger, on a port that takes no token) cannot take every slot and
//! lock the others out.
//!
//! A slot is taken with [`Slots::take`] and given back when its [`Slot`]
//! is dropped. Sources are counted as the pending pools count them
//! ([`SourceKey`]: an IPv4 address, an IPv6 /64).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::pending::SourceKey;

/// Why a port refused a connection after its first message (counted per
/// reason in [`crate::Counters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot is taken.
    Busy,
    /// The connection's source holds its whole share of the slots.
    SourceBusy,
    /// An admitted connection's data connections did not all attach in
    /// time (its slot is given back).
    AttachTimeout,
}

struct Held {
    total: usize,
    by_source: HashMap<SourceKey, usize>,
}

/// A port's slots; share it (Arc) with every handshake.
pub struct Slots {
    capacity: usize,
    per_source: usize,
    held: Mutex<Held>,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("capacity", &self.capacity)
            .field("per_source", &self.per_source)
            .field("held", &self.held())
            .finish()
    }
}

/// A slot taken; dropping it gives the slot back.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    source: SourceKey,
}

impl Slots {
    /// `capacity` slots, at most `per_source` of them (clamped to
    /// 1..=capacity) for one source.
    pub fn new(capacity: usize, per_source: usize) -> Arc<Slots> {
        let capacity = capacity.max(1);
        Arc::new(Slots {
            capacity,
            per_source: per_source.clamp(1, capacity),
            held: Mutex::new(Held {
                total: 0,
                by_source: HashMap::new(),
            }),
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn per_source(&self) -> usize {
        self.per_source
    }

    /// Slots taken right now.
    pub fn held(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a connection from `ip`, or why not: its source holds
    /// its share ([`Refusal::SourceBusy`], said first: it is the source's
    /// own doing) or every slot is taken ([`Refusal::Busy`]).
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refusal> {
        let source = SourceKey::of(ip);
        let mut held = self.lock();
        let mine = held.by_source.get(&source).copied().unwrap_or(0);
        if mine >= self.per_source {
            return Err(Refusal::SourceBusy);
        }
        if held.total >= self.capacity {
            return Err(Refusal::Busy);
        }
        held.total += 1;
        *held.by_source.entry(source).or_default() += 1;
        Ok(Slot {
            slots: self.clone(),
            source,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.lock();
        held.total -= 1;
        if let Some(n) = held.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                held.by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_source_gets_its_share_and_the_others_the_rest() {
        let slots = Slots::new(4, 2);
        let a1 = slots.take(ip("10.0.0.1")).unwrap();
        let _a2 = slots.take(ip("10.0.0.1")).unwrap();
        assert_eq!(slots.take(ip("10.0.0.1")).unwrap_err(), Refusal::SourceBusy);
        let _b1 = slots.take(ip("10.0.0.2")).unwrap();
        let _c1 = slots.take(ip("::ffff:10.0.0.3")).unwrap();
        assert_eq!(slots.take(ip("10.0.0.4")).unwrap_err(), Refusal::Busy);
        // Its own share first, even when the port is full too.
        assert_eq!(slots.take(ip("10.0.0.1")).unwrap_err(), Refusal::SourceBusy);
        assert_eq!(slots.held(), 4);
        drop(a1);
        assert_eq!(slots.held(), 3);
        let _a3 = slots.take(ip("10.0.0.1")).unwrap();
    }

    #[test]
    fn shares_are_clamped_to_the_capacity() {
        let slots = Slots::new(2, 10);
        assert_eq!(slots.per_source(), 2);
        let _a = slots.take(ip("2001:db8::1")).unwrap();
        // The same /64: the same source.
        let _b = slots.take(ip("2001:db8::2")).unwrap();
        assert_eq!(
            slots.take(ip("2001:db8::3")).unwrap_err(),
            Refusal::SourceBusy
        );
        assert_eq!(Slots::new(3, 0).per_source(), 1);
    }
}
