//! The sender pipeline: reader threads per device read files at a queue
//! depth into one bounded block queue, and every data stream (a task of
//! the data workers) takes blocks from it, hashes each chunk right before
//! it sends it, and writes the frames.
//!
//! Files are dealt round-robin to the `--io-workers-per-device` readers of
//! their device group, so each device is read by its own thread and two
//! controllers are driven in parallel. A reader keeps [`READ_DEPTH`] chunk
//! reads in flight ([`super::ioqueue`]: io_uring, or a few threads), across file
//! boundaries, so the device is never idle between small files; blocks
//! enter the queue as their reads complete, in any order (frames carry
//! their offset). Holes of sparse files (SEEK_DATA) become `Hole` frames
//! with no payload. A resumed file's prefix is read and hashed but not
//! sent. A file that vanishes, cannot be opened or changes size/mtime while
//! being read becomes a `Fail` frame and a [`FileFailure`]; the other files
//! go on.
//!
//! The file checksum is folded from chunk hashes in file order
//! ([`OrderedDigest`]): the streams deposit the hash of each chunk they
//! send (the hash reads the chunk into the cache the send then copies it
//! from: one pass over the data), and whoever completes a file whose reads
//! all ended, reader or stream, queues its `End` frame.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::buffer::BufferPool;
use super::checksum::{
    chunk_count, chunk_hash, chunk_len, hash_prefix, next_data, FileDigest, OrderedDigest,
};
use super::devices::DeviceGroup;
use super::ioqueue::{Backend, IoQueue, Op};
use super::walk::SourcePath;
use super::wire::{Block, FileFailure, FrameHeader, FrameKind, FrameOut, Wrote};
use super::{DiskError, DiskOptions, CHUNK_SIZE};
use crate::datapath::{Grant, Progress, SendBudget, StreamIo};
use crate::workers::{WaitList, Waker};

/// One file to read.
#[derive(Debug, Clone)]
pub(crate) struct SendItem {
    pub(crate) id: u32,
    /// Relative path, for messages.
    pub(crate) rel: String,
    pub(crate) src: SourcePath,
    pub(crate) size: u64,
    pub(crate) mtime: (i64, u32),
    /// st_ino the walk saw: a file put in its place since then is not the
    /// file listed. (Not st_dev too: on overlayfs before Linux 4.19 an
    /// open file reports the lower file system's device, its path the
    /// overlay's.)
    pub(crate) ino: u64,
    pub(crate) sparse: bool,
    /// Index of its device group.
    pub(crate) group: usize,
    /// Resume offset: the receiver verified everything before it.
    pub(crate) from: u64,
}

/// What a stream gets from the queue.
pub(crate) enum Next {
    Block(Block),
    /// Nothing yet; the stream's waker runs when a block arrives.
    Later,
    /// Every reader is done and the queue is empty.
    Finished,
}

struct Queue {
    blocks: VecDeque<Block>,
    readers_left: usize,
}

/// A file being sent: its checksum so far (chunk hashes arrive from the
/// streams in any order) and whether all its reads ended.
struct Sending {
    digest: OrderedDigest,
    read: bool,
}

/// The running sender pipeline; share it (Arc) with every data stream.
pub(crate) struct SendPipeline {
    queue: Mutex<Queue>,
    /// Readers wait here while the queue is full.
    space: Condvar,
    /// Streams waiting for a block.
    waiting: WaitList,
    cap: usize,
    sending: Mutex<HashMap<u32, Sending>>,
    pool: Arc<BufferPool>,
    groups: Vec<Arc<DeviceGroup>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    failures: Mutex<Vec<FileFailure>>,
    aborted: AtomicBool,
    /// Files and payload bytes this pipeline sends (resumed prefixes left
    /// out), and the files whose last frame went out.
    files_total: u64,
    bytes_total: u64,
    files_sent: AtomicU64,
}

/// A stream with nothing to carry (readers hashing a long resumed prefix,
/// a slow disk) sends a keep-alive this often, well inside the engine's
/// 30 s data idle timeout.
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// Reads each reader keeps in flight ([`super::ioqueue::DEPTH`]).
pub(crate) const READ_DEPTH: usize = super::ioqueue::DEPTH;

/// Warn once per process that O_DIRECT was refused.
static DIRECT_WARNED: AtomicBool = AtomicBool::new(false);

/// Open `src` for reading, O_DIRECT if asked and the file system allows.
pub(crate) fn open_source(src: &SourcePath, direct: bool, follow: bool) -> io::Result<File> {
    if direct {
        match src.open(libc::O_DIRECT, follow) {
            Ok(f) => return Ok(f),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if !DIRECT_WARNED.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "longhaul: warning: O_DIRECT refused on {}; using buffered IO",
                        src.display()
                    );
                }
            }
            Err(e) => return Err(e),
        }
    }
    let f = src.open(0, follow)?;
    // We read every file front to back: ask for the larger readahead.
    // SAFETY: advisory call on a valid descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    Ok(f)
}

/// The most buffers a pipeline keeps for its streams, however many streams
/// it has. It bounds what one session can make an end hold (otherwise a
/// peer sending faster than the disk writes could fill 2 GiB at 1024
/// streams, or pin 1 GiB by starting a block on each stream and
/// trickling). A stream whose socket is full keeps the block it is
/// sending, so on a long path only this many streams refill their sockets
/// at once: 128 buffers keep 128 streams with 2 MB windows going, about
/// 22 Gb/s at 93 ms, more with larger windows.
pub(crate) const STREAM_BUFFERS_MAX: usize = 128;

/// Pool size: two blocks per stream in flight (at most
/// [`STREAM_BUFFERS_MAX`]) plus, per IO worker, two queued and its IO depth
/// in flight, so neither side starves the other; never grows. With more
/// streams than that, streams wait their turn for a buffer: each IO worker
/// always has its depth's worth, and every other buffer is either a block a
/// stream is sending or receiving whole, or a write in flight, so each comes
/// back.
pub(crate) fn pool_buffers(streams: usize, workers: usize) -> usize {
    (2 * streams).min(STREAM_BUFFERS_MAX) + (2 + READ_DEPTH) * workers + 2
}

impl SendPipeline {
    /// Start reader workers for `items` (already in manifest order).
    pub(crate) fn start(
        items: Vec<SendItem>,
        groups: Vec<Arc<DeviceGroup>>,
        opts: &DiskOptions,
    ) -> Arc<SendPipeline> {
        let per_device = opts.io_workers_per_device.max(1);
        let workers = groups.len().max(1) * per_device;
        let pool = Arc::new(BufferPool::new(pool_buffers(opts.streams, workers)));
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
        let lists: Vec<Vec<SendItem>> = lists.into_iter().filter(|l| !l.is_empty()).collect();
        let p = Arc::new(SendPipeline {
            queue: Mutex::new(Queue {
                blocks: VecDeque::new(),
                readers_left: lists.len(),
            }),
            space: Condvar::new(),
            waiting: WaitList::default(),
            // Data blocks are bounded by the pool; this bounds the small
            // ones (holes, ends, failures) of a tree of many empty files.
            cap: pool.total() + 256,
            sending: Mutex::new(HashMap::new()),
            pool,
            groups,
            workers: Mutex::new(Vec::new()),
            failures: Mutex::new(Vec::new()),
            aborted: AtomicBool::new(false),
            files_total,
            bytes_total,
            files_sent: AtomicU64::new(0),
        });
        let backend = Backend::from_env();
        let mut handles = Vec::new();
        for list in lists {
            let reader = Reader {
                p: p.clone(),
                io: IoQueue::new(READ_DEPTH, backend),
                direct: opts.direct,
                follow_symlinks: opts.follow_symlinks,
                open: HashMap::new(),
            };
            let h = std::thread::Builder::new()
                .name("lh-disk-read".into())
                .spawn(move || reader.run(list))
                .expect("spawn reader thread");
            handles.push(h);
        }
        *lock(&p.workers) = handles;
        p
    }

    /// The next block for a stream (see [`Next`]).
    pub(crate) fn next(&self, waker: &Waker) -> Next {
        let mut q = lock(&self.queue);
        if let Some(b) = q.blocks.pop_front() {
            drop(q);
            self.space.notify_one();
            return Next::Block(b);
        }
        if q.readers_left == 0 {
            return Next::Finished;
        }
        // Registered under the queue's lock: a push after it wakes us.
        self.waiting.add(waker);
        Next::Later
    }

    /// Queues a block (readers; waits for room unless `urgent`). False once
    /// the pipeline was aborted.
    fn push(&self, b: Block, urgent: bool) -> bool {
        let mut q = lock(&self.queue);
        while !urgent && q.blocks.len() >= self.cap && !self.aborted.load(Ordering::Relaxed) {
            q = self.space.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        if self.aborted.load(Ordering::Relaxed) {
            return false;
        }
        if urgent {
            q.blocks.push_front(b);
        } else {
            q.blocks.push_back(b);
        }
        drop(q);
        self.waiting.wake_one();
        true
    }

    fn reader_done(&self) {
        let mut q = lock(&self.queue);
        q.readers_left -= 1;
        drop(q);
        self.waiting.wake_all();
    }

    /// A stream hashed chunk `index` of `file`: fold it in, and queue the
    /// file's `End` if that completed it.
    fn deposit(&self, file: u32, index: u64, hash: u64) {
        let mut sending = lock(&self.sending);
        let Some(s) = sending.get_mut(&file) else {
            return; // the file failed meanwhile
        };
        s.digest.data(index, hash);
        if s.read && s.digest.complete() {
            let checksum = s.digest.finish();
            sending.remove(&file);
            drop(sending);
            self.push(Block::End { file, checksum }, true);
        }
    }

    /// The `Stage` a block is sent as, hashing data on the way.
    pub(crate) fn frame(&self, block: Block) -> FrameOut {
        match block {
            Block::Data {
                file, offset, buf, ..
            } => {
                self.deposit(file, offset / CHUNK_SIZE, chunk_hash(buf.as_slice()));
                let mut h = FrameHeader::new(FrameKind::Data, file);
                h.offset = offset;
                h.len = buf.len() as u32;
                FrameOut::with_block(h, buf)
            }
            Block::Hole { file, offset, len } => {
                let mut h = FrameHeader::new(FrameKind::Hole, file);
                h.offset = offset;
                h.value = len;
                FrameOut::new(h, Vec::new())
            }
            Block::End { file, checksum } => {
                let mut h = FrameHeader::new(FrameKind::End, file);
                h.value = checksum;
                FrameOut::new(h, Vec::new())
            }
            Block::Fail { file, message } => {
                let msg = message.as_bytes()
                    [..message.len().min(super::wire::MAX_FAIL_MESSAGE as usize)]
                    .to_vec();
                let mut h = FrameHeader::new(FrameKind::Fail, file);
                h.len = msg.len() as u32;
                FrameOut::new(h, msg)
            }
        }
    }

    /// A frame went out whole: its buffer goes back to the pool, a file's
    /// `End` counts the file as sent.
    pub(crate) fn sent(&self, frame: FrameOut) {
        if frame.header().kind == FrameKind::End {
            self.files_sent.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(buf) = frame.into_block() {
            self.pool.put(buf);
        }
    }

    /// Stop reading: readers finish their current reads and exit, waiting
    /// streams wake up.
    pub(crate) fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
        self.pool.close();
        lock(&self.queue).blocks.clear();
        self.space.notify_all();
        self.waiting.wake_all();
    }

    /// Wait for the readers; returns the files that failed on this side.
    pub(crate) fn finish(&self) -> Vec<FileFailure> {
        let handles: Vec<_> = std::mem::take(&mut *lock(&self.workers));
        for h in handles {
            let _ = h.join();
        }
        lock(&self.failures).clone()
    }

    /// Files and payload bytes this pipeline sends in all.
    pub(crate) fn totals(&self) -> (u64, u64) {
        (self.files_total, self.bytes_total)
    }

    /// Files whose every frame went out on a stream.
    pub(crate) fn files_sent(&self) -> u64 {
        self.files_sent.load(Ordering::Relaxed)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One data stream's side of the pipeline: frames out of the queue onto a
/// non-blocking socket, paced, with keep-alives while the queue is empty.
pub(crate) struct Feed {
    pipeline: Arc<SendPipeline>,
    out: Option<FrameOut>,
    last_write: Instant,
    /// The `EndOfStream` frame is queued or sent.
    ended: bool,
}

impl Feed {
    pub(crate) fn new(pipeline: Arc<SendPipeline>) -> Feed {
        Feed {
            pipeline,
            out: None,
            last_write: Instant::now(),
            ended: false,
        }
    }

    /// One turn; `Done` once `EndOfStream` went out. An error (the socket
    /// failed, the session stopped) aborts the whole pipeline.
    pub(crate) fn send(
        &mut self,
        io: &StreamIo<'_>,
        budget: &mut SendBudget,
    ) -> io::Result<Progress> {
        let r = self.turn(io, budget);
        if r.is_err() {
            self.pipeline.abort();
        }
        r
    }

    fn turn(&mut self, io: &StreamIo<'_>, budget: &mut SendBudget) -> io::Result<Progress> {
        let mut moved = 0;
        loop {
            if budget.stopped() {
                return Err(io::Error::other("session stopped"));
            }
            if let Some(out) = &mut self.out {
                let remaining = out.payload_left();
                let allowed = match budget.pace(remaining.max(1)) {
                    Grant::Send(n) => n,
                    Grant::WaitUntil(t) => return Ok(Progress::at(t)),
                    Grant::Done => return Err(io::Error::other("session stopped")),
                    // Never from `pace`: only `grant` applies a `--time` queue
                    // cap, and disk mode has no `--time`. Waits as on a full socket.
                    Grant::Full => return Ok(budget.until_writable()),
                };
                let (wrote, payload) = out.write_to(io.sock, allowed)?;
                budget.spent(payload);
                moved += payload;
                // A stream's bytes are file data, as the receiving end
                // counts them: a `Fail` frame's message is not (counted,
                // it made the two ends disagree on the stream's bytes and
                // a file that failed on the sender failed the whole tree).
                if out.header().kind == FrameKind::Data {
                    io.moved(payload as u64);
                }
                match wrote {
                    Wrote::Whole => {
                        let frame = self.out.take().expect("written above");
                        self.pipeline.sent(frame);
                        self.last_write = Instant::now();
                    }
                    Wrote::Part => continue,
                    Wrote::Blocked => return Ok(Progress::writable()),
                }
                continue;
            }
            if self.ended {
                return Ok(Progress::Done);
            }
            if moved >= io.allowance {
                return Ok(Progress::Yield);
            }
            match self.pipeline.next(io.waker) {
                Next::Block(b) => self.out = Some(self.pipeline.frame(b)),
                Next::Finished => {
                    self.out = Some(FrameOut::new(
                        FrameHeader::new(FrameKind::EndOfStream, 0),
                        Vec::new(),
                    ));
                    self.ended = true;
                }
                Next::Later => {
                    let due = self.last_write + KEEPALIVE_INTERVAL;
                    if Instant::now() < due {
                        return Ok(Progress::at(due));
                    }
                    self.out = Some(FrameOut::new(
                        FrameHeader::new(FrameKind::KeepAlive, 0),
                        Vec::new(),
                    ));
                }
            }
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        if let Some(buf) = self.out.take().and_then(FrameOut::into_block) {
            self.pipeline.pool.put(buf);
        }
    }
}

/// What a read in flight belongs to.
struct ReadTag {
    file: u32,
    offset: u64,
    len: u64,
}

/// A file being read by a reader.
struct Reading {
    it: SendItem,
    file: Arc<File>,
    /// Reads in flight.
    outstanding: usize,
    /// Every read of the file is submitted (or it failed).
    submitted: bool,
    failed: Option<DiskError>,
}

/// Where a reader is in the file it submits reads for.
struct Cursor {
    id: u32,
    index: u64,
    chunks: u64,
    data_from: u64,
    hole_start: Option<u64>,
}

/// A reader thread: its files, its IO queue.
struct Reader {
    p: Arc<SendPipeline>,
    io: IoQueue<ReadTag>,
    direct: bool,
    follow_symlinks: bool,
    open: HashMap<u32, Reading>,
}

fn changed(md: &std::fs::Metadata, it: &SendItem) -> bool {
    md.len() != it.size
        || md.mtime() != it.mtime.0
        || md.mtime_nsec() as u32 != it.mtime.1
        || md.ino() != it.ino
}

impl Reader {
    fn aborted(&self) -> bool {
        self.p.aborted.load(Ordering::Relaxed)
    }

    fn run(mut self, list: Vec<SendItem>) {
        let mut items = list.into_iter();
        let mut cursor: Option<Cursor> = None;
        let mut more = true;
        while !self.aborted() {
            while !self.io.full() && !self.aborted() {
                if cursor.is_none() {
                    match items.next() {
                        Some(it) => cursor = self.begin(it),
                        None => {
                            more = false;
                            break;
                        }
                    }
                    continue;
                }
                let c = cursor.as_mut().expect("checked above");
                if !self.step(c) {
                    let id = c.id;
                    cursor = None;
                    if let Some(r) = self.open.get_mut(&id) {
                        r.submitted = true;
                    }
                    self.settle(id);
                }
            }
            if !more && cursor.is_none() && self.io.in_flight() == 0 {
                break;
            }
            for d in self.io.wait(None) {
                let t = d.tag;
                let Some(r) = self.open.get_mut(&t.file) else {
                    self.p.pool.put(d.buf);
                    continue;
                };
                r.outstanding -= 1;
                match d.result {
                    Ok(_) if r.failed.is_none() => {
                        let mut buf = d.buf;
                        buf.set_len(t.len as usize);
                        self.p.groups[r.it.group].add_read(t.len);
                        let block = Block::Data {
                            file: t.file,
                            offset: t.offset,
                            buf,
                            hash: (),
                        };
                        if !self.p.push(block, false) {
                            break;
                        }
                    }
                    Ok(_) => self.p.pool.put(d.buf),
                    Err(e) => {
                        self.p.pool.put(d.buf);
                        let src = r.it.src.display();
                        r.failed.get_or_insert(match e.kind() {
                            io::ErrorKind::UnexpectedEof => DiskError::SourceChanged { path: src },
                            _ => DiskError::from_io(src, e),
                        });
                    }
                }
                self.settle(t.file);
            }
        }
        // Aborted or done: nothing may stay in flight.
        for d in self.io.drain() {
            self.p.pool.put(d.buf);
        }
        self.p.reader_done();
    }

    /// Opens a file, hashes a resumed prefix, and registers its checksum;
    /// `None` when it failed at once (its `Fail` is queued).
    fn begin(&mut self, it: SendItem) -> Option<Cursor> {
        let id = it.id;
        match self.open_file(&it) {
            Ok((file, digest)) => {
                let chunks = chunk_count(it.size);
                let from_chunk = (it.from / CHUNK_SIZE).min(chunks);
                lock(&self.p.sending).insert(
                    id,
                    Sending {
                        digest,
                        read: false,
                    },
                );
                self.open.insert(
                    id,
                    Reading {
                        it,
                        file: Arc::new(file),
                        outstanding: 0,
                        submitted: false,
                        failed: None,
                    },
                );
                Some(Cursor {
                    id,
                    index: from_chunk,
                    chunks,
                    data_from: 0,
                    hole_start: None,
                })
            }
            Err(e) => {
                self.fail(&it, e);
                None
            }
        }
    }

    fn open_file(&self, it: &SendItem) -> Result<(File, OrderedDigest), DiskError> {
        let src = it.src.display();
        let file = open_source(&it.src, self.direct, self.follow_symlinks).map_err(|e| match e
            .kind()
        {
            io::ErrorKind::NotFound => DiskError::SourceVanished { path: src.clone() },
            _ => DiskError::from_io(src.clone(), e),
        })?;
        let md = file
            .metadata()
            .map_err(|e| DiskError::from_io(src.clone(), e))?;
        if changed(&md, it) {
            return Err(DiskError::SourceChanged { path: src });
        }
        let chunks = chunk_count(it.size);
        let from_chunk = (it.from / CHUNK_SIZE).min(chunks);
        let mut prefix = FileDigest::default();
        if from_chunk > 0 {
            let Some(mut buf) = self.p.pool.get() else {
                return Err(DiskError::Io {
                    path: src,
                    source: io::Error::other("sender shutting down"),
                });
            };
            let r = hash_prefix(
                &file,
                it.size,
                from_chunk,
                it.sparse,
                buf.as_mut_full(),
                &mut prefix,
            );
            self.p.pool.put(buf);
            let read = r.map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => DiskError::SourceChanged { path: src.clone() },
                _ => DiskError::from_io(src.clone(), e),
            })?;
            self.p.groups[it.group].add_read(read);
        }
        Ok((file, OrderedDigest::resume(it.size, from_chunk, prefix)))
    }

    /// Submits the cursor's next read (or queues a hole); false when the
    /// file has nothing more to submit.
    fn step(&mut self, c: &mut Cursor) -> bool {
        let (sparse, size, file) = match self.open.get(&c.id) {
            Some(r) if r.failed.is_none() => (r.it.sparse, r.it.size, r.file.clone()),
            _ => return false,
        };
        while c.index < c.chunks {
            let off = c.index * CHUNK_SIZE;
            let len = chunk_len(c.index, size);
            if sparse && off + len > c.data_from {
                match next_data(&file, off) {
                    Ok(d) => c.data_from = d.unwrap_or(u64::MAX),
                    Err(e) => {
                        if let Some(r) = self.open.get_mut(&c.id) {
                            r.failed = Some(DiskError::from_io(r.it.src.display(), e));
                        }
                        return false;
                    }
                }
            }
            if sparse && c.data_from >= off + len {
                c.hole_start.get_or_insert(off);
                c.index += 1;
                continue;
            }
            if let Some(start) = c.hole_start.take() {
                self.hole(c.id, start, off);
            }
            let Some(buf) = self.p.pool.get() else {
                return false; // aborted
            };
            self.io.submit(Op {
                file: file.clone(),
                offset: off,
                // O_DIRECT wants aligned lengths: read a whole chunk buffer
                // and let EOF shorten it.
                len: buf.capacity(),
                need: len as usize,
                buf,
                write: false,
                tag: ReadTag {
                    file: c.id,
                    offset: off,
                    len,
                },
            });
            if let Some(r) = self.open.get_mut(&c.id) {
                r.outstanding += 1;
            }
            c.index += 1;
            return true;
        }
        if let Some(start) = c.hole_start.take() {
            self.hole(c.id, start, size);
        }
        false
    }

    /// Chunks of `file` from `start` to `end` are a hole: fold their zero
    /// hashes in and queue the frame.
    fn hole(&self, file: u32, start: u64, end: u64) {
        let first = start / CHUNK_SIZE;
        let count = chunk_count(end) - first;
        if let Some(s) = lock(&self.p.sending).get_mut(&file) {
            s.digest.zeros(first, count);
        }
        self.p.push(
            Block::Hole {
                file,
                offset: start,
                len: end - start,
            },
            false,
        );
    }

    /// Ends a file whose reads all completed: checks it did not change,
    /// then lets its `End` go (or fails it).
    fn settle(&mut self, id: u32) {
        let done = self
            .open
            .get(&id)
            .is_some_and(|r| r.submitted && r.outstanding == 0);
        if !done {
            return;
        }
        let r = self.open.remove(&id).expect("looked up above");
        let src = r.it.src.display();
        let failure = r.failed.or_else(|| match r.file.metadata() {
            Err(e) => Some(DiskError::from_io(src.clone(), e)),
            Ok(_) if !r.it.src.exists(self.follow_symlinks) => {
                Some(DiskError::SourceVanished { path: src.clone() })
            }
            Ok(md) if changed(&md, &r.it) => Some(DiskError::SourceChanged { path: src.clone() }),
            Ok(_) => None,
        });
        if let Some(e) = failure {
            lock(&self.p.sending).remove(&id);
            self.fail(&r.it, e);
            return;
        }
        let mut sending = lock(&self.p.sending);
        if let Some(s) = sending.get_mut(&id) {
            s.read = true;
            if s.digest.complete() {
                let checksum = s.digest.finish();
                sending.remove(&id);
                drop(sending);
                self.p.push(Block::End { file: id, checksum }, false);
            }
        }
    }

    fn fail(&self, it: &SendItem, e: DiskError) {
        let failure = FileFailure::new(it.id, &it.rel, &e);
        // The receiver learns code and message: "code\tmessage".
        let message = format!("{}\t{}", failure.code, failure.error);
        lock(&self.p.failures).push(failure);
        self.p.push(
            Block::Fail {
                file: it.id,
                message,
            },
            false,
        );
    }
}
