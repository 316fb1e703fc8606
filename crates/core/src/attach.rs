//! The header a data connection sends to join a session.
//!
//! ```text
//! +--------+------------+-----------------+----------+--------------+
//! | "LHDA" | session id | stream id u32BE | reserved | proof        |
//! | 4      | 16         | 4               | 8 (zero) | 32           |
//! +--------+------------+-----------------+----------+--------------+
//! ```
//!
//! `proof = HMAC-SHA256(attach_key, "longhaul-attach-v1" | session id | stream id)`,
//! so a random connection cannot join a session, and a stream of one session
//! cannot be replayed into another. The server answers one byte
//! ([`ATTACH_OK`] or [`ATTACH_REJECTED`]) and then the stream carries payload
//! only.

use std::io::{Read, Write};

use crate::auth::{hmac_parts, proofs_equal};
use crate::error::{Error, Result};

/// First four bytes of a data connection.
pub(crate) const ATTACH_MAGIC: [u8; 4] = *b"LHDA";
/// Total header length.
pub const ATTACH_LEN: usize = 64;
/// Bytes of a session id.
pub const SESSION_ID_LEN: usize = 16;
/// Reply byte: attached.
pub const ATTACH_OK: u8 = 0;
/// Reply byte: unknown session, bad proof or duplicate stream.
pub const ATTACH_REJECTED: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachHeader {
    pub session_id: [u8; SESSION_ID_LEN],
    pub stream_id: u32,
    pub(crate) proof: [u8; 32],
}

/// The proof for one stream.
pub(crate) fn attach_proof(
    key: &[u8],
    session_id: &[u8; SESSION_ID_LEN],
    stream_id: u32,
) -> [u8; 32] {
    hmac_parts(
        key,
        b"longhaul-attach-v1",
        &[session_id, &stream_id.to_be_bytes()],
    )
}

impl AttachHeader {
    pub fn new(key: &[u8], session_id: [u8; SESSION_ID_LEN], stream_id: u32) -> AttachHeader {
        AttachHeader {
            session_id,
            stream_id,
            proof: attach_proof(key, &session_id, stream_id),
        }
    }

    pub(crate) fn encode(&self) -> [u8; ATTACH_LEN] {
        let mut out = [0u8; ATTACH_LEN];
        out[..4].copy_from_slice(&ATTACH_MAGIC);
        out[4..20].copy_from_slice(&self.session_id);
        out[20..24].copy_from_slice(&self.stream_id.to_be_bytes());
        out[32..64].copy_from_slice(&self.proof);
        out
    }

    pub fn decode(bytes: &[u8; ATTACH_LEN]) -> Result<AttachHeader> {
        if bytes[..4] != ATTACH_MAGIC {
            return Err(Error::Protocol("bad attach magic".into()));
        }
        let mut session_id = [0u8; SESSION_ID_LEN];
        session_id.copy_from_slice(&bytes[4..20]);
        let stream_id = u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
        let mut proof = [0u8; 32];
        proof.copy_from_slice(&bytes[32..64]);
        Ok(AttachHeader {
            session_id,
            stream_id,
            proof,
        })
    }

    /// Whether the proof matches `key`.
    pub fn verify(&self, key: &[u8]) -> bool {
        proofs_equal(
            &self.proof,
            &attach_proof(key, &self.session_id, self.stream_id),
        )
    }

    /// Client side: send the header and wait for the server's verdict.
    pub fn send_and_confirm(&self, stream: &mut (impl Read + Write)) -> Result<()> {
        stream
            .write_all(&self.encode())
            .map_err(|e| Error::io("attaching a data connection", e))?;
        let mut reply = [0u8; 1];
        stream
            .read_exact(&mut reply)
            .map_err(|e| Error::io("attaching a data connection", e))?;
        match reply[0] {
            ATTACH_OK => Ok(()),
            _ => Err(Error::Auth(format!(
                "the server rejected data stream {}",
                self.stream_id
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_verifies() {
        let h = AttachHeader::new(b"key", [7; 16], 34);
        let back = AttachHeader::decode(&h.encode()).unwrap();
        assert_eq!(h, back);
        assert!(back.verify(b"key"));
        assert!(!back.verify(b"other"));
    }
}
