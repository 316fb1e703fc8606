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

use std::collections::HashSet;
use std::fs::{self, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{DiskError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// One file or directory to send.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Path relative to the destination, '/'-separated, valid UTF-8.
    pub rel: String,
    /// Where to read it on this host.
    pub src: PathBuf,
    pub kind: Kind,
    pub size: u64,
    /// Permission bits (07777).
    pub mode: u32,
    /// (seconds, nanoseconds) since the epoch.
    pub mtime: (i64, u32),
    /// st_dev of the file, for device grouping.
    pub dev: u64,
    /// Fewer blocks allocated than the size needs: worth seeking for holes.
    pub sparse: bool,
}

/// The walk's result: entries in send order, plus warnings for what was
/// skipped.
#[derive(Debug, Default)]
pub struct Walk {
    pub entries: Vec<Entry>,
    pub warnings: Vec<String>,
}

impl Walk {
    pub fn files(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.kind == Kind::File)
    }
}

fn io_err(path: &Path, e: std::io::Error) -> DiskError {
    DiskError::from_io(path.display().to_string(), e)
}

fn entry(rel: String, src: PathBuf, md: &Metadata, kind: Kind) -> Entry {
    let size = if kind == Kind::File { md.len() } else { 0 };
    Entry {
        rel,
        src,
        kind,
        size,
        mode: md.mode() & 0o7777,
        mtime: (md.mtime(), md.mtime_nsec() as u32),
        dev: md.dev(),
        sparse: kind == Kind::File && md.blocks().saturating_mul(512) < size,
    }
}

fn utf8_name(path: &Path, name: &std::ffi::OsStr) -> Result<String> {
    name.to_str()
        .map(str::to_string)
        .ok_or_else(|| DiskError::Refused {
            path: path.display().to_string(),
            reason: "file name is not valid UTF-8".into(),
        })
}

/// Walk `paths` into a manifest.
pub fn walk(paths: &[PathBuf], follow_symlinks: bool) -> Result<Walk> {
    let mut out = Walk::default();
    let mut seen_roots = HashSet::new();
    let mut seen_dirs = HashSet::new();
    for p in paths {
        let md = if follow_symlinks {
            fs::metadata(p)
        } else {
            fs::symlink_metadata(p)
        }
        .map_err(|e| io_err(p, e))?;
        let name = match p.file_name() {
            Some(n) => n.to_os_string(),
            None => fs::canonicalize(p)
                .map_err(|e| io_err(p, e))?
                .file_name()
                .map(|n| n.to_os_string())
                .ok_or_else(|| DiskError::Refused {
                    path: p.display().to_string(),
                    reason: "cannot send '/'".into(),
                })?,
        };
        let name = utf8_name(p, &name)?;
        if !seen_roots.insert(name.clone()) {
            return Err(DiskError::Refused {
                path: p.display().to_string(),
                reason: format!("two arguments both land as '{name}'"),
            });
        }
        // Depth-first with an explicit stack: deep trees cannot overflow it.
        let mut stack = vec![(name, p.clone(), md)];
        while let Some((rel, src, md)) = stack.pop() {
            let ft = md.file_type();
            if ft.is_symlink() {
                out.warnings.push(format!(
                    "skipped symlink {} (use --follow-symlinks)",
                    src.display()
                ));
            } else if ft.is_file() {
                out.entries.push(entry(rel, src, &md, Kind::File));
            } else if ft.is_dir() {
                if !seen_dirs.insert((md.dev(), md.ino())) {
                    out.warnings
                        .push(format!("skipped directory loop at {}", src.display()));
                    continue;
                }
                out.entries
                    .push(entry(rel.clone(), src.clone(), &md, Kind::Dir));
                let mut children = Vec::new();
                for de in fs::read_dir(&src).map_err(|e| io_err(&src, e))? {
                    let de = de.map_err(|e| io_err(&src, e))?;
                    let cpath = de.path();
                    let cname = utf8_name(&cpath, &de.file_name())?;
                    // Before its metadata: such a file may be renamed away
                    // by the transfer writing it.
                    if super::partial::is_internal(&cname) {
                        out.warnings.push(format!(
                            "skipped {} (a temporary file of an unfinished longhaul transfer)",
                            cpath.display()
                        ));
                        continue;
                    }
                    let cmd = if follow_symlinks {
                        fs::metadata(&cpath)
                    } else {
                        fs::symlink_metadata(&cpath)
                    };
                    let cmd = match cmd {
                        Ok(m) => m,
                        Err(e) if follow_symlinks && e.kind() == std::io::ErrorKind::NotFound => {
                            out.warnings
                                .push(format!("skipped dangling symlink {}", cpath.display()));
                            continue;
                        }
                        Err(e) => return Err(io_err(&cpath, e)),
                    };
                    children.push((format!("{rel}/{cname}"), cpath, cmd));
                }
                // Reverse name order on the stack pops in name order.
                children.sort_by(|a, b| b.0.cmp(&a.0));
                stack.extend(children);
            } else {
                out.warnings
                    .push(format!("skipped special file {}", src.display()));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
