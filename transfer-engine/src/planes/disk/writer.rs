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
    DiskReport, FileFailure, FrameHeader, FrameKind, Manifest, ManifestEntry, Plan,
    FRAME_HEADER_LEN,
};
use super::{DiskError, DiskOptions, CHUNK_SIZE, DIRECT_ALIGN, MAX_FILE_SIZE};
use crate::datapath::{Progress, StreamIo};
use crate::workers::{WaitList, Waker};

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
pub const MAX_PARKED_BLOCKS: usize = 1 << 20;

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
pub const MAX_OPEN_FILES: usize = 256;

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

enum Work {
    Data {
        file: u32,
        offset: u64,
        buf: AlignedBuf,
        /// Chunk hash, computed by the stream that received it, piece by
        /// piece as the bytes arrived (while they are in the cache), so
        /// the writer only waits for the disk.
        hash: u64,
    },
    Hole {
        file: u32,
        offset: u64,
        len: u64,
    },
    End {
        file: u32,
        checksum: u64,
    },
    Fail {
        file: u32,
        message: String,
    },
}

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

/// The receiver's plan as it is drawn up, entry by entry of the manifest.
struct Planning<'a> {
    root: &'a Root,
    manifest: &'a Manifest,
    claimant: Option<&'a Claimant>,
    claims: Option<ClaimSet>,
    map: DeviceMap,
    plan: Plan,
    totals: Totals,
    /// Directories to create, with their entries (modes and times are set
    /// at the end).
    dirs: Vec<(String, ManifestEntry)>,
}

impl Planning<'_> {
    /// Plans one entry at `path` (its wire path): refused, a directory made,
    /// a file skipped as complete, or a file to write (from where, on which
    /// device group).
    fn entry(&mut self, e: &ManifestEntry, path: &str) -> Result<Option<Expect>, DiskError> {
        let path = path.to_string();
        let comps = safepath::components(&path)?;
        if let Some(c) = comps.iter().find(|c| partial::is_internal(c)) {
            return Err(DiskError::Refused {
                path: path.clone(),
                reason: format!("'{c}' is a name longhaul keeps for its own temporary files"),
            });
        }
        if !e.dir && e.size > MAX_FILE_SIZE {
            return Err(DiskError::Refused {
                path: path.clone(),
                reason: format!(
                    "{} bytes, more than the largest file this receiver takes ({MAX_FILE_SIZE} bytes, 1 PiB)",
                    e.size
                ),
            });
        }
        if e.dir {
            self.root.open_dir(&comps, true, &path)?;
            self.dirs.push((path.clone(), e.clone()));
            return Ok(None);
        }
        let (dir, name) = self.root.parent_of(&path, true)?;
        if let (Some(c), Some(set)) = (self.claimant, self.claims.as_mut()) {
            let key = ClaimKey {
                dir: dir
                    .identity()
                    .map_err(|err| DiskError::from_io(path.clone(), err))?,
                name: name.to_string(),
            };
            c.claim(set, key).map_err(|by| DiskError::InUse {
                path: path.clone(),
                by,
            })?;
        }
        let have = if self.manifest.resume {
            partial::what_we_have(&dir, name, e)
                .map_err(|err| DiskError::from_io(path.clone(), err))?
        } else {
            Have::Nothing
        };
        let from = match have {
            Have::Complete { by_checksum } => {
                self.skipped(e, by_checksum);
                return Ok(None);
            }
            Have::Partial(off) => {
                self.plan.resume.push((e.id, off));
                off
            }
            Have::Nothing => 0,
        };
        let dev = dir
            .dev()
            .map_err(|err| DiskError::from_io(path.clone(), err))?;
        let group = self.map.group_of(dev);
        Ok(Some(Expect {
            entry: e.clone(),
            path,
            from,
            worker: 0,
            group,
        }))
    }

    /// A file already complete here: skipped, and counted.
    fn skipped(&mut self, e: &ManifestEntry, by_checksum: bool) {
        self.plan.skip.push(e.id);
        let totals = &mut self.totals;
        totals.files += 1;
        totals.file_bytes += e.size;
        totals.skipped += 1;
        totals.skipped_bytes += e.size;
        if by_checksum {
            totals.skipped_by_checksum += 1;
            totals.skipped_by_checksum_bytes += e.size;
        }
    }
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
pub struct ReceivePipeline {
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
    pub fn prepare(
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
    pub fn groups(&self) -> &[Arc<DeviceGroup>] {
        &self.shared.groups
    }

    /// Payload bytes written so far.
    pub fn written_bytes(&self) -> u64 {
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

    /// Stop: unblock streams waiting for buffers. Partial files keep their
    /// sidecars for resume.
    pub fn abort(&self) {
        self.shared.pool.close();
    }

    /// After every stream ended (or failed): stop the writers, name every
    /// file that did not complete, apply directory metadata, and report.
    pub fn finish(&self) -> DiskReport {
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

/// Work waiting for one writer worker: bounded, so a stream that finds it
/// full stops reading its socket (TCP pushes back on the sender) until the
/// writer takes something.
struct WorkQueue {
    items: Mutex<(VecDeque<Work>, bool)>,
    cap: usize,
    /// Streams waiting for room.
    space: WaitList,
    /// Ends the writer's wait for IO completions: work arrived.
    kicker: Kicker,
}

/// What [`WorkQueue::push`] did.
enum Push {
    Queued,
    /// Full: the waker runs when there is room; the work comes back.
    Full(Work),
    Closed,
}

impl WorkQueue {
    fn new(cap: usize, kicker: Kicker) -> WorkQueue {
        WorkQueue {
            items: Mutex::new((VecDeque::new(), false)),
            cap,
            space: WaitList::default(),
            kicker,
        }
    }

    fn push(&self, work: Work, waker: &Waker) -> Push {
        {
            let mut q = lock(&self.items);
            if q.1 {
                return Push::Closed;
            }
            if q.0.len() >= self.cap {
                // Registered under the lock: a pop after it wakes us.
                self.space.add(waker);
                return Push::Full(work);
            }
            q.0.push_back(work);
        }
        self.kicker.kick();
        Push::Queued
    }

    fn pop(&self) -> Option<Work> {
        let w = lock(&self.items).0.pop_front();
        if w.is_some() {
            self.space.wake_one();
        }
        w
    }

    /// Closed and empty: the writer may stop once its IO settled.
    fn finished(&self) -> bool {
        let q = lock(&self.items);
        q.1 && q.0.is_empty()
    }

    fn close(&self) {
        lock(&self.items).1 = true;
        self.kicker.kick();
        self.space.wake_all();
    }
}

/// Where a data stream's [`Intake`] is in the frame it reads.
enum Reading {
    Header {
        buf: [u8; FRAME_HEADER_LEN],
        got: usize,
    },
    /// A data frame's payload, into a pool buffer (`None` until the pool
    /// has one), hashed piece by piece as it arrives.
    Data {
        h: FrameHeader,
        buf: Option<AlignedBuf>,
        got: usize,
    },
    Fail {
        h: FrameHeader,
        msg: Vec<u8>,
        got: usize,
    },
    /// Parsed work for a writer whose queue was full.
    Handing { work: Work, worker: usize },
}

/// One data stream's side of the receiver pipeline: reads frames off a
/// non-blocking socket and hands their work to the file's writer.
pub struct Intake {
    pipeline: Arc<ReceivePipeline>,
    state: Reading,
    hasher: Xxh3,
}

impl Intake {
    pub fn new(pipeline: Arc<ReceivePipeline>) -> Intake {
        Intake {
            pipeline,
            state: Reading::Header {
                buf: [0; FRAME_HEADER_LEN],
                got: 0,
            },
            hasher: Xxh3::new(),
        }
    }

    /// One turn; `Done` at the stream's `EndOfStream`. A protocol violation
    /// is an `InvalidData` error.
    pub fn receive(&mut self, io: &StreamIo<'_>) -> io::Result<Progress> {
        let mut moved = 0;
        loop {
            match &mut self.state {
                Reading::Handing { .. } => {
                    let Reading::Handing { work, worker } = std::mem::replace(
                        &mut self.state,
                        Reading::Header {
                            buf: [0; FRAME_HEADER_LEN],
                            got: 0,
                        },
                    ) else {
                        unreachable!("matched above")
                    };
                    match self.pipeline.queues[worker].push(work, io.waker) {
                        Push::Queued => {}
                        Push::Full(work) => {
                            self.state = Reading::Handing { work, worker };
                            return Ok(Progress::woken());
                        }
                        Push::Closed => return Err(io::Error::other("receiver shutting down")),
                    }
                }
                Reading::Header { buf, got } => {
                    if *got == 0 && moved >= io.allowance {
                        return Ok(Progress::Yield);
                    }
                    match read_some(io.sock, &mut buf[*got..])? {
                        None => return Ok(Progress::readable()),
                        Some(0) if *got == 0 => {
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "data stream closed before its end marker",
                            ))
                        }
                        Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                        Some(n) => *got += n,
                    }
                    if *got < FRAME_HEADER_LEN {
                        continue;
                    }
                    let h = FrameHeader::decode(buf)?;
                    match self.after_header(h)? {
                        Some(next) => self.state = next,
                        None => return Ok(Progress::Done),
                    }
                }
                Reading::Data { h, buf, got } => {
                    if buf.is_none() {
                        match self.pipeline.shared.pool.take(io.waker) {
                            Take::Buf(b) => *buf = Some(b),
                            Take::Later => return Ok(Progress::woken()),
                            Take::Closed => return Err(io::Error::other("receiver shutting down")),
                        }
                    }
                    let b = buf.as_mut().expect("taken above");
                    let len = h.len as usize;
                    let n = match read_some(io.sock, &mut b.as_mut_full()[*got..len])? {
                        None => return Ok(Progress::readable()),
                        Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                        Some(n) => n,
                    };
                    // Hash what just arrived while it is in the cache.
                    self.hasher.update(&b.head(*got + n)[*got..]);
                    *got += n;
                    moved += n;
                    io.moved(n as u64);
                    if *got < len {
                        continue;
                    }
                    let mut b = buf.take().expect("taken above");
                    b.set_len(len);
                    let hash = self.hasher.digest();
                    self.hasher.reset();
                    let h = *h;
                    let work = Work::Data {
                        file: h.file,
                        offset: h.offset,
                        buf: b,
                        hash,
                    };
                    self.state = self.hand(&h, work)?;
                }
                Reading::Fail { h, msg, got } => {
                    if *got < msg.len() {
                        match read_some(io.sock, &mut msg[*got..])? {
                            None => return Ok(Progress::readable()),
                            Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                            Some(n) => *got += n,
                        }
                        continue;
                    }
                    let h = *h;
                    let work = Work::Fail {
                        file: h.file,
                        message: String::from_utf8_lossy(msg).into_owned(),
                    };
                    self.state = self.hand(&h, work)?;
                }
            }
        }
    }

    /// What a frame's header leads to: reading its payload, or handing its
    /// work on; `None` at the stream's end marker.
    fn after_header(&self, h: FrameHeader) -> io::Result<Option<Reading>> {
        Ok(Some(match h.kind {
            FrameKind::EndOfStream => return Ok(None),
            FrameKind::KeepAlive => Reading::Header {
                buf: [0; FRAME_HEADER_LEN],
                got: 0,
            },
            FrameKind::Data => {
                self.pipeline.check(&h)?;
                Reading::Data {
                    h,
                    buf: None,
                    got: 0,
                }
            }
            FrameKind::Fail => {
                self.pipeline.check(&h)?;
                Reading::Fail {
                    h,
                    msg: vec![0; h.len as usize],
                    got: 0,
                }
            }
            FrameKind::Hole => self.hand(
                &h,
                Work::Hole {
                    file: h.file,
                    offset: h.offset,
                    len: h.value,
                },
            )?,
            FrameKind::End => self.hand(
                &h,
                Work::End {
                    file: h.file,
                    checksum: h.value,
                },
            )?,
        }))
    }

    /// The state that hands `work` to the writer of `h`'s file.
    fn hand(&self, h: &FrameHeader, work: Work) -> io::Result<Reading> {
        let x = self.pipeline.check(h)?;
        Ok(Reading::Handing {
            work,
            worker: x.worker,
        })
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        let buf = match std::mem::replace(
            &mut self.state,
            Reading::Header {
                buf: [0; FRAME_HEADER_LEN],
                got: 0,
            },
        ) {
            Reading::Data { buf, .. } => buf,
            Reading::Handing {
                work: Work::Data { buf, .. },
                ..
            } => Some(buf),
            _ => None,
        };
        if let Some(b) = buf {
            self.pipeline.shared.pool.put(b);
        }
    }
}

/// One non-blocking read: `None` when nothing is there yet.
fn read_some(sock: &std::net::TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match std::io::Read::read(&mut &*sock, buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The descriptors of a file being written: closed while the file waits
/// for its next frame if its writer needs the room ([`MAX_OPEN_FILES`]).
struct Handles {
    dir: Arc<Dir>,
    file: Arc<File>,
    direct: Option<Arc<File>>,
}

/// A file being written by a worker.
struct Open {
    name: String,
    /// `None` while closed for room.
    fds: Option<Handles>,
    /// The temporary file as it was when closed for room (inode, ctime;
    /// set by [`release`]): a reopened one must be the same file,
    /// unchanged since.
    seen: (u64, i64, i64),
    digest: OrderedDigest,
    /// Its digest's parked blocks, as counted into [`Shared::parked`].
    parked: usize,
    end: Option<u64>,
    saved: u64,
    /// Chunks with writes in flight: only a file without any is closed
    /// for room.
    writing: Vec<u64>,
    /// Its stamp in its worker's least-recently-used order.
    used: u64,
}

impl Open {
    /// After its digest took a chunk or a hole: count the change in its
    /// parked blocks into the session's.
    fn count_parked(&mut self, total: &AtomicUsize) {
        let now = self.digest.parked();
        if now > self.parked {
            total.fetch_add(now - self.parked, Ordering::Relaxed);
        } else {
            total.fetch_sub(self.parked - now, Ordering::Relaxed);
        }
        self.parked = now;
    }

    /// Its descriptors, which every caller holds by [`Worker::ensure_open`]
    /// or by a write in flight.
    fn fds(&self) -> &Handles {
        self.fds
            .as_ref()
            .expect("a file in use holds its descriptors")
    }
}

/// What a writer worker hands its finisher: everything that touches a
/// file's metadata rather than its data (sidecar saves, the verify + sync +
/// rename of a complete file). These are journal
/// round trips (a rename or fdatasync costs milliseconds); done on the
/// writer thread they would leave the device idle between data writes.
/// One finisher per writer, fed in order, so a file's sidecar saves and
/// its completion happen in the order the writer decided them.
enum Finish {
    /// Save the sidecar of `name` in `dir`.
    Save {
        dir: Arc<Dir>,
        name: String,
        state: PartState,
    },
    /// Every chunk is in and the sender's checksum arrived: verify, sync,
    /// rename into place (or fail naming the file).
    Complete { id: u32, open: Box<Open> },
}

/// The bytes of a file resumed from `from` that the sender does not send
/// again: it starts at the chunk `from` falls in.
fn resumed_prefix(from: u64, size: u64) -> u64 {
    (from / CHUNK_SIZE * CHUNK_SIZE).min(size)
}

fn finisher(rx: Receiver<Finish>, sh: Arc<Shared>) {
    for f in rx {
        match f {
            Finish::Save { dir, name, state } => {
                let _ = partial::save_state(&dir, &name, &state);
            }
            Finish::Complete { id, mut open } => {
                let x = sh.files[id as usize]
                    .as_ref()
                    .expect("the intake checked the id");
                match complete(x, &mut open) {
                    Ok(()) => {
                        let mut t = lock(&sh.totals);
                        t.files += 1;
                        t.file_bytes += x.entry.size;
                        t.resumed_bytes += resumed_prefix(x.from, x.entry.size);
                        t.done[id as usize] = true;
                    }
                    Err(e) => {
                        let dir = &open.fds().dir;
                        if matches!(e, DiskError::ChecksumMismatch { .. }) {
                            let _ = partial::discard(dir, &open.name);
                        } else {
                            let _ = partial::save_state(
                                dir,
                                &open.name,
                                &PartState::for_entry(&x.entry, open.digest.verified_offset()),
                            );
                        }
                        fail(&sh, x, e.code(), e.to_string());
                    }
                }
            }
        }
    }
}

fn write_worker(queue: Arc<WorkQueue>, io: IoQueue<WriteTag>, sh: Arc<Shared>) {
    let (fin_tx, fin_rx) = sync_channel::<Finish>(sh.finish_queue);
    let fin = {
        let sh = sh.clone();
        std::thread::Builder::new()
            .name("lh-disk-finish".into())
            .spawn(move || finisher(fin_rx, sh))
            .expect("spawn finisher thread")
    };
    write_loop(&queue, io, &sh, &fin_tx);
    drop(fin_tx);
    let _ = fin.join();
}

/// Writes each writer worker keeps in flight ([`super::ioqueue`]). A worker owns
/// its files' state while the device always has the next block queued as
/// one completes (and while the worker opens the next file). Blocks of one
/// file land at distinct offsets and the [`OrderedDigest`] takes chunks in
/// any order; a chunk counts as written only once its write returned.
pub const WRITE_DEPTH: usize = super::ioqueue::DEPTH;

/// What a write in flight belongs to.
struct WriteTag {
    file: u32,
    offset: u64,
    hash: u64,
}

/// The state of one writer worker.
struct Worker<'a> {
    sh: &'a Arc<Shared>,
    fin: &'a SyncSender<Finish>,
    open: HashMap<u32, Open>,
    // Files that failed or completed: any later frame for them is dropped
    // (a confused or hostile sender cannot reopen a finished file).
    closed: HashSet<u32>,
    /// The files of `open` that hold descriptors, least recently used
    /// first (by [`Open::used`]).
    lru: BTreeMap<u64, u32>,
    clock: u64,
    io: IoQueue<WriteTag>,
}

fn write_loop(
    queue: &WorkQueue,
    io: IoQueue<WriteTag>,
    sh: &Arc<Shared>,
    fin: &SyncSender<Finish>,
) {
    let mut w = Worker {
        sh,
        fin,
        open: HashMap::new(),
        closed: HashSet::new(),
        lru: BTreeMap::new(),
        clock: 0,
        io,
    };
    loop {
        while !w.io.full() {
            match queue.pop() {
                Some(work) => w.handle(work),
                None => break,
            }
        }
        if queue.finished() && w.io.in_flight() == 0 {
            break;
        }
        // Until a write completes or a stream queues work (its kick).
        for d in w.io.wait(None) {
            w.written(d);
        }
    }
    // Streams are done: keep what arrived for resume.
    for id in w.open.keys().copied().collect::<Vec<_>>() {
        if let Some(o) = w.close(id) {
            if let Some(x) = sh.files[id as usize].as_ref() {
                save(sh, fin, &o, x);
            }
        }
    }
}

impl Worker<'_> {
    fn handle(&mut self, work: Work) {
        let sh = self.sh;
        let id = match &work {
            Work::Data { file, .. }
            | Work::Hole { file, .. }
            | Work::End { file, .. }
            | Work::Fail { file, .. } => *file,
        };
        let x = sh.files[id as usize]
            .as_ref()
            .expect("the intake checked the id");
        if self.closed.contains(&id) {
            if let Work::Data { buf, .. } = work {
                sh.pool.put(buf);
            }
            return;
        }
        if let Work::Fail { message, .. } = work {
            if let Some(o) = self.close(id) {
                save(sh, self.fin, &o, x);
            }
            let (code, msg) = message.split_once('\t').unwrap_or(("source", &message));
            fail(sh, x, code, msg.to_string());
            self.closed.insert(id);
            return;
        }
        // Chunks this frame covers, beyond a resumed prefix.
        let chunks = match &work {
            Work::Data { offset, .. } if *offset >= x.from => {
                Some((offset / CHUNK_SIZE, offset / CHUNK_SIZE + 1))
            }
            Work::Hole { offset, len, .. } => Some((
                (offset / CHUNK_SIZE).max(x.from / CHUNK_SIZE),
                chunk_count(offset + len),
            )),
            _ => None,
        };
        // A chunk sent twice, or data where a hole was (or the reverse),
        // would leave other bytes on disk than the digest vouches for.
        if let (Some((first, end)), Some(o)) = (chunks, self.open.get(&id)) {
            if o.digest.holds_any(first, end)
                || o.writing.iter().any(|&i| (first..end).contains(&i))
            {
                let e = format!(
                    "{}: the sender sent chunk {first} again (or data where it sent a hole)",
                    x.path
                );
                return self.give_up(id, x, work, "protocol", e);
            }
        }
        // Only a write needs the file open: holes, ends and a resumed
        // prefix only change the digest, so a file closed for room is
        // opened again for them only if it completes ([`Self::progressed`]).
        let writes = matches!(work, Work::Data { offset, .. } if offset >= x.from)
            || !self.open.contains_key(&id);
        if let Err(e) = if writes {
            self.ensure_open(id, x)
        } else {
            Ok(())
        } {
            // No sidecar save: its temporary file may not be the one this
            // session wrote (a resume re-hashes the prefix either way).
            return self.give_up(id, x, work, e.code(), e.to_string());
        }
        self.apply(id, x, work);
    }

    /// File `id` failed: `work`'s buffer back to the pool, the file closed
    /// and failed with `code` and `why`; its later frames are dropped.
    fn give_up(&mut self, id: u32, x: &Expect, work: Work, code: &str, why: String) {
        if let Work::Data { buf, .. } = work {
            self.sh.pool.put(buf);
        }
        self.close(id);
        fail(self.sh, x, code, why);
        self.closed.insert(id);
    }

    /// `work` on open file `id`: a write submitted, or the digest (a
    /// resumed prefix, a hole) or the end marker taken in.
    fn apply(&mut self, id: u32, x: &Expect, work: Work) {
        let sh = self.sh;
        let o = self.open.get_mut(&id).expect("opened above");
        match work {
            Work::Data {
                offset, buf, hash, ..
            } => {
                if offset < x.from {
                    // Already verified on this side (a resumed prefix).
                    sh.pool.put(buf);
                    o.digest.data(offset / CHUNK_SIZE, hash);
                    o.count_parked(&sh.parked);
                } else {
                    let aligned = buf.len() % DIRECT_ALIGN == 0;
                    let fds = o.fds();
                    let target = match &fds.direct {
                        Some(d) if aligned => d.clone(),
                        _ => fds.file.clone(),
                    };
                    let len = buf.len();
                    o.writing.push(offset / CHUNK_SIZE);
                    self.io.submit(Op {
                        file: target,
                        offset,
                        buf,
                        len,
                        need: len,
                        write: true,
                        tag: WriteTag {
                            file: id,
                            offset,
                            hash,
                        },
                    });
                    return;
                }
            }
            Work::Hole { offset, len, .. } => {
                let first = offset / CHUNK_SIZE;
                let count = chunk_count(offset + len) - first;
                o.digest.zeros(first, count);
                o.count_parked(&sh.parked);
            }
            Work::End { checksum, .. } => o.end = Some(checksum),
            Work::Fail { .. } => unreachable!("handled above"),
        }
        self.progressed(id);
    }

    /// Makes file `id` hold its descriptors, most recently used: opens it
    /// (the first frame) or reopens it (closed for room), closing the least
    /// recently used file without writes in flight when this worker holds
    /// its share of [`MAX_OPEN_FILES`].
    fn ensure_open(&mut self, id: u32, x: &Expect) -> Result<(), DiskError> {
        let holds = self.open.get(&id).map(|o| o.fds.is_some());
        if holds != Some(true) {
            self.make_room();
            match self.open.get_mut(&id) {
                None => {
                    let o = open_part(self.sh, x)?;
                    self.open.insert(id, o);
                }
                Some(o) => o.fds = Some(reopen(self.sh, x, o.seen)?),
            }
            let open = self.sh.open_files.fetch_add(1, Ordering::Relaxed) + 1;
            self.sh.open_files_peak.fetch_max(open, Ordering::Relaxed);
        }
        let o = self.open.get_mut(&id).expect("opened above");
        self.lru.remove(&o.used);
        self.clock += 1;
        o.used = self.clock;
        self.lru.insert(o.used, id);
        Ok(())
    }

    /// Below its share of [`MAX_OPEN_FILES`]: closes the least recently used files that
    /// have no write in flight (at most the queue depth are skipped).
    fn make_room(&mut self) {
        while self.lru.len() >= self.sh.open_per_writer {
            let Some((&stamp, &id)) = self
                .lru
                .iter()
                .find(|(_, id)| self.open.get(id).is_some_and(|o| o.writing.is_empty()))
            else {
                return;
            };
            self.lru.remove(&stamp);
            if let Some(o) = self.open.get_mut(&id) {
                release(self.sh, o);
            }
        }
    }

    /// Stops writing file `id`: its parked blocks and descriptors no
    /// longer count.
    fn close(&mut self, id: u32) -> Option<Open> {
        let o = self.open.remove(&id)?;
        self.sh.parked.fetch_sub(o.parked, Ordering::Relaxed);
        if o.fds.is_some() {
            self.lru.remove(&o.used);
            self.sh.open_files.fetch_sub(1, Ordering::Relaxed);
        }
        // Its descriptors stay with the returned file (a save or the
        // finisher may need them); it just no longer counts.
        Some(o)
    }

    /// A write completed.
    fn written(&mut self, d: super::ioqueue::Done<WriteTag>) {
        let sh = self.sh;
        let t = d.tag;
        let len = d.buf.len() as u64;
        sh.pool.put(d.buf);
        if let Some(o) = self.open.get_mut(&t.file) {
            let index = t.offset / CHUNK_SIZE;
            o.writing.retain(|&i| i != index);
        }
        if self.closed.contains(&t.file) {
            return;
        }
        let x = sh.files[t.file as usize]
            .as_ref()
            .expect("the intake checked the id");
        if let Err(e) = d.result {
            let e = DiskError::from_io(x.path.clone(), e);
            if let Some(o) = self.close(t.file) {
                save(sh, self.fin, &o, x);
            }
            fail(sh, x, e.code(), e.to_string());
            self.closed.insert(t.file);
            return;
        }
        sh.written.fetch_add(len, Ordering::Relaxed);
        sh.groups[x.group].add_written(len);
        if let Some(o) = self.open.get_mut(&t.file) {
            o.digest.data(t.offset / CHUNK_SIZE, t.hash);
            o.count_parked(&sh.parked);
        }
        self.progressed(t.file);
    }

    /// After the digest of `id` grew: save the sidecar now and then, and
    /// hand a complete file to the finisher.
    fn progressed(&mut self, id: u32) {
        let x = self.sh.files[id as usize]
            .as_ref()
            .expect("the intake checked the id");
        let Some(o) = self.open.get(&id) else {
            return;
        };
        if o.digest.complete() && o.end.is_some() {
            if let Err(e) = self.ensure_open(id, x) {
                self.close(id);
                fail(self.sh, x, e.code(), e.to_string());
                self.closed.insert(id);
                return;
            }
            let o = self.close(id).expect("looked up above");
            self.closed.insert(id);
            let _ = self.fin.send(Finish::Complete {
                id,
                open: Box::new(o),
            });
            return;
        }
        let o = self.open.get_mut(&id).expect("looked up above");
        let v = o.digest.verified_offset();
        if v >= o.saved + STATE_SAVE_BYTES && v < x.entry.size {
            o.saved = v;
            save(self.sh, self.fin, o, x);
        }
    }
}

fn fail(sh: &Shared, x: &Expect, code: &str, error: String) {
    lock(&sh.totals).failures.push(FileFailure {
        id: x.entry.id,
        path: x.path.clone(),
        code: code.to_string(),
        error,
    });
}

/// Save the sidecar of `o` (by its finisher, in order); a file closed for
/// room has its directory opened again for it.
fn save(sh: &Shared, fin: &SyncSender<Finish>, o: &Open, x: &Expect) {
    let dir = match &o.fds {
        Some(fds) => fds.dir.clone(),
        None => match sh.root.parent_of(&x.path, false) {
            Ok((d, _)) => Arc::new(d),
            Err(_) => return,
        },
    };
    let _ = fin.send(Finish::Save {
        dir,
        name: o.name.clone(),
        state: PartState::for_entry(&x.entry, o.digest.verified_offset()),
    });
}

/// Closes the descriptors of `o` for room, noting what its temporary file
/// looks like so that [`reopen`] can tell it was changed meanwhile.
fn release(sh: &Shared, o: &mut Open) {
    let Some(Handles { dir, file, direct }) = o.fds.take() else {
        return;
    };
    sh.open_files.fetch_sub(1, Ordering::Relaxed);
    // Closed first, looked at after: whatever the kernel does at the last
    // close (IMA, for one, may rewrite an xattr, which moves the ctime) is
    // in what is noted.
    let ino = file.metadata().map(|m| m.ino()).ok();
    drop((file, direct));
    o.seen = match dir.stat(&partial::part_name(&o.name)) {
        Ok(Some(st)) if Some(st.st_ino) == ino => (st.st_ino, st.st_ctime, st.st_ctime_nsec),
        // Gone or replaced already: no reopen will match.
        _ => (0, 0, 0),
    };
}

/// Takes the exclusive lock on a temporary file: one writer per file across
/// processes too (the claims cover one server's sessions; two `get`s into
/// one --dest are two processes). The lock lives with the descriptor, past
/// the final rename.
fn lock_part(file: &File, x: &Expect) -> Result<(), DiskError> {
    // SAFETY: flock on a descriptor we own; no memory involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        DiskError::InUse {
            path: x.path.clone(),
            by: "another process holds its temporary file".into(),
        }
    } else {
        DiskError::from_io(x.path.clone(), e)
    })
}

/// Opens again the temporary file of a file closed for room: the same file
/// (inode) and unchanged (ctime) since, else the chunks this session wrote
/// into it may not be there and its digest would vouch for other bytes.
fn reopen(sh: &Shared, x: &Expect, seen: (u64, i64, i64)) -> Result<Handles, DiskError> {
    let io = |e: io::Error| DiskError::from_io(x.path.clone(), e);
    let changed = || DiskError::Io {
        path: x.path.clone(),
        source: io::Error::other(
            "its temporary file was replaced or changed by someone else while this session \
             had it closed (partial data kept)",
        ),
    };
    let (dir, name) = sh.root.parent_of(&x.path, false)?;
    let part = partial::part_name(name);
    let file = match dir.open_file(&part, libc::O_RDWR, 0) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(changed()),
        Err(e) => return Err(io(e)),
    };
    lock_part(&file, x)?;
    let m = file.metadata().map_err(io)?;
    if (m.ino(), m.ctime(), m.ctime_nsec()) != seen {
        return Err(changed());
    }
    let direct = if sh.direct {
        open_direct(&dir, &part)
    } else {
        None
    };
    Ok(Handles {
        dir: Arc::new(dir),
        file: Arc::new(file),
        direct: direct.map(Arc::new),
    })
}

/// Warn once per process that O_DIRECT was refused.
static DIRECT_WARNED: AtomicBool = AtomicBool::new(false);

fn open_part(sh: &Shared, x: &Expect) -> Result<Open, DiskError> {
    let io = |e: io::Error| DiskError::from_io(x.path.clone(), e);
    let (dir, name) = sh.root.parent_of(&x.path, true)?;
    let part = partial::part_name(name);
    let size = x.entry.size;
    let file = dir
        .open_file(&part, libc::O_RDWR | libc::O_CREAT, 0o600)
        .map_err(io)?;
    lock_part(&file, x)?;
    let mut digest = OrderedDigest::new(size);
    if x.from == 0 {
        file.set_len(0).map_err(io)?;
        if x.entry.sparse {
            file.set_len(size).map_err(io)?;
        } else {
            if let Err(e) = preallocate(&file, size) {
                // Nothing was written: leave no empty temporary behind.
                let _ = dir.unlink(&part);
                return Err(io(e));
            }
        }
    } else {
        file.set_len(size).map_err(io)?;
        let Some(mut buf) = sh.pool.get() else {
            return Err(DiskError::Io {
                path: x.path.clone(),
                source: io::Error::other("receiver shutting down"),
            });
        };
        let mut d = FileDigest::default();
        let chunks = (x.from / CHUNK_SIZE).min(chunk_count(size));
        let r = hash_prefix(&file, size, chunks, true, buf.as_mut_full(), &mut d);
        sh.pool.put(buf);
        r.map_err(io)?;
        digest = OrderedDigest::resume(size, chunks, d);
    }
    let direct = if sh.direct {
        open_direct(&dir, &part)
    } else {
        None
    };
    Ok(Open {
        name: name.to_string(),
        fds: Some(Handles {
            dir: Arc::new(dir),
            file: Arc::new(file),
            direct: direct.map(Arc::new),
        }),
        seen: (0, 0, 0),
        digest,
        parked: 0,
        end: None,
        saved: x.from,
        writing: Vec::new(),
        used: 0,
    })
}

fn open_direct(dir: &Dir, part: &str) -> Option<File> {
    match dir.open_file(part, libc::O_WRONLY | libc::O_DIRECT, 0) {
        Ok(f) => Some(f),
        Err(e) => {
            if !DIRECT_WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "longhaul: warning: O_DIRECT refused for writing ({e}); using buffered IO"
                );
            }
            None
        }
    }
}

/// fallocate the whole file; file systems without it just get the size.
fn preallocate(file: &File, size: u64) -> io::Result<()> {
    if size == 0 {
        return Ok(());
    }
    // SAFETY: valid descriptor, no memory passed.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => file.set_len(size),
        _ => Err(e),
    }
}

fn complete(x: &Expect, o: &mut Open) -> Result<(), DiskError> {
    let fds = o.fds();
    let io = |e: io::Error| DiskError::from_io(x.path.clone(), e);
    if Some(o.digest.finish()) != o.end {
        return Err(DiskError::ChecksumMismatch {
            path: x.path.clone(),
        });
    }
    // SAFETY: valid descriptor.
    if unsafe { libc::fchmod(fds.file.as_raw_fd(), x.entry.mode as libc::mode_t) } != 0 {
        return Err(io(io::Error::last_os_error()));
    }
    safepath::set_mtime_fd(
        fds.file.as_raw_fd(),
        (x.entry.mtime_sec, x.entry.mtime_nsec),
    )
    .map_err(io)?;
    // A file under its final name must be on disk: after a power loss a
    // re-run trusts it by size and mtime. (Partial files need no sync: their
    // prefix is re-hashed against the source when resumed.)
    fds.file.sync_data().map_err(io)?;
    fds.dir
        .rename(&partial::part_name(&o.name), &o.name)
        .map_err(io)?;
    partial::remove_state(&fds.dir, &o.name).map_err(io)?;
    Ok(())
}
