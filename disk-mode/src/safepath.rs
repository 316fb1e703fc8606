//! Path safety on the server: every path from the wire resolves beneath the
//! `--root` directory or is refused, whether a push writes it or a pull
//! (`walk::walk_beneath`, [`Root::open_beneath`]) reads it.
//!
//! A wire path must be canonical and relative: '/'-separated components, none
//! empty, `.` or `..`, no NUL, not absolute. It is then resolved one
//! component at a time with `openat(O_NOFOLLOW | O_DIRECTORY)` from a
//! descriptor of the root, so a symlink anywhere inside the root (even one
//! planted after validation) is never followed: the open fails with ELOOP or
//! ENOTDIR and the path is refused. Files are then created with `openat(...,
//! O_NOFOLLOW)` and renamed with `renameat` relative to the same directory
//! descriptor, which never follows a symlink either.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::{DiskError, Result};

/// Longest wire path accepted (PATH_MAX).
pub(crate) const MAX_PATH_BYTES: usize = 4096;

/// Split a wire path into its components, refusing anything that could
/// leave the root.
pub(crate) fn components(rel: &str) -> Result<Vec<&str>> {
    let refuse = |reason: &str| DiskError::Refused {
        path: rel.escape_debug().to_string(),
        reason: reason.into(),
    };
    if rel.is_empty() {
        return Err(refuse("empty path"));
    }
    if rel.len() > MAX_PATH_BYTES {
        return Err(refuse("path too long"));
    }
    if rel.contains('\0') {
        return Err(refuse("NUL byte in path"));
    }
    if rel.starts_with('/') {
        return Err(refuse("absolute path escapes the root"));
    }
    let parts: Vec<&str> = rel.split('/').collect();
    for p in &parts {
        match *p {
            ".." => return Err(refuse("'..' escapes the root")),
            "." | "" => return Err(refuse("non-canonical path component")),
            _ => {}
        }
    }
    Ok(parts)
}

/// Join a validated `--dest` (may be empty or ".") and a validated relative
/// path into one wire path.
pub(crate) fn join(dest: &str, rel: &str) -> String {
    let dest = dest.trim_end_matches('/');
    if dest.is_empty() || dest == "." {
        rel.to_string()
    } else {
        format!("{dest}/{rel}")
    }
}

/// Validate `--dest`: empty or "." mean the root itself.
pub(crate) fn validate_dest(dest: &str) -> Result<()> {
    let d = dest.trim_end_matches('/');
    if d.is_empty() || d == "." {
        return Ok(());
    }
    components(d).map(|_| ())
}

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The server's root directory, held open.
pub(crate) struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

impl Root {
    pub(crate) fn open(path: &Path) -> Result<Root> {
        let f = File::open(path).map_err(|e| DiskError::from_io(path.display().to_string(), e))?;
        if !f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(DiskError::Io {
                path: path.display().to_string(),
                source: io::Error::from_raw_os_error(libc::ENOTDIR),
            });
        }
        Ok(Root {
            fd: f.into(),
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Open the existing file `rel` beneath the root with `flags` (plus
    /// O_NOFOLLOW and O_CLOEXEC), passing no symlink on the way: a
    /// directory swapped for a symlink fails the open, it is not followed.
    pub(crate) fn open_beneath(&self, rel: &str, flags: libc::c_int) -> io::Result<File> {
        let (dir, name) = self.parent_of(rel, false).map_err(|e| match e {
            DiskError::Io { source, .. } => source,
            other => io::Error::other(other.to_string()),
        })?;
        dir.open_file(name, flags, 0).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::other(format!(
                "{rel}: a symlink inside the server's --root; the server reads nothing through symlinks"
            )),
            _ => e,
        })
    }

    /// Whether `rel` beneath the root still exists, reached without
    /// passing a symlink (a final symlink counts as there).
    pub(crate) fn exists_beneath(&self, rel: &str) -> bool {
        self.parent_of(rel, false)
            .is_ok_and(|(d, name)| matches!(d.stat(name), Ok(Some(_))))
    }

    /// The directory that holds the wire path `rel`, reached without
    /// passing a symlink (with `create`, made where missing), and `rel`'s
    /// last component.
    pub(crate) fn parent_of<'r>(&self, rel: &'r str, create: bool) -> Result<(Dir, &'r str)> {
        let comps = components(rel)?;
        let (name, parent) = comps.split_last().expect("components are never empty");
        Ok((self.open_dir(parent, create, rel)?, name))
    }

    /// Open (and with `create`, make) the directory `comps` beneath the
    /// root; `rel` names it in errors.
    pub(crate) fn open_dir(&self, comps: &[&str], create: bool, rel: &str) -> Result<Dir> {
        let mut cur = Dir {
            fd: self
                .fd
                .try_clone()
                .map_err(|e| DiskError::from_io(rel, e))?,
        };
        for c in comps {
            cur = cur.child_dir(c, create, rel)?;
        }
        Ok(cur)
    }
}

impl std::fmt::Debug for Root {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Root").field("path", &self.path).finish()
    }
}

/// An open directory beneath the root; all operations are relative to it
/// and never follow a symlink in the final component.
pub(crate) struct Dir {
    fd: OwnedFd,
}

impl Dir {
    pub(crate) fn into_fd(self) -> OwnedFd {
        self.fd
    }

    fn child_dir(&self, name: &str, create: bool, rel: &str) -> Result<Dir> {
        let c = cstr(name).map_err(|e| DiskError::from_io(rel, e))?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let mut made = false;
        loop {
            // SAFETY: valid dirfd and NUL-terminated name.
            let r = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags) };
            if r >= 0 {
                // SAFETY: r is a fresh descriptor we own.
                return Ok(Dir {
                    fd: unsafe { OwnedFd::from_raw_fd(r) },
                });
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::ENOENT) if create && !made => {
                    made = true;
                    // SAFETY: as above.
                    let m = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o755) };
                    if m < 0 {
                        let e = io::Error::last_os_error();
                        if e.raw_os_error() != Some(libc::EEXIST) {
                            return Err(DiskError::from_io(rel, e));
                        }
                    }
                }
                Some(libc::ELOOP) => {
                    return Err(DiskError::Refused {
                        path: rel.into(),
                        reason: format!("symlink component '{name}' inside the root"),
                    })
                }
                Some(libc::ENOTDIR) if self.is_symlink(name) => {
                    return Err(DiskError::Refused {
                        path: rel.into(),
                        reason: format!("symlink component '{name}' inside the root"),
                    })
                }
                _ => return Err(DiskError::from_io(rel, err)),
            }
        }
    }

    fn is_symlink(&self, name: &str) -> bool {
        matches!(self.stat(name), Ok(Some(st)) if st.st_mode & libc::S_IFMT == libc::S_IFLNK)
    }

    /// (st_dev, st_ino) of the directory: which directory it is, however
    /// it was reached.
    pub(crate) fn identity(&self) -> io::Result<(u64, u64)> {
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd and out pointer.
        cvt(unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) })?;
        Ok((st.st_dev, st.st_ino))
    }

    /// st_dev of the directory: the device its files land on.
    pub(crate) fn dev(&self) -> io::Result<u64> {
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd and out pointer.
        cvt(unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) })?;
        Ok(st.st_dev)
    }

    /// lstat of `name` in this directory; `None` if it does not exist.
    pub(crate) fn stat(&self, name: &str) -> io::Result<Option<libc::stat>> {
        let c = cstr(name)?;
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid dirfd, name and out pointer.
        let r = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOENT) {
                return Ok(None);
            }
            return Err(e);
        }
        Ok(Some(st))
    }

    /// Open `name` with `flags | O_NOFOLLOW | O_CLOEXEC` (and `mode` when
    /// creating).
    pub(crate) fn open_file(&self, name: &str, flags: libc::c_int, mode: u32) -> io::Result<File> {
        let c = cstr(name)?;
        let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: valid dirfd and name.
        let r = cvt(unsafe {
            libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint)
        })?;
        // SAFETY: r is a fresh descriptor we own.
        Ok(unsafe { File::from_raw_fd(r) })
    }

    pub(crate) fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (a, b) = (cstr(from)?, cstr(to)?);
        // SAFETY: valid dirfds and names.
        cvt(unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                a.as_ptr(),
                self.fd.as_raw_fd(),
                b.as_ptr(),
            )
        })?;
        Ok(())
    }

    /// Remove file `name`; a missing file is not an error.
    pub(crate) fn unlink(&self, name: &str) -> io::Result<()> {
        let c = cstr(name)?;
        // SAFETY: valid dirfd and name.
        let r = unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Set mode and mtime of the directory itself.
    pub(crate) fn set_meta(&self, mode: u32, mtime: (i64, u32)) -> io::Result<()> {
        // SAFETY: valid fd.
        cvt(unsafe { libc::fchmod(self.fd.as_raw_fd(), mode as libc::mode_t) })?;
        set_mtime_fd(self.fd.as_raw_fd(), mtime)
    }
}

/// futimens with atime = mtime = `mtime` (seconds, nanoseconds).
pub(crate) fn set_mtime_fd(fd: libc::c_int, mtime: (i64, u32)) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: mtime.0 as libc::time_t,
        tv_nsec: mtime.1 as libc::c_long,
    };
    let times = [ts, ts];
    // SAFETY: valid fd and a two-element timespec array.
    cvt(unsafe { libc::futimens(fd, times.as_ptr()) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(r: Result<Vec<&str>>) -> bool {
        matches!(r, Err(DiskError::Refused { .. }))
    }

    #[test]
    fn wire_paths_that_escape_are_refused() {
        assert!(refused(components("../etc/passwd")));
        assert!(refused(components("a/../../b")));
        assert!(refused(components("a/..")));
        assert!(refused(components("/etc/passwd")));
        assert!(refused(components("a\0b")));
        assert!(refused(components("")));
        assert!(refused(components("a//b")));
        assert!(refused(components("./a")));
        assert_eq!(
            components("a/b c/ü.txt").unwrap(),
            vec!["a", "b c", "ü.txt"]
        );
        assert_eq!(components("..foo").unwrap(), vec!["..foo"]);
        assert!(
            validate_dest("").is_ok()
                && validate_dest(".").is_ok()
                && validate_dest("x/y/").is_ok()
        );
        assert!(validate_dest("../x").is_err());
        assert_eq!(join("d/", "a"), "d/a");
        assert_eq!(join("", "a"), "a");
    }

    #[test]
    fn symlink_inside_root_is_not_followed() {
        let base = std::env::temp_dir().join(format!("lh-sp-{}", std::process::id()));
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), root.join("filelink")).unwrap();
        let r = Root::open(&root).unwrap();
        let err = r
            .open_dir(&["link", "sub"], true, "link/sub/x")
            .err()
            .unwrap();
        assert!(matches!(err, DiskError::Refused { .. }), "{err}");
        // A symlink as the final file component is not opened through.
        let d = r.open_dir(&[], true, "x").unwrap();
        assert!(d
            .open_file("filelink", libc::O_WRONLY | libc::O_CREAT, 0o600)
            .is_err());
        // Normal nested creation works.
        let d = r.open_dir(&["a", "b"], true, "a/b/x").unwrap();
        d.open_file("x", libc::O_WRONLY | libc::O_CREAT, 0o600)
            .unwrap();
        assert!(root.join("a/b/x").exists());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
