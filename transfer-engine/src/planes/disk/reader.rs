//! The sender pipeline: reader workers per device feed one bounded block
//! queue that every data stream drains.
//!
//! Files are dealt round-robin to the `--io-workers-per-device` workers of
//! their device group, so each device is read by its own threads and two
//! controllers are driven in parallel. A worker reads its files one after
//! another, chunk by chunk, with [`READ_DEPTH`] chunk reads in flight on
//! helper threads (forwarded in file order), hashing as it goes; holes of sparse files
//! (SEEK_DATA) become `Hole` frames with no payload. A resumed file's prefix
//! is read and hashed but not sent. A file that vanishes, cannot be opened or
//! changes size/mtime while being read becomes a `Fail` frame and a
//! [`FileFailure`]; the other files go on.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::buffer::{AlignedBuf, BufferPool};
use super::checksum::{
    chunk_count, chunk_hash, chunk_len, hash_prefix, next_data, read_full_at, zero_chunk_hash,
    FileDigest,
};
use super::devices::DeviceGroup;
use super::wire::{write_frame, FileFailure, FrameHeader, FrameKind};
use super::{DiskError, DiskOptions, CHUNK_SIZE};

/// One file to read.
#[derive(Debug, Clone)]
pub struct SendItem {
    pub id: u32,
    /// Relative path, for messages.
    pub rel: String,
    pub src: PathBuf,
    pub size: u64,
    pub mtime: (i64, u32),
    pub sparse: bool,
    /// Index of its device group.
    pub group: usize,
    /// Resume offset: the receiver verified everything before it.
    pub from: u64,
}

/// A unit of work for the data streams.
pub enum Block {
    Data {
        file: u32,
        offset: u64,
        buf: AlignedBuf,
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

/// What a reader worker hands its hashing stage: blocks in file order, each
/// file opened by `Begin`. The hasher folds chunk hashes into the file's
/// digest, fills in the `End` checksum and forwards every block to the
/// streams' queue, so the reader thread only ever waits for IO.
enum Stage {
    Begin { size: u64, digest: Box<FileDigest> },
    Block(Block),
}

/// The running sender pipeline; share it (Arc) with every data stream.
pub struct SendPipeline {
    queue: Mutex<Receiver<Block>>,
    pool: Arc<BufferPool>,
    groups: Vec<Arc<DeviceGroup>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    failures: Arc<Mutex<Vec<FileFailure>>>,
    aborted: Arc<AtomicBool>,
    /// Files and payload bytes this pipeline sends (resumed prefixes left
    /// out), and the files whose last frame went out.
    files_total: u64,
    bytes_total: u64,
    files_sent: AtomicU64,
}

struct Ctx {
    tx: SyncSender<Stage>,
    pool: Arc<BufferPool>,
    groups: Vec<Arc<DeviceGroup>>,
    failures: Arc<Mutex<Vec<FileFailure>>>,
    aborted: Arc<AtomicBool>,
    direct: bool,
    follow_symlinks: bool,
}

/// A stream with nothing to carry (readers hashing a long resumed prefix,
/// a slow disk) sends a keep-alive this often, well inside the engine's
/// 30 s data idle timeout.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// How long a stream waits on the shared queue before yielding it to the
/// other streams (and checking whether a keep-alive is due).
const QUEUE_POLL: Duration = Duration::from_millis(100);

/// Warn once per process that O_DIRECT was refused.
static DIRECT_WARNED: AtomicBool = AtomicBool::new(false);

/// Open `path` for reading, O_DIRECT if asked and the file system allows.
pub fn open_source(path: &std::path::Path, direct: bool, follow: bool) -> io::Result<File> {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    if direct {
        match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT | nofollow)
            .open(path)
        {
            Ok(f) => return Ok(f),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if !DIRECT_WARNED.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "longhaul: warning: O_DIRECT refused on {}; using buffered IO",
                        path.display()
                    );
                }
            }
            Err(e) => return Err(e),
        }
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(nofollow)
        .open(path)?;
    // We read every file front to back: ask for the larger readahead.
    // SAFETY: advisory call on a valid descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    Ok(f)
}

/// Pool size: two blocks per stream in flight plus, per IO worker, two
/// queued and [`READ_DEPTH`] in flight, so neither side starves the other;
/// never grows.
pub fn pool_buffers(streams: usize, workers: usize) -> usize {
    2 * streams + (2 + READ_DEPTH) * workers + 2
}

impl SendPipeline {
    /// Start reader workers for `items` (already in manifest order).
    pub fn start(
        items: Vec<SendItem>,
        groups: Vec<Arc<DeviceGroup>>,
        opts: &DiskOptions,
    ) -> Arc<SendPipeline> {
        let per_device = opts.io_workers_per_device.max(1);
        let workers = groups.len().max(1) * per_device;
        let pool = Arc::new(BufferPool::new(pool_buffers(opts.streams, workers)));
        let (tx, rx) = sync_channel(pool.total());
        let failures = Arc::new(Mutex::new(Vec::new()));
        let aborted = Arc::new(AtomicBool::new(false));
        let files_total = items.len() as u64;
        let bytes_total = items.iter().map(|i| i.size - i.from.min(i.size)).sum();
        // Deal files round-robin to the workers of their device.
        let mut lists: Vec<Vec<SendItem>> = vec![Vec::new(); workers];
        let mut dealt = vec![0usize; groups.len().max(1)];
        for it in items {
            let k = dealt[it.group] % per_device;
            dealt[it.group] += 1;
            lists[it.group * per_device + k].push(it);
        }
        let mut handles = Vec::new();
        for list in lists.into_iter().filter(|l| !l.is_empty()) {
            // Two blocks between IO and hashing keep the disk busy while a
            // chunk is hashed.
            let (stage_tx, stage_rx) = sync_channel::<Stage>(2);
            let queue = tx.clone();
            let h = std::thread::Builder::new()
                .name("lh-disk-hash".into())
                .spawn(move || hash_stage(stage_rx, queue))
                .expect("spawn hashing thread");
            handles.push(h);
            let ctx = Ctx {
                tx: stage_tx,
                pool: pool.clone(),
                groups: groups.clone(),
                failures: failures.clone(),
                aborted: aborted.clone(),
                direct: opts.direct,
                follow_symlinks: opts.follow_symlinks,
            };
            let h = std::thread::Builder::new()
                .name("lh-disk-read".into())
                .spawn(move || read_worker(list, ctx))
                .expect("spawn reader thread");
            handles.push(h);
        }
        drop(tx);
        Arc::new(SendPipeline {
            queue: Mutex::new(rx),
            pool,
            groups,
            workers: Mutex::new(handles),
            failures,
            aborted,
            files_total,
            bytes_total,
            files_sent: AtomicU64::new(0),
        })
    }

    /// Move blocks onto one data stream until the queue is drained, then
    /// send `EndOfStream`. `pace` is called before each block is written
    /// (rate limit), `progress` sees every payload byte written;
    /// `stop` (the session failed) ends the stream with an error. Returns
    /// the payload bytes this stream carried.
    pub fn pump<W: Write>(
        &self,
        w: &mut W,
        pace: &dyn Fn(usize),
        progress: &dyn Fn(u64),
        stop: &AtomicBool,
    ) -> io::Result<u64> {
        let mut sent = 0;
        let mut last_write = Instant::now();
        loop {
            if stop.load(Ordering::Relaxed) {
                self.abort();
                return Err(io::Error::other("session stopped"));
            }
            // Wait briefly with the queue locked, then let the other streams
            // have it: every stream gets to send its keep-alive in time.
            let next = self
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .recv_timeout(QUEUE_POLL);
            let block = match next {
                Ok(b) => b,
                Err(RecvTimeoutError::Timeout) => {
                    if last_write.elapsed() >= KEEPALIVE_INTERVAL {
                        let keepalive = FrameHeader::new(FrameKind::KeepAlive, 0);
                        if let Err(e) = write_frame(w, &keepalive, &[]) {
                            self.abort();
                            return Err(e);
                        }
                        last_write = Instant::now();
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let r = match block {
                Block::Data { file, offset, buf } => {
                    pace(buf.len());
                    let mut h = FrameHeader::new(FrameKind::Data, file);
                    h.offset = offset;
                    h.len = buf.len() as u32;
                    let r = write_frame(w, &h, buf.as_slice());
                    let n = buf.len() as u64;
                    self.pool.put(buf);
                    if r.is_ok() {
                        sent += n;
                        progress(n);
                    }
                    r
                }
                Block::Hole { file, offset, len } => {
                    let mut h = FrameHeader::new(FrameKind::Hole, file);
                    h.offset = offset;
                    h.value = len;
                    write_frame(w, &h, &[])
                }
                Block::End { file, checksum } => {
                    let mut h = FrameHeader::new(FrameKind::End, file);
                    h.value = checksum;
                    let r = write_frame(w, &h, &[]);
                    if r.is_ok() {
                        self.files_sent.fetch_add(1, Ordering::Relaxed);
                    }
                    r
                }
                Block::Fail { file, message } => {
                    let msg = &message.as_bytes()
                        [..message.len().min(super::wire::MAX_FAIL_MESSAGE as usize)];
                    let mut h = FrameHeader::new(FrameKind::Fail, file);
                    h.len = msg.len() as u32;
                    write_frame(w, &h, msg)
                }
            };
            if let Err(e) = r {
                self.abort();
                return Err(e);
            }
            last_write = Instant::now();
        }
        write_frame(w, &FrameHeader::new(FrameKind::EndOfStream, 0), &[])?;
        w.flush()?;
        Ok(sent)
    }

    /// Stop reading: workers finish their current block and exit.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
        self.pool.close();
        // Drain so workers blocked on a full queue wake up.
        if let Ok(q) = self.queue.try_lock() {
            while q.try_recv().is_ok() {}
        }
    }

    /// Wait for the readers; returns the files that failed on this side.
    pub fn finish(&self) -> Vec<FileFailure> {
        let handles: Vec<_> =
            std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        for h in handles {
            let _ = h.join();
        }
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn groups(&self) -> &[Arc<DeviceGroup>] {
        &self.groups
    }

    /// Files and payload bytes this pipeline sends in all.
    pub fn totals(&self) -> (u64, u64) {
        (self.files_total, self.bytes_total)
    }

    /// Files whose every frame went out on a stream.
    pub fn files_sent(&self) -> u64 {
        self.files_sent.load(Ordering::Relaxed)
    }
}

/// Reads each reader worker keeps in flight. The worker hands chunk reads
/// of the current file to this many helper threads and forwards the blocks
/// in file order, so the device has the next chunk queued while one
/// completes (and while the worker opens the next file or waits for the
/// hashing stage). A file's reads never outlive it ([`Reads::settle`]).
pub const READ_DEPTH: usize = 2;

struct ReadJob {
    file: Arc<File>,
    offset: u64,
    buf: AlignedBuf,
}

struct ReadDone {
    offset: u64,
    buf: AlignedBuf,
    result: io::Result<usize>,
}

/// The reads in flight of one reader worker, in file order.
struct Reads {
    jobs: Sender<ReadJob>,
    done: Receiver<ReadDone>,
    /// Offsets submitted, oldest first, with the length each must fill.
    pending: VecDeque<(u64, u64)>,
    /// Completions that arrived ahead of the oldest pending read.
    arrived: Vec<ReadDone>,
}

impl Reads {
    fn start() -> Reads {
        let (jobs, job_rx) = channel::<ReadJob>();
        let (done_tx, done) = channel::<ReadDone>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        for _ in 0..READ_DEPTH {
            let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
            std::thread::Builder::new()
                .name("lh-disk-pread".into())
                .spawn(move || loop {
                    let job = match job_rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                        Ok(j) => j,
                        Err(_) => return,
                    };
                    let mut buf = job.buf;
                    let result = read_full_at(&job.file, buf.as_mut_full(), job.offset);
                    let d = ReadDone {
                        offset: job.offset,
                        buf,
                        result,
                    };
                    if done_tx.send(d).is_err() {
                        return;
                    }
                })
                .expect("spawn read helper thread");
        }
        Reads {
            jobs,
            done,
            pending: VecDeque::new(),
            arrived: Vec::new(),
        }
    }

    fn full(&self) -> bool {
        self.pending.len() >= READ_DEPTH
    }

    fn submit(&mut self, file: &Arc<File>, offset: u64, len: u64, buf: AlignedBuf) {
        let job = ReadJob {
            file: file.clone(),
            offset,
            buf,
        };
        // The helpers live as long as `jobs`, which this worker owns.
        if self.jobs.send(job).is_ok() {
            self.pending.push_back((offset, len));
        }
    }

    /// Wait for the oldest read: its offset, length, buffer and result.
    fn next(&mut self) -> Option<(u64, u64, AlignedBuf, io::Result<usize>)> {
        let (offset, len) = self.pending.pop_front()?;
        loop {
            if let Some(i) = self.arrived.iter().position(|d| d.offset == offset) {
                let d = self.arrived.swap_remove(i);
                return Some((offset, len, d.buf, d.result));
            }
            match self.done.recv() {
                Ok(d) => self.arrived.push(d),
                Err(_) => return None,
            }
        }
    }

    /// Wait for every read in flight and return the buffers to the pool.
    fn settle(&mut self, pool: &BufferPool) {
        while let Some((_, _, buf, _)) = self.next() {
            pool.put(buf);
        }
        for d in self.arrived.drain(..) {
            pool.put(d.buf);
        }
    }
}

fn read_worker(list: Vec<SendItem>, ctx: Ctx) {
    let mut reads = Reads::start();
    for it in list {
        if ctx.aborted.load(Ordering::Relaxed) {
            break;
        }
        let r = read_file(&it, &ctx, &mut reads);
        // Whatever happened, no read of this file stays in flight.
        reads.settle(&ctx.pool);
        match r {
            Ok(true) => {}
            Ok(false) => break, // aborted
            Err(e) => {
                let failure = FileFailure::new(it.id, &it.rel, &e);
                // The receiver learns code and message: "code\tmessage".
                let message = format!("{}\t{}", failure.code, failure.error);
                ctx.failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(failure);
                if ctx
                    .tx
                    .send(Stage::Block(Block::Fail {
                        file: it.id,
                        message,
                    }))
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// The hashing stage of one reader worker (see [`Stage`]).
fn hash_stage(rx: Receiver<Stage>, queue: SyncSender<Block>) {
    let mut size = 0;
    let mut digest = FileDigest::default();
    for stage in rx {
        let block = match stage {
            Stage::Begin { size: s, digest: d } => {
                size = s;
                digest = *d;
                continue;
            }
            Stage::Block(b) => b,
        };
        let block = match block {
            Block::Data { file, offset, buf } => {
                digest.push(chunk_hash(buf.as_slice()));
                Block::Data { file, offset, buf }
            }
            Block::Hole { file, offset, len } => {
                let first = offset / CHUNK_SIZE;
                for index in first..chunk_count(offset + len) {
                    digest.push(zero_chunk_hash(chunk_len(index, size)));
                }
                Block::Hole { file, offset, len }
            }
            Block::End { file, .. } => Block::End {
                file,
                checksum: digest.finish(),
            },
            fail @ Block::Fail { .. } => fail,
        };
        if queue.send(block).is_err() {
            return;
        }
    }
}

fn changed(md: &std::fs::Metadata, it: &SendItem) -> bool {
    md.len() != it.size || md.mtime() != it.mtime.0 || md.mtime_nsec() as u32 != it.mtime.1
}

/// Read one file into blocks. `Ok(false)` when the pipeline was aborted.
fn read_file(it: &SendItem, ctx: &Ctx, reads: &mut Reads) -> Result<bool, DiskError> {
    let src = it.src.display().to_string();
    let file =
        open_source(&it.src, ctx.direct, ctx.follow_symlinks).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => DiskError::SourceVanished { path: src.clone() },
            _ => DiskError::from_io(src.clone(), e),
        })?;
    let md = file
        .metadata()
        .map_err(|e| DiskError::from_io(src.clone(), e))?;
    if changed(&md, it) {
        return Err(DiskError::SourceChanged { path: src });
    }
    let group = &ctx.groups[it.group];
    let size = it.size;
    let chunks = chunk_count(size);
    let from_chunk = (it.from / CHUNK_SIZE).min(chunks);
    let mut digest = FileDigest::default();
    if from_chunk > 0 {
        let Some(mut buf) = ctx.pool.get() else {
            return Ok(false);
        };
        let r = hash_prefix(
            &file,
            size,
            from_chunk,
            it.sparse,
            buf.as_mut_full(),
            &mut digest,
        );
        ctx.pool.put(buf);
        let read = r.map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => DiskError::SourceChanged { path: src.clone() },
            _ => DiskError::from_io(src.clone(), e),
        })?;
        group.add_read(read);
    }
    let digest = Box::new(digest);
    if ctx.tx.send(Stage::Begin { size, digest }).is_err() {
        return Ok(false);
    }
    // Each send is `false` once the pipeline was aborted.
    let send = |block: Block| ctx.tx.send(Stage::Block(block)).is_ok();
    // A pending hole ends where the next data (or the file) starts.
    let send_hole = |hole_start: &mut Option<u64>, end: u64| match hole_start.take() {
        Some(start) => send(Block::Hole {
            file: it.id,
            offset: start,
            len: end - start,
        }),
        None => true,
    };
    // Forward the oldest read in flight as a block (false: aborted).
    let forward = |reads: &mut Reads| -> Result<bool, DiskError> {
        let Some((off, len, mut buf, r)) = reads.next() else {
            return Ok(false);
        };
        // Reads fill a whole chunk buffer: O_DIRECT needs aligned
        // lengths, EOF shortens the last one.
        let n = match r {
            Ok(n) => n,
            Err(e) => {
                ctx.pool.put(buf);
                return Err(DiskError::from_io(src.clone(), e));
            }
        };
        if (n as u64) < len {
            ctx.pool.put(buf);
            return Err(DiskError::SourceChanged { path: src.clone() });
        }
        buf.set_len(len as usize);
        group.add_read(len);
        Ok(send(Block::Data {
            file: it.id,
            offset: off,
            buf,
        }))
    };
    // Forward every read in flight, in order.
    let flush = |reads: &mut Reads| -> Result<bool, DiskError> {
        while !reads.pending.is_empty() {
            if !forward(reads)? {
                return Ok(false);
            }
        }
        Ok(true)
    };
    let file = Arc::new(file);
    let mut data_from = 0u64;
    let mut hole_start: Option<u64> = None;
    for index in from_chunk..chunks {
        let off = index * CHUNK_SIZE;
        let len = chunk_len(index, size);
        if it.sparse && off + len > data_from {
            data_from = next_data(&file, off)
                .map_err(|e| DiskError::from_io(src.clone(), e))?
                .unwrap_or(u64::MAX);
        }
        if it.sparse && data_from >= off + len {
            hole_start.get_or_insert(off);
            continue;
        }
        if hole_start.is_some() && (!flush(reads)? || !send_hole(&mut hole_start, off)) {
            return Ok(false);
        }
        if reads.full() && !forward(reads)? {
            return Ok(false);
        }
        let Some(buf) = ctx.pool.get() else {
            return Ok(false);
        };
        reads.submit(&file, off, len, buf);
    }
    if !flush(reads)? || !send_hole(&mut hole_start, size) {
        return Ok(false);
    }
    let md = file
        .metadata()
        .map_err(|e| DiskError::from_io(src.clone(), e))?;
    if !it.src.exists() {
        return Err(DiskError::SourceVanished { path: src });
    }
    if changed(&md, it) {
        return Err(DiskError::SourceChanged { path: src });
    }
    Ok(send(Block::End {
        file: it.id,
        checksum: 0, // the hashing stage fills it in
    }))
}
