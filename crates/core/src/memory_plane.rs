//! Memory-to-memory mode: a pattern source and a discarding sink.
//!
//! The source sends a pattern that is written once and never touched again;
//! the sink throws away what it receives. There are several ways to move
//! the bytes; `docs/performance.md` records what each costs here. The
//! defaults are the fastest measured; the environment variables
//! `LONGHAUL_SEND_METHOD` (`write`, `sendfile`, `zerocopy`) and
//! `LONGHAUL_RECV_METHOD` (`read`, `trunc`, `splice`) select another one for
//! measurements.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use crate::datapath::{
    DataPlane, Grant, Progress, RecvBatching, SendBudget, Sink, Source, StreamIo,
};
use crate::error::{Error, Result};

/// Default bytes handed to one write/sendfile call. Large enough that
/// syscall overhead vanishes next to the copy, small enough to keep the time
/// limit and stop flag responsive (1 MiB at 10 Gb/s is under a millisecond).
/// `LONGHAUL_CHUNK` (a size, e.g. `256K`) overrides it for measurements.
pub(crate) const CHUNK: usize = 1 << 20;

/// Size of the memory-mode pattern (buffer or memfd). Several chunks, so
/// consecutive sendfile calls walk through different pages.
pub(crate) const PATTERN_LEN: usize = 8 << 20;

/// Bytes asked from one receive call.
pub(crate) const RECV_CHUNK: usize = 1 << 20;

/// Buffer of the `read` receive method (measurements only): the copy it
/// measures costs the same per byte whatever the buffer, and 1024 streams
/// must not cost a gigabyte. The default `trunc` method needs no buffer.
pub(crate) const READ_BUFFER: usize = 256 << 10;

/// How memory mode sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendMethod {
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
pub(crate) enum RecvMethod {
    /// read(2) into a reusable buffer: one copy kernel -> user.
    Read,
    /// recv(2) with MSG_TRUNC: TCP discards the data without copying it.
    Trunc,
    /// splice(2) socket -> pipe -> /dev/null.
    Splice,
}

impl SendMethod {
    pub(crate) fn from_env() -> Result<SendMethod> {
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
    pub(crate) fn from_env() -> Result<RecvMethod> {
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
    memfd: Option<Arc<OwnedFd>>,
}

/// The process's one pattern, made when the first stream sends: a server
/// that only receives never pays for it, and sessions at once share it
/// (it is never written after it is made). It lives as long as the
/// process, which MSG_ZEROCOPY needs.
fn pattern() -> Arc<Vec<u8>> {
    static PATTERN: OnceLock<Arc<Vec<u8>>> = OnceLock::new();
    PATTERN.get_or_init(|| Arc::new(make_pattern())).clone()
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
    pub(crate) fn new(send: SendMethod, recv: RecvMethod) -> Result<MemoryPlane> {
        let memfd = if send == SendMethod::Sendfile {
            Some(Arc::new(make_memfd(&pattern())?))
        } else {
            None
        };
        let chunk = match std::env::var("LONGHAUL_CHUNK") {
            Ok(v) => longhaul_units::parse_size(&v)
                .map_err(|e| Error::Usage(format!("LONGHAUL_CHUNK: {e}")))?
                .clamp(4096, PATTERN_LEN as u64) as usize,
            Err(_) => CHUNK,
        };
        Ok(MemoryPlane {
            chunk,
            send,
            recv,
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
            pattern: pattern(),
            memfd: self.memfd.clone(),
            sent: 0,
            sends: 0,
            zerocopy_on: false,
        }))
    }

    fn sink(&self, _stream_id: u32) -> Result<Box<dyn Sink>> {
        Ok(Box::new(MemorySink {
            method: self.recv,
            buf: Vec::new(),
            pipe: None,
            batching: RecvBatching::new(),
        }))
    }
}

struct MemorySource {
    chunk: usize,
    method: SendMethod,
    pattern: Arc<Vec<u8>>,
    memfd: Option<Arc<OwnedFd>>,
    /// Payload bytes sent so far.
    sent: u64,
    /// MSG_ZEROCOPY sends (the error queue is drained every 16).
    sends: u64,
    zerocopy_on: bool,
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

impl MemorySource {
    fn enable_zerocopy(&mut self, fd: i32) -> Result<()> {
        if self.method != SendMethod::Zerocopy || self.zerocopy_on {
            return Ok(());
        }
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
        self.zerocopy_on = true;
        Ok(())
    }

    /// One non-blocking send of `len` bytes at pattern `offset`.
    fn send_once(&mut self, fd: i32, offset: usize, len: usize) -> isize {
        const FLAGS: libc::c_int = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
        match self.method {
            // SAFETY: the range lies inside the pattern buffer.
            SendMethod::Write => unsafe {
                libc::send(fd, self.pattern[offset..].as_ptr().cast(), len, FLAGS)
            },
            SendMethod::Zerocopy => {
                self.sends += 1;
                if self.sends.is_multiple_of(16) {
                    drain_errqueue(fd);
                }
                // SAFETY: as above; the pattern outlives the socket's use of
                // it because it is never freed while the plane lives.
                unsafe {
                    libc::send(
                        fd,
                        self.pattern[offset..].as_ptr().cast(),
                        len,
                        FLAGS | libc::MSG_ZEROCOPY,
                    )
                }
            }
            SendMethod::Sendfile => {
                let memfd = self.memfd.as_ref().expect("sendfile plane has a memfd");
                let mut off = offset as libc::off_t;
                // SAFETY: both descriptors are open; off is a local. The
                // socket is non-blocking, so sendfile is too.
                unsafe { libc::sendfile(fd, memfd.as_raw_fd(), &mut off, len) }
            }
        }
    }
}

impl Source for MemorySource {
    fn send(&mut self, io: &StreamIo<'_>, budget: &mut SendBudget) -> Result<Progress> {
        let fd = io.sock.as_raw_fd();
        self.enable_zerocopy(fd)?;
        let mut moved = 0;
        loop {
            if moved >= io.allowance {
                return Ok(Progress::Yield);
            }
            // At least one chunk per turn, whatever LONGHAUL_CHUNK says.
            let room = if moved == 0 {
                self.chunk
            } else {
                self.chunk.min(io.allowance - moved)
            };
            let want = match budget.grant(self.sent, room) {
                Grant::Send(n) => n,
                Grant::WaitUntil(t) => return Ok(Progress::at(t)),
                Grant::Done => return Ok(Progress::Done),
                Grant::Full => return Ok(budget.until_writable()),
            };
            // write/zerocopy always send the head of the pattern, which stays
            // cache-hot; sendfile walks the memfd (its pages are referenced,
            // not copied, so their cache state does not matter).
            let offset = match self.method {
                SendMethod::Sendfile => (self.sent % PATTERN_LEN as u64) as usize,
                _ => 0,
            };
            let len = want.min(PATTERN_LEN - offset);
            let n = self.send_once(fd, offset, len);
            if n < 0 {
                let e = last_err();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => return Ok(budget.until_writable()),
                    // MSG_ZEROCOPY: too many sends not yet completed.
                    Some(libc::ENOBUFS) if self.method == SendMethod::Zerocopy => {
                        drain_errqueue(fd);
                        return Ok(Progress::Yield);
                    }
                    _ => return Err(Error::io("sending", e)),
                }
            }
            let n = n as usize;
            self.sent += n as u64;
            moved += n;
            io.moved(n as u64);
            budget.spent(n);
            if n < len {
                // The socket buffer is full.
                return Ok(budget.until_writable());
            }
        }
    }
}

struct MemorySink {
    method: RecvMethod,
    /// Only the `read` method uses it; allocated on first use.
    buf: Vec<u8>,
    pipe: Option<(OwnedFd, OwnedFd, std::fs::File)>,
    /// SO_RCVLOWAT while the stream is fast.
    batching: RecvBatching,
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

impl MemorySink {
    /// One non-blocking receive of up to [`RECV_CHUNK`] bytes, dropped.
    fn receive_once(&mut self, fd: i32) -> Result<isize> {
        Ok(match self.method {
            RecvMethod::Trunc => {
                // SAFETY: with MSG_TRUNC, TCP discards up to RECV_CHUNK
                // bytes without copying them anywhere (tcp(7)): no buffer.
                unsafe {
                    libc::recv(
                        fd,
                        std::ptr::null_mut(),
                        RECV_CHUNK,
                        libc::MSG_TRUNC | libc::MSG_DONTWAIT,
                    )
                }
            }
            RecvMethod::Read => {
                if self.buf.is_empty() {
                    self.buf = vec![0u8; READ_BUFFER];
                }
                // SAFETY: buf is READ_BUFFER bytes long.
                unsafe {
                    libc::recv(
                        fd,
                        self.buf.as_mut_ptr().cast(),
                        self.buf.len(),
                        libc::MSG_DONTWAIT,
                    )
                }
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
                        libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
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
        })
    }
}

impl Sink for MemorySink {
    fn receive(&mut self, io: &StreamIo<'_>) -> Result<Progress> {
        let fd = io.sock.as_raw_fd();
        let mut moved = 0;
        loop {
            if moved >= io.allowance {
                self.batching.wait(io.sock, moved);
                return Ok(Progress::Yield);
            }
            let n = self.receive_once(fd)?;
            if n < 0 {
                let e = last_err();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => return Ok(self.batching.wait(io.sock, moved)),
                    _ => return Err(Error::io("receiving", e)),
                }
            }
            if n == 0 {
                return Ok(Progress::Done);
            }
            moved += n as usize;
            io.moved(n as u64);
            if (n as usize) < RECV_CHUNK {
                // The socket is (almost surely) empty: saves a call that
                // would only say so. A later byte or the EOF makes it
                // readable again.
                return Ok(self.batching.wait(io.sock, moved));
            }
        }
    }
}
