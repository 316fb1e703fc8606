//! Partial files and what the receiver already has.
//!
//! A file `NAME` is written as `.NAME.longhaul-part` in its destination
//! directory, next to a small JSON sidecar `.NAME.longhaul-state` that
//! records the source's size and mtime and the verified offset (the prefix
//! whose chunks were written and hashed). Only a verified file is renamed to
//! `NAME` and its sidecar removed. On a re-run, [`what_we_have`] answers per
//! manifest entry: complete (the final file has the same size and mtime, the
//! quick check rsync uses too), partial from a verified offset (the sidecar
//! matches the source), or nothing. The resumed prefix is re-read and
//! re-hashed on both ends, so the final checksum still covers every byte.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use std::os::fd::AsRawFd;

use super::checksum::{chunk_count, hash_prefix, FileDigest};
use super::safepath::Dir;
use super::wire::ManifestEntry;
use super::CHUNK_SIZE;

const PART_SUFFIX: &str = ".longhaul-part";
const STATE_SUFFIX: &str = ".longhaul-state";
/// NAME_MAX of Linux file systems.
const NAME_MAX: usize = 255;
/// Largest sidecar we read; real ones are ~100 bytes.
const MAX_STATE_BYTES: u64 = 4096;

fn hidden(name: &str, suffix: &str) -> String {
    // Room for the longest suffix plus ".tmp" and the leading dot.
    if name.len() + 1 + STATE_SUFFIX.len() + 4 <= NAME_MAX {
        format!(".{name}{suffix}")
    } else {
        format!(".longhaul-{:016x}{suffix}", xxh3_64(name.as_bytes()))
    }
}

/// Whether `name` is one that [`part_name`], [`state_name`] or a sidecar's
/// temporary copy can produce. The receiver refuses such names in a
/// manifest (a file named like another's temporary file would be
/// truncated, renamed or deleted by that file's writer), and the walk skips
/// them: they are what an unfinished transfer left behind.
pub(crate) fn is_internal(name: &str) -> bool {
    name.starts_with('.')
        && [PART_SUFFIX, STATE_SUFFIX].iter().any(|suffix| {
            name.ends_with(suffix)
                || name
                    .strip_suffix(".tmp")
                    .is_some_and(|n| n.ends_with(suffix))
        })
}

/// Temporary name of `name` while it is being written.
pub(crate) fn part_name(name: &str) -> String {
    hidden(name, PART_SUFFIX)
}

/// Name of the resume sidecar of `name`.
pub(crate) fn state_name(name: &str) -> String {
    hidden(name, STATE_SUFFIX)
}

/// Contents of the sidecar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PartState {
    pub(crate) size: u64,
    pub(crate) mtime_sec: i64,
    pub(crate) mtime_nsec: u32,
    pub(crate) chunk_size: u64,
    /// Bytes from the start that were written and hashed.
    pub(crate) verified: u64,
}

impl PartState {
    pub(crate) fn for_entry(e: &ManifestEntry, verified: u64) -> Self {
        PartState {
            size: e.size,
            mtime_sec: e.mtime_sec,
            mtime_nsec: e.mtime_nsec,
            chunk_size: CHUNK_SIZE,
            verified,
        }
    }

    fn matches(&self, e: &ManifestEntry) -> bool {
        self.size == e.size
            && self.mtime_sec == e.mtime_sec
            && self.mtime_nsec == e.mtime_nsec
            && self.chunk_size == CHUNK_SIZE
            && self.verified <= e.size
            && (self.verified.is_multiple_of(CHUNK_SIZE) || self.verified == e.size)
    }
}

/// The temporary name a sidecar is written under before its rename.
fn state_tmp_name(name: &str) -> String {
    format!("{}.tmp", state_name(name))
}

/// Write the sidecar of `name` atomically (temp + rename).
pub(crate) fn save_state(dir: &Dir, name: &str, st: &PartState) -> io::Result<()> {
    let tmp = state_tmp_name(name);
    let mut f = dir.open_file(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o600)?;
    f.write_all(
        serde_json::to_string(st)
            .map_err(io::Error::other)?
            .as_bytes(),
    )?;
    drop(f);
    dir.rename(&tmp, &state_name(name))
}

/// The sidecar of `name`, if there is a readable one.
pub(crate) fn load_state(dir: &Dir, name: &str) -> Option<PartState> {
    let f = dir.open_file(&state_name(name), libc::O_RDONLY, 0).ok()?;
    let mut text = String::new();
    f.take(MAX_STATE_BYTES).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// Remove the sidecar of `name`, and the half-written one a run killed in
/// the middle of a save leaves behind.
pub(crate) fn remove_state(dir: &Dir, name: &str) -> io::Result<()> {
    dir.unlink(&state_tmp_name(name))?;
    dir.unlink(&state_name(name))
}

/// Remove the temporary file and sidecar of `name`.
pub(crate) fn discard(dir: &Dir, name: &str) -> io::Result<()> {
    dir.unlink(&part_name(name))?;
    remove_state(dir, name)
}

/// What the receiver has of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Have {
    /// The final file is there: same size and mtime, or, when the sender
    /// sent a checksum (`--checksum`), same size and content.
    Complete {
        by_checksum: bool,
    },
    /// A partial file verified up to this offset.
    Partial(u64),
    Nothing,
}

/// Decide what `dir/name` already holds of `entry`. With a checksum in
/// the entry (`--checksum`) a final file of the right size is read and
/// hashed, and skipped only if it hashes the same; its mode and mtime are
/// then set to the sender's, so the next quick check agrees.
pub(crate) fn what_we_have(dir: &Dir, name: &str, entry: &ManifestEntry) -> io::Result<Have> {
    if let Some(st) = dir.stat(name)? {
        let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
        let same_size = regular && st.st_size as u64 == entry.size;
        match entry.checksum {
            Some(want) if same_size => {
                let file = dir.open_file(name, libc::O_RDONLY, 0)?;
                if content_checksum(&file, entry.size)? == want {
                    // SAFETY: valid descriptor.
                    if unsafe { libc::fchmod(file.as_raw_fd(), entry.mode as libc::mode_t) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    super::safepath::set_mtime_fd(
                        file.as_raw_fd(),
                        (entry.mtime_sec, entry.mtime_nsec),
                    )?;
                    return Ok(Have::Complete { by_checksum: true });
                }
            }
            None if same_size
                && st.st_mtime == entry.mtime_sec
                && st.st_mtime_nsec as u32 == entry.mtime_nsec =>
            {
                return Ok(Have::Complete { by_checksum: false });
            }
            _ => {}
        }
    }
    let Some(state) = load_state(dir, name) else {
        return Ok(Have::Nothing);
    };
    match dir.stat(&part_name(name))? {
        Some(st)
            if st.st_mode & libc::S_IFMT == libc::S_IFREG
                && state.matches(entry)
                && st.st_size as u64 >= state.verified =>
        {
            // Whole chunks only: the receiver re-reads a resumed prefix
            // chunk by chunk, and a short last chunk (verified == size) would
            // otherwise count as verified on the sidecar's word alone.
            let whole = state.verified - state.verified % CHUNK_SIZE;
            Ok(if whole > 0 {
                Have::Partial(whole)
            } else {
                Have::Nothing
            })
        }
        _ => Ok(Have::Nothing),
    }
}

/// The file checksum ([`super::checksum`]) of a `size`-byte file's
/// content, holes hashed without reading them.
pub(crate) fn content_checksum(file: &std::fs::File, size: u64) -> io::Result<u64> {
    let mut buf = vec![0u8; CHUNK_SIZE as usize];
    let mut digest = FileDigest::default();
    hash_prefix(file, size, chunk_count(size), true, &mut buf, &mut digest)?;
    Ok(digest.finish())
}

#[cfg(test)]
mod tests {
    use super::super::safepath::Root;
    use super::*;

    #[test]
    fn every_name_longhaul_writes_on_the_side_is_internal_and_no_other() {
        let long = "x".repeat(250);
        for name in ["f", "big.bin", ".hidden", long.as_str()] {
            for own in [part_name(name), state_name(name), state_tmp_name(name)] {
                assert!(is_internal(&own), "{own}");
            }
            assert!(!is_internal(name), "{name}");
        }
        for other in [
            "f.longhaul-part",
            ".f.longhaul-partial",
            ".f.longhaul-state.bak",
            ".f.tmp",
            "longhaul-state",
        ] {
            assert!(!is_internal(other), "{other}");
        }
    }

    fn entry(size: u64) -> ManifestEntry {
        ManifestEntry {
            id: 0,
            path: "f".into(),
            dir: false,
            size,
            mode: 0o644,
            mtime_sec: 1_700_000_000,
            mtime_nsec: 5,
            sparse: false,
            device: "x".into(),
            checksum: None,
        }
    }

    #[test]
    fn names_stay_within_name_max() {
        assert_eq!(part_name("a.txt"), ".a.txt.longhaul-part");
        let long = "x".repeat(250);
        assert!(part_name(&long).len() <= NAME_MAX);
        assert!(format!("{}.tmp", state_name(&long)).len() <= NAME_MAX);
    }

    #[test]
    fn sidecar_decides_resume_and_final_file_decides_skip() {
        let base = std::env::temp_dir().join(format!("lh-part-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let root = Root::open(&base).unwrap();
        let dir = root.open_dir(&[], false, "").unwrap();
        let e = entry(3 * CHUNK_SIZE);
        assert_eq!(what_we_have(&dir, "f", &e).unwrap(), Have::Nothing);
        let part = dir
            .open_file(&part_name("f"), libc::O_WRONLY | libc::O_CREAT, 0o600)
            .unwrap();
        part.set_len(e.size).unwrap();
        save_state(&dir, "f", &PartState::for_entry(&e, CHUNK_SIZE)).unwrap();
        assert_eq!(
            what_we_have(&dir, "f", &e).unwrap(),
            Have::Partial(CHUNK_SIZE)
        );
        // A changed source invalidates the partial file.
        let mut changed = e.clone();
        changed.mtime_sec += 1;
        assert_eq!(what_we_have(&dir, "f", &changed).unwrap(), Have::Nothing);
        // A final file with the same size and mtime is complete.
        let f = dir
            .open_file("f", libc::O_WRONLY | libc::O_CREAT, 0o644)
            .unwrap();
        f.set_len(e.size).unwrap();
        super::super::safepath::set_mtime_fd(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            (e.mtime_sec, e.mtime_nsec),
        )
        .unwrap();
        assert_eq!(
            what_we_have(&dir, "f", &e).unwrap(),
            Have::Complete { by_checksum: false }
        );
        // With a checksum, size and mtime are not enough: the content decides.
        let mut with_sum = e.clone();
        with_sum.checksum = Some(super::super::checksum::checksum_bytes(&vec![
            1u8;
            e.size as usize
        ]));
        // (The partial file beside it still resumes.)
        assert_eq!(
            what_we_have(&dir, "f", &with_sum).unwrap(),
            Have::Partial(CHUNK_SIZE)
        );
        with_sum.checksum = Some(super::super::checksum::checksum_bytes(&vec![
            0u8;
            e.size as usize
        ]));
        assert_eq!(
            what_we_have(&dir, "f", &with_sum).unwrap(),
            Have::Complete { by_checksum: true }
        );
        // A run killed while it saved the sidecar left its temporary file.
        std::fs::write(base.join(state_tmp_name("f")), b"{").unwrap();
        discard(&dir, "f").unwrap();
        assert!(!base.join(part_name("f")).exists());
        assert!(!base.join(state_name("f")).exists());
        assert!(!base.join(state_tmp_name("f")).exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
