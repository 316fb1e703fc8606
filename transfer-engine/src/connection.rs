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
    /// How long one [`Connection::send`] may take, `None` for ever.
    write_timeout: Option<Duration>,
    /// A send failed (e.g. its send timeout passed): what the peer got
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

    /// Sets how long each subsequent [`Connection::send`] may take, from
    /// its call to the last byte handed to the kernel: a whole message, not
    /// each write (SO_SNDTIMEO alone bounds each write, so a peer that takes
    /// in a little now and then, or a message that half fits in the send
    /// buffer, held a send for twice the timeout or more).
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.writer
            .set_write_timeout(timeout)
            .map_err(|e| Error::io("control connection", e))?;
        self.write_timeout = timeout;
        Ok(())
    }

    /// Another handle on the same socket for writing, with the same send
    /// deadline (for a reader thread taking this one).
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
        let frame = msg.to_frame()?;
        let sent = match self.write_timeout {
            None => frame.write_to(&mut self.writer),
            Some(t) => frame
                .write_to(&mut WriteByDeadline {
                    socket: &self.writer,
                    deadline: Instant::now() + t,
                })
                // The option is the socket's, shared with its clones (the
                // keep-alive writer): leave it whole again.
                .map_err(|e| match e {
                    Error::Timeout(_) => Error::Timeout(format!(
                        "writing a control frame: the peer took nothing in for {} s",
                        t.as_secs()
                    )),
                    e => e,
                })
                .and_then(|()| {
                    self.writer
                        .set_write_timeout(Some(t))
                        .map_err(|e| Error::io("control connection", e))
                }),
        };
        self.broken = sent.is_err();
        sent
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
    /// another send timeout, and after a failed send nothing is written
    /// (the peer may be mid-frame).
    pub fn send_error(&mut self, err: &Error) {
        if self.broken {
            return;
        }
        let Ok(bytes) = Message::error(err).to_frame().and_then(|f| f.encode()) else {
            return;
        };
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

/// Writes that end at `deadline`: before each write the socket's send
/// timeout is set to what remains of it.
struct WriteByDeadline<'a> {
    socket: &'a TcpStream,
    deadline: Instant,
}

impl Write for WriteByDeadline<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.socket.set_write_timeout(Some(left))?;
        match (&mut &*self.socket).write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                Err(std::io::ErrorKind::TimedOut.into())
            }
            r => r,
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
}
