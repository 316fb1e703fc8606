//! Disk reads and writes at a queue depth, for the per-device IO threads of
//! the reader and writer pipelines.
//!
//! An [`IoQueue`] takes whole-buffer operations (read a chunk into a pool
//! buffer, write a pool buffer at an offset) and hands back each one's
//! buffer and result when it completes, in any order. Up to its depth are
//! in flight at once, so the device always has the next request queued
//! while one completes. Two backends:
//!
//! - io_uring (Linux 5.6+): one ring per IO thread, no extra threads;
//! - a few helper threads doing pread/pwrite, where io_uring is missing or
//!   forbidden (kernel.io_uring_disabled, a container's seccomp profile),
//!   or asked for with `LONGHAUL_DISK_IO=threads` (measurements, tests).
//!
//! Short transfers are continued until the operation is whole, so callers
//! see a full chunk, an error, or (reads only) end of file.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::buffer::AlignedBuf;

/// Operations each IO thread keeps in flight: enough that the device has
/// the next requests queued while one completes, also across small files.
pub(crate) const DEPTH: usize = 4;

/// Which backend an [`IoQueue`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Uring,
    Threads,
}

impl Backend {
    /// `LONGHAUL_DISK_IO` (`uring`, `threads`); default io_uring where the
    /// kernel lets us set up a ring.
    pub(crate) fn from_env() -> Backend {
        match std::env::var("LONGHAUL_DISK_IO").as_deref() {
            Ok("threads") => Backend::Threads,
            _ => Backend::Uring,
        }
    }
}

/// One operation: the whole of `len` bytes of the buffer at `offset`.
pub(crate) struct Op<T> {
    pub(crate) file: Arc<File>,
    pub(crate) offset: u64,
    pub(crate) buf: AlignedBuf,
    /// Bytes to transfer (from the buffer's start).
    pub(crate) len: usize,
    /// Reads only: end of file after this many bytes is a success (an
    /// O_DIRECT read asks for a whole aligned buffer; the file may end
    /// before). Writes: equal to `len`.
    pub(crate) need: usize,
    pub(crate) write: bool,
    /// The caller's note, handed back with the result.
    pub(crate) tag: T,
}

/// A finished operation: the caller's note, its buffer, and the bytes
/// transferred (at least `need`) or the error.
pub(crate) struct Done<T> {
    pub(crate) tag: T,
    pub(crate) buf: AlignedBuf,
    pub(crate) result: io::Result<usize>,
}

struct InFlight<T> {
    op: Op<T>,
    /// Bytes transferred so far.
    done: usize,
}

/// Reads and writes in flight, up to a depth.
pub(crate) struct IoQueue<T> {
    depth: usize,
    kind: Kind<T>,
}

enum Kind<T> {
    Uring {
        ring: Box<io_uring::IoUring>,
        ops: HashMap<u64, InFlight<T>>,
        next: u64,
        /// The kicker's eventfd and the 8 bytes a read of it fills; the
        /// read is always in flight under [`KICK_KEY`].
        kick: Option<(Arc<std::os::fd::OwnedFd>, Box<u64>)>,
    },
    Threads {
        jobs: Option<Sender<InFlight<T>>>,
        done: Receiver<Completed<T>>,
        /// For the kicker: a `None` ends a wait.
        done_tx: Sender<Completed<T>>,
        in_flight: usize,
        kickable: bool,
    },
}

/// What a helper thread hands back; `None` is a kick.
type Completed<T> = Option<(InFlight<T>, io::Result<usize>)>;

/// The ring key of the kicker's eventfd read (operations count from 1).
const KICK_KEY: u64 = 0;

/// Ends an [`IoQueue::wait`] from another thread (work arrived for the IO
/// thread that waits there).
#[derive(Clone)]
pub(crate) struct Kicker(KickerKind);

#[derive(Clone)]
enum KickerKind {
    EventFd(Arc<std::os::fd::OwnedFd>),
    Channel(Arc<Mutex<Box<dyn Fn() + Send>>>),
}

impl Kicker {
    pub(crate) fn kick(&self) {
        match &self.0 {
            KickerKind::EventFd(fd) => {
                let one: u64 = 1;
                // SAFETY: writes 8 bytes from a local to an eventfd we own.
                unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
            }
            KickerKind::Channel(f) => (f.lock().unwrap_or_else(|e| e.into_inner()))(),
        }
    }
}

impl<T: Send + 'static> IoQueue<T> {
    /// A queue of `depth` operations on `backend`, falling back to threads
    /// when no ring can be set up.
    pub(crate) fn new(depth: usize, backend: Backend) -> IoQueue<T> {
        let depth = depth.max(1);
        if backend == Backend::Uring {
            if let Ok(ring) = io_uring::IoUring::new((depth * 2).next_power_of_two() as u32) {
                return IoQueue {
                    depth,
                    kind: Kind::Uring {
                        ring: Box::new(ring),
                        ops: HashMap::new(),
                        next: KICK_KEY,
                        kick: None,
                    },
                };
            }
        }
        let (jobs, job_rx) = channel::<InFlight<T>>();
        let (done_tx, done) = channel::<Completed<T>>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        for _ in 0..depth {
            let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
            std::thread::Builder::new()
                .name("lh-disk-io".into())
                .spawn(move || loop {
                    let job = match job_rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                        Ok(j) => j,
                        Err(_) => return,
                    };
                    let mut job = job;
                    let r = blocking(&mut job);
                    if done_tx.send(Some((job, r))).is_err() {
                        return;
                    }
                })
                .expect("spawn disk IO thread");
        }
        IoQueue {
            depth,
            kind: Kind::Threads {
                jobs: Some(jobs),
                done,
                done_tx,
                in_flight: 0,
                kickable: false,
            },
        }
    }

    /// A handle that ends this queue's [`IoQueue::wait`] from another
    /// thread. From then on `wait` also blocks with nothing in flight.
    pub(crate) fn kicker(&mut self) -> io::Result<Kicker> {
        match &mut self.kind {
            Kind::Uring { ring, kick, .. } => {
                if kick.is_none() {
                    // SAFETY: plain syscall; the descriptor is owned at once.
                    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // SAFETY: a fresh descriptor we own.
                    let fd = Arc::new(unsafe {
                        <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
                    });
                    let mut buf = Box::new(0u64);
                    arm_kick(ring, &fd, &mut buf);
                    *kick = Some((fd, buf));
                }
                let fd = kick.as_ref().expect("set above").0.clone();
                Ok(Kicker(KickerKind::EventFd(fd)))
            }
            Kind::Threads {
                done_tx, kickable, ..
            } => {
                *kickable = true;
                let tx = done_tx.clone();
                Ok(Kicker(KickerKind::Channel(Arc::new(Mutex::new(Box::new(
                    move || {
                        let _ = tx.send(None);
                    },
                ))))))
            }
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        match &self.kind {
            Kind::Uring { ops, .. } => ops.len(),
            Kind::Threads { in_flight, .. } => *in_flight,
        }
    }

    /// Whether the queue holds its depth of operations.
    pub(crate) fn full(&self) -> bool {
        self.in_flight() >= self.depth
    }

    /// Starts `op` (the caller keeps the queue at most [`IoQueue::full`]).
    pub(crate) fn submit(&mut self, op: Op<T>) {
        let f = InFlight { op, done: 0 };
        match &mut self.kind {
            Kind::Uring {
                ring, ops, next, ..
            } => {
                *next += 1;
                let key = *next;
                push(ring, key, &f);
                ops.insert(key, f);
                // Errors surface as failed completions on the next wait.
                let _ = ring.submit();
            }
            Kind::Threads {
                jobs, in_flight, ..
            } => {
                if let Some(jobs) = jobs {
                    if jobs.send(f).is_ok() {
                        *in_flight += 1;
                    }
                }
            }
        }
    }

    /// Waits up to `timeout` (`None`: until one completes) for at least one
    /// operation to finish and returns every finished one. Empty when
    /// nothing is in flight or the time ran out.
    pub(crate) fn wait(&mut self, timeout: Option<Duration>) -> Vec<Done<T>> {
        let mut out = Vec::new();
        let kickable = match &self.kind {
            Kind::Uring { kick, .. } => kick.is_some(),
            Kind::Threads { kickable, .. } => *kickable,
        };
        if self.in_flight() == 0 && !kickable {
            return out;
        }
        match &mut self.kind {
            Kind::Uring {
                ring, ops, kick, ..
            } => {
                let ts;
                let r = match timeout {
                    Some(t) => {
                        ts = io_uring::types::Timespec::new()
                            .sec(t.as_secs())
                            .nsec(t.subsec_nanos());
                        let args = io_uring::types::SubmitArgs::new().timespec(&ts);
                        ring.submitter().submit_with_args(1, &args)
                    }
                    None => ring.submit_and_wait(1),
                };
                if let Err(e) = r {
                    if !matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR)) {
                        // The ring itself failed: fail everything in flight.
                        for (_, f) in ops.drain() {
                            out.push(Done {
                                tag: f.op.tag,
                                buf: f.op.buf,
                                result: Err(io::Error::new(e.kind(), e.to_string())),
                            });
                        }
                        return out;
                    }
                }
                let cqes: Vec<(u64, i32)> = ring
                    .completion()
                    .map(|c| (c.user_data(), c.result()))
                    .collect();
                let mut resubmitted = false;
                for (key, res) in cqes {
                    if key == KICK_KEY {
                        if let Some((fd, buf)) = kick.as_mut() {
                            arm_kick(ring, fd, buf);
                            resubmitted = true;
                        }
                        continue;
                    }
                    let Some(mut f) = ops.remove(&key) else {
                        continue;
                    };
                    let step = if res < 0 {
                        Err(io::Error::from_raw_os_error(-res))
                    } else {
                        Ok(res as usize)
                    };
                    match advance(&mut f, step) {
                        Some(result) => out.push(Done {
                            tag: f.op.tag,
                            buf: f.op.buf,
                            result,
                        }),
                        None => {
                            push(ring, key, &f);
                            ops.insert(key, f);
                            resubmitted = true;
                        }
                    }
                }
                if resubmitted {
                    let _ = ring.submit();
                }
            }
            Kind::Threads {
                done, in_flight, ..
            } => {
                let first = match timeout {
                    Some(t) => match done.recv_timeout(t) {
                        Ok(d) => Some(d),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => None,
                    },
                    None => done.recv().ok(),
                };
                let first = first.flatten().map(Some);
                let more = std::iter::from_fn(|| done.try_recv().ok());
                for (f, result) in first.into_iter().chain(more).flatten() {
                    *in_flight -= 1;
                    out.push(Done {
                        tag: f.op.tag,
                        buf: f.op.buf,
                        result,
                    });
                }
            }
        }
        out
    }

    /// Waits for everything in flight (kicks are ignored).
    pub(crate) fn drain(&mut self) -> Vec<Done<T>> {
        let mut out = Vec::new();
        while self.in_flight() > 0 {
            out.extend(self.wait(None));
        }
        out
    }
}

impl<T> Drop for IoQueue<T> {
    fn drop(&mut self) {
        match &mut self.kind {
            // The kernel must be done with our buffers before they are freed.
            // The kernel must be done with our buffers (and the kick read's)
            // before they are freed: complete the kick read, reap everything.
            Kind::Uring {
                ring, ops, kick, ..
            } => {
                let mut kick_pending = kick.is_some();
                if let Some((fd, _)) = kick {
                    let one: u64 = 1;
                    // SAFETY: writes 8 bytes from a local to our eventfd.
                    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
                }
                while !ops.is_empty() || kick_pending {
                    if ring.submit_and_wait(1).is_err() {
                        break;
                    }
                    let keys: Vec<u64> = ring.completion().map(|c| c.user_data()).collect();
                    for k in keys {
                        if k == KICK_KEY {
                            kick_pending = false;
                        }
                        ops.remove(&k);
                    }
                }
            }
            Kind::Threads { jobs, .. } => {
                jobs.take();
            }
        }
    }
}

/// Queues a read of the kicker's eventfd.
fn arm_kick(ring: &mut io_uring::IoUring, fd: &std::os::fd::OwnedFd, buf: &mut u64) {
    use io_uring::{opcode, types};
    let entry = opcode::Read::new(types::Fd(fd.as_raw_fd()), (buf as *mut u64).cast(), 8)
        .build()
        .user_data(KICK_KEY);
    // SAFETY: `buf` is boxed in the queue and outlives the ring.
    if unsafe { ring.submission().push(&entry) }.is_err() {
        let _ = ring.submit();
        // SAFETY: as above.
        let _ = unsafe { ring.submission().push(&entry) };
    }
    let _ = ring.submit();
}

/// Queues the rest of `f` on the ring.
fn push<T>(ring: &mut io_uring::IoUring, key: u64, f: &InFlight<T>) {
    use io_uring::{opcode, types};
    let fd = types::Fd(f.op.file.as_raw_fd());
    let len = (f.op.len - f.done) as u32;
    let offset = f.op.offset + f.done as u64;
    // SAFETY: the buffer lives in `ops` until its completion is reaped (or
    // the ring is dropped, which waits for every completion first).
    let ptr = unsafe { f.op.buf.as_ptr().add(f.done) };
    let entry = if f.op.write {
        opcode::Write::new(fd, ptr, len).offset(offset).build()
    } else {
        opcode::Read::new(fd, ptr.cast_mut(), len)
            .offset(offset)
            .build()
    };
    let entry = entry.user_data(key);
    // SAFETY: as above; the ring has room for twice the depth.
    let pushed = unsafe { ring.submission().push(&entry) };
    if pushed.is_err() {
        let _ = ring.submit();
        // SAFETY: as above, after the kernel took the queued entries.
        let _ = unsafe { ring.submission().push(&entry) };
    }
}

/// Adds one transfer's outcome; `Some` once the operation is finished.
fn advance<T>(f: &mut InFlight<T>, step: io::Result<usize>) -> Option<io::Result<usize>> {
    match step {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
        Err(e) => Some(Err(e)),
        Ok(0) if f.op.write => Some(Err(io::ErrorKind::WriteZero.into())),
        Ok(0) => Some(if f.done >= f.op.need {
            Ok(f.done)
        } else {
            Err(io::ErrorKind::UnexpectedEof.into())
        }),
        Ok(n) => {
            f.done += n;
            if f.done >= f.op.len || (!f.op.write && f.done >= f.op.need) {
                Some(Ok(f.done))
            } else {
                None
            }
        }
    }
}

/// The whole operation with blocking calls (the threads backend).
fn blocking<T>(f: &mut InFlight<T>) -> io::Result<usize> {
    let op = &mut f.op;
    let mut done = 0;
    while done < op.len {
        let at = op.offset + done as u64;
        let r = if op.write {
            op.file.write_at(&op.buf.head(op.len)[done..], at)
        } else {
            op.file.read_at(&mut op.buf.as_mut_full()[done..op.len], at)
        };
        match r {
            Ok(0) if op.write => return Err(io::ErrorKind::WriteZero.into()),
            Ok(0) if done >= op.need => return Ok(done),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if !op.write && done >= op.need {
            return Ok(done);
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> (Arc<File>, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "longhaul-io-{}-{}",
            std::process::id(),
            bytes.len()
        ));
        let mut f = File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (Arc::new(f), path)
    }

    #[test]
    fn both_backends_read_and_write_whole_buffers() {
        for backend in [Backend::Uring, Backend::Threads] {
            let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
            let (file, path) = file_of(&data);
            let mut q: IoQueue<u32> = IoQueue::new(4, backend);
            // Three reads: two whole 4 KiB pieces, and the tail asking for a
            // whole buffer but needing only what is left.
            for (i, off) in [0u64, 4096, 8192].into_iter().enumerate() {
                let need = (data.len() as u64 - off).min(4096) as usize;
                q.submit(Op {
                    file: file.clone(),
                    offset: off,
                    buf: AlignedBuf::new(4096),
                    len: 4096,
                    need,
                    write: false,
                    tag: i as u32,
                });
            }
            let mut got = q.drain();
            got.sort_by_key(|d| d.tag);
            assert_eq!(got.len(), 3);
            for d in &got {
                let off = d.tag as usize * 4096;
                let n = *d.result.as_ref().unwrap();
                assert_eq!(n, (data.len() - off).min(4096), "{backend:?}");
                assert_eq!(d.buf.head(n), &data[off..off + n]);
            }
            // A read past the end that needs bytes is an early EOF.
            q.submit(Op {
                file: file.clone(),
                offset: 20_000,
                buf: AlignedBuf::new(4096),
                len: 4096,
                need: 1,
                write: false,
                tag: 9,
            });
            let d = q.drain().pop().unwrap();
            assert_eq!(d.result.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
            // A write lands where it was asked to.
            let mut buf = AlignedBuf::new(4096);
            buf.as_mut_full()[..5].copy_from_slice(b"hello");
            q.submit(Op {
                file: file.clone(),
                offset: 3,
                buf,
                len: 5,
                need: 5,
                write: true,
                tag: 1,
            });
            assert_eq!(q.drain().pop().unwrap().result.unwrap(), 5);
            let back = std::fs::read(&path).unwrap();
            assert_eq!(&back[3..8], b"hello");
            assert!(q.wait(Some(Duration::from_millis(1))).is_empty());
            std::fs::remove_file(path).unwrap();
        }
    }
}
