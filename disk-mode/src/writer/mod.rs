//! The receiver pipeline: plan a manifest against `--root`, then let data
//! streams (tasks of the data workers) hand blocks to writer threads per
//! device.
//!
//! [`ReceivePipeline::prepare`] validates every path ([`super::safepath`]),
//! creates directories, and answers per file what is already there
//! ([`super::partial`]). Each file is bound to one writer worker of its
//! device group (round-robin), so a file's state has one owner and needs no
//! lock. A worker creates `.NAME.longhaul-part`, preallocates it (fallocate;
//! sparse files only get their size, so holes stay holes), `pwrite`s blocks
//! at their offsets in whatever order they come ([`WRITE_DEPTH`] writes in
//! flight through [`super::ioqueue`]; a chunk counts once its write returned), folds
//! chunk hashes into an [`OrderedDigest`] and saves the verified offset in
//! the sidecar as it grows. When every chunk is in and the sender's checksum
//! has arrived, the worker's finisher thread (which also saves the sidecars,
//! so journal round trips never stall the data writes) compares the
//! checksums; a match sets mode and mtime, syncs the data and renames the
//! file into place, a mismatch is an error naming the file. A full disk is
//! an error naming the file and keeps the partial data for resume.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use xxhash_rust::xxh3::Xxh3;

use super::buffer::{AlignedBuf, BufferPool, Take};
use super::checksum::{chunk_count, chunk_len, hash_prefix, FileDigest, OrderedDigest};
use super::claims::{ClaimKey, ClaimSet, Claimant};
use super::devices::{snapshot, DeviceGroup, DeviceMap};
use super::ioqueue::{Backend, IoQueue, Kicker, Op};
use super::partial::{self, Have, PartState};
use super::safepath::{self, Dir, Root};
use super::wire::{
    Block, DiskReport, FileFailure, FrameHeader, FrameKind, Manifest, ManifestEntry, Plan,
    FRAME_HEADER_LEN,
};
use super::{DiskError, DiskOptions, CHUNK_SIZE, DIRECT_ALIGN, MAX_FILE_SIZE};
use crate::datapath::{Progress, StreamIo};
use crate::workers::{WaitList, Waker};

mod files;
mod intake;
mod plan;
mod queue;
mod worker;

use files::*;
pub(crate) use intake::Intake;
use plan::*;
use queue::*;
pub(crate) use worker::WRITE_DEPTH;
use worker::*;

/// Save the sidecar each time the verified prefix grows by this much: a
/// crash loses at most this much progress, and a 2 GiB file costs ~128
/// small renames.
const STATE_SAVE_BYTES: u64 = 16 << 20;

/// Most blocks (data or hole frames) a session's writers keep parked, in
/// all its files' [`OrderedDigest`]s, waiting for an earlier chunk of their
/// file; a frame beyond that fails the session, naming its file. A parked
/// block costs ~50 bytes (a B-tree entry, measured), so this is ~50 MiB,
/// well under the session's block pool. Without it a sender that never
/// sent chunk 0 parked one entry per 32-byte `Hole` frame: ~1 GiB for
/// 512 MB of frames into one sparse 16 TiB file, more over many files.
///
/// One bound per session, not per file: a per-file bound alone allows it
/// once per manifest entry (4 Mi of them), and one big file can honestly
/// take all of a session's reordering, so a per-file bound could not be
/// lower than this one.
///
/// How far an honest sender gets ahead: one reader reads each file in
/// order, so a chunk is overtaken by later chunks of its file only
/// - among its reader's reads in flight (`READ_DEPTH` - 1 = 3);
/// - between the streams: once a stream has written a frame into its
///   socket the frame holds no pool buffer, so while it waits behind its
///   stream's socket buffers the other streams go on. At most about
///   (streams - 1) x both ends' socket buffers (the kernel doubles what is
///   asked): ~500 chunks at 64 streams with the default 2 MB, ~8 K at
///   1,024 streams, ~260 K at 1,024 streams with 64 MB;
/// - on this side, while it waits for a pool buffer, for room in its
///   writer's queue or for its write: within the pool, the queues and the
///   writes in flight, ~1.2 K blocks at 1,024 streams;
/// - and a sparse file adds at most one hole frame per data frame (x 2).
///
/// (64 streams over loopback peak at ~80.) The part between the streams is
/// bounded by time more than by buffers: a stream slowed to a trickle (not
/// idle, so the 30 s data idle timeout spares it) holds its chunk back
/// while the others deliver. 1 Mi still covers a chunk held back a whole
/// 30 s while the others move 100 Gb/s, with a hole frame next to every
/// data frame (2 x 30 s x 12.5 GB/s / 1 MiB = ~720 K).
pub(crate) const MAX_PARKED_BLOCKS: usize = 1 << 20;

/// Most files a session's writers keep open at once, shared out among them
/// (but at least [`WRITE_DEPTH`] + 1 each, so that one always has a file
/// without writes in flight to close). Each holds its temporary file, its
/// directory and, with `--direct`, a second descriptor of the file. Past
/// a writer's share, the file its least recent frame went to, with no write
/// in flight, is closed and reopened when its next data frame comes
/// ([`Worker::ensure_open`]). Without it a sender could make the server
/// open every manifest entry (4 Mi of them) by sending one frame each, and
/// a process out of descriptors also fails every other session's files and
/// its accepts. An honest sender has about one file per stream in progress
/// (its readers read each file in order), so this closes files only past
/// 256 streams of large files, where a reopen (a few syscalls and a walk
/// down the path) is small beside the 1 MiB write it serves.
pub(crate) const MAX_OPEN_FILES: usize = 256;

/// Complete files and sidecar saves a session's writers may queue for
/// their finishers, shared out among them (at least 2 each): queued files
/// hold their descriptors too.
const FINISH_QUEUE: usize = 64;

/// A file the receiver expects blocks for.
#[derive(Debug, Clone)]
struct Expect {
    entry: ManifestEntry,
    /// Full wire path (dest joined), for messages and resolution.
    path: String,
    from: u64,
    worker: usize,
    group: usize,
}

/// A block as the receiving stream hands it to the file's writer: a chunk
/// carries its hash, computed by the stream piece by piece as the bytes
/// arrived (while they are in the cache), so the writer only waits for the
/// disk.
type Work = Block<u64>;

#[derive(Default)]
struct Totals {
    files: u64,
    file_bytes: u64,
    skipped: u64,
    skipped_bytes: u64,
    skipped_by_checksum: u64,
    skipped_by_checksum_bytes: u64,
    /// Of `file_bytes`: the resumed prefixes of the files completed in
    /// this session (verified on this side, not sent again).
    resumed_bytes: u64,
    failures: Vec<FileFailure>,
    done: Vec<bool>,
}

struct Shared {
    root: Root,
    files: Vec<Option<Expect>>,
    pool: Arc<BufferPool>,
    groups: Vec<Arc<DeviceGroup>>,
    totals: Mutex<Totals>,
    written: AtomicU64,
    /// Blocks parked in the writers' digests ([`MAX_PARKED_BLOCKS`]): the
    /// writers count, the streams refuse frames beyond the bound.
    parked: AtomicUsize,
    /// Files holding descriptors, in all this session's writers, and the
    /// most there have been.
    open_files: AtomicUsize,
    open_files_peak: AtomicUsize,
    /// Each writer's share of [`MAX_OPEN_FILES`] and of [`FINISH_QUEUE`].
    open_per_writer: usize,
    finish_queue: usize,
    direct: bool,
    /// This session's claims on its destination files: released when the
    /// last writer has ended (the writers hold `Shared`), not before, so no
    /// other session writes a file this one still has writes queued for.
    _claims: Option<ClaimSet>,
}

/// The writers' work queues and threads, one of each per writer.
type Writers = (Vec<Arc<WorkQueue>>, Vec<JoinHandle<()>>);

/// Starts the session's `nworkers` writers, each with its IO queue and its
/// work queue (up to one block per stream of `streams`).
fn start_writers(
    shared: &Arc<Shared>,
    nworkers: usize,
    streams: usize,
    dest: &str,
) -> Result<Writers, DiskError> {
    let mut queues = Vec::new();
    let mut handles = Vec::new();
    let backend = Backend::from_env();
    for _ in 0..nworkers {
        let mut io = IoQueue::new(WRITE_DEPTH, backend);
        let kicker = io
            .kicker()
            .map_err(|e| DiskError::from_io(dest.to_string(), e))?;
        // Up to one block per stream queued per worker: a writer that
        // is descheduled for a moment does not stall every stream at
        // once. Memory stays bounded by the buffer pool either way.
        let queue = Arc::new(WorkQueue::new(streams.max(4), kicker));
        queues.push(queue.clone());
        let sh = shared.clone();
        handles.push(
            std::thread::Builder::new()
                .name("lh-disk-write".into())
                .spawn(move || write_worker(queue, io, sh))
                .expect("spawn writer thread"),
        );
    }
    Ok((queues, handles))
}

/// The running receiver pipeline; share it (Arc) with every data stream.
/// Dropped without [`Self::finish`] (a failed session), it still stops its
/// writers: they finish the writes in flight, save resume sidecars and end.
pub(crate) struct ReceivePipeline {
    shared: Arc<Shared>,
    /// One per writer worker.
    queues: Vec<Arc<WorkQueue>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    dirs: Vec<(String, ManifestEntry)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ReceivePipeline {
    /// Plan `manifest` beneath `root`: refuse unsafe paths, create
    /// directories, decide what to skip or resume, start writer workers.
    /// With a `claimant` (the server), every file is claimed for this
    /// session first ([`super::claims`]); a file another live session holds
    /// is refused, never skipped or written.
    pub(crate) fn prepare(
        root: &Path,
        manifest: &Manifest,
        opts: &DiskOptions,
        claimant: Option<&Claimant>,
    ) -> Result<(Arc<ReceivePipeline>, Plan), DiskError> {
        if manifest.chunk_size != CHUNK_SIZE {
            return Err(DiskError::Refused {
                path: manifest.dest.clone(),
                reason: format!(
                    "chunk size {} (this receiver uses {CHUNK_SIZE})",
                    manifest.chunk_size
                ),
            });
        }
        safepath::validate_dest(&manifest.dest)?;
        let root = Root::open(root)?;
        let mut planning = Planning {
            root: &root,
            manifest,
            claimant,
            claims: claimant.map(Claimant::start),
            map: DeviceMap::new(&opts.sysfs),
            plan: Plan::default(),
            totals: Totals {
                done: vec![true; manifest.entries.len()],
                ..Totals::default()
            },
            dirs: Vec::new(),
        };
        let mut expected: Vec<Expect> = Vec::new();
        for (i, e) in manifest.entries.iter().enumerate() {
            if e.id as usize != i {
                return Err(DiskError::Refused {
                    path: e.path.clone(),
                    reason: "manifest ids out of order".into(),
                });
            }
            let path = safepath::join(&manifest.dest, &e.path);
            match planning.entry(e, &path) {
                Ok(Some(x)) => expected.push(x),
                Ok(None) => {}
                Err(err) => {
                    let f = FileFailure::new(e.id, &path, &err);
                    planning.plan.refused.push(f.clone());
                    planning.totals.failures.push(f);
                }
            }
        }
        let Planning {
            claims,
            map,
            plan,
            mut totals,
            dirs,
            ..
        } = planning;
        // Bind each file to a worker of its group, round-robin.
        let per_device = opts.io_workers_per_device.max(1);
        let ngroups = map.groups().len().max(1);
        let mut dealt = vec![0usize; ngroups];
        let mut files: Vec<Option<Expect>> = vec![None; manifest.entries.len()];
        for mut x in expected {
            x.worker = x.group * per_device + dealt[x.group] % per_device;
            dealt[x.group] += 1;
            totals.done[x.entry.id as usize] = false;
            let id = x.entry.id as usize;
            files[id] = Some(x);
        }
        let nworkers = ngroups * per_device;
        let pool = Arc::new(BufferPool::new(super::reader::pool_buffers(
            opts.streams,
            nworkers,
        )));
        let shared = Arc::new(Shared {
            root,
            files,
            pool: pool.clone(),
            groups: map.groups().to_vec(),
            totals: Mutex::new(totals),
            written: AtomicU64::new(0),
            parked: AtomicUsize::new(0),
            open_files: AtomicUsize::new(0),
            open_files_peak: AtomicUsize::new(0),
            open_per_writer: (MAX_OPEN_FILES / nworkers).max(WRITE_DEPTH + 1),
            finish_queue: (FINISH_QUEUE / nworkers).max(2),
            direct: opts.direct,
            _claims: claims,
        });
        let (queues, handles) = start_writers(&shared, nworkers, opts.streams, &manifest.dest)?;
        let pipe = ReceivePipeline {
            shared,
            queues,
            workers: Mutex::new(handles),
            dirs,
        };
        Ok((Arc::new(pipe), plan))
    }

    /// Device groups and their live counters (for the stats API).
    pub(crate) fn groups(&self) -> &[Arc<DeviceGroup>] {
        &self.shared.groups
    }

    /// Payload bytes written so far.
    pub(crate) fn written_bytes(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    /// Blocks parked in the writers' digests now ([`MAX_PARKED_BLOCKS`]).
    #[cfg(test)]
    pub(super) fn parked_blocks(&self) -> usize {
        self.shared.parked.load(Ordering::Relaxed)
    }

    /// The most files this session's writers held open at once
    /// ([`MAX_OPEN_FILES`] among them).
    #[cfg(test)]
    pub(super) fn open_files_peak(&self) -> usize {
        self.shared.open_files_peak.load(Ordering::Relaxed)
    }

    /// Writer workers of this session.
    #[cfg(test)]
    pub(super) fn writers(&self) -> usize {
        self.queues.len()
    }

    /// Checks a frame header against the manifest: the file it names
    /// and, for data and holes, that the range lies inside the file and
    /// that the session's parked blocks are below [`MAX_PARKED_BLOCKS`].
    fn check(&self, h: &FrameHeader) -> io::Result<&Expect> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
        let x = self
            .shared
            .files
            .get(h.file as usize)
            .and_then(|f| f.as_ref())
            .ok_or_else(|| bad(format!("block for unexpected file id {}", h.file)))?;
        let size = x.entry.size;
        match h.kind {
            FrameKind::Data => {
                let index = h.offset / CHUNK_SIZE;
                if h.offset >= size || u64::from(h.len) != chunk_len(index, size) {
                    return Err(bad(format!(
                        "block at {} of {} bytes outside {}",
                        h.offset, h.len, x.path
                    )));
                }
            }
            FrameKind::Hole => match h.offset.checked_add(h.value) {
                Some(end) if end <= size => {}
                _ => return Err(bad(format!("hole outside {}", x.path))),
            },
            _ => {}
        }
        if matches!(h.kind, FrameKind::Data | FrameKind::Hole) {
            // The writers count after the fact: this overshoots by at most
            // what their queues and writes in flight hold.
            let parked = self.shared.parked.load(Ordering::Relaxed);
            if parked >= MAX_PARKED_BLOCKS {
                return Err(bad(format!(
                    "block for {} refused: {parked} blocks already wait for earlier chunks of \
                     their files (at most {MAX_PARKED_BLOCKS}): the sender skips chunks",
                    x.path
                )));
            }
        }
        Ok(x)
    }

    /// After every stream ended (or failed): stop the writers, name every
    /// file that did not complete, apply directory metadata, and report.
    pub(crate) fn finish(&self) -> DiskReport {
        for q in &self.queues {
            q.close();
        }
        let handles: Vec<_> = std::mem::take(&mut *lock(&self.workers));
        for h in handles {
            let _ = h.join();
        }
        // Directories last, deepest first: writing into them moved mtimes.
        for (path, e) in self.dirs.iter().rev() {
            if let Ok(comps) = safepath::components(path) {
                if let Ok(d) = self.shared.root.open_dir(&comps, false, path) {
                    let _ = d.set_meta(e.mode, (e.mtime_sec, e.mtime_nsec));
                }
            }
        }
        let mut t = lock(&self.shared.totals);
        let missing: Vec<FileFailure> = t
            .done
            .iter()
            .enumerate()
            .filter(|(_, d)| !**d)
            .filter_map(|(i, _)| self.shared.files[i].as_ref())
            .filter(|x| !t.failures.iter().any(|f| f.id == x.entry.id))
            .map(|x| FileFailure {
                id: x.entry.id,
                path: x.path.clone(),
                code: "incomplete".into(),
                error: format!("incomplete: the transfer ended before all of {} arrived (partial data kept for resume)", x.path),
            })
            .collect();
        t.failures.extend(missing);
        t.failures.sort_by_key(|f| f.id);
        DiskReport {
            files: t.files,
            file_bytes: t.file_bytes,
            skipped: t.skipped,
            skipped_bytes: t.skipped_bytes,
            skipped_by_checksum: t.skipped_by_checksum,
            skipped_by_checksum_bytes: t.skipped_by_checksum_bytes,
            resumed_bytes: t.resumed_bytes,
            written_bytes: self.written_bytes(),
            failures: t.failures.clone(),
            devices: snapshot(&self.shared.groups),
        }
    }
}

impl Drop for ReceivePipeline {
    /// A session that failed never calls `finish`: close the queues so each
    /// writer drains, saves what arrived for resume and ends (no join: a
    /// slow disk must not hold the thread that drops the last stream).
    fn drop(&mut self) {
        for q in &self.queues {
            q.close();
        }
    }
}
