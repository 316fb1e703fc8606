//! Frames of the control connection.
//!
//! ```text
//! +---------+------+----------------+-------------------+
//! | "LHCF"  | type | length (u32 BE)| payload (length)  |
//! | 4 bytes | u8   | 4 bytes        | <= MAX_FRAME_LEN  |
//! +---------+------+----------------+-------------------+
//! ```
//!
//! The magic lets the server tell a control connection from a data
//! connection (which starts with [`crate::attach::ATTACH_MAGIC`]) and reject
//! garbage on the first read. The type byte says which message the payload
//! holds ([`crate::messages::MessageType`]); the payload is the message body.

use std::io::{Read, Write};

use crate::error::{Error, Result};

/// First four bytes of every control frame.
pub const FRAME_MAGIC: [u8; 4] = *b"LHCF";

/// Bytes of the frame header: magic, type, length.
pub const HEADER_LEN: usize = 9;

/// Largest payload accepted. Control messages are small (a few hundred
/// bytes); 1 MiB leaves room for disk mode's file manifests, sent in chunks,
/// while bounding what a garbage length field can make us allocate.
pub const MAX_FRAME_LEN: usize = 1 << 20;

/// Payload bytes reserved before any arrive; the buffer grows as they do.
const INITIAL_PAYLOAD_CAPACITY: usize = 4096;

/// One frame: the message type byte and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub payload: Vec<u8>,
}

impl Frame {
    /// Encodes header and payload into one buffer (one write syscall).
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.payload.len() > MAX_FRAME_LEN {
            return Err(Error::Protocol(format!(
                "frame of {} bytes exceeds the {MAX_FRAME_LEN}-byte limit",
                self.payload.len()
            )));
        }
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&FRAME_MAGIC);
        out.push(self.kind);
        out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.payload);
        Ok(out)
    }

    /// Parses a header; returns (type, payload length) or a protocol error.
    /// The payload may be at most `max` bytes, never more than
    /// [`MAX_FRAME_LEN`] (the handshake takes only small frames from a peer
    /// that has not proven anything).
    pub(crate) fn parse_header_limited(
        header: &[u8; HEADER_LEN],
        max: usize,
    ) -> Result<(u8, usize)> {
        if header[..4] != FRAME_MAGIC {
            return Err(Error::Protocol(format!(
                "bad frame magic {:02x?} (not a longhaul peer?)",
                &header[..4]
            )));
        }
        let len = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) as usize;
        let max = max.min(MAX_FRAME_LEN);
        if len > max {
            return Err(Error::Protocol(format!(
                "frame length {len} exceeds the {max}-byte limit"
            )));
        }
        Ok((header[4], len))
    }

    /// Reads one frame. `Ok(None)` on a clean end of stream before a header.
    pub fn read_from(reader: &mut impl Read) -> Result<Option<Frame>> {
        Frame::read_limited(reader, MAX_FRAME_LEN)
    }

    /// [`Frame::read_from`] taking payloads of at most `max` bytes. The
    /// payload buffer grows with the bytes that actually arrive, so a header
    /// that announces a large frame costs nothing until the frame comes.
    pub fn read_limited(reader: &mut impl Read, max: usize) -> Result<Option<Frame>> {
        let mut header = [0u8; HEADER_LEN];
        let mut got = 0;
        while got < HEADER_LEN {
            match reader.read(&mut header[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => {
                    return Err(Error::PeerAborted(
                        "connection closed in the middle of a frame".into(),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("reading a control frame", e)),
            }
        }
        let (kind, len) = Frame::parse_header_limited(&header, max)?;
        let mut payload = Vec::with_capacity(len.min(INITIAL_PAYLOAD_CAPACITY));
        let got = reader
            .take(len as u64)
            .read_to_end(&mut payload)
            .map_err(|e| Error::io("reading a control frame", e))?;
        if got < len {
            return Err(Error::PeerAborted(
                "connection closed in the middle of a frame".into(),
            ));
        }
        Ok(Some(Frame { kind, payload }))
    }

    /// Writes one frame.
    pub fn write_to(&self, writer: &mut impl Write) -> Result<()> {
        let bytes = self.encode()?;
        writer
            .write_all(&bytes)
            .and_then(|_| writer.flush())
            .map_err(|e| Error::io("writing a control frame", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trips() {
        let f = Frame {
            kind: 7,
            payload: b"hello".to_vec(),
        };
        let bytes = f.encode().unwrap();
        let back = Frame::read_from(&mut &bytes[..]).unwrap().unwrap();
        assert_eq!(f, back);
    }

    #[test]
    fn garbage_is_rejected_by_magic() {
        let bytes = b"GET / HTTP/1.1\r\n\r\n".to_vec();
        let err = Frame::read_from(&mut &bytes[..]).unwrap_err();
        assert!(matches!(err, Error::Protocol(_)), "{err}");
    }

    #[test]
    fn oversized_length_is_rejected_before_allocating() {
        let mut bytes = FRAME_MAGIC.to_vec();
        bytes.push(1);
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Frame::read_from(&mut &bytes[..]),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn clean_eof_is_none_and_truncated_is_abort() {
        assert!(Frame::read_from(&mut &b""[..]).unwrap().is_none());
        assert!(matches!(
            Frame::read_from(&mut &b"LHC"[..]),
            Err(Error::PeerAborted(_))
        ));
    }
}
