//! Page-aligned block buffers and the fixed pool they come from.
//!
//! Every block in flight, on either end, sits in one of these buffers, and
//! the pool never grows: that is what keeps RSS flat whatever the tree size.
//! Buffers are [`DIRECT_ALIGN`]-aligned so the same buffer serves buffered
//! and O_DIRECT IO.
//!
//! A pool's buffers are carved from one [`Region`] backed by transparent
//! huge pages where the kernel grants them: a 1 MiB O_DIRECT request from
//! 4 KiB pages has 256 pieces, more than many devices take in one request
//! (virtio-blk here: 254), so the block layer splits it in two; from a
//! huge page it is one piece and one request. docs/performance.md has the
//! measurement.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};

use crate::workers::{WaitList, Waker};

use super::{CHUNK_SIZE, DIRECT_ALIGN};

/// A heap buffer of `capacity` bytes aligned to [`DIRECT_ALIGN`], with a
/// fill length.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
    /// The region the buffer was carved from (freed with the region's last
    /// buffer); `None`: a heap allocation of its own.
    region: Option<Arc<Region>>,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.max(DIRECT_ALIGN).next_multiple_of(DIRECT_ALIGN);
        let layout = Layout::from_size_align(cap, DIRECT_ALIGN).expect("valid buffer layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            cap,
            len: 0,
            region: None,
        }
    }

    /// Buffers of `cap` bytes each, `count` of them, from one region.
    fn carve(count: usize, cap: usize) -> Vec<AlignedBuf> {
        let Some(region) = Region::new(count * cap) else {
            return (0..count).map(|_| AlignedBuf::new(cap)).collect();
        };
        let region = Arc::new(region);
        (0..count)
            .map(|i| AlignedBuf {
                // SAFETY: i * cap + cap <= the region's length.
                ptr: unsafe { NonNull::new_unchecked(region.ptr.as_ptr().add(i * cap)) },
                cap,
                len: 0,
                region: Some(region.clone()),
            })
            .collect()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "length beyond capacity");
        self.len = len;
    }

    /// The filled part.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialized (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The first `n` bytes, whatever the fill length (`n` <= capacity).
    pub(crate) fn head(&self, n: usize) -> &[u8] {
        assert!(n <= self.cap, "length beyond capacity");
        // SAFETY: ptr is valid for cap >= n initialized (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), n) }
    }

    /// Start of the allocation (for IO the kernel does on our behalf).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The whole capacity, to fill.
    pub(crate) fn as_mut_full(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap initialized bytes, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.region.is_some() {
            return;
        }
        let layout = Layout::from_size_align(self.cap, DIRECT_ALIGN).expect("valid buffer layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// Huge page size of x86-64 and arm64 (4K pages): the region's alignment.
const HUGE_PAGE: usize = 2 << 20;

/// Anonymous memory aligned to [`HUGE_PAGE`], asked to be backed by
/// transparent huge pages (`MADV_HUGEPAGE`; with THP set to `never` it
/// still works, on 4 KiB pages). Zero-filled, faulted in on first use.
struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory; the buffers carved from it are
// disjoint and each is owned by one AlignedBuf.
unsafe impl Send for Region {}
// SAFETY: Region itself hands out no access.
unsafe impl Sync for Region {}

impl Region {
    /// `None` where the mapping fails (the caller falls back to the heap).
    fn new(bytes: usize) -> Option<Region> {
        let len = bytes.max(1).next_multiple_of(HUGE_PAGE);
        let span = len + HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping; no existing memory.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        let head = aligned - start;
        let tail = HUGE_PAGE - head;
        // SAFETY: both trims lie inside the mapping made above and outside
        // [aligned, aligned + len), which we keep; munmap of a zero length
        // is skipped.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            // Advice only: without THP the region stays on small pages.
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(Region {
            ptr: NonNull::new(aligned as *mut u8)?,
            len,
        })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping of `new`; no buffer into it is left (each
        // holds an Arc to the region).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A fixed set of chunk-sized buffers. `get` blocks while all are in use
/// (IO threads); `take` never blocks and wakes the data worker's stream
/// when a buffer comes back; `close` wakes every waiter with `None` so a
/// failed pipeline unwinds.
pub(crate) struct BufferPool {
    state: Mutex<(Vec<AlignedBuf>, bool)>,
    ready: Condvar,
    waiting: WaitList,
    total: usize,
}

/// What [`BufferPool::take`] got.
pub(crate) enum Take {
    Buf(AlignedBuf),
    /// None free: the waker runs when one is put back.
    Later,
    Closed,
}

impl BufferPool {
    pub(crate) fn new(count: usize) -> Self {
        let count = count.max(1);
        let bufs = AlignedBuf::carve(count, CHUNK_SIZE as usize);
        BufferPool {
            state: Mutex::new((bufs, false)),
            ready: Condvar::new(),
            waiting: WaitList::default(),
            total: count,
        }
    }

    /// Buffers the pool was created with.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    pub(crate) fn get(&self) -> Option<AlignedBuf> {
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
    pub(crate) fn take(&self, waker: &Waker) -> Take {
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

    pub(crate) fn put(&self, buf: AlignedBuf) {
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.0.push(buf);
            self.ready.notify_one();
        }
        self.waiting.wake_one();
    }

    pub(crate) fn close(&self) {
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

    /// The AnonHugePages of the mapping that holds `addr`, in KiB.
    fn huge_kib_at(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&addr);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("AnonHugePages:") {
                    return v.trim().trim_end_matches("kB").trim().parse().ok();
                }
            }
        }
        None
    }

    #[test]
    fn pool_buffers_are_carved_from_one_huge_page_region() {
        let pool = BufferPool::new(5);
        let mut bufs: Vec<AlignedBuf> = (0..5).map(|_| pool.get().unwrap()).collect();
        let mut addrs: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
        addrs.sort();
        assert!(bufs.iter().all(|b| b.region.is_some()));
        // Adjacent, whole chunks, the region starting on a huge page: each
        // 1 MiB buffer lies inside one 2 MiB page.
        assert_eq!(addrs[0] % HUGE_PAGE, 0);
        for w in addrs.windows(2) {
            assert_eq!(w[1] - w[0], CHUNK_SIZE as usize);
        }
        for (i, b) in bufs.iter_mut().enumerate() {
            b.as_mut_full().fill(i as u8 + 1);
            b.set_len(CHUNK_SIZE as usize);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.as_slice().iter().all(|&x| x == i as u8 + 1));
        }
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !thp.contains("[never]") {
            let huge = huge_kib_at(addrs[0]).expect("the region is in /proc/self/smaps");
            assert!(
                huge >= 2048,
                "THP is '{}' but the pool has {huge} KiB of huge pages",
                thp.trim()
            );
        }
        // Buffers outlive the pool; the region goes with the last of them.
        let region = Arc::downgrade(bufs[0].region.as_ref().unwrap());
        drop(pool);
        let last = bufs.pop().unwrap();
        drop(bufs);
        assert!(
            region.upgrade().is_some(),
            "region kept while a buffer is out"
        );
        drop(last);
        assert!(
            region.upgrade().is_none(),
            "region freed with its last buffer"
        );
    }
}
