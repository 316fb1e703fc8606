//! The sender's tree walk: `PATH...` arguments into a list of entries.
//!
//! Each argument contributes its last component and everything below it
//! (`send /data/run7 --dest in` lands as `in/run7/...`), like `cp -r` and
//! rsync without a trailing slash. Directories come before their contents,
//! children in name order, so the receiver can create parents first and the
//! manifest is deterministic. Empty files and empty directories are entries
//! like any other. Symlinks are skipped with a warning unless
//! `follow_symlinks` (then the target is sent, with loop detection); FIFOs,
//! sockets and device nodes are skipped with a warning.
//!
//! Directories are listed through descriptors: each is opened from its
//! parent's with `openat`, so what is listed is what was opened, whatever is
//! renamed meanwhile. [`walk_beneath`] walks the server's tree for a pull:
//! no symlink is followed anywhere, and its entries' [`SourcePath`]s are
//! opened again beneath the root, component by component.

use std::collections::HashSet;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::safepath::{self, Root};
use super::{DiskError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
}

/// Where a sender reads an entry from.
#[derive(Debug, Clone)]
pub(crate) enum SourcePath {
    /// A path on this host: the client's own `PATH...` arguments.
    Local(PathBuf),
    /// A path beneath the server's `--root` (a pull). It is opened one
    /// component at a time from the root's descriptor without following a
    /// symlink, so a directory of the served tree swapped for a symlink
    /// after the walk cannot make the server read outside the root.
    Beneath { root: Arc<Root>, rel: String },
}

impl SourcePath {
    /// The path, for messages.
    pub(crate) fn display(&self) -> String {
        match self {
            SourcePath::Local(p) => p.display().to_string(),
            SourcePath::Beneath { root, rel } => root.path().join(rel).display().to_string(),
        }
    }

    /// Open for reading with `flags` (O_DIRECT, say) added to O_RDONLY.
    /// A local path follows a symlink in its last component only with
    /// `follow`; a path beneath the root follows none anywhere. Only a
    /// regular file opens: the open does not block (O_NONBLOCK, cleared
    /// again before it is read) so a FIFO put in a listed file's place is
    /// refused at once instead of holding a reader until someone writes.
    pub(crate) fn open(&self, flags: libc::c_int, follow: bool) -> io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        let flags = flags | libc::O_NONBLOCK;
        let file = match self {
            SourcePath::Local(p) => {
                let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(flags | nofollow)
                    .open(p)?
            }
            SourcePath::Beneath { root, rel } => root.open_beneath(rel, libc::O_RDONLY | flags)?,
        };
        if !file.metadata()?.is_file() {
            return Err(io::Error::other(format!(
                "{}: no longer a regular file",
                self.display()
            )));
        }
        // Blocking again: io_uring answers EAGAIN for a non-blocking file
        // instead of waiting for the disk.
        // SAFETY: fcntl on a descriptor we own.
        let fl = cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) })?;
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK) })?;
        Ok(file)
    }

    /// Whether it is still there (a local path through a final symlink
    /// with `follow`, as [`SourcePath::open`] went).
    pub(crate) fn exists(&self, follow: bool) -> bool {
        match self {
            SourcePath::Local(p) if follow => p.exists(),
            SourcePath::Local(p) => p.symlink_metadata().is_ok(),
            SourcePath::Beneath { root, rel } => root.exists_beneath(rel),
        }
    }
}

/// One file or directory to send.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Path relative to the destination, '/'-separated, valid UTF-8.
    pub(crate) rel: String,
    /// Where to read it on this host.
    pub(crate) src: SourcePath,
    pub(crate) kind: Kind,
    pub(crate) size: u64,
    /// Permission bits (07777).
    pub(crate) mode: u32,
    /// (seconds, nanoseconds) since the epoch.
    pub(crate) mtime: (i64, u32),
    /// st_dev of the file, for device grouping.
    pub(crate) dev: u64,
    /// st_ino of the file: with `dev`, which file the walk saw, so a reader
    /// notices a file replaced under the same name.
    pub(crate) ino: u64,
    /// Fewer blocks allocated than the size needs: worth seeking for holes.
    pub(crate) sparse: bool,
}

/// The walk's result: entries in send order, plus warnings for what was
/// skipped.
#[derive(Debug, Default)]
pub(crate) struct Walk {
    pub(crate) entries: Vec<Entry>,
    pub(crate) warnings: Vec<String>,
}

fn io_err(path: impl std::fmt::Display, e: io::Error) -> DiskError {
    DiskError::from_io(path.to_string(), e)
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn kind_of(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

fn entry(rel: String, src: SourcePath, st: &libc::stat, kind: Kind) -> Entry {
    let size = if kind == Kind::File {
        st.st_size as u64
    } else {
        0
    };
    Entry {
        rel,
        src,
        kind,
        size,
        mode: st.st_mode & 0o7777,
        mtime: (st.st_mtime, st.st_mtime_nsec as u32),
        dev: st.st_dev,
        ino: st.st_ino,
        sparse: kind == Kind::File && (st.st_blocks as u64).saturating_mul(512) < size,
    }
}

fn utf8_name(path: impl std::fmt::Display, name: &OsStr) -> Result<String> {
    name.to_str()
        .map(str::to_string)
        .ok_or_else(|| DiskError::Refused {
            path: path.to_string(),
            reason: "file name is not valid UTF-8".into(),
        })
}

/// stat of `name` in the directory `dir` (or of the path `name` itself
/// with `dir` None), following a final symlink only with `follow`.
fn stat_at(dir: Option<&OwnedFd>, name: &CStr, follow: bool) -> io::Result<libc::stat> {
    let fd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid dirfd (or AT_FDCWD), NUL-terminated name, out pointer.
    cvt(unsafe { libc::fstatat(fd, name.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// Open the directory at `path`, not through a final symlink unless
/// `follow`.
fn open_dir_path(path: &CStr, follow: bool) -> io::Result<OwnedFd> {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | nofollow;
    // SAFETY: NUL-terminated path.
    let r = cvt(unsafe { libc::open(path.as_ptr(), flags) })?;
    // SAFETY: r is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// The names in an open directory, without `.` and `..`.
fn names_in(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    // fdopendir takes the descriptor over: give it a duplicate.
    // SAFETY: valid fd.
    let dup = cvt(unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: dup is a fresh descriptor of a directory.
    let dp = unsafe { libc::fdopendir(dup) };
    if dp.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: dup is ours and was not taken over.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local; readdir reports errors only there.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: dp is an open directory stream.
        let ent = unsafe { libc::readdir64(dp) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break if e.raw_os_error() == Some(0) {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name.to_vec()));
        }
    };
    // SAFETY: dp is open; closedir closes dup with it.
    unsafe { libc::closedir(dp) };
    result.map(|()| names)
}

/// One thing found and not yet listed: where it is and what it was.
struct Node {
    /// Path in the manifest.
    rel: String,
    src: SourcePath,
    st: libc::stat,
}

impl SourcePath {
    /// Open it as a directory: a local path through a final symlink only
    /// with `follow`; beneath the root through none.
    fn open_dir(&self, follow: bool) -> Result<OwnedFd> {
        match self {
            SourcePath::Local(p) => {
                let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| DiskError::Refused {
                    path: p.display().to_string(),
                    reason: "NUL byte in path".into(),
                })?;
                open_dir_path(&c, follow).map_err(|e| io_err(p.display(), e))
            }
            SourcePath::Beneath { root, rel } => {
                let comps = safepath::components(rel)?;
                Ok(root.open_dir(&comps, false, rel)?.into_fd())
            }
        }
    }

    /// The entry `name` inside this directory.
    fn child(&self, name: &str) -> SourcePath {
        match self {
            SourcePath::Local(p) => SourcePath::Local(p.join(name)),
            SourcePath::Beneath { root, rel } => SourcePath::Beneath {
                root: root.clone(),
                rel: format!("{rel}/{name}"),
            },
        }
    }
}

/// Walk `paths` (the client's own) into a manifest.
pub(crate) fn walk(paths: &[PathBuf], follow_symlinks: bool) -> Result<Walk> {
    let mut tops = Vec::with_capacity(paths.len());
    for p in paths {
        let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| DiskError::Refused {
            path: p.display().to_string(),
            reason: "NUL byte in path".into(),
        })?;
        let st = stat_at(None, &c, follow_symlinks).map_err(|e| io_err(p.display(), e))?;
        let name = match p.file_name() {
            Some(n) => n.to_os_string(),
            None => std::fs::canonicalize(p)
                .map_err(|e| io_err(p.display(), e))?
                .file_name()
                .map(|n| n.to_os_string())
                .ok_or_else(|| DiskError::Refused {
                    path: p.display().to_string(),
                    reason: "cannot send '/'".into(),
                })?,
        };
        tops.push(Node {
            rel: utf8_name(p.display(), &name)?,
            src: SourcePath::Local(p.clone()),
            st,
        });
    }
    walk_nodes(tops, follow_symlinks)
}

/// Walk the paths a client asked a server for, beneath its `--root`. A
/// path that leaves the root (absolute, `..`, a symlink anywhere on the
/// way, the last component included) is refused; a missing one is an
/// error naming it. Below them symlinks are skipped with a warning, and
/// every directory is opened from the root's descriptor one component at a
/// time without following one, so no listing and no read leaves the root,
/// whatever is renamed or replaced in the tree meanwhile.
pub(crate) fn walk_beneath(root: &Path, rels: &[String]) -> Result<Walk> {
    let base = Arc::new(Root::open(root)?);
    let mut tops = Vec::with_capacity(rels.len());
    for rel in rels {
        let (dir, name) = base.parent_of(rel, false)?;
        let st = match dir.stat(name) {
            Ok(Some(st)) if kind_of(&st) == libc::S_IFLNK => {
                return Err(DiskError::Refused {
                    path: rel.escape_debug().to_string(),
                    reason: "a symlink; the server sends nothing through symlinks".into(),
                })
            }
            Ok(Some(st)) => st,
            Ok(None) => {
                return Err(DiskError::from_io(
                    format!("{rel} beneath the server's --root"),
                    io::Error::from_raw_os_error(libc::ENOENT),
                ))
            }
            Err(e) => return Err(DiskError::from_io(rel.as_str(), e)),
        };
        tops.push(Node {
            rel: name.to_string(),
            src: SourcePath::Beneath {
                root: base.clone(),
                rel: rel.clone(),
            },
            st,
        });
    }
    walk_nodes(tops, false)
}

fn walk_nodes(tops: Vec<Node>, follow: bool) -> Result<Walk> {
    let mut out = Walk::default();
    let mut seen_roots = HashSet::new();
    let mut seen_dirs = HashSet::new();
    for top in tops {
        if !seen_roots.insert(top.rel.clone()) {
            return Err(DiskError::Refused {
                path: top.src.display(),
                reason: format!("two arguments both land as '{}'", top.rel),
            });
        }
        // Depth-first with an explicit stack: deep trees cannot overflow
        // it. One directory is open at a time, while it is listed; paths
        // are at most MAX_PATH_BYTES, so a tree nested without end costs
        // neither descriptors nor unbounded memory.
        let mut stack = vec![top];
        while let Some(node) = stack.pop() {
            let shown = node.src.display();
            match kind_of(&node.st) {
                libc::S_IFLNK => out
                    .warnings
                    .push(format!("skipped symlink {shown} (use --follow-symlinks)")),
                libc::S_IFREG => {
                    out.entries
                        .push(entry(node.rel, node.src, &node.st, Kind::File));
                }
                libc::S_IFDIR => {
                    let fd = node.src.open_dir(follow)?;
                    // What was opened, not what was looked at before: the
                    // name may have been given to another directory since.
                    let st = fstat(&fd).map_err(|e| io_err(&shown, e))?;
                    if !seen_dirs.insert((st.st_dev, st.st_ino)) {
                        out.warnings
                            .push(format!("skipped directory loop at {shown}"));
                        continue;
                    }
                    let mut children = Vec::new();
                    for name in names_in(&fd).map_err(|e| io_err(&shown, e))? {
                        let cshown = format!("{shown}/{}", name.to_string_lossy());
                        let cname = utf8_name(&cshown, &name)?;
                        let rel = format!("{}/{cname}", node.rel);
                        if rel.len() > safepath::MAX_PATH_BYTES {
                            return Err(DiskError::Refused {
                                path: cshown,
                                reason: format!(
                                    "its path in the transfer is longer than {} bytes",
                                    safepath::MAX_PATH_BYTES
                                ),
                            });
                        }
                        // Before its metadata: such a file may be renamed away
                        // by the transfer writing it.
                        if super::partial::is_internal(&cname) {
                            out.warnings.push(format!(
                                "skipped {cshown} (a temporary file of an unfinished longhaul transfer)"
                            ));
                            continue;
                        }
                        let c = CString::new(name.into_vec()).expect("names hold no NUL");
                        let cst = match stat_at(Some(&fd), &c, follow) {
                            Ok(m) => m,
                            Err(e) if e.kind() == io::ErrorKind::NotFound && follow => {
                                out.warnings
                                    .push(format!("skipped dangling symlink {cshown}"));
                                continue;
                            }
                            Err(e) => return Err(io_err(&cshown, e)),
                        };
                        children.push(Node {
                            rel,
                            src: node.src.child(&cname),
                            st: cst,
                        });
                    }
                    out.entries.push(entry(node.rel, node.src, &st, Kind::Dir));
                    // Reverse name order on the stack pops in name order.
                    children.sort_by(|a, b| b.rel.cmp(&a.rel));
                    stack.extend(children);
                }
                _ => out.warnings.push(format!("skipped special file {shown}")),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::process::Command;

    #[test]
    fn walks_tree_keeping_empty_things_and_skipping_symlinks() {
        let base = std::env::temp_dir().join(format!("lh-walk-{}", std::process::id()));
        let top = base.join("top");
        fs::create_dir_all(top.join("empty")).unwrap();
        fs::create_dir_all(top.join("a/b/c")).unwrap();
        fs::write(top.join("a/b/c/deep.txt"), b"x").unwrap();
        fs::write(top.join("zero"), b"").unwrap();
        fs::write(top.join("ünï.txt"), b"u").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", top.join("link")).unwrap();
        let w = walk(std::slice::from_ref(&top), false).unwrap();
        let rels: Vec<&str> = w.entries.iter().map(|e| e.rel.as_str()).collect();
        assert_eq!(
            rels,
            [
                "top",
                "top/a",
                "top/a/b",
                "top/a/b/c",
                "top/a/b/c/deep.txt",
                "top/empty",
                "top/zero",
                "top/ünï.txt"
            ]
        );
        assert_eq!(w.warnings.len(), 1, "{:?}", w.warnings);
        let zero = w.entries.iter().find(|e| e.rel == "top/zero").unwrap();
        assert_eq!((zero.kind, zero.size), (Kind::File, 0));
        let followed = walk(std::slice::from_ref(&top), true).unwrap();
        assert!(followed
            .entries
            .iter()
            .any(|e| e.rel == "top/link" && e.kind == Kind::File));
        // A single file lands under its own name.
        let one = walk(&[top.join("zero")], false).unwrap();
        assert_eq!(one.entries[0].rel, "zero");
        assert!(walk(&[top.join("zero"), top.join("a/../zero")], false).is_err());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn walks_beneath_a_root_without_symlinks() {
        let base = std::env::temp_dir().join(format!("lh-walkb-{}", std::process::id()));
        let root = base.join("root");
        fs::create_dir_all(root.join("run/sub")).unwrap();
        fs::create_dir_all(base.join("outside")).unwrap();
        fs::write(base.join("outside/secret"), b"s").unwrap();
        fs::write(root.join("run/sub/f"), b"f").unwrap();
        std::os::unix::fs::symlink(base.join("outside"), root.join("run/out")).unwrap();
        std::os::unix::fs::symlink(base.join("outside"), root.join("up")).unwrap();
        let w = walk_beneath(&root, &["run".to_string()]).unwrap();
        let rels: Vec<&str> = w.entries.iter().map(|e| e.rel.as_str()).collect();
        assert_eq!(rels, ["run", "run/sub", "run/sub/f"]);
        assert_eq!(w.warnings.len(), 1, "{:?}", w.warnings);
        let f = &w.entries[2];
        assert!(
            matches!(&f.src, SourcePath::Beneath { rel, .. } if rel == "run/sub/f"),
            "{:?}",
            f.src
        );
        assert_eq!(
            f.src.display(),
            root.join("run/sub/f").display().to_string()
        );
        let mut file = f.src.open(0, false).unwrap();
        let mut got = String::new();
        std::io::Read::read_to_string(&mut file, &mut got).unwrap();
        assert_eq!(got, "f");
        for (rel, says) in [
            ("up", "a symlink"),
            ("up/secret", "symlink component 'up'"),
            ("../outside", "'..' escapes the root"),
            ("/etc", "absolute path"),
        ] {
            let e = walk_beneath(&root, &[rel.to_string()]).unwrap_err();
            assert!(e.to_string().contains(says), "{rel}: {e}");
        }
        let e = walk_beneath(&root, &["run/none".to_string()]).unwrap_err();
        assert!(
            e.to_string()
                .contains("run/none beneath the server's --root"),
            "{e}"
        );
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_tree_deeper_than_a_path_may_be_is_refused_by_name() {
        let base = std::env::temp_dir().join(format!("lh-walkd-{}", std::process::id()));
        let root = base.join("root");
        fs::create_dir_all(&root).unwrap();
        // 17 levels of 250-byte names: 4,266 bytes, longer than any path
        // a receiver takes; made from descriptors, as no path reaches it.
        let name = "n".repeat(250);
        let nest = |top: &'static str, levels: usize| {
            let mut comps = vec![top];
            comps.extend(std::iter::repeat_n(name.as_str(), levels));
            Root::open(&root)
                .unwrap()
                .open_dir(&comps, true, top)
                .unwrap();
        };
        nest("deep", 17);
        let e = walk_beneath(&root, &["deep".to_string()]).unwrap_err();
        assert!(e.to_string().contains("longer than 4096 bytes"), "{e}");
        // 16 levels, 4,015 bytes: walked.
        nest("fits", 16);
        let w = walk_beneath(&root, &["fits".to_string()]).unwrap();
        assert_eq!(w.entries.len(), 17);
        Command::new("rm").arg("-rf").arg(&base).status().unwrap();
    }
}
