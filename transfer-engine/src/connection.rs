//! A control connection: a TCP stream that sends and receives [`Message`]s,
//! and how a client reaches a server ([`resolve`], [`connect`]).
//!
//! Reads carry a timeout so a silent peer cannot hold a handshake forever;
//! an `Error` message from the peer turns into the matching [`Error`].

use std::io::{BufReader, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

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
    TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .map_err(|e| Error::io(format!("connecting to {addr}"), e))
}

pub struct Connection {
    reader: BufReader<Box<dyn Read + Send>>,
    writer: TcpStream,
    peer: SocketAddr,
    /// Largest frame payload [`Connection::recv`] takes.
    max_frame: usize,
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

    /// Sets the read timeout of subsequent [`Connection::recv`] calls.
    pub fn set_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        self.writer
            .set_read_timeout(timeout)
            .map_err(|e| Error::io("control connection", e))
    }

    pub fn send(&mut self, msg: &Message) -> Result<()> {
        msg.to_frame()?.write_to(&mut self.writer)
    }

    /// Receives one message; a closed connection is [`Error::PeerAborted`],
    /// an `Error` message from the peer is returned as the matching error.
    pub fn recv(&mut self) -> Result<Message> {
        match Frame::read_limited(&mut self.reader, self.max_frame)? {
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
    /// are already failing.
    pub fn send_error(&mut self, err: &Error) {
        let _ = self.send(&Message::error(err));
    }

    /// Splits into (reader, writer) for a reader thread. The reader keeps
    /// whatever was already buffered, so no message is lost.
    pub fn split(self) -> Result<(Connection, Connection)> {
        let writer = Connection::new(
            self.writer
                .try_clone()
                .map_err(|e| Error::io("control connection", e))?,
        )?;
        Ok((self, writer))
    }
}
