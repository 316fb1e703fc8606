//! Disk-mode messages: the control-connection exchange (manifest -> plan ->
//! report, serde types the session layer carries) and the block frames every
//! data stream carries.
//!
//! Control exchange:
//! 1. client -> server [`Manifest`]: every entry with its relative path,
//!    size, mode, mtime and device group.
//! 2. server -> client [`Plan`]: per file what the server already has
//!    (complete: skip; partial: resume offset) and what it refuses.
//! 3. data streams carry [`Frame`]s until each sends `EndOfStream`.
//! 4. server -> client [`DiskReport`]: per-file failures, totals and the
//!    server's device counters.
//!
//! A frame is a fixed 32-byte little-endian header, then `len` payload bytes
//! for `Data` and `Fail`. Any stream may carry any file's blocks.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use longhaul_stats_api::DeviceIo;
use serde::{Deserialize, Serialize};

use super::buffer::AlignedBuf;
use super::CHUNK_SIZE;

/// One entry of the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Index in [`Manifest::entries`]; frames name files by it.
    pub(crate) id: u32,
    /// Relative path below `--dest`, '/'-separated.
    pub(crate) path: String,
    pub(crate) dir: bool,
    pub(crate) size: u64,
    pub(crate) mode: u32,
    pub(crate) mtime_sec: i64,
    pub(crate) mtime_nsec: u32,
    /// The sender found holes; the receiver leaves holes unwritten.
    pub(crate) sparse: bool,
    /// The sender's device group (informational).
    pub(crate) device: String,
    /// `--checksum`: the file's checksum, hashed before the session; the
    /// receiver skips the file only if its copy hashes the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) checksum: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// `--dest`, relative to the server's `--root`.
    pub(crate) dest: String,
    /// Skip complete files and continue partial ones.
    pub(crate) resume: bool,
    /// Must equal [`CHUNK_SIZE`]; a different value is a version mismatch.
    pub(crate) chunk_size: u64,
    pub(crate) entries: Vec<ManifestEntry>,
}

/// The server's answer to a manifest. Files not listed are sent whole.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Already complete on the server (same size and mtime).
    pub(crate) skip: Vec<u32>,
    /// (file id, verified offset) of partial files to continue.
    pub(crate) resume: Vec<(u32, u64)>,
    /// Refused entries (unsafe path, cannot create), with the cause.
    pub(crate) refused: Vec<FileFailure>,
}

/// One file that did not arrive intact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct FileFailure {
    pub(crate) id: u32,
    pub(crate) path: String,
    /// [`super::DiskError::code`] of the cause.
    pub(crate) code: String,
    pub(crate) error: String,
}

impl FileFailure {
    pub(crate) fn new(id: u32, path: &str, err: &super::DiskError) -> Self {
        FileFailure {
            id,
            path: path.to_string(),
            code: err.code().into(),
            error: err.to_string(),
        }
    }
}

/// The server's summary after every data stream ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct DiskReport {
    /// Files complete on the server: sent and verified in this session, plus
    /// the skipped ones.
    pub(crate) files: u64,
    /// Their total size.
    pub(crate) file_bytes: u64,
    /// Of `files`: skipped because the server had them already.
    #[serde(default)]
    pub(crate) skipped: u64,
    #[serde(default)]
    pub(crate) skipped_bytes: u64,
    /// Of `skipped`: skipped because their content hashed the same as the
    /// sender's (`--checksum`), not on size and mtime alone.
    #[serde(default)]
    pub(crate) skipped_by_checksum: u64,
    #[serde(default)]
    pub(crate) skipped_by_checksum_bytes: u64,
    /// Of `file_bytes`: the resumed prefixes of files completed in this
    /// session, which were not sent again (0 from an engine before it).
    #[serde(default)]
    pub(crate) resumed_bytes: u64,
    /// Payload bytes written in this session.
    pub(crate) written_bytes: u64,
    pub(crate) failures: Vec<FileFailure>,
    pub(crate) devices: Vec<DeviceIo>,
}

/// Frame magic: "LHDB" — catches a stream that lost framing.
pub const FRAME_MAGIC: u32 = 0x4244_484C;
pub const FRAME_HEADER_LEN: usize = 32;
/// Longest `Fail` message accepted.
pub(crate) const MAX_FAIL_MESSAGE: u32 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum FrameKind {
    /// `len` bytes of file `file` at `offset` (one chunk) follow.
    Data = 1,
    /// `value` bytes of zeros at `offset` (whole chunks, or to EOF).
    Hole = 2,
    /// The sender read the whole file; `value` is its checksum.
    End = 3,
    /// The sender could not read the file; a `len`-byte message follows.
    Fail = 4,
    /// No more frames on this stream.
    EndOfStream = 5,
    /// Nothing to send yet (readers busy); keeps idle timeouts quiet.
    KeepAlive = 6,
}

/// One piece of a file's way from the sender's readers to the receiver's
/// writers: a chunk of data, a hole, the file's end with its checksum, or the
/// sender's failure to read it. Each is one frame on the wire. `H` is what a
/// chunk carries beside its bytes: nothing at the sender (`()`), its hash at
/// the receiver (computed by the stream that received it, `u64`).
pub(crate) enum Block<H = ()> {
    Data {
        file: u32,
        offset: u64,
        buf: AlignedBuf,
        hash: H,
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

impl<H> Block<H> {
    /// The file (its manifest id) the block belongs to.
    pub(crate) fn file(&self) -> u32 {
        match self {
            Block::Data { file, .. }
            | Block::Hole { file, .. }
            | Block::End { file, .. }
            | Block::Fail { file, .. } => *file,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub(crate) kind: FrameKind,
    pub(crate) file: u32,
    pub(crate) len: u32,
    pub(crate) offset: u64,
    pub(crate) value: u64,
}

impl FrameHeader {
    pub(crate) fn new(kind: FrameKind, file: u32) -> Self {
        FrameHeader {
            kind,
            file,
            len: 0,
            offset: 0,
            value: 0,
        }
    }

    pub(crate) fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[8..12].copy_from_slice(&self.file.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; FRAME_HEADER_LEN]) -> io::Result<Self> {
        let bad =
            |m: &str| io::Error::new(io::ErrorKind::InvalidData, format!("bad disk frame: {m}"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(0) != FRAME_MAGIC {
            return Err(bad("magic"));
        }
        let kind = match b[4] {
            1 => FrameKind::Data,
            2 => FrameKind::Hole,
            3 => FrameKind::End,
            4 => FrameKind::Fail,
            5 => FrameKind::EndOfStream,
            6 => FrameKind::KeepAlive,
            k => return Err(bad(&format!("kind {k}"))),
        };
        let h = FrameHeader {
            kind,
            file: u32_at(8),
            len: u32_at(12),
            offset: u64_at(16),
            value: u64_at(24),
        };
        match kind {
            FrameKind::Data
                if h.len == 0
                    || u64::from(h.len) > CHUNK_SIZE
                    || !h.offset.is_multiple_of(CHUNK_SIZE) =>
            {
                Err(bad("data block size or alignment"))
            }
            FrameKind::Hole if !h.offset.is_multiple_of(CHUNK_SIZE) => Err(bad("hole alignment")),
            FrameKind::Fail if h.len > MAX_FAIL_MESSAGE => Err(bad("message too long")),
            FrameKind::Hole | FrameKind::End | FrameKind::EndOfStream | FrameKind::KeepAlive
                if h.len != 0 =>
            {
                Err(bad("unexpected payload"))
            }
            _ => Ok(h),
        }
    }

    /// Payload bytes that follow this header.
    pub fn payload_len(&self) -> usize {
        match self.kind {
            FrameKind::Data | FrameKind::Fail => self.len as usize,
            _ => 0,
        }
    }
}

/// Write a header and its payload (blocking writers, for tests).
#[cfg(test)]
pub(crate) fn write_frame<W: Write>(w: &mut W, h: &FrameHeader, payload: &[u8]) -> io::Result<()> {
    debug_assert_eq!(payload.len(), h.payload_len());
    w.write_all(&h.encode())?;
    w.write_all(payload)
}

/// A frame's payload on its way out.
enum PayloadOut {
    Bytes(Vec<u8>),
    Block(AlignedBuf),
}

/// A frame being written to a non-blocking socket, a piece at a time.
pub(crate) struct FrameOut {
    header: FrameHeader,
    head: [u8; FRAME_HEADER_LEN],
    payload: PayloadOut,
    /// Bytes of header + payload written so far.
    written: usize,
}

/// How far [`FrameOut::write_to`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// The whole frame is out.
    Whole,
    /// All that was allowed went out; more of the frame is left.
    Part,
    /// The socket is full.
    Blocked,
}

impl FrameOut {
    /// A frame with a small payload (or none).
    pub(crate) fn new(header: FrameHeader, payload: Vec<u8>) -> FrameOut {
        debug_assert_eq!(payload.len(), header.payload_len());
        FrameOut {
            head: header.encode(),
            header,
            payload: PayloadOut::Bytes(payload),
            written: 0,
        }
    }

    /// A data frame whose payload is a pool buffer.
    pub(crate) fn with_block(header: FrameHeader, buf: AlignedBuf) -> FrameOut {
        debug_assert_eq!(buf.len(), header.payload_len());
        FrameOut {
            head: header.encode(),
            header,
            payload: PayloadOut::Block(buf),
            written: 0,
        }
    }

    pub(crate) fn header(&self) -> &FrameHeader {
        &self.header
    }

    fn payload(&self) -> &[u8] {
        match &self.payload {
            PayloadOut::Bytes(b) => b,
            PayloadOut::Block(b) => b.as_slice(),
        }
    }

    /// Payload bytes not written yet.
    pub(crate) fn payload_left(&self) -> usize {
        self.payload().len() - self.written.saturating_sub(FRAME_HEADER_LEN)
    }

    /// The pool buffer, for the pool.
    pub(crate) fn into_block(self) -> Option<AlignedBuf> {
        match self.payload {
            PayloadOut::Block(b) => Some(b),
            PayloadOut::Bytes(_) => None,
        }
    }

    /// One write of what is left, with at most `allowed` payload bytes (the
    /// pacer's share). Returns how far it got and the payload bytes written.
    pub(crate) fn write_to(
        &mut self,
        sock: &TcpStream,
        allowed: usize,
    ) -> io::Result<(Wrote, usize)> {
        let head = &self.head[self.written.min(FRAME_HEADER_LEN)..];
        let from = self.written.saturating_sub(FRAME_HEADER_LEN);
        let payload = self.payload();
        let to = payload.len().min(from + allowed);
        let asked = head.len() + (to - from);
        if asked == 0 {
            return Ok((
                if from == payload.len() {
                    Wrote::Whole
                } else {
                    Wrote::Part
                },
                0,
            ));
        }
        let slices = [io::IoSlice::new(head), io::IoSlice::new(&payload[from..to])];
        let n = loop {
            match (&mut &*sock).write_vectored(&slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((Wrote::Blocked, 0)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        let before = self.written.saturating_sub(FRAME_HEADER_LEN);
        self.written += n;
        let payload_written = self.written.saturating_sub(FRAME_HEADER_LEN) - before;
        let wrote = if self.written == FRAME_HEADER_LEN + self.payload().len() {
            Wrote::Whole
        } else if n < asked {
            Wrote::Blocked
        } else {
            Wrote::Part
        };
        Ok((wrote, payload_written))
    }
}

/// Read the next header; `None` on a clean EOF before its first byte.
pub fn read_header<R: Read>(r: &mut R) -> io::Result<Option<FrameHeader>> {
    let mut b = [0u8; FRAME_HEADER_LEN];
    let mut got = 0;
    while got < b.len() {
        match r.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    FrameHeader::decode(&b).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_rejected() {
        let mut h = FrameHeader::new(FrameKind::Data, 7);
        h.len = 5;
        h.offset = 3 * CHUNK_SIZE;
        let mut out = Vec::new();
        write_frame(&mut out, &h, b"hello").unwrap();
        let mut end = FrameHeader::new(FrameKind::End, 7);
        end.value = 42;
        write_frame(&mut out, &end, &[]).unwrap();
        let mut r = &out[..];
        assert_eq!(read_header(&mut r).unwrap(), Some(h));
        r = &r[5..];
        assert_eq!(read_header(&mut r).unwrap(), Some(end));
        assert_eq!(read_header(&mut r).unwrap(), None);
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(FrameHeader::decode(&bad).is_err());
        h.offset = 5;
        assert!(FrameHeader::decode(&h.encode()).is_err());
        h.offset = 0;
        h.len = CHUNK_SIZE as u32 + 1;
        assert!(FrameHeader::decode(&h.encode()).is_err());
    }

    #[test]
    fn manifest_round_trips_as_json() {
        let m = Manifest {
            dest: "in".into(),
            resume: true,
            chunk_size: CHUNK_SIZE,
            entries: vec![ManifestEntry {
                id: 0,
                path: "ü/a".into(),
                dir: false,
                size: 1,
                mode: 0o644,
                mtime_sec: 5,
                mtime_nsec: 6,
                sparse: false,
                device: "vda".into(),
                checksum: Some(7),
            }],
        };
        let back: Manifest = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }
}
