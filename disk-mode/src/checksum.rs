//! The per-file checksum and the hole-aware helpers that compute it.
//!
//! A file's checksum is xxh3-64 over the little-endian xxh3-64 of each
//! [`CHUNK_SIZE`] chunk (the last one may be short). The sender computes it
//! while reading; the receiver computes it from the bytes it writes. Because
//! the receiver gets chunks from many streams in any order, [`OrderedDigest`]
//! parks out-of-order chunk hashes until the gap before them closes; the
//! contiguous prefix it has hashed is the file's "verified offset" that resume
//! continues from. A chunk that is all hole hashes to a precomputed constant,
//! so a 1 GiB sparse file costs almost nothing to checksum.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::OnceLock;

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::CHUNK_SIZE;

/// Hash of one chunk's bytes.
pub(crate) fn chunk_hash(data: &[u8]) -> u64 {
    xxh3_64(data)
}

fn zeros() -> &'static [u8] {
    static ZEROS: OnceLock<Vec<u8>> = OnceLock::new();
    ZEROS.get_or_init(|| vec![0u8; CHUNK_SIZE as usize])
}

/// Hash of a chunk of `len` zero bytes (`len <= CHUNK_SIZE`).
pub(crate) fn zero_chunk_hash(len: u64) -> u64 {
    static FULL: OnceLock<u64> = OnceLock::new();
    if len == CHUNK_SIZE {
        *FULL.get_or_init(|| xxh3_64(zeros()))
    } else {
        xxh3_64(&zeros()[..len as usize])
    }
}

/// Length of chunk `index` of a file of `size` bytes.
pub(crate) fn chunk_len(index: u64, size: u64) -> u64 {
    size.saturating_sub(index * CHUNK_SIZE).min(CHUNK_SIZE)
}

/// Number of chunks of a file of `size` bytes.
pub(crate) fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK_SIZE)
}

/// Runs of equal chunk hashes a [`FileDigest`] keeps as they are before it
/// folds them into an xxh3 state.
const FEW_RUNS: usize = 4;

/// Folds chunk hashes, in file order, into the file checksum.
///
/// A receiver holds one per file in progress, and a sender may put a
/// million files in progress with one frame each. So the first
/// [`FEW_RUNS`] runs of equal hashes (a hole is one run, however long) are
/// kept inline, 72 bytes, and only a file with more runs (a sender sent
/// it at least two chunks of data) gets a boxed xxh3 state of about 600
/// bytes. The checksum is the same: xxh3 over the hashes' bytes, however
/// they are split.
#[derive(Clone)]
pub(crate) struct FileDigest {
    state: Fold,
}

#[derive(Clone)]
enum Fold {
    /// (hash, how many times), in file order.
    Runs {
        runs: [(u64, u64); FEW_RUNS],
        len: u8,
    },
    Streaming(Box<Xxh3>),
}

impl Default for FileDigest {
    fn default() -> Self {
        FileDigest {
            state: Fold::Runs {
                runs: [(0, 0); FEW_RUNS],
                len: 0,
            },
        }
    }
}

impl FileDigest {
    pub(crate) fn push(&mut self, chunk_hash: u64) {
        self.push_repeated(chunk_hash, 1);
    }

    /// `push(chunk_hash)` `n` times.
    pub(crate) fn push_repeated(&mut self, chunk_hash: u64, n: u64) {
        if n == 0 {
            return;
        }
        if let Fold::Runs { runs, len } = &mut self.state {
            let kept = *len as usize;
            if kept > 0 && runs[kept - 1].0 == chunk_hash {
                runs[kept - 1].1 += n;
                return;
            }
            if kept < FEW_RUNS {
                runs[kept] = (chunk_hash, n);
                *len += 1;
                return;
            }
            let mut hasher = Box::new(Xxh3::new());
            for &(hash, n) in &runs[..kept] {
                fold(&mut hasher, hash, n);
            }
            self.state = Fold::Streaming(hasher);
        }
        if let Fold::Streaming(hasher) = &mut self.state {
            fold(hasher, chunk_hash, n);
        }
    }

    pub(crate) fn finish(&self) -> u64 {
        match &self.state {
            Fold::Runs { runs, len } => {
                let mut hasher = Xxh3::new();
                for &(hash, n) in &runs[..*len as usize] {
                    fold(&mut hasher, hash, n);
                }
                hasher.digest()
            }
            Fold::Streaming(hasher) => hasher.digest(),
        }
    }
}

/// Feeds `hash` `n` times into `hasher` in a few large updates: a hole of
/// 2^30 chunks costs the time xxh3 takes over 8 GiB, not 2^30 calls.
fn fold(hasher: &mut Xxh3, hash: u64, n: u64) {
    const BATCH: usize = 512;
    let mut batch = [0u8; 8 * BATCH];
    for b in batch.chunks_exact_mut(8) {
        b.copy_from_slice(&hash.to_le_bytes());
    }
    let mut left = n;
    while left > 0 {
        let k = left.min(BATCH as u64);
        hasher.update(&batch[..8 * k as usize]);
        left -= k;
    }
}

/// The checksum of a whole buffer, as if it were a file (for tests).
#[cfg(test)]
pub(crate) fn checksum_bytes(data: &[u8]) -> u64 {
    let mut d = FileDigest::default();
    for chunk in data.chunks(CHUNK_SIZE as usize) {
        d.push(chunk_hash(chunk));
    }
    d.finish()
}

enum Parked {
    Data(u64),
    /// `n` chunks of zeros starting at the key.
    Zeros(u64),
}

/// Receiver-side digest that accepts chunk hashes in any order.
pub(crate) struct OrderedDigest {
    size: u64,
    next: u64,
    parked: BTreeMap<u64, Parked>,
    digest: FileDigest,
}

impl OrderedDigest {
    /// A digest of a `size`-byte file whose first `prefix` chunks are
    /// already folded into `digest`.
    pub(crate) fn resume(size: u64, prefix: u64, digest: FileDigest) -> Self {
        OrderedDigest {
            size,
            next: prefix,
            parked: BTreeMap::new(),
            digest,
        }
    }

    pub(crate) fn new(size: u64) -> Self {
        Self::resume(size, 0, FileDigest::default())
    }

    /// Chunk `index` holds data hashing to `hash`. Chunks before the
    /// verified prefix are ignored (a duplicate after resume).
    pub(crate) fn data(&mut self, index: u64, hash: u64) {
        if index >= self.next {
            self.parked.insert(index, Parked::Data(hash));
            self.advance();
        }
    }

    /// Chunks `first .. first + count` are all zeros (a hole).
    pub(crate) fn zeros(&mut self, first: u64, count: u64) {
        let end = first + count;
        if end > self.next && count > 0 {
            let first = first.max(self.next);
            self.parked.insert(first, Parked::Zeros(end - first));
            self.advance();
        }
    }

    fn advance(&mut self) {
        while let Some(p) = self.parked.remove(&self.next) {
            match p {
                Parked::Data(h) => {
                    self.digest.push(h);
                    self.next += 1;
                }
                Parked::Zeros(n) => {
                    // Whole chunks in one go; only the file's last chunk
                    // can be short.
                    let end = self.next + n;
                    let whole = end.min(self.size / CHUNK_SIZE).saturating_sub(self.next);
                    self.digest
                        .push_repeated(zero_chunk_hash(CHUNK_SIZE), whole);
                    self.next += whole;
                    while self.next < end {
                        self.digest
                            .push(zero_chunk_hash(chunk_len(self.next, self.size)));
                        self.next += 1;
                    }
                }
            }
        }
    }

    /// Some chunk of `first .. end` is folded in or waiting: a frame for it
    /// would be a second one (parked runs never overlap, as long as every
    /// frame is checked with this first).
    pub(crate) fn holds_any(&self, first: u64, end: u64) -> bool {
        if first >= end {
            return false;
        }
        if first < self.next {
            return true;
        }
        self.parked
            .range(..end)
            .next_back()
            .is_some_and(|(&k, p)| match p {
                Parked::Data(_) => k >= first,
                Parked::Zeros(n) => k + n > first,
            })
    }

    /// Chunk hashes and zero runs waiting for an earlier chunk: the memory
    /// out-of-order arrivals hold (the receiver bounds it per session).
    pub(crate) fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Bytes from the start of the file whose hashes are folded in.
    pub(crate) fn verified_offset(&self) -> u64 {
        (self.next * CHUNK_SIZE).min(self.size)
    }

    /// Every chunk is folded in.
    pub(crate) fn complete(&self) -> bool {
        self.next >= chunk_count(self.size)
    }

    pub(crate) fn finish(&self) -> u64 {
        self.digest.finish()
    }
}

/// First data offset at or after `offset`, `None` if only a hole follows.
/// File systems without SEEK_DATA report everything as data.
pub(crate) fn next_data(file: &File, offset: u64) -> io::Result<Option<u64>> {
    // SAFETY: lseek on a valid descriptor has no memory effects.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, libc::SEEK_DATA) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(Some(offset)),
        _ => Err(err),
    }
}

/// Read `buf.len()` bytes at `offset`, or fewer at EOF; returns the bytes
/// read. A short read is EOF for a regular file, and stopping there matters
/// for O_DIRECT, where retrying at the unaligned offset after a short tail
/// would fail with EINVAL instead of returning 0.
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    loop {
        match file.read_at(buf, offset) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Hash chunks `0..chunks` of a `size`-byte file into `digest`, skipping
/// holes when `sparse`; `buf` must hold a chunk (aligned if `file` is
/// O_DIRECT). Returns the bytes actually read, or `UnexpectedEof` when the
/// file is shorter than `size`.
pub(crate) fn hash_prefix(
    file: &File,
    size: u64,
    chunks: u64,
    sparse: bool,
    buf: &mut [u8],
    digest: &mut FileDigest,
) -> io::Result<u64> {
    let mut read = 0;
    let mut data_from = 0u64;
    let mut index = 0;
    while index < chunks {
        let off = index * CHUNK_SIZE;
        let len = chunk_len(index, size);
        if sparse && off + len > data_from {
            data_from = next_data(file, off)?.unwrap_or(u64::MAX);
        }
        if sparse && data_from >= off + len {
            digest.push(zero_chunk_hash(len));
        } else {
            let want = len as usize;
            // O_DIRECT wants aligned lengths: read a whole chunk buffer and
            // let EOF shorten it.
            let n = read_full_at(file, &mut buf[..CHUNK_SIZE as usize], off)?;
            if n < want {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shorter than expected",
                ));
            }
            read += want as u64;
            digest.push(chunk_hash(&buf[..want]));
        }
        index += 1;
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_digest_matches_sequential_in_any_order() {
        let size = 3 * CHUNK_SIZE + 7;
        let mut data = vec![0u8; size as usize];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        // Chunk 1 is a hole.
        data[CHUNK_SIZE as usize..2 * CHUNK_SIZE as usize].fill(0);
        let want = checksum_bytes(&data);
        let hash = |i: u64| {
            let s = (i * CHUNK_SIZE) as usize;
            let e = (s + CHUNK_SIZE as usize).min(data.len());
            chunk_hash(&data[s..e])
        };
        let mut d = OrderedDigest::new(size);
        d.data(3, hash(3));
        d.data(2, hash(2));
        assert_eq!(d.verified_offset(), 0);
        d.zeros(1, 1);
        assert!(!d.complete());
        d.data(0, hash(0));
        assert!(d.complete());
        assert_eq!(d.verified_offset(), size);
        assert_eq!(d.finish(), want);
    }

    /// The checksum of a `size`-byte file whose chunks in `data` hold data
    /// (hashing to their index) and whose other chunks are holes, folded
    /// one chunk at a time as the wire format defines it.
    fn chunk_by_chunk(size: u64, data: &[u64]) -> u64 {
        let mut d = FileDigest::default();
        for i in 0..chunk_count(size) {
            d.push(if data.contains(&i) {
                i
            } else {
                zero_chunk_hash(chunk_len(i, size))
            });
        }
        d.finish()
    }

    #[test]
    fn zero_runs_fold_in_batches_to_the_same_checksum() {
        for size in [
            1000 * CHUNK_SIZE,
            1000 * CHUNK_SIZE + 7,
            5,
            513 * CHUNK_SIZE,
        ] {
            let n = chunk_count(size);
            // The whole file one hole.
            let mut d = OrderedDigest::new(size);
            d.zeros(0, n);
            assert!(d.complete());
            assert_eq!(d.finish(), chunk_by_chunk(size, &[]), "size {size}");
            if n < 3 {
                continue;
            }
            // Data at both ends and in the middle, holes between, the hole
            // before the middle one arriving first and parked.
            let mid = n / 2;
            let mut d = OrderedDigest::new(size);
            d.zeros(mid + 1, n - mid - 2);
            d.data(mid, mid);
            d.zeros(1, mid - 1);
            assert_eq!(d.parked(), 3);
            d.data(0, 0);
            assert_eq!(d.parked(), 0);
            assert!(!d.complete());
            d.data(n - 1, n - 1);
            assert!(d.complete());
            assert_eq!(
                d.finish(),
                chunk_by_chunk(size, &[0, mid, n - 1]),
                "size {size}"
            );
        }
    }

    #[test]
    fn a_hole_over_the_largest_file_folds_in_seconds() {
        // 2^30 chunks: chunk by chunk this took minutes in a debug build.
        let size = super::super::MAX_FILE_SIZE;
        let t = std::time::Instant::now();
        let mut d = OrderedDigest::new(size);
        d.zeros(0, chunk_count(size));
        assert!(d.complete());
        d.finish();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            t.elapsed()
        );
    }

    /// Hash sequences with every number of runs around the inline limit,
    /// pushed one by one and in runs: the checksum is xxh3 over their
    /// bytes whether the digest kept them inline or folded them, and only
    /// a digest past the limit holds a boxed state.
    #[test]
    fn inline_runs_and_the_folded_state_give_one_checksum() {
        assert!(std::mem::size_of::<FileDigest>() <= 80);
        for runs in 0..=FEW_RUNS + 3 {
            // Run r: hash 1000 + r, r + 1 times (hash 7 twice in a row at
            // the end merges into one run: it is not a new one).
            let mut hashes: Vec<u64> = (0..runs)
                .flat_map(|r| std::iter::repeat_n(1000 + r as u64, r + 1))
                .collect();
            hashes.extend([7, 7]);
            let bytes: Vec<u8> = hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
            let want = xxh3_64(&bytes);
            let mut one_by_one = FileDigest::default();
            for &h in &hashes {
                one_by_one.push(h);
            }
            let mut in_runs = FileDigest::default();
            for r in 0..runs {
                in_runs.push_repeated(1000 + r as u64, r as u64 + 1);
            }
            in_runs.push_repeated(7, 0);
            in_runs.push_repeated(7, 2);
            for d in [&one_by_one, &in_runs] {
                assert_eq!(d.finish(), want, "{runs} runs");
                assert_eq!(
                    matches!(d.state, Fold::Streaming(_)),
                    runs + 1 > FEW_RUNS,
                    "{runs} runs"
                );
            }
            // A copy goes on from where the original was.
            let mut copy = in_runs.clone();
            copy.push(9);
            let mut more = bytes.clone();
            more.extend(9u64.to_le_bytes());
            assert_eq!(copy.finish(), xxh3_64(&more), "{runs} runs");
            assert_eq!(in_runs.finish(), want);
        }
    }

    #[test]
    fn empty_file_is_complete_at_once() {
        let d = OrderedDigest::new(0);
        assert!(d.complete());
        assert_eq!(d.finish(), checksum_bytes(&[]));
    }

    #[test]
    fn zero_hash_matches_real_zeros() {
        assert_eq!(
            zero_chunk_hash(CHUNK_SIZE),
            chunk_hash(&vec![0; CHUNK_SIZE as usize])
        );
        assert_eq!(zero_chunk_hash(7), chunk_hash(&[0; 7]));
    }

    #[test]
    fn hash_prefix_skips_holes_and_matches() {
        let dir = std::env::temp_dir().join(format!("lh-ck-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sparse");
        let f = File::create(&path).unwrap();
        let size = 8 * CHUNK_SIZE + 3;
        f.set_len(size).unwrap();
        f.write_at(b"hello", 5 * CHUNK_SIZE + 10).unwrap();
        let mut data = vec![0u8; size as usize];
        data[5 * CHUNK_SIZE as usize + 10..5 * CHUNK_SIZE as usize + 15].copy_from_slice(b"hello");
        let f = File::open(&path).unwrap();
        let mut buf = vec![0u8; CHUNK_SIZE as usize];
        let mut d = FileDigest::default();
        hash_prefix(&f, size, chunk_count(size), true, &mut buf, &mut d).unwrap();
        assert_eq!(d.finish(), checksum_bytes(&data));
        let mut d2 = FileDigest::default();
        hash_prefix(&f, size, chunk_count(size), false, &mut buf, &mut d2).unwrap();
        assert_eq!(d2.finish(), d.finish());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
