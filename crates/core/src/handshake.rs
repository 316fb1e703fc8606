//! The control handshake, both halves, and the longhaul protocol's side of
//! admission (`longhaul-admission`): what a first message is, the control
//! handshake up to the token proof, and the attach of data connections.
//!
//! - The client runs Hello -> Challenge -> Auth -> AuthOk with
//!   [`client_authenticate`] and may then ask for a session or ping.
//! - A control connection's first message is a whole `Hello` frame (at most
//!   [`MAX_HELLO_LEN`] bytes of payload); its handshake (Challenge, Auth,
//!   proof check) runs on a thread of its own with small frames only
//!   ([`MAX_HANDSHAKE_FRAME`]), and [`authenticate`] returns once the peer
//!   proved the token. Only then does the server admit it and give it a
//!   session slot.
//! - A data connection's first message is its 64-byte attach header; the
//!   attach check is a lookup and an HMAC, done on the admission thread
//!   without blocking.
//! - Anything else is garbage.

use std::net::IpAddr;

use longhaul_admission::{AuthFailure, FirstMessage, ProofTurn};

use crate::attach::{ATTACH_LEN, ATTACH_MAGIC};
use crate::auth::{from_hex, proofs_equal, random_bytes, to_hex, Token, NONCE_LEN};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::frame::{Frame, FRAME_MAGIC, HEADER_LEN};
use crate::limits::{CONTROL_WRITE_TIMEOUT, HANDSHAKE_TIMEOUT};
use crate::messages::{Auth, Challenge, Hello, Message, MessageType};
use crate::{PROTOCOL_VERSION, SOFTWARE_VERSION};

/// Largest `Hello` payload: a version, a 64-character nonce and a software
/// name take ~120 bytes of JSON.
pub(crate) const MAX_HELLO_LEN: usize = 1024;

/// Largest frame taken from a peer that has not proven the token yet. The
/// handshake's messages are a few hundred bytes each.
pub const MAX_HANDSHAKE_FRAME: usize = 4096;

/// Largest first message of any kind, for the admission pool's buffers.
pub const MAX_FIRST_MESSAGE: usize = HEADER_LEN + MAX_HELLO_LEN;

/// Classifies the first bytes of a connection (any bytes: this is what a
/// stranger on the network controls).
pub fn classify(received: &[u8]) -> FirstMessage {
    let seen = received.len().min(4);
    if received[..seen] == FRAME_MAGIC[..seen] {
        if received.len() < HEADER_LEN {
            return FirstMessage::NeedMore;
        }
        let header: [u8; HEADER_LEN] = received[..HEADER_LEN]
            .try_into()
            .expect("length checked above");
        return match Frame::parse_header_limited(&header, MAX_HELLO_LEN) {
            Err(e) => FirstMessage::Garbage(format!("control frame: {e}")),
            Ok((kind, _)) if kind != MessageType::Hello as u8 => FirstMessage::Garbage(format!(
                "control connection opened with message type 0x{kind:02x}, not Hello"
            )),
            Ok((_, len)) if received.len() < HEADER_LEN + len => FirstMessage::NeedMore,
            Ok(_) => FirstMessage::Handshake,
        };
    }
    if received[..seen] == ATTACH_MAGIC[..seen] {
        return if received.len() < ATTACH_LEN {
            FirstMessage::NeedMore
        } else {
            FirstMessage::Quick
        };
    }
    FirstMessage::Garbage(format!(
        "first bytes {:02x?}, not a longhaul peer",
        &received[..seen]
    ))
}

/// Who may open a session without a token.
#[derive(Debug, Clone)]
pub struct AuthPolicy {
    pub token: Option<Token>,
    pub allow_unauthenticated: bool,
}

/// A control connection that proved the token (or needed none).
pub struct Proven {
    pub server_nonce: [u8; NONCE_LEN],
    pub client_nonce: Vec<u8>,
}

pub(crate) fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Waits for the peer's source's turn to have a token proof checked (its
/// failed proofs budget); None when the admission deadline passed.
pub(crate) type ProofGate<'a> = &'a dyn Fn() -> Option<ProofTurn>;

/// What a failed server handshake counts as, if anything: a peer that
/// left or went silent is not counted here (the admission deadline counts
/// the silent ones).
pub fn auth_failure(e: &Error) -> Option<AuthFailure> {
    match e {
        Error::Auth(_) => Some(AuthFailure::BadToken),
        Error::VersionMismatch { .. } | Error::RemoteVersionMismatch(_) => {
            Some(AuthFailure::BadVersion)
        }
        Error::Protocol(_) => Some(AuthFailure::BadProof),
        _ => None,
    }
}

/// Server side of Hello -> Challenge -> Auth on a fresh control connection,
/// up to (not including) `AuthOk`; a token proof is checked only in its
/// source's turn (`gate`). On failure the peer has been told why.
pub fn authenticate(
    conn: &mut Connection,
    policy: &AuthPolicy,
    gate: ProofGate<'_>,
) -> Result<Proven> {
    conn.set_max_frame(MAX_HANDSHAKE_FRAME);
    conn.set_timeout(Some(HANDSHAKE_TIMEOUT))?;
    // A client that reads nothing must not hold a session slot while we
    // wait to write.
    conn.set_write_timeout(Some(CONTROL_WRITE_TIMEOUT))?;
    let result = authenticate_inner(conn, policy, gate);
    if let Err(e) = &result {
        conn.send_error(e);
    }
    result
}

fn authenticate_inner(
    conn: &mut Connection,
    policy: &AuthPolicy,
    gate: ProofGate<'_>,
) -> Result<Proven> {
    let peer = conn.peer();
    let hello = match conn.recv()? {
        Message::Hello(h) => h,
        other => return Err(expect_kind(other, "Hello")),
    };
    if hello.version != PROTOCOL_VERSION {
        return Err(Error::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: hello.version,
        });
    }
    if policy.token.is_none() && !policy.allow_unauthenticated && !is_loopback(peer.ip()) {
        return Err(Error::Auth(format!(
            "{} is not a loopback peer and the server has no --token-file (or --allow-unauthenticated)",
            peer.ip()
        )));
    }
    let client_nonce = from_hex(&hello.client_nonce)?;
    if client_nonce.len() != NONCE_LEN {
        return Err(Error::Protocol("client nonce has the wrong length".into()));
    }
    let server_nonce = random_bytes::<NONCE_LEN>();
    conn.send(&Message::Challenge(Challenge {
        version: PROTOCOL_VERSION,
        server_nonce: to_hex(&server_nonce),
        token_required: policy.token.is_some(),
    }))?;
    let auth = match conn.recv()? {
        Message::Auth(a) => a,
        other => return Err(expect_kind(other, "Auth")),
    };
    if let Some(t) = &policy.token {
        let Some(proof) = auth.proof else {
            return Err(Error::Auth(
                "the server requires a token: pass --token-file".into(),
            ));
        };
        let proof = from_hex(&proof)?;
        let Some(turn) = gate() else {
            return Err(Error::Timeout(
                "too many failed proofs from this address: slowed down past the admission deadline"
                    .into(),
            ));
        };
        let expected = t.client_proof(&server_nonce, &client_nonce);
        if !proofs_equal(&proof, &expected) {
            // The turn stays spent.
            return Err(Error::Auth("wrong token".into()));
        }
        turn.passed();
    }
    Ok(Proven {
        server_nonce,
        client_nonce,
    })
}

/// Nonces of an authenticated control connection (the attach key derives
/// from them).
pub struct Nonces {
    pub client: [u8; NONCE_LEN],
    pub server: Vec<u8>,
}

fn expect_kind(got: Message, want: &str) -> Error {
    Error::Protocol(format!("expected {want}, got {:?}", got.kind()))
}

/// Client side of Hello -> Challenge -> Auth -> AuthOk on a fresh control
/// connection. After it the client may send `SessionRequest` (or `Ping`).
pub fn client_authenticate(conn: &mut Connection, token: Option<&Token>) -> Result<Nonces> {
    conn.set_timeout(Some(HANDSHAKE_TIMEOUT))?;
    // A server that stops reading (frozen, or its host hung) must not hold
    // a client in the middle of sending its manifest for ever.
    conn.set_write_timeout(Some(CONTROL_WRITE_TIMEOUT))?;
    let client_nonce = random_bytes::<NONCE_LEN>();
    conn.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        client_nonce: to_hex(&client_nonce),
        software: format!("longhaul {SOFTWARE_VERSION}"),
    }))?;
    let challenge = match conn.recv()? {
        Message::Challenge(c) => c,
        other => return Err(expect_kind(other, "Challenge")),
    };
    if challenge.version != PROTOCOL_VERSION {
        return Err(Error::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: challenge.version,
        });
    }
    let server_nonce = from_hex(&challenge.server_nonce)?;
    if challenge.token_required && token.is_none() {
        return Err(Error::Auth(
            "the server requires a token: pass --token-file".into(),
        ));
    }
    conn.send(&Message::Auth(Auth {
        proof: token.map(|t| to_hex(&t.client_proof(&server_nonce, &client_nonce))),
    }))?;
    let ok = match conn.recv()? {
        Message::AuthOk(a) => a,
        other => return Err(expect_kind(other, "AuthOk")),
    };
    if let Some(t) = token {
        let Some(proof) = ok.proof else {
            return Err(Error::Auth(
                "the server runs without a token and cannot prove it knows ours".into(),
            ));
        };
        if !proofs_equal(
            &from_hex(&proof)?,
            &t.server_proof(&server_nonce, &client_nonce),
        ) {
            return Err(Error::Auth(
                "the server's proof is wrong: different token".into(),
            ));
        }
    }
    Ok(Nonces {
        client: client_nonce,
        server: server_nonce,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_peers_include_v4_mapped() {
        assert!(is_loopback("127.0.0.1".parse().unwrap()));
        assert!(is_loopback("127.1.2.3".parse().unwrap()));
        assert!(is_loopback("::1".parse().unwrap()));
        assert!(is_loopback("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_loopback("10.0.0.1".parse().unwrap()));
        assert!(!is_loopback("::ffff:10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn first_messages_are_classified_from_their_bytes() {
        let hello = Message::Hello(crate::messages::Hello {
            version: PROTOCOL_VERSION,
            client_nonce: "ab".repeat(32),
            software: "t".into(),
        })
        .to_frame()
        .unwrap()
        .encode()
        .unwrap();
        assert_eq!(classify(&hello[..3]), FirstMessage::NeedMore);
        assert_eq!(classify(&hello[..20]), FirstMessage::NeedMore);
        assert_eq!(classify(&hello), FirstMessage::Handshake);
        let attach = crate::attach::AttachHeader::new(b"k", [1; 16], 3).encode();
        assert_eq!(classify(&attach[..10]), FirstMessage::NeedMore);
        assert_eq!(classify(&attach), FirstMessage::Quick);
        assert!(matches!(
            classify(b"GET / HTTP/1.1"),
            FirstMessage::Garbage(_)
        ));
        // A frame that is not Hello, or a Hello too large to be one.
        let start = Message::Start.to_frame().unwrap().encode().unwrap();
        assert!(matches!(classify(&start), FirstMessage::Garbage(_)));
        let mut big = FRAME_MAGIC.to_vec();
        big.push(MessageType::Hello as u8);
        big.extend_from_slice(&(MAX_HELLO_LEN as u32 + 1).to_be_bytes());
        assert!(matches!(classify(&big), FirstMessage::Garbage(_)));
    }
}
