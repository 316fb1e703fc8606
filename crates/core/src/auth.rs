//! Challenge-response authentication with a shared token.
//!
//! Both ends read the same token from `--token-file`. Each sends a random
//! nonce; the client proves knowledge of the token with
//! `HMAC-SHA256(token, "longhaul-client-v1" | server_nonce | client_nonce)`,
//! the server answers with the mirrored proof, and both derive the key that
//! authenticates data connections (see [`crate::attach`]). The token itself
//! never crosses the wire, and a recorded exchange cannot be replayed because
//! the other end's nonce is fresh every time.

use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the handshake nonces.
pub const NONCE_LEN: usize = 32;

/// A shared secret read from a token file.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Reads a token file; surrounding whitespace (a trailing newline) is
    /// ignored, an empty token is refused.
    pub fn from_file(path: &Path) -> Result<Token> {
        let text = std::fs::read(path)
            .map_err(|e| Error::Usage(format!("cannot read token file {}: {e}", path.display())))?;
        let trimmed = text.trim_ascii();
        if trimmed.is_empty() {
            return Err(Error::Usage(format!(
                "token file {} is empty",
                path.display()
            )));
        }
        Ok(Token(trimmed.to_vec()))
    }

    pub fn from_bytes(bytes: &[u8]) -> Token {
        Token(bytes.to_vec())
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        hmac_parts(&self.0, label, parts)
    }

    /// The client's proof.
    pub(crate) fn client_proof(&self, server_nonce: &[u8], client_nonce: &[u8]) -> [u8; 32] {
        self.mac(b"longhaul-client-v1", &[server_nonce, client_nonce])
    }

    /// The server's proof (mirrored order and label, so it cannot be
    /// reflected back as a client proof).
    pub fn server_proof(&self, server_nonce: &[u8], client_nonce: &[u8]) -> [u8; 32] {
        self.mac(b"longhaul-server-v1", &[client_nonce, server_nonce])
    }

    /// The session's attach key, derived on both ends.
    pub fn attach_key(&self, server_nonce: &[u8], client_nonce: &[u8]) -> [u8; 32] {
        self.mac(b"longhaul-attach-key-v1", &[server_nonce, client_nonce])
    }
}

/// HMAC-SHA256 of `label | parts...` under `key`.
pub(crate) fn hmac_parts(key: &[u8], label: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(label);
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// Compares two proofs in constant time.
pub(crate) fn proofs_equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Fills a buffer from the kernel's CSPRNG.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    let mut filled = 0;
    while filled < N {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let n = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), N - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            panic!("getrandom failed: {}", std::io::Error::last_os_error());
        }
    }
    buf
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(text: &str) -> Result<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return Err(Error::Protocol(format!("bad hex string '{text}'")));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&text[i..i + 2], 16)
                .map_err(|_| Error::Protocol(format!("bad hex string '{text}'")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_token_and_direction() {
        let a = Token::from_bytes(b"secret");
        let b = Token::from_bytes(b"other");
        let (s, c) = ([1u8; 32], [2u8; 32]);
        assert!(proofs_equal(
            &a.client_proof(&s, &c),
            &a.client_proof(&s, &c)
        ));
        assert!(!proofs_equal(
            &a.client_proof(&s, &c),
            &b.client_proof(&s, &c)
        ));
        assert!(!proofs_equal(
            &a.client_proof(&s, &c),
            &a.server_proof(&s, &c)
        ));
    }

    #[test]
    fn hex_round_trips() {
        let bytes = random_bytes::<16>();
        assert_eq!(from_hex(&to_hex(&bytes)).unwrap(), bytes);
        assert!(from_hex("zz").is_err());
    }
}
