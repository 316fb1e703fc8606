//! iperf3's optional authentication, server side (and the client's token,
//! for tests and for `longhaul send --protocol iperf3`).
//!
//! A client started with `--username` puts an `authtoken` in its parameter
//! block: the text `user: NAME\npwd:  PASSWORD\nts:   UNIXTIME`, encrypted
//! with the server's RSA public key and base64-encoded. iperf3 up to 3.16
//! pads with PKCS #1 v1.5, 3.17 and later with OAEP (SHA-1) unless told
//! `--use-pkcs1-padding`; we accept both. The server decrypts it with its
//! private key, refuses a timestamp more than the skew threshold (10 s by
//! default) away from its clock, and looks the user up in the authorized
//! users file: lines `NAME,SHA256HEX` where the hash is of `{NAME}PASSWORD`
//! (`#` starts a comment). Any failure is one answer to the client, iperf3's
//! "test authorization failed", whatever the cause, so the answer tells a
//! prober nothing; the cause goes to the server's log.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rsa::{Oaep, Pkcs1v15Encrypt, RsaPrivateKey, RsaPublicKey};
use sha2::{Digest, Sha256};

use longhaul_admission::AuthFailure;

use crate::error::{Error, Result};

/// iperf3's default `--time-skew-threshold`.
pub const DEFAULT_SKEW: Duration = Duration::from_secs(10);

/// Largest authorized users file we read (a line per user; 1 MiB is tens
/// of thousands of users).
const MAX_USERS_FILE: u64 = 1 << 20;

/// Longest token we try to decode: a 16384-bit key's ciphertext in base64.
pub const MAX_TOKEN_LEN: usize = 4096;

/// How a token is padded (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    Pkcs1v15,
    OaepSha1,
}

fn read_pem(path: &Path, what: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("cannot read the {what} {}: {e}", path.display())))
}

/// Loads an RSA private key from PEM (PKCS #8 `PRIVATE KEY` or PKCS #1
/// `RSA PRIVATE KEY`, unencrypted), as `openssl genrsa` writes them.
pub fn load_private_key(path: &Path) -> Result<RsaPrivateKey> {
    let pem = read_pem(path, "RSA private key")?;
    RsaPrivateKey::from_pkcs8_pem(&pem)
        .or_else(|_| RsaPrivateKey::from_pkcs1_pem(&pem))
        .map_err(|e| {
            Error::Usage(format!(
                "{} is not an unencrypted RSA private key in PEM (PKCS #8 or PKCS #1): {e}",
                path.display()
            ))
        })
}

/// Loads an RSA public key from PEM (`PUBLIC KEY` or `RSA PUBLIC KEY`).
pub fn load_public_key(path: &Path) -> Result<RsaPublicKey> {
    let pem = read_pem(path, "RSA public key")?;
    RsaPublicKey::from_public_key_pem(&pem)
        .or_else(|_| RsaPublicKey::from_pkcs1_pem(&pem))
        .map_err(|e| {
            Error::Usage(format!(
                "{} is not an RSA public key in PEM: {e}",
                path.display()
            ))
        })
}

/// The hash an authorized users file holds for a user's password.
pub fn password_hash(user: &str, password: &str) -> String {
    let digest = Sha256::digest(format!("{{{user}}}{password}").as_bytes());
    crate::auth::to_hex(&digest)
}

/// Whether `user` with `hash` is a line of the authorized users `text`.
fn listed(text: &str, user: &str, hash: &str) -> bool {
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(','))
        .any(|(u, h)| u == user && h.split(',').next() == Some(hash))
}

/// Why a token proves nothing: the counters' kind (wrong or missing
/// credentials are a bad token; a token that is no proof, undecryptable or
/// out of time, a bad proof) and the log's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub kind: AuthFailure,
    pub why: String,
}

/// Credentials from a decrypted token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
    /// Unix seconds the client put in.
    pub timestamp: i64,
}

/// The token's text.
pub fn token_text(c: &Credentials) -> String {
    format!(
        "user: {}\npwd:  {}\nts:   {}",
        c.user, c.password, c.timestamp
    )
}

/// Reads a token's text the way iperf3's `sscanf` does: words separated
/// by any whitespace.
fn parse_token_text(text: &str) -> Option<Credentials> {
    let mut w = text.split_whitespace();
    let (Some("user:"), Some(user), Some("pwd:"), Some(password), Some("ts:"), Some(ts)) =
        (w.next(), w.next(), w.next(), w.next(), w.next(), w.next())
    else {
        return None;
    };
    Some(Credentials {
        user: user.to_string(),
        password: password.to_string(),
        timestamp: ts.parse().ok()?,
    })
}

/// Encrypts credentials into a token for `key`, as an iperf3 client does.
pub fn encode_token(c: &Credentials, key: &RsaPublicKey, padding: Padding) -> Result<String> {
    let mut rng = rsa::rand_core::OsRng;
    let text = token_text(c);
    let sealed = match padding {
        Padding::Pkcs1v15 => key.encrypt(&mut rng, Pkcs1v15Encrypt, text.as_bytes()),
        Padding::OaepSha1 => key.encrypt(&mut rng, Oaep::new::<sha1::Sha1>(), text.as_bytes()),
    }
    .map_err(|e| Error::Usage(format!("cannot encrypt the iperf3 credentials: {e}")))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(sealed))
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A server's authentication: its private key, the users file (read for
/// every test, as iperf3 does, so edits need no restart) and the allowed
/// clock skew.
#[derive(Clone)]
pub struct ServerAuth {
    key: RsaPrivateKey,
    users: PathBuf,
    skew: Duration,
}

impl std::fmt::Debug for ServerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerAuth")
            .field("users", &self.users)
            .field("skew", &self.skew)
            .finish_non_exhaustive()
    }
}

impl ServerAuth {
    /// Loads the key and checks that the users file can be read.
    pub fn load(private_key: &Path, users: &Path, skew: Duration) -> Result<ServerAuth> {
        let key = load_private_key(private_key)?;
        read_users(users).map_err(Error::Usage)?;
        Ok(ServerAuth {
            key,
            users: users.to_path_buf(),
            skew,
        })
    }

    /// The user a token proves, or what kind of failure it is and why it
    /// proves nothing (for the counters and the log).
    pub fn check(&self, token: Option<&str>) -> std::result::Result<String, Denied> {
        self.check_at(token, now_unix())
            .map_err(|(kind, why)| Denied { kind, why })
    }

    fn check_at(
        &self,
        token: Option<&str>,
        now: i64,
    ) -> std::result::Result<String, (AuthFailure, String)> {
        let bad = |why: String| (AuthFailure::BadProof, why);
        let token = token.ok_or_else(|| {
            (
                AuthFailure::BadToken,
                "no credentials (the client needs --username and --rsa-public-key-path)"
                    .to_string(),
            )
        })?;
        if token.len() > MAX_TOKEN_LEN {
            return Err(bad(format!("a {}-byte token", token.len())));
        }
        let sealed = base64::engine::general_purpose::STANDARD
            .decode(token.trim())
            .map_err(|e| bad(format!("the token is not base64: {e}")))?;
        let mut rng = rsa::rand_core::OsRng;
        let plain = self
            .key
            .decrypt_blinded(&mut rng, Pkcs1v15Encrypt, &sealed)
            .or_else(|_| {
                self.key
                    .decrypt_blinded(&mut rng, Oaep::new::<sha1::Sha1>(), &sealed)
            })
            .map_err(|_| bad("the token does not decrypt with our private key".to_string()))?;
        let text = String::from_utf8_lossy(&plain);
        let c = parse_token_text(&text)
            .ok_or_else(|| bad("the decrypted token is not user/pwd/ts".to_string()))?;
        let skew = (now - c.timestamp).unsigned_abs();
        if skew > self.skew.as_secs() {
            return Err(bad(format!(
                "user {}: the token's time is {skew} s off ours (at most {} s allowed)",
                c.user,
                self.skew.as_secs()
            )));
        }
        // The users file is ours: a failure to read it is no fault of the
        // client's, but the test is refused all the same.
        let users = read_users(&self.users).map_err(bad)?;
        if listed(&users, &c.user, &password_hash(&c.user, &c.password)) {
            Ok(c.user)
        } else {
            Err((
                AuthFailure::BadToken,
                format!("user {}: unknown, or the password does not match", c.user),
            ))
        }
    }
}

fn read_users(path: &Path) -> std::result::Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| {
        format!(
            "cannot read the authorized users file {}: {e}",
            path.display()
        )
    })?;
    let mut text = String::new();
    file.take(MAX_USERS_FILE)
        .read_to_string(&mut text)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsa::pkcs8::{EncodePrivateKey, LineEnding};

    fn server(dir: &Path, key: &RsaPrivateKey) -> ServerAuth {
        let key_path = dir.join("private.pem");
        std::fs::write(
            &key_path,
            key.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes(),
        )
        .unwrap();
        let users = dir.join("users.csv");
        std::fs::write(
            &users,
            format!(
                "# name,sha256 of {{name}}password\n\nmallory\nalice,{}\r\n",
                password_hash("alice", "s3cret")
            ),
        )
        .unwrap();
        ServerAuth::load(&key_path, &users, DEFAULT_SKEW).unwrap()
    }

    #[test]
    fn tokens_of_both_paddings_prove_listed_users_only() {
        let dir = std::env::temp_dir().join(format!("lh-iperf3-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 1024).unwrap();
        let auth = server(&dir, &key);
        let public = key.to_public_key();
        let now = 1_700_000_000;
        let token = |user: &str, pw: &str, ts: i64, pad| {
            let c = Credentials {
                user: user.into(),
                password: pw.into(),
                timestamp: ts,
            };
            encode_token(&c, &public, pad).unwrap()
        };
        for pad in [Padding::Pkcs1v15, Padding::OaepSha1] {
            assert_eq!(
                auth.check_at(Some(&token("alice", "s3cret", now, pad)), now + 3),
                Ok("alice".into())
            );
        }
        let fail = |t: Option<&str>| auth.check_at(t, now).unwrap_err();
        let wrong = |t: Option<&str>| {
            let (kind, why) = fail(t);
            assert_eq!(kind, AuthFailure::BadToken, "{why}");
            why
        };
        let no_proof = |t: Option<&str>| {
            let (kind, why) = fail(t);
            assert_eq!(kind, AuthFailure::BadProof, "{why}");
            why
        };
        assert!(wrong(Some(&token("alice", "wrong", now, Padding::Pkcs1v15))).contains("alice"));
        assert!(wrong(Some(&token("bob", "s3cret", now, Padding::OaepSha1))).contains("bob"));
        assert!(
            no_proof(Some(&token("alice", "s3cret", now - 60, Padding::Pkcs1v15))).contains("60 s")
        );
        assert!(wrong(None).contains("--username"));
        assert!(no_proof(Some("!!")).contains("base64"));
        let other = RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 1024).unwrap();
        let c = Credentials {
            user: "alice".into(),
            password: "s3cret".into(),
            timestamp: now,
        };
        let foreign = encode_token(&c, &other.to_public_key(), Padding::Pkcs1v15).unwrap();
        assert!(no_proof(Some(&foreign)).contains("decrypt"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn token_text_reads_like_sscanf() {
        let c = Credentials {
            user: "u".into(),
            password: "p".into(),
            timestamp: -5,
        };
        assert_eq!(parse_token_text(&token_text(&c)), Some(c));
        assert_eq!(parse_token_text("user: a\npwd: b"), None);
        assert_eq!(
            password_hash("mario", "rossi"),
            "bf7a49a846d44b454a5d11e7acfaf13d138bbe0b7483aa3e050879700572709b"
        );
    }
}
