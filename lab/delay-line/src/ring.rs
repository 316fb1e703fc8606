//! Preallocated storage for the packets one direction holds: a byte ring
//! the reader reads straight into, plus a FIFO of (offset, length, release
//! time). No allocation per packet: the byte ring is allocated once, sized
//! from the queue limit plus the bandwidth-delay product, and the FIFO only
//! grows if more (small) packets are held than its initial capacity.
//!
//! Packets are stored contiguously; when a packet would not fit before the
//! end of the buffer the writer wraps to offset 0 and the tail of the buffer
//! stays unused for that lap (at most one MTU is wasted).

use std::collections::VecDeque;

/// FIFO entry: where a held packet's bytes are and when to release it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    offset: usize,
    len: u32,
    release: u64,
}

/// Byte ring plus FIFO; see the module docs.
pub struct PacketRing {
    buf: Box<[u8]>,
    entries: VecDeque<Entry>,
    /// Offset of the oldest held packet (meaningful only when non-empty).
    head: usize,
    /// Offset just after the newest held packet.
    tail: usize,
    held_bytes: u64,
}

/// Typical small packet (a TCP ACK), used to size the FIFO's initial capacity.
const TYPICAL_SMALL_PACKET: usize = 64;

impl PacketRing {
    /// A ring of `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        PacketRing {
            buf: vec![0u8; capacity].into_boxed_slice(),
            entries: VecDeque::with_capacity(capacity / TYPICAL_SMALL_PACKET + 1),
            head: 0,
            tail: 0,
            held_bytes: 0,
        }
    }

    /// Number of packets held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sum of the held packets' lengths.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// A writable slice of `max_len` bytes where the next packet can be
    /// read into, or `None` when the ring is full. Nothing is held until
    /// [`PacketRing::commit`] is called, so a packet that is dropped after
    /// reading just leaves the space free.
    pub fn reserve(&mut self, max_len: usize) -> Option<&mut [u8]> {
        let offset = self.free_offset(max_len)?;
        Some(&mut self.buf[offset..offset + max_len])
    }

    fn free_offset(&mut self, max_len: usize) -> Option<usize> {
        if self.entries.is_empty() {
            self.head = 0;
            self.tail = 0;
        }
        let wrapped = !self.entries.is_empty() && self.tail <= self.head;
        if wrapped {
            // Free space is [tail, head).
            (self.head - self.tail >= max_len).then_some(self.tail)
        } else if self.buf.len() - self.tail >= max_len {
            Some(self.tail)
        } else if self.head >= max_len {
            // Wrap: free space [0, head).
            Some(0)
        } else {
            None
        }
    }

    /// Holds the first `len` bytes of the slice last returned by
    /// [`PacketRing::reserve`] (called with `max_len >= len`) until `release`.
    pub fn commit(&mut self, max_len: usize, len: usize, release: u64) {
        let offset = self
            .free_offset(max_len)
            .expect("commit follows a successful reserve");
        debug_assert!(len <= max_len);
        self.entries.push_back(Entry {
            offset,
            len: len as u32,
            release,
        });
        if self.entries.len() == 1 {
            self.head = offset;
        }
        self.tail = offset + len;
        self.held_bytes += len as u64;
    }

    /// Release time of the oldest held packet.
    pub fn next_release(&self) -> Option<u64> {
        self.entries.front().map(|e| e.release)
    }

    /// The oldest held packet's bytes.
    pub fn front(&self) -> Option<&[u8]> {
        self.entries
            .front()
            .map(|e| &self.buf[e.offset..e.offset + e.len as usize])
    }

    /// Forgets the oldest held packet.
    pub fn pop(&mut self) {
        if let Some(e) = self.entries.pop_front() {
            self.held_bytes -= e.len as u64;
            match self.entries.front() {
                Some(next) => self.head = next.offset,
                None => {
                    self.head = 0;
                    self.tail = 0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(ring: &mut PacketRing, mtu: usize, payload: &[u8], release: u64) -> bool {
        match ring.reserve(mtu) {
            Some(slot) => {
                slot[..payload.len()].copy_from_slice(payload);
                ring.commit(mtu, payload.len(), release);
                true
            }
            None => false,
        }
    }

    #[test]
    fn fifo_order_and_wrap() {
        let mtu = 100;
        let mut ring = PacketRing::new(350);
        assert!(push(&mut ring, mtu, &[1; 100], 1));
        assert!(push(&mut ring, mtu, &[2; 100], 2));
        assert!(push(&mut ring, mtu, &[3; 100], 3));
        // 50 bytes left at the end: not enough for an MTU, and no room at
        // the start either.
        assert!(!push(&mut ring, mtu, &[4; 10], 4));
        ring.pop();
        // Now [0, 100) is free: the writer wraps.
        assert!(push(&mut ring, mtu, &[4; 60], 4));
        assert_eq!(ring.len(), 3);
        assert_eq!(ring.held_bytes(), 260);
        let mut seen = Vec::new();
        while let Some(p) = ring.front() {
            seen.push((p[0], p.len(), ring.next_release().unwrap()));
            ring.pop();
        }
        assert_eq!(seen, vec![(2, 100, 2), (3, 100, 3), (4, 60, 4)]);
        assert!(ring.is_empty());
        assert_eq!(ring.held_bytes(), 0);
    }

    #[test]
    fn matches_a_model_queue_under_random_traffic() {
        let mtu = 1500;
        let mut ring = PacketRing::new(20_000);
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut counter = 0u8;
        for _ in 0..200_000 {
            if next() % 3 != 0 {
                let len = 1 + (next() % mtu as u64) as usize;
                counter = counter.wrapping_add(1);
                let pkt = vec![counter; len];
                if push(&mut ring, mtu, &pkt, 0) {
                    model.push_back(pkt);
                } else {
                    // Full must really mean nearly full.
                    assert!(ring.held_bytes() + 2 * mtu as u64 > 20_000 - mtu as u64);
                }
            } else if let Some(p) = ring.front() {
                assert_eq!(p, model.front().unwrap().as_slice());
                ring.pop();
                model.pop_front();
            }
            assert_eq!(ring.len(), model.len());
        }
    }
}
