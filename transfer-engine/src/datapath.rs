//! Data sources and sinks: what a stream worker sends and where received
//! bytes go.
//!
//! A session's mode picks a [`DataPlane`], which hands every sending stream a
//! [`Source`] and every receiving stream a [`Sink`]. Memory mode
//! ([`MemoryPlane`]) sends a pattern that is written once and never touched
//! again and discards what it receives; disk mode plugs in its own plane
//! (reading and writing files) without touching the session machinery.
//!
//! Memory mode has several ways to move bytes; `docs/performance.md` records
//! what each costs here. The defaults are the fastest measured; the
//! environment variables `LONGHAUL_SEND_METHOD` (`write`, `sendfile`,
//! `zerocopy`) and `LONGHAUL_RECV_METHOD` (`read`, `trunc`, `splice`) select
//! another one for measurements.

use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::pacer::Pacer;

/// Default bytes handed to one write/sendfile call. Large enough that
/// syscall overhead vanishes next to the copy, small enough to keep the time
/// limit and stop flag responsive (1 MiB at 10 Gb/s is under a millisecond).
/// `LONGHAUL_CHUNK` (a size, e.g. `256K`) overrides it for measurements.
pub const CHUNK: usize = 1 << 20;

/// Size of the memory-mode pattern (buffer or memfd). Several chunks, so
/// consecutive sendfile calls walk through different pages.
pub const PATTERN_LEN: usize = 8 << 20;

/// Bytes asked from one receive call.
pub const RECV_CHUNK: usize = 1 << 20;

/// Buffer of the `read` receive method (measurements only): the copy it
/// measures costs the same per byte whatever the buffer, and 1024 streams
/// must not cost a gigabyte. The default `trunc` method needs no buffer.
pub const READ_BUFFER: usize = 256 << 10;

/// When a sending stream stops.
#[derive(Debug, Clone, Copy)]
pub enum Limit {
    /// Exactly this many payload bytes.
    Bytes(u64),
    /// For this long after the session's streams start (`--time`); turned
    /// into [`Limit::Until`] by [`SendBudget::started_at`].
    For(std::time::Duration),
    /// Until this instant.
    Until(Instant),
}

/// Makes the sending streams of one end that already moved data pause
/// until every one of them has started sending. A 1024-stream session on
/// a few cores otherwise leaves the scheduler to decide which streams run:
/// the busy ones keep the CPUs and some streams never send a byte.
#[derive(Debug)]
pub struct FairStart {
    not_started: AtomicUsize,
}

/// How long a stream that already sent naps while others have not started.
const FAIR_START_NAP: std::time::Duration = std::time::Duration::from_millis(2);

/// Streams stop waiting for the others after this long, whatever happens
/// (a stream that cannot start in this time is stuck for other reasons).
const FAIR_START_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl FairStart {
    /// A start for `streams` sending streams.
    pub fn new(streams: usize) -> FairStart {
        FairStart {
            not_started: AtomicUsize::new(streams),
        }
    }

    fn started(&self) {
        self.not_started.fetch_sub(1, Ordering::AcqRel);
    }

    fn everyone_started(&self) -> bool {
        self.not_started.load(Ordering::Acquire) == 0
    }
}

/// Everything a [`Source`] needs to know about how much to send.
#[derive(Debug, Clone)]
pub struct SendBudget {
    pub limit: Limit,
    /// Shared in-process pacer of this direction (`--rate`).
    pub pacer: Option<Arc<Pacer>>,
    /// Shared by this end's sending streams; see [`FairStart`].
    pub fair: Option<Arc<FairStart>>,
    /// Whether this stream told `fair` it started.
    pub counted: std::cell::Cell<bool>,
    /// Set when the session fails; sources stop at the next chunk.
    pub stop: Arc<AtomicBool>,
}

impl SendBudget {
    /// The streams started at `start`: a [`Limit::For`] ends then.
    pub fn started_at(&mut self, start: Instant) {
        if let Limit::For(d) = self.limit {
            self.limit = Limit::Until(start + d);
        }
    }

    /// Bytes to send next after `sent` so far (0 = done).
    pub fn next_chunk(&self, sent: u64, max: usize) -> usize {
        if self.stop.load(Ordering::Relaxed) {
            return 0;
        }
        if let Some(fair) = &self.fair {
            if !self.counted.replace(true) {
                fair.started();
            } else {
                self.wait_for_the_others(fair);
            }
        }
        let max = match &self.pacer {
            Some(p) => max.min(p.chunk()),
            None => max,
        };
        match self.limit {
            Limit::Bytes(total) => (total.saturating_sub(sent)).min(max as u64) as usize,
            Limit::Until(deadline) if Instant::now() < deadline => max,
            Limit::Until(_) => 0,
            // Not started: the stream worker calls `started_at` first.
            Limit::For(_) => 0,
        }
    }

    /// Naps while some stream of this end has not sent yet (bounded by the
    /// deadline, the stop flag and [`FAIR_START_MAX_WAIT`]).
    fn wait_for_the_others(&self, fair: &FairStart) {
        let since = Instant::now();
        while !fair.everyone_started()
            && !self.stop.load(Ordering::Relaxed)
            && since.elapsed() < FAIR_START_MAX_WAIT
            && !matches!(self.limit, Limit::Until(d) if Instant::now() >= d)
        {
            std::thread::sleep(FAIR_START_NAP);
        }
    }
}

/// Produces a sending stream's payload.
pub trait Source: Send {
    /// Writes payload to `sock` until the budget says stop, adding every
    /// byte accepted by the kernel to `counter`. Returns the total.
    fn pump(&mut self, sock: &TcpStream, budget: &SendBudget, counter: &AtomicU64) -> Result<u64>;
}

/// Consumes a receiving stream's payload.
pub trait Sink: Send {
    /// Reads from `sock` until end of stream, adding to `counter`. Returns
    /// the total.
    fn drain(&mut self, sock: &TcpStream, counter: &AtomicU64) -> Result<u64>;
}

/// Per-session factory of sources and sinks, chosen by the session's mode.
pub trait DataPlane: Send + Sync {
    fn source(&self, stream_id: u32) -> Result<Box<dyn Source>>;
    fn sink(&self, stream_id: u32) -> Result<Box<dyn Sink>>;
    /// Called on each end once its workers are done; the value is sent to
    /// the peer in `Done::mode_summary` and shown in the output (disk mode:
    /// the `files` object).
    fn summary(&self) -> Result<Option<serde_json::Value>> {
        Ok(None)
    }
    /// Client only: `SessionRequest::mode_params` of this mode.
    fn mode_params(&self) -> Option<serde_json::Value> {
        None
    }
    /// Client only: runs after `SessionRequest` is sent and before
    /// `SessionAccepted` is read (disk mode: manifest out, plan in).
    fn negotiate(&self, _conn: &mut crate::connection::Connection) -> Result<()> {
        Ok(())
    }
    /// Per-device IO counters for the stats API (disk mode).
    fn devices(&self) -> Vec<Arc<crate::disk::devices::DeviceGroup>> {
        Vec::new()
    }
}

/// How memory mode sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendMethod {
    /// write(2) from a pattern buffer: one copy user -> kernel.
    Write,
    /// sendfile(2) from a memfd filled once: the kernel references the
    /// pages, no copy on the sending side.
    Sendfile,
    /// send(2) with MSG_ZEROCOPY from the pattern buffer.
    Zerocopy,
}

/// How memory mode receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvMethod {
    /// read(2) into a reusable buffer: one copy kernel -> user.
    Read,
    /// recv(2) with MSG_TRUNC: TCP discards the data without copying it.
    Trunc,
    /// splice(2) socket -> pipe -> /dev/null.
    Splice,
}

impl SendMethod {
    pub fn from_env() -> Result<SendMethod> {
        match std::env::var("LONGHAUL_SEND_METHOD").as_deref() {
            Err(_) | Ok("") | Ok("write") => Ok(SendMethod::Write),
            Ok("sendfile") => Ok(SendMethod::Sendfile),
            Ok("zerocopy") => Ok(SendMethod::Zerocopy),
            Ok(other) => Err(Error::Usage(format!(
                "LONGHAUL_SEND_METHOD={other}: expected write, sendfile or zerocopy"
            ))),
        }
    }
}

impl RecvMethod {
    pub fn from_env() -> Result<RecvMethod> {
        match std::env::var("LONGHAUL_RECV_METHOD").as_deref() {
            Err(_) | Ok("") | Ok("trunc") => Ok(RecvMethod::Trunc),
            Ok("read") => Ok(RecvMethod::Read),
            Ok("splice") => Ok(RecvMethod::Splice),
            Ok(other) => Err(Error::Usage(format!(
                "LONGHAUL_RECV_METHOD={other}: expected read, trunc or splice"
            ))),
        }
    }
}

/// Memory-to-memory plane: a pattern source and a discarding sink.
pub struct MemoryPlane {
    chunk: usize,
    send: SendMethod,
    recv: RecvMethod,
    pattern: Arc<Vec<u8>>,
    memfd: Option<Arc<OwnedFd>>,
}

/// A recognisable, non-zero pattern (zero pages could be special-cased by
/// some layer and make the numbers lie).
fn make_pattern() -> Vec<u8> {
    let block: Vec<u8> = (0..(64u32 << 10))
        .map(|i| i.wrapping_mul(2654435761).to_be_bytes()[0] | 1)
        .collect();
    let mut pattern = Vec::with_capacity(PATTERN_LEN);
    while pattern.len() < PATTERN_LEN {
        pattern.extend_from_slice(&block);
    }
    pattern
}

fn make_memfd(pattern: &[u8]) -> Result<OwnedFd> {
    // SAFETY: the name is a NUL-terminated literal.
    let fd = unsafe { libc::memfd_create(c"longhaul-pattern".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::io("memfd_create", std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd.try_clone().map_err(|e| Error::io("memfd", e))?);
    std::io::Write::write_all(&mut file, pattern).map_err(|e| Error::io("filling memfd", e))?;
    Ok(fd)
}

impl MemoryPlane {
    pub fn new(send: SendMethod, recv: RecvMethod) -> Result<MemoryPlane> {
        let pattern = make_pattern();
        let memfd = if send == SendMethod::Sendfile {
            Some(Arc::new(make_memfd(&pattern)?))
        } else {
            None
        };
        let chunk = match std::env::var("LONGHAUL_CHUNK") {
            Ok(v) => crate::units::parse_size(&v)?.clamp(4096, PATTERN_LEN as u64) as usize,
            Err(_) => CHUNK,
        };
        Ok(MemoryPlane {
            chunk,
            send,
            recv,
            pattern: Arc::new(pattern),
            memfd,
        })
    }

    /// The plane with the methods chosen by the environment (defaults: the
    /// fastest measured).
    pub fn from_env() -> Result<MemoryPlane> {
        MemoryPlane::new(SendMethod::from_env()?, RecvMethod::from_env()?)
    }
}

impl DataPlane for MemoryPlane {
    fn source(&self, _stream_id: u32) -> Result<Box<dyn Source>> {
        Ok(Box::new(MemorySource {
            chunk: self.chunk,
            method: self.send,
            pattern: self.pattern.clone(),
            memfd: self.memfd.clone(),
        }))
    }

    fn sink(&self, _stream_id: u32) -> Result<Box<dyn Sink>> {
        Ok(Box::new(MemorySink {
            method: self.recv,
            buf: Vec::new(),
            pipe: None,
        }))
    }
}

struct MemorySource {
    chunk: usize,
    method: SendMethod,
    pattern: Arc<Vec<u8>>,
    memfd: Option<Arc<OwnedFd>>,
}

fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// SO_ZEROCOPY (asm-generic/socket.h).
const SO_ZEROCOPY: libc::c_int = 60;

/// Reads and drops MSG_ZEROCOPY completion notifications. The pattern is
/// never modified, so we need not track which sends completed; we only keep
/// the error queue (and the socket's optmem) from filling up.
fn drain_errqueue(fd: i32) {
    let mut control = [0u8; 256];
    loop {
        // SAFETY: msghdr points at a local control buffer; no data iovecs.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() as _;
        // SAFETY: msg is valid for the duration of the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if n < 0 {
            return;
        }
    }
}

impl Source for MemorySource {
    fn pump(&mut self, sock: &TcpStream, budget: &SendBudget, counter: &AtomicU64) -> Result<u64> {
        let fd = sock.as_raw_fd();
        if self.method == SendMethod::Zerocopy {
            let one: libc::c_int = 1;
            // SAFETY: valid pointer/size pair.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    SO_ZEROCOPY,
                    (&one as *const libc::c_int).cast(),
                    4,
                )
            };
            if rc != 0 {
                return Err(Error::io("setting SO_ZEROCOPY", last_err()));
            }
        }
        let mut sent: u64 = 0;
        let mut sends: u64 = 0;
        loop {
            let want = budget.next_chunk(sent, self.chunk);
            if want == 0 {
                return Ok(sent);
            }
            if let Some(p) = &budget.pacer {
                p.acquire(want);
            }
            // write/zerocopy always send the head of the pattern, which stays
            // cache-hot; sendfile walks the memfd (its pages are referenced,
            // not copied, so their cache state does not matter).
            let offset = match self.method {
                SendMethod::Sendfile => (sent % PATTERN_LEN as u64) as usize,
                _ => 0,
            };
            let len = want.min(PATTERN_LEN - offset);
            let n = match self.method {
                SendMethod::Write => {
                    // SAFETY: the range lies inside the pattern buffer.
                    unsafe {
                        libc::send(
                            fd,
                            self.pattern[offset..].as_ptr().cast(),
                            len,
                            libc::MSG_NOSIGNAL,
                        )
                    }
                }
                SendMethod::Zerocopy => {
                    sends += 1;
                    if sends % 16 == 0 {
                        drain_errqueue(fd);
                    }
                    // SAFETY: as above; the pattern outlives the socket's use of it
                    // because it is never freed while the plane lives.
                    let n = unsafe {
                        libc::send(
                            fd,
                            self.pattern[offset..].as_ptr().cast(),
                            len,
                            libc::MSG_NOSIGNAL | libc::MSG_ZEROCOPY,
                        )
                    };
                    if n < 0 && last_err().raw_os_error() == Some(libc::ENOBUFS) {
                        drain_errqueue(fd);
                        std::thread::sleep(std::time::Duration::from_micros(50));
                        continue;
                    }
                    n
                }
                SendMethod::Sendfile => {
                    let memfd = self.memfd.as_ref().expect("sendfile plane has a memfd");
                    let mut off = offset as libc::off_t;
                    // SAFETY: both descriptors are open; off is a local.
                    unsafe { libc::sendfile(fd, memfd.as_raw_fd(), &mut off, len) }
                }
            };
            if n < 0 {
                let e = last_err();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::io("sending", e));
            }
            sent += n as u64;
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

struct MemorySink {
    method: RecvMethod,
    /// Only the `read` method uses it; allocated on first use.
    buf: Vec<u8>,
    pipe: Option<(OwnedFd, OwnedFd, std::fs::File)>,
}

impl MemorySink {
    fn pipe(&mut self) -> Result<&(OwnedFd, OwnedFd, std::fs::File)> {
        if self.pipe.is_none() {
            let mut fds = [0i32; 2];
            // SAFETY: fds is a 2-element out array.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(Error::io("pipe2", last_err()));
            }
            // SAFETY: fresh descriptors we own.
            let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            // Best effort: a pipe as large as a chunk halves the syscalls.
            // SAFETY: plain fcntl on our descriptor.
            unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, RECV_CHUNK as libc::c_int) };
            let null = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .map_err(|e| Error::io("opening /dev/null", e))?;
            self.pipe = Some((r, w, null));
        }
        Ok(self.pipe.as_ref().expect("pipe was just created"))
    }
}

impl Sink for MemorySink {
    fn drain(&mut self, sock: &TcpStream, counter: &AtomicU64) -> Result<u64> {
        let fd = sock.as_raw_fd();
        let mut total = 0u64;
        loop {
            let n = match self.method {
                RecvMethod::Trunc => {
                    // SAFETY: with MSG_TRUNC, TCP discards up to RECV_CHUNK
                    // bytes without copying them anywhere (tcp(7)): no buffer.
                    unsafe { libc::recv(fd, std::ptr::null_mut(), RECV_CHUNK, libc::MSG_TRUNC) }
                }
                RecvMethod::Read => {
                    if self.buf.is_empty() {
                        self.buf = vec![0u8; READ_BUFFER];
                    }
                    // SAFETY: buf is READ_BUFFER bytes long.
                    unsafe { libc::recv(fd, self.buf.as_mut_ptr().cast(), self.buf.len(), 0) }
                }
                RecvMethod::Splice => {
                    let (r, w, null) = self.pipe()?;
                    let (r, w, null) = (r.as_raw_fd(), w.as_raw_fd(), null.as_raw_fd());
                    // SAFETY: descriptors are open; null offsets mean "current".
                    let n = unsafe {
                        libc::splice(
                            fd,
                            std::ptr::null_mut(),
                            w,
                            std::ptr::null_mut(),
                            RECV_CHUNK,
                            libc::SPLICE_F_MOVE,
                        )
                    };
                    if n > 0 {
                        let mut left = n as usize;
                        while left > 0 {
                            // SAFETY: as above.
                            let m = unsafe {
                                libc::splice(
                                    r,
                                    std::ptr::null_mut(),
                                    null,
                                    std::ptr::null_mut(),
                                    left,
                                    libc::SPLICE_F_MOVE,
                                )
                            };
                            if m <= 0 {
                                return Err(Error::io("splicing to /dev/null", last_err()));
                            }
                            left -= m as usize;
                        }
                    }
                    n
                }
            };
            if n < 0 {
                let e = last_err();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::io("receiving", e));
            }
            if n == 0 {
                return Ok(total);
            }
            total += n as u64;
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}
