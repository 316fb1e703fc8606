//! One writer per destination path.
//!
//! Two sessions writing the same file at once would interleave their blocks
//! in one temporary file and rename whatever results into place, and each
//! would verify only the blocks it received. So a disk session *claims*
//! every file of its manifest (skipped ones too: a file another session is
//! about to replace is not "already there") when the server plans it, and
//! holds the claims until the session ends; a second live session aimed at
//! a claimed file gets that file refused with [`super::DiskError::InUse`],
//! naming the session that holds it. A file is named by its directory's
//! (device, inode) and its name, so two spellings of one path are one claim.
//!
//! Claims live in the server process. [`RootLock`] makes that enough: it
//! takes an exclusive `flock` on `--root` for the server's lifetime, so a
//! second `longhaul serve` on the same root refuses to start instead of
//! writing beside the first.

use std::collections::HashMap;
use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// A destination file: its directory's (st_dev, st_ino) and its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ClaimKey {
    pub(crate) dir: (u64, u64),
    pub(crate) name: String,
}

/// Who holds a claim, for the refusal message.
#[derive(Debug, Clone)]
struct Holder {
    session: String,
    peer: SocketAddr,
}

/// Every claim of one server.
#[derive(Debug, Default)]
pub struct Claims {
    held: Mutex<HashMap<ClaimKey, Holder>>,
}

/// A session asking for claims: the server's claims, the session's id and
/// its client.
#[derive(Debug, Clone)]
pub struct Claimant {
    pub claims: Arc<Claims>,
    pub session: String,
    pub peer: SocketAddr,
}

/// The claims one session holds; released on drop (the session ended).
#[derive(Debug)]
pub(crate) struct ClaimSet {
    claims: Arc<Claims>,
    keys: Vec<ClaimKey>,
}

impl Claimant {
    /// An empty set for this session.
    pub(crate) fn start(&self) -> ClaimSet {
        ClaimSet {
            claims: self.claims.clone(),
            keys: Vec::new(),
        }
    }

    /// Claims `key` into `set`, or says which live session holds it.
    pub(crate) fn claim(
        &self,
        set: &mut ClaimSet,
        key: ClaimKey,
    ) -> std::result::Result<(), String> {
        let mut held = self.claims.held.lock().unwrap_or_else(|e| e.into_inner());
        match held.get(&key) {
            Some(h) if h.session != self.session => Err(format!(
                "session {} from {} is writing it",
                h.session, h.peer
            )),
            Some(_) => Ok(()),
            None => {
                held.insert(
                    key.clone(),
                    Holder {
                        session: self.session.clone(),
                        peer: self.peer,
                    },
                );
                set.keys.push(key);
                Ok(())
            }
        }
    }
}

impl Drop for ClaimSet {
    fn drop(&mut self) {
        let mut held = self.claims.held.lock().unwrap_or_else(|e| e.into_inner());
        for k in &self.keys {
            held.remove(k);
        }
    }
}

/// An exclusive lock on `--root`, held while the server runs.
#[derive(Debug)]
pub struct RootLock {
    _dir: File,
}

impl RootLock {
    /// Locks `root`; fails with a usage error when another process holds it.
    pub fn take(root: &Path) -> Result<RootLock> {
        let dir = File::open(root)
            .map_err(|e| Error::Usage(format!("--root {}: {e}", root.display())))?;
        // SAFETY: flock on a descriptor we own; no memory involved.
        if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::Usage(
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    format!(
                        "--root {}: another longhaul serve already writes there (one server per root, so no two sessions write one file)",
                        root.display()
                    )
                } else {
                    format!("--root {}: cannot lock it: {e}", root.display())
                },
            ));
        }
        Ok(RootLock { _dir: dir })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimant(claims: &Arc<Claims>, session: &str) -> Claimant {
        Claimant {
            claims: claims.clone(),
            session: session.into(),
            peer: "127.0.0.1:9".parse().unwrap(),
        }
    }

    #[test]
    fn a_claimed_file_is_refused_to_others_until_released() {
        let claims = Arc::new(Claims::default());
        let (a, b) = (claimant(&claims, "a"), claimant(&claims, "b"));
        let key = ClaimKey {
            dir: (1, 2),
            name: "f".into(),
        };
        let mut set_a = a.start();
        a.claim(&mut set_a, key.clone()).unwrap();
        a.claim(&mut set_a, key.clone()).unwrap();
        let mut set_b = b.start();
        let err = b.claim(&mut set_b, key.clone()).unwrap_err();
        assert!(err.contains("session a"), "{err}");
        drop(set_a);
        b.claim(&mut set_b, key).unwrap();
    }

    #[test]
    fn a_root_is_locked_once() {
        let dir = std::env::temp_dir().join(format!("lh-rootlock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = RootLock::take(&dir).unwrap();
        let err = RootLock::take(&dir).unwrap_err();
        assert!(err.to_string().contains("another longhaul serve"), "{err}");
        drop(first);
        RootLock::take(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
