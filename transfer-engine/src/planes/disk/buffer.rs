//! Page-aligned block buffers and the fixed pool they come from.
//!
//! Every block in flight, on either end, sits in one of these buffers, and
//! the pool never grows: that is what keeps RSS flat whatever the tree size.
//! Buffers are [`DIRECT_ALIGN`]-aligned so the same buffer serves buffered
//! and O_DIRECT IO.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{Condvar, Mutex};

use crate::workers::{WaitList, Waker};

use super::{CHUNK_SIZE, DIRECT_ALIGN};

/// A heap buffer of `capacity` bytes aligned to [`DIRECT_ALIGN`], with a
/// fill length.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(DIRECT_ALIGN).next_multiple_of(DIRECT_ALIGN);
        let layout = Layout::from_size_align(cap, DIRECT_ALIGN).expect("valid buffer layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, cap, len: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "length beyond capacity");
        self.len = len;
    }

    /// The filled part.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialized (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The first `n` bytes, whatever the fill length (`n` <= capacity).
    pub fn head(&self, n: usize) -> &[u8] {
        assert!(n <= self.cap, "length beyond capacity");
        // SAFETY: ptr is valid for cap >= n initialized (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), n) }
    }

    /// Start of the allocation (for IO the kernel does on our behalf).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The whole capacity, to fill.
    pub fn as_mut_full(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap initialized bytes, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, DIRECT_ALIGN).expect("valid buffer layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// A fixed set of chunk-sized buffers. `get` blocks while all are in use
/// (IO threads); `take` never blocks and wakes the data worker's stream
/// when a buffer comes back; `close` wakes every waiter with `None` so a
/// failed pipeline unwinds.
pub struct BufferPool {
    state: Mutex<(Vec<AlignedBuf>, bool)>,
    ready: Condvar,
    waiting: WaitList,
    total: usize,
}

/// What [`BufferPool::take`] got.
pub enum Take {
    Buf(AlignedBuf),
    /// None free: the waker runs when one is put back.
    Later,
    Closed,
}

impl BufferPool {
    pub fn new(count: usize) -> Self {
        let count = count.max(1);
        let bufs = (0..count)
            .map(|_| AlignedBuf::new(CHUNK_SIZE as usize))
            .collect();
        BufferPool {
            state: Mutex::new((bufs, false)),
            ready: Condvar::new(),
            waiting: WaitList::default(),
            total: count,
        }
    }

    /// Buffers the pool was created with.
    pub fn total(&self) -> usize {
        self.total
    }

    pub fn get(&self) -> Option<AlignedBuf> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if st.1 {
                return None;
            }
            if let Some(mut b) = st.0.pop() {
                b.set_len(0);
                return Some(b);
            }
            st = self.ready.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A buffer if one is free; otherwise `waker` runs when one is put back.
    pub fn take(&self, waker: &Waker) -> Take {
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.1 {
                return Take::Closed;
            }
            if let Some(mut b) = st.0.pop() {
                b.set_len(0);
                return Take::Buf(b);
            }
            // Registered under the lock: a put after it wakes us.
            self.waiting.add(waker);
        }
        Take::Later
    }

    pub fn put(&self, buf: AlignedBuf) {
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.0.push(buf);
            self.ready.notify_one();
        }
        self.waiting.wake_one();
    }

    pub fn close(&self) {
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.1 = true;
            self.ready.notify_all();
        }
        self.waiting.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn buffers_are_aligned_and_pool_blocks_until_put() {
        let pool = Arc::new(BufferPool::new(1));
        let b = pool.get().unwrap();
        assert_eq!(b.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
        assert_eq!(b.capacity(), CHUNK_SIZE as usize);
        let p2 = pool.clone();
        let t = std::thread::spawn(move || p2.get().is_some());
        std::thread::sleep(std::time::Duration::from_millis(20));
        pool.put(b);
        assert!(t.join().unwrap());
        pool.close();
        assert!(pool.get().is_none());
    }
}
