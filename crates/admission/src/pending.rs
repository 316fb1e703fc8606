//! The bookkeeping of a bounded pool of connections that have not proven
//! anything yet: who is in it, from which source, since when, until when.
//!
//! A [`PendingSet`] never refuses a newcomer. When it is over its global
//! capacity or over the newcomer's per-source share it *evicts* instead:
//! the oldest entry of the newcomer's own source first (per-source limit),
//! then the oldest entry of whichever source holds the most entries (global
//! limit). A flood of silent connections therefore only ever pushes out its
//! own oldest members, while a real client, whose connection leaves the pool
//! within a round trip or two, is evicted only if a whole per-source share
//! of newer connections arrives from its own address in that time.
//!
//! Every entry also carries a deadline; [`PendingSet::expired`] hands back
//! the entries past theirs. The set holds a caller-chosen payload per entry
//! (a socket to shut down, a cancel handle) and returns the payloads of
//! evicted and expired entries so the caller can close them.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Instant;

/// Who a connection comes from, for the per-source limit: the IPv4 address,
/// or the /64 prefix of an IPv6 address (one host usually owns a whole /64,
/// so counting single IPv6 addresses would limit nothing). IPv4-mapped IPv6
/// addresses count as their IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKey {
    V4([u8; 4]),
    V6Prefix([u8; 8]),
}

impl SourceKey {
    pub fn of(ip: IpAddr) -> SourceKey {
        match ip {
            IpAddr::V4(v4) => SourceKey::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => SourceKey::V4(v4.octets()),
                None => {
                    let mut prefix = [0u8; 8];
                    prefix.copy_from_slice(&v6.octets()[..8]);
                    SourceKey::V6Prefix(prefix)
                }
            },
        }
    }
}

/// The two limits of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries in the whole pool.
    pub capacity: usize,
    /// Entries from one [`SourceKey`].
    pub per_source: usize,
}

/// Handle of an entry, unique within its set.
pub type EntryId = u64;

struct Entry<T> {
    source: SourceKey,
    deadline: Instant,
    value: T,
}

/// A bounded pool of pending connections; see the module documentation.
pub struct PendingSet<T> {
    limits: Limits,
    next_id: EntryId,
    entries: HashMap<EntryId, Entry<T>>,
    /// Entry ids per source, oldest first (ids grow with arrival).
    by_source: HashMap<SourceKey, BTreeSet<EntryId>>,
}

impl<T> PendingSet<T> {
    pub fn new(limits: Limits) -> PendingSet<T> {
        assert!(
            limits.capacity >= 1 && limits.per_source >= 1,
            "a pool holds at least one entry"
        );
        PendingSet {
            limits,
            next_id: 0,
            entries: HashMap::new(),
            by_source: HashMap::new(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries from `source` right now.
    pub fn from_source(&self, source: SourceKey) -> usize {
        self.by_source.get(&source).map_or(0, BTreeSet::len)
    }

    /// Adds an entry and returns its id and the values of the entries it
    /// pushed out (never the new one).
    pub fn insert(&mut self, ip: IpAddr, deadline: Instant, value: T) -> (EntryId, Vec<T>) {
        let source = SourceKey::of(ip);
        let id = self.next_id;
        self.next_id += 1;
        self.entries.insert(
            id,
            Entry {
                source,
                deadline,
                value,
            },
        );
        self.by_source.entry(source).or_default().insert(id);
        let mut evicted = Vec::new();
        while self.from_source(source) > self.limits.per_source {
            match self.oldest_of(source, id) {
                Some(victim) => evicted.extend(self.remove(victim)),
                None => break,
            }
        }
        while self.entries.len() > self.limits.capacity {
            match self.global_victim(id) {
                Some(victim) => evicted.extend(self.remove(victim)),
                None => break,
            }
        }
        (id, evicted)
    }

    /// The oldest entry of `source` other than `spare`.
    fn oldest_of(&self, source: SourceKey, spare: EntryId) -> Option<EntryId> {
        self.by_source
            .get(&source)?
            .iter()
            .copied()
            .find(|&id| id != spare)
    }

    /// The oldest entry (other than `spare`) of the source holding the most
    /// entries; ties go to the source whose oldest entry is older.
    fn global_victim(&self, spare: EntryId) -> Option<EntryId> {
        self.by_source
            .iter()
            .filter_map(|(source, ids)| {
                let oldest = self.oldest_of(*source, spare)?;
                Some((ids.len(), std::cmp::Reverse(oldest)))
            })
            .max()
            .map(|(_, std::cmp::Reverse(id))| id)
    }

    /// Removes an entry; `None` if it already left (evicted or expired).
    pub fn remove(&mut self, id: EntryId) -> Option<T> {
        let entry = self.entries.remove(&id)?;
        if let Some(ids) = self.by_source.get_mut(&entry.source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&entry.source);
            }
        }
        Some(entry.value)
    }

    /// The value of an entry still in the set.
    pub fn get_mut(&mut self, id: EntryId) -> Option<&mut T> {
        self.entries.get_mut(&id).map(|e| &mut e.value)
    }

    /// Whether the entry is still in the set.
    pub fn contains(&self, id: EntryId) -> bool {
        self.entries.contains_key(&id)
    }

    /// Removes and returns every entry whose deadline is at or before `now`.
    pub fn expired(&mut self, now: Instant) -> Vec<T> {
        let due: Vec<EntryId> = self
            .entries
            .iter()
            .filter(|(_, e)| e.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        due.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    /// The earliest deadline in the set.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.deadline).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sources_group_v6_by_prefix_and_mapped_v4_as_v4() {
        assert_eq!(
            SourceKey::of(ip("::ffff:10.0.0.1")),
            SourceKey::of(ip("10.0.0.1"))
        );
        assert_eq!(
            SourceKey::of(ip("2001:db8:1:2::1")),
            SourceKey::of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            SourceKey::of(ip("2001:db8:1:2::1")),
            SourceKey::of(ip("2001:db8:1:3::1"))
        );
    }

    #[test]
    fn a_full_source_evicts_its_own_oldest_never_the_newcomer() {
        let mut set = PendingSet::new(Limits {
            capacity: 100,
            per_source: 3,
        });
        let later = Instant::now() + Duration::from_secs(10);
        for v in 0..3 {
            assert!(set.insert(ip("10.0.0.1"), later, v).1.is_empty());
        }
        let other = set.insert(ip("10.0.0.2"), later, 100).0;
        let (newest, evicted) = set.insert(ip("10.0.0.1"), later, 3);
        assert_eq!(evicted, vec![0]);
        assert!(set.contains(newest) && set.contains(other));
        assert_eq!(set.from_source(SourceKey::of(ip("10.0.0.1"))), 3);
    }

    #[test]
    fn a_full_pool_evicts_from_the_biggest_source() {
        let mut set = PendingSet::new(Limits {
            capacity: 4,
            per_source: 4,
        });
        let later = Instant::now() + Duration::from_secs(10);
        let quiet = set.insert(ip("192.0.2.7"), later, "client").0;
        for v in ["a", "b", "c"] {
            set.insert(ip("10.0.0.1"), later, v);
        }
        // The pool is full; a newcomer from the quiet source pushes out the
        // flooding source's oldest, not the quiet source's connection.
        let (_, evicted) = set.insert(ip("192.0.2.7"), later, "client2");
        assert_eq!(evicted, vec!["a"]);
        assert!(set.contains(quiet));
        let (_, evicted) = set.insert(ip("10.0.0.1"), later, "d");
        assert_eq!(evicted, vec!["b"]);
        assert_eq!(set.len(), 4);
    }

    #[test]
    fn deadlines_expire_entries() {
        let mut set = PendingSet::new(Limits {
            capacity: 10,
            per_source: 10,
        });
        let now = Instant::now();
        set.insert(ip("10.0.0.1"), now, 1);
        let (late, _) = set.insert(ip("10.0.0.1"), now + Duration::from_secs(5), 2);
        assert_eq!(set.next_deadline(), Some(now));
        assert_eq!(set.expired(now), vec![1]);
        assert!(set.contains(late));
        assert_eq!(set.remove(late), Some(2));
        assert_eq!(set.remove(late), None);
        assert!(set.is_empty());
    }
}
