//! A control connection: a TCP stream that sends and receives [`Message`]s,
//! and how a client reaches a server ([`resolve`], [`connect`],
//! [`connect_prepared`]).
//!
//! Each message carries a deadline so a silent or trickling peer cannot hold
//! a handshake forever; an `Error` message from the peer turns into the
//! matching [`Error`].

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::frame::{Frame, MAX_FRAME_LEN};
use crate::limits::CONNECT_TIMEOUT;
use crate::messages::Message;
use crate::sockopt;

/// The first address `HOST:PORT` resolves to.
pub fn resolve(to: &str) -> Result<SocketAddr> {
    let mut addrs = to
        .to_socket_addrs()
        .map_err(|e| Error::Refused(format!("cannot resolve '{to}': {e}")))?;
    addrs
        .next()
        .ok_or_else(|| Error::Refused(format!("'{to}' resolves to no address")))
}

/// A TCP connection to `addr`, within [`CONNECT_TIMEOUT`].
pub fn connect(addr: SocketAddr) -> Result<TcpStream> {
    connect_prepared(addr, |_| Ok(())).map(|(stream, ())| stream)
}

/// A TCP connection to `addr`, within [`CONNECT_TIMEOUT`], whose socket
/// `prepare` configured before it connected.
///
/// Some options only fully apply to a socket that has not connected yet: a
/// congestion control chosen after the handshake runs on top of the
/// default's initialisation (BBR, this machine's default, switches the
/// socket's pacing on and a later `cubic` does not switch it off), and the
/// window scale is agreed in the SYN from the receive buffer of that
/// moment. `prepare`'s result (e.g. a buffer warning) is returned with the
/// stream.
pub fn connect_prepared<T>(
    addr: SocketAddr,
    prepare: impl FnOnce(BorrowedFd<'_>) -> Result<T>,
) -> Result<(TcpStream, T)> {
    let fail = |e| Error::io(format!("connecting to {addr}"), e);
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM.cloexec(),
        Some(socket2::Protocol::TCP),
    )
    .map_err(fail)?;
    let prepared = prepare(sock.as_fd())?;
    sock.connect_timeout(&addr.into(), CONNECT_TIMEOUT)
        .map_err(fail)?;
    Ok((sock.into(), prepared))
}

pub struct Connection {
    reader: BufReader<Box<dyn Read + Send>>,
    writer: TcpStream,
    peer: SocketAddr,
    /// Largest frame payload [`Connection::recv`] takes.
    max_frame: usize,
    /// How long one [`Connection::recv`] may take, `None` for ever.
    timeout: Option<Duration>,
    /// The send patience ([`Connection::set_write_timeout`]), `None` for
    /// ever.
    write_timeout: Option<Duration>,
    /// A send failed (e.g. its patience was spent): what the peer got
    /// may end mid-frame, so nothing more is written.
    broken: bool,
}

impl Connection {
    pub fn new(stream: TcpStream) -> Result<Connection> {
        Connection::with_prefix(stream, Vec::new())
    }

    /// A connection whose first bytes (`prefix`) were already read, e.g. by
    /// the server when it looked at the magic to tell control from data.
    pub fn with_prefix(stream: TcpStream, prefix: Vec<u8>) -> Result<Connection> {
        let peer = stream
            .peer_addr()
            .map_err(|e| Error::io("control connection", e))?;
        // Control messages are small and latency-bound.
        let _ = stream.set_nodelay(true);
        let writer = stream
            .try_clone()
            .map_err(|e| Error::io("control connection", e))?;
        let reader: Box<dyn Read + Send> = Box::new(std::io::Cursor::new(prefix).chain(stream));
        Ok(Connection {
            reader: BufReader::new(reader),
            writer,
            peer,
            max_frame: MAX_FRAME_LEN,
            timeout: None,
            write_timeout: None,
            broken: false,
        })
    }

    /// Limits the frames [`Connection::recv`] takes (the server lowers it
    /// while the peer has not authenticated).
    pub fn set_max_frame(&mut self, max: usize) {
        self.max_frame = max.min(MAX_FRAME_LEN);
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// This end's address, when the socket still knows it.
    pub fn local(&self) -> Option<SocketAddr> {
        self.writer.local_addr().ok()
    }

    /// The underlying socket (for timeouts, shutdown, cloning a reader).
    pub fn socket(&self) -> &TcpStream {
        &self.writer
    }

    /// Sets how long each subsequent [`Connection::recv`] may take, from
    /// its call to the last byte of the message: a whole message, not each
    /// read, so a peer that trickles a byte now and then is cut off too.
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.writer
            .set_read_timeout(timeout)
            .map_err(|e| Error::io("control connection", e))?;
        self.timeout = timeout;
        Ok(())
    }

    /// Sets the patience of a [`Connection::send`]: a peer that takes in
    /// less than [`MIN_TAKEN_IN`] of a message over this long fails the
    /// send, one that reads slowly keeps it going. (SO_SNDTIMEO alone bounds
    /// each write from its start: a message that half fit in the send
    /// buffer held a send for two timeouts, and a trickle for ever.)
    pub(crate) fn set_write_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.writer
            .set_write_timeout(timeout)
            .map_err(|e| Error::io("control connection", e))?;
        self.write_timeout = timeout;
        Ok(())
    }

    /// Another handle on the same socket for writing, with the same send
    /// patience (for a reader thread taking this one).
    pub fn try_clone_writer(&self) -> Result<Connection> {
        let mut c = Connection::new(
            self.writer
                .try_clone()
                .map_err(|e| Error::io("control connection", e))?,
        )?;
        c.write_timeout = self.write_timeout;
        Ok(c)
    }

    pub fn send(&mut self, msg: &Message) -> Result<()> {
        if self.broken {
            return Err(Error::io(
                "writing a control frame",
                std::io::Error::other("an earlier write to this connection failed"),
            ));
        }
        // Encoded first: a message too large to send fails here, with
        // nothing written, and the connection stays usable.
        let bytes = msg.to_frame()?.encode()?;
        let sent = match self.write_timeout {
            None => (&self.writer).write_all(&bytes),
            Some(t) => WhileTakenIn::new(&self.writer, t).write_all(&bytes),
        };
        self.broken = sent.is_err();
        sent.map_err(|e| match (e.get_ref(), self.write_timeout) {
            (Some(inner), Some(t)) if inner.is::<PatienceSpent>() => Error::Timeout(format!(
                "writing a control frame: the peer took in less than {} KiB in {} s",
                MIN_TAKEN_IN >> 10,
                t.as_secs()
            )),
            _ => Error::io("writing a control frame", e),
        })
    }

    /// Receives one message; a closed connection is [`Error::PeerAborted`],
    /// an `Error` message from the peer is returned as the matching error.
    pub fn recv(&mut self) -> Result<Message> {
        let frame = match self.timeout {
            None => Frame::read_limited(&mut self.reader, self.max_frame),
            Some(t) => Frame::read_limited(
                &mut ByDeadline {
                    reader: &mut self.reader,
                    socket: &self.writer,
                    deadline: Instant::now() + t,
                },
                self.max_frame,
            ),
        };
        match frame? {
            None => Err(Error::PeerAborted(format!(
                "{} closed the control connection",
                self.peer
            ))),
            Some(frame) => match Message::from_frame(&frame)? {
                Message::Error(e) => Err(Error::from_remote(&e.code, &e.message)),
                m => Ok(m),
            },
        }
    }

    /// Best effort: tell the peer why we stop. Errors are ignored because we
    /// are already failing. It never waits: a peer that reads nothing (its
    /// window closed, our send buffer full) must not hold this end for
    /// another send patience; it is sent only if it fits in the send buffer
    /// whole, and after a failed send nothing is written (the peer may be
    /// mid-frame).
    pub fn send_error(&mut self, err: &Error) {
        if self.broken {
            return;
        }
        let Ok(bytes) = Message::error(err).to_frame().and_then(|f| f.encode()) else {
            return;
        };
        // Whole or not at all: a torn frame would tell the peer nothing.
        let room = sockopt::sndbuf(&self.writer).map(|b| b / 2).unwrap_or(0) as u64;
        let queued = sockopt::unacked(&self.writer).unwrap_or(u64::MAX);
        if queued.saturating_add(bytes.len() as u64) > room {
            return;
        }
        let _ = socket2::SockRef::from(&self.writer)
            .send_with_flags(&bytes, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
    }

    /// Splits into (reader, writer) for a reader thread. The reader keeps
    /// whatever was already buffered, so no message is lost.
    pub fn split(self) -> Result<(Connection, Connection)> {
        let writer = self.try_clone_writer()?;
        Ok((self, writer))
    }
}

/// Reads that end at `deadline`: before each read the socket's timeout is
/// set to what remains of it.
struct ByDeadline<'a, R> {
    reader: &'a mut R,
    socket: &'a TcpStream,
    deadline: Instant,
}

impl<R: Read> Read for ByDeadline<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.socket.set_read_timeout(Some(left))?;
        self.reader.read(buf)
    }
}

/// Least a peer must take in of a message it is sent per send patience
/// ([`Connection::set_write_timeout`]): 64 KiB per 30 s is ~17 kbit/s.
/// Any progress at all would not do: a peer that reads nothing still
/// acknowledges a few bytes now and then (its kernel squeezes its receive
/// queue and reopens the window a crack), and a peer could read a byte a
/// minute.
pub(crate) const MIN_TAKEN_IN: u64 = 64 << 10;

/// Writes that fail once the peer took in less than [`MIN_TAKEN_IN`] over
/// the last `patience`: each write waits at most a second (SO_SNDTIMEO),
/// and between them the peer's acknowledgements (tcpi_bytes_acked; where
/// the kernel does not report them, what the writes got into the send
/// buffer) are sampled, so a peer that stops reading fails the send
/// `patience` after it stopped, whatever it took in before.
struct WhileTakenIn<'a> {
    socket: &'a TcpStream,
    patience: Duration,
    /// (when, bytes taken in by then), oldest first, reaching back just
    /// past `patience`.
    samples: std::collections::VecDeque<(Instant, u64)>,
    /// tcpi_bytes_acked at the start, if the kernel reports it.
    acked_at_start: Option<u64>,
    written: u64,
}

impl<'a> WhileTakenIn<'a> {
    fn new(socket: &'a TcpStream, patience: Duration) -> Self {
        let now = Instant::now();
        WhileTakenIn {
            socket,
            patience,
            samples: [(now, 0)].into(),
            acked_at_start: sockopt::bytes_acked(socket),
            written: 0,
        }
    }

    /// Bytes the peer took in since the start.
    fn taken(&self) -> u64 {
        match (self.acked_at_start, sockopt::bytes_acked(self.socket)) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => self.written,
        }
    }

    /// Whether the peer took in less than [`MIN_TAKEN_IN`] over the last
    /// `patience` (never before `patience` has passed).
    fn spent(&mut self) -> bool {
        let now = Instant::now();
        let taken = self.taken();
        self.samples.push_back((now, taken));
        // Keep the newest sample at least `patience` old as the baseline.
        while self
            .samples
            .get(1)
            .is_some_and(|&(t, _)| now.duration_since(t) >= self.patience)
        {
            self.samples.pop_front();
        }
        let (t0, base) = self.samples[0];
        // The baseline is the start until `patience` has passed.
        now.duration_since(t0) >= self.patience && taken - base < MIN_TAKEN_IN
    }
}

/// How long one write of [`WhileTakenIn`] waits before it looks again.
const WRITE_SLICE: Duration = Duration::from_secs(1);

/// The error of a send whose peer took in too little (not the kernel's
/// ETIMEDOUT of a dead connection, which has the same kind).
#[derive(Debug)]
struct PatienceSpent;

impl std::fmt::Display for PatienceSpent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the peer took in too little")
    }
}

impl std::error::Error for PatienceSpent {}

impl Write for WhileTakenIn<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            if self.spent() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    PatienceSpent,
                ));
            }
            self.socket.set_write_timeout(Some(WRITE_SLICE))?;
            match (&mut &*self.socket).write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Ok(n) => {
                    self.written += n as u64;
                    return Ok(n);
                }
                r => return r,
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sockopt;
    use std::net::TcpListener;

    #[test]
    fn a_prepared_socket_is_configured_before_it_connects() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (sock, peer_while_prepared) = connect_prepared(l.local_addr().unwrap(), |fd| {
            sockopt::set_cc(&fd, "reno")?;
            Ok(socket2::SockRef::from(&fd)
                .peer_addr()
                .map_err(|e| e.raw_os_error()))
        })
        .unwrap();
        // prepare saw a socket with no peer yet: its options were in place
        // for the SYN, and they hold on the connected stream.
        assert_eq!(peer_while_prepared.unwrap_err(), Some(libc::ENOTCONN));
        assert_eq!(sock.peer_addr().unwrap(), l.local_addr().unwrap());
        assert_eq!(sockopt::get_cc(&sock).as_deref(), Some("reno"));
        let (accepted, _) = l.accept().unwrap();
        assert_eq!(accepted.peer_addr().unwrap(), sock.local_addr().unwrap());
    }

    #[test]
    fn a_failed_preparation_connects_nothing() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let err = connect_prepared(l.local_addr().unwrap(), |fd| {
            sockopt::set_cc(&fd, "no-such-cc")
        })
        .unwrap_err();
        assert!(err.to_string().contains("no-such-cc"), "{err}");
        let pending = l.accept().map(|_| ()).map_err(|e| e.kind());
        assert_eq!(pending, Err(std::io::ErrorKind::WouldBlock));
    }

    #[test]
    fn a_refused_connection_names_the_address() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let err = connect_prepared(addr, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }

    /// A 1 MiB message through small buffers with a send patience of 1 s: a
    /// peer that reads 16 KiB every 100 ms (above MIN_TAKEN_IN a second)
    /// for 4 s, four times the patience, and then the rest gets it whole;
    /// one that reads nothing fails the send after about the patience, and
    /// the error says so.
    #[test]
    fn a_send_waits_while_the_peer_reads_and_fails_when_it_reads_nothing() {
        let patience = Duration::from_secs(1);
        for reads in [true, false] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let (mut peer, ()) = connect_prepared(l.local_addr().unwrap(), |fd| {
                sockopt::set_buffer(&fd, libc::SO_RCVBUF, 64 << 10)
                    .map_err(|e| Error::io("setting SO_RCVBUF", e))
            })
            .unwrap();
            let (accepted, _) = l.accept().unwrap();
            sockopt::set_buffer(&accepted, libc::SO_SNDBUF, 16 << 10).unwrap();
            let mut conn = Connection::new(accepted).unwrap();
            conn.set_write_timeout(Some(patience)).unwrap();
            let reader = std::thread::spawn(move || {
                let mut got = 0;
                let mut buf = vec![0u8; 16 << 10];
                let slow_until = Instant::now() + 4 * patience;
                if !reads {
                    std::thread::sleep(6 * patience);
                    return 0;
                }
                while Instant::now() < slow_until {
                    got += peer.read(&mut buf).unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                }
                let mut rest = Vec::new();
                got + peer.read_to_end(&mut rest).unwrap()
            });
            let msg = Message::ModeData(serde_json::json!({"x": "a".repeat(1000 << 10)}));
            let started = Instant::now();
            let sent = conn.send(&msg);
            let took = started.elapsed();
            if reads {
                sent.unwrap();
                assert!(
                    took >= 3 * patience,
                    "the message fit in the buffers: {took:?}"
                );
                drop(conn);
                assert!(reader.join().unwrap() > 1000 << 10);
            } else {
                let err = sent.unwrap_err().to_string();
                assert!(
                    err.contains("the peer took in less than 64 KiB in 1 s"),
                    "{err}"
                );
                assert!(took < 5 * patience, "{took:?}");
                // Nothing more is written after a failed send.
                assert!(conn.send(&Message::Start).is_err());
                reader.join().unwrap();
            }
        }
    }
}
