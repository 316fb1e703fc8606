//! iperf3's optional authentication, server side (and the client's token,
//! for tests and for `longhaul send --protocol iperf3`).
//!
//! A client started with `--username` puts an `authtoken` in its parameter
//! block: the text `user: NAME\npwd:  PASSWORD\nts:   UNIXTIME`, encrypted
//! with the server's RSA public key and base64-encoded. iperf3 up to 3.16
//! pads with PKCS #1 v1.5, 3.17 and later with OAEP (OpenSSL's default:
//! SHA-1, MGF1 with SHA-1, no label) unless told `--use-pkcs1-padding`; we
//! accept both.
//!
//! Decryption leaks nothing through its timing (the Marvin attack,
//! RUSTSEC-2023-0071, on the `rsa` crate before 0.10): the private-key
//! operation is constant-time big-number arithmetic (crypto-bigint) with
//! base, exponent and modulus blinding, and every token is decrypted the
//! same way whatever its bytes: first as OAEP, whose check is constant-time
//! and tells only OAEP-valid from not (no use to an attacker: a forged
//! ciphertext is OAEP-valid with negligible chance), then as PKCS #1 v1.5
//! with implicit rejection: bad padding yields a deterministic random-looking
//! message derived from the key and the ciphertext, never an error, so
//! valid and invalid v1.5 padding take the same path to the same answer
//! ("test authorization failed"). The server decrypts it with its
//! private key, refuses a timestamp more than the skew threshold (10 s by
//! default) away from its clock, and looks the user up in the authorized
//! users file: lines `NAME,SHA256HEX` where the hash is of `{NAME}PASSWORD`
//! (`#` starts a comment). Any failure is one answer to the client, iperf3's
//! "test authorization failed", whatever the cause, so the answer tells a
//! prober nothing; the cause goes to the server's log.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::PrivateKey;
use sha2::{Digest, Sha256};

use longhaul_admission::AuthFailure;

use crate::error::{Error, Result};

/// iperf3's default `--time-skew-threshold`.
pub const DEFAULT_SKEW: Duration = Duration::from_secs(10);

/// Largest authorized users file we read (a line per user; 1 MiB is tens
/// of thousands of users).
const MAX_USERS_FILE: u64 = 1 << 20;

/// Longest token we try to decode: a 16384-bit key's ciphertext in base64.
pub(crate) const MAX_TOKEN_LEN: usize = 4096;

/// How a token is padded (see the module documentation).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Padding {
    Pkcs1v15,
    OaepSha1,
}

fn read_pem(path: &Path, what: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("cannot read the {what} {}: {e}", path.display())))
}

/// Loads an RSA private key from PEM (PKCS #8 `PRIVATE KEY` or PKCS #1
/// `RSA PRIVATE KEY`, unencrypted), as `openssl genrsa` writes them.
pub(crate) fn load_private_key(path: &Path) -> Result<PrivateKey> {
    let pem = read_pem(path, "RSA private key")?;
    PrivateKey::from_pkcs8_pem(&pem)
        .or_else(|_| PrivateKey::from_pkcs1_pem(&pem))
        .map_err(|e| {
            Error::Usage(format!(
                "{} is not an unencrypted RSA private key in PEM (PKCS #8 or PKCS #1): {e}",
                path.display()
            ))
        })
}

/// The hash an authorized users file holds for a user's password.
pub(crate) fn password_hash(user: &str, password: &str) -> String {
    let digest = Sha256::digest(format!("{{{user}}}{password}").as_bytes());
    longhaul_core::auth::to_hex(&digest)
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
pub(crate) struct Denied {
    pub(crate) kind: AuthFailure,
    pub(crate) why: String,
}

/// Credentials from a decrypted token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
    /// Unix seconds the client put in.
    pub(crate) timestamp: i64,
}

/// The token's text.
#[cfg(test)]
pub(crate) fn token_text(c: &Credentials) -> String {
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
#[cfg(test)]
pub(crate) fn encode_token(
    c: &Credentials,
    key: &rsa::PublicKey,
    padding: Padding,
) -> Result<String> {
    let text = token_text(c);
    let sealed = match padding {
        Padding::Pkcs1v15 => key.pkcs1v15_encrypt(text.as_bytes()),
        Padding::OaepSha1 => key.oaep_encrypt::<sha1::Sha1>(text.as_bytes()),
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
    key: PrivateKey,
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
    pub(crate) fn check(&self, token: Option<&str>) -> std::result::Result<String, Denied> {
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
        // OAEP, else PKCS #1 v1.5 with implicit rejection (see the module
        // documentation): an error here is a token of the wrong size for
        // our key, nothing about its padding.
        let plain = self
            .key
            .oaep_decrypt::<sha1::Sha1>(&sealed)
            .or_else(|_| self.key.pkcs1v15_decrypt(&sealed))
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

    /// Test keys (1024 bits: the smallest the crate takes, the fastest to
    /// use), made with `openssl genrsa 1024`.
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIICdwIBADANBgkqhkiG9w0BAQEFAASCAmEwggJdAgEAAoGBALpbuxUeha/Fw/ox\nQPGGIfEjnlB4FTyibjxe/6XPREj+dfONMjfBuE8ju/RetWGdxjw6zh+Ll4FhWzpu\n7PKNuhalpde9YKppnJAFGJZFajBUN/XWdMElNEN7JrShGGSpMVsVvQfYANUpID/M\nxzC8m3v8YhW9a2rfku7fpMAwKVhDAgMBAAECgYBMb1NMVjh+356B/7GjXmCNhw5n\n8tjDBdww5sX0PA7F4Zh/TGpMdCgkTYPJtw6t+whTq8rfJWH+ru+8B8MnuPmZnOcC\no/B8nw5F3Q3VHclCx8wvd1umRk/hCDLaPrzsk290mUi7xrxHyHh+orkHaEiiohlt\nmbwy3c1dW1sIiAb4AQJBAOakQ8Kt6Cx4nB+Tk2Wwlwy+tu4BF3r6uaPXuPZYPyjv\nmsJE2UL7WboWI6KssEFz1eH2wOcZIENxj+kiMF2Ej/cCQQDO2QyPi3BqJDXsCWjb\nx07BPGBl6Gi7YpyByStY2o2S4pbLkjDfdX8LrzkpkslOgcEf8Ubwvg6hARy/HaYK\nkn8VAkB+P/ifflaS0UqUtlF+3pUwcszrp0lVFh28I/+pSVD5dX7/THSpB7Fr/WZw\nS5sHmQLA+DNLzSMuB+HAuehDqKatAkEAsaWNeRa7dB0nRlGKgf65b5IIBF3G3PBD\nE+AO31/MaRM7iRhD6xaBByr0//R1+XvMvj88uvOvoq1O4AB5oujQRQJBALR8GXqd\n9LIHTlnygHQgOpiPSHftHhuRgB/JHMd6ScBxLg2Sg+aDOHxuW4bcKFbk2l51EAGM\nYP1YUIL81TJalOw=\n-----END PRIVATE KEY-----";
    const OTHER_KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIICeQIBADANBgkqhkiG9w0BAQEFAASCAmMwggJfAgEAAoGBAKDFfK6/8i2QBXDz\nu0YvNOdI+T8ZR8+AM+AmaV5spXJiNMZ+n4Y/uvIjDENda1cA3KJtQ0XfyYm/OY82\ni5FGsoTeYpLGucnCiHimGL2HE0R1B8ILBmvDYnniIDz1mM0OKNqQFXdrY9eHo8tL\nYFt3WchyXmfXw06hDRVW09NOgSQhAgMBAAECgYEAj7yg4ZeozMWDp92xJGmWMeYT\nOS+//SuQtamB8TLPpHla19BjjWIzIMLm9t9x1WJm4C0xxSn0BNxbeMf6dhMwDKG0\nIdMzGiddvqEf56Ir3KRtsqRhS6moQWM6Jza30DEHAShiAdb/+6pnsUFCG8I/267I\naT6lT4Goi/6hxmWQbRUCQQDTrHZgPn6DQyHeIc1uN8A6xSAVPRbxf279BACf5J87\nikcXZv2V3l1EqkqF7/j0CwkiRUtMVLu9nf4i68jRumQbAkEAwnA5ebKEoi8R0KlD\nwbjPG9PukEdl1nqsOiGNDO59XQGUXqiIbmgQ7Lw9m/uxuBwxR1VOBlQb/dqSk8dx\nXH1EcwJBAMuyLFxj52UzxjS4PLOzDNbBeiVWG20c39a18k/sN1uZrt4Taza8vO5m\nHb8UdnOK5yhGnLaA2AYaM0SxuBgzkT8CQQCU7gy4EGrTJyaIIv5JJdtNP1mdnXJ9\ng9zjcctuOkY/tPQGRSSrHH7KNa0jCvinQsDkGIz4//eoy4A2PS+xXinNAkEAssOU\n98zEjK53vwa5B92e7IBM4xKvDqrw7y0l3SJ3mZgo98U9/+PCj3LWiHeLnKCrapr2\nkP/C/9nqlQ36f/XfhQ==\n-----END PRIVATE KEY-----";

    /// `user: alice / pwd: s3cret / ts: 1700000000` encrypted to KEY by
    /// OpenSSL, the library iperf3 encrypts with, in the two paddings
    /// iperf3 uses (`openssl pkeyutl -encrypt -pkeyopt
    /// rsa_padding_mode:pkcs1` as 3.12, `rsa_padding_mode:oaep`, SHA-1 and
    /// MGF1 with SHA-1, as 3.17 and later), base64.
    const OPENSSL_PKCS1: &str = "HA0zXYdMSHJoL4xhBR2rRcpXXc+HWWJSxGdxnI9FSmQ6sVA4BjbF6MvKHZsxU9E1DGDjeSdX7xlC7bVPTC4RAz/hQh9QY2FCP4l3/PccbJbp56xQFfRXV2/Y1oKy0UZvnhgnCEx1esN8S8XepNN+DEugqqXOvQBDpk5NoQJIHDM=";
    const OPENSSL_OAEP: &str = "sozEiyW93AfJO4T4juuU08Ew+HYyVn51ujSRcVx7xr58U4qJJEDSPDs69OmOYQdb6TEI02N69oueFYfrZt2OYdrKrzkPFSxR2MFNOVXy54NyamwIHQq3l4goIouRsaDNAF3Sj5MmMkBmW3a8GS1HznA7qkIcqJBm0mjH49MJqCM=";
    const OPENSSL_TS: i64 = 1_700_000_000;

    struct Fixture {
        dir: std::path::PathBuf,
        auth: ServerAuth,
        public: rsa::PublicKey,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn fixture(tag: &str) -> Fixture {
        let dir = std::env::temp_dir().join(format!("lh-iperf3-auth-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key_path = dir.join("private.pem");
        std::fs::write(&key_path, KEY).unwrap();
        let users = dir.join("users.csv");
        std::fs::write(
            &users,
            format!(
                "# name,sha256 of {{name}}password\n\nmallory\nalice,{}\r\n",
                password_hash("alice", "s3cret")
            ),
        )
        .unwrap();
        let auth = ServerAuth::load(&key_path, &users, DEFAULT_SKEW).unwrap();
        let public = load_private_key(&key_path).unwrap().to_public_key();
        Fixture { dir, auth, public }
    }

    #[test]
    fn openssl_tokens_of_both_paddings_iperf3_uses_are_read() {
        let f = fixture("openssl");
        for token in [OPENSSL_PKCS1, OPENSSL_OAEP] {
            assert_eq!(
                f.auth.check_at(Some(token), OPENSSL_TS + 3),
                Ok("alice".into())
            );
        }
        // Either, a byte changed: no proof, whichever padding it had.
        for token in [OPENSSL_PKCS1, OPENSSL_OAEP] {
            let mut sealed = base64::engine::general_purpose::STANDARD
                .decode(token)
                .unwrap();
            sealed[40] ^= 1;
            let tampered = base64::engine::general_purpose::STANDARD.encode(sealed);
            let (kind, why) = f.auth.check_at(Some(&tampered), OPENSSL_TS).unwrap_err();
            assert_eq!(kind, AuthFailure::BadProof, "{why}");
        }
    }

    #[test]
    fn tokens_of_both_paddings_prove_listed_users_only() {
        let f = fixture("ours");
        let auth = &f.auth;
        let now = 1_700_000_000;
        let token = |user: &str, pw: &str, ts: i64, pad| {
            let c = Credentials {
                user: user.into(),
                password: pw.into(),
                timestamp: ts,
            };
            encode_token(&c, &f.public, pad).unwrap()
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
        for pad in [Padding::Pkcs1v15, Padding::OaepSha1] {
            assert!(wrong(Some(&token("alice", "wrong", now, pad))).contains("alice"));
            assert!(wrong(Some(&token("bob", "s3cret", now, pad))).contains("bob"));
            assert!(no_proof(Some(&token("alice", "s3cret", now - 60, pad))).contains("60 s"));
        }
        assert!(wrong(None).contains("--username"));
        assert!(no_proof(Some("!!")).contains("base64"));
        // Sealed for another key: PKCS #1 v1.5 rejects it implicitly (a
        // random-looking message, not an error), OAEP does not decrypt.
        let other = PrivateKey::from_pkcs8_pem(OTHER_KEY)
            .unwrap()
            .to_public_key();
        let c = Credentials {
            user: "alice".into(),
            password: "s3cret".into(),
            timestamp: now,
        };
        for pad in [Padding::Pkcs1v15, Padding::OaepSha1] {
            let foreign = encode_token(&c, &other, pad).unwrap();
            assert!(no_proof(Some(&foreign)).contains("user/pwd/ts"));
        }
        // Not even a ciphertext of our key's size.
        let short = base64::engine::general_purpose::STANDARD.encode([7u8; 16]);
        assert!(no_proof(Some(&short)).contains("decrypt"));
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
