//! The files a writer works on: their descriptors, the part files and
//! their sidecars, the finisher thread that saves, verifies and renames.

use super::*;

/// The descriptors of a file being written: closed while the file waits
/// for its next frame if its writer needs the room ([`MAX_OPEN_FILES`]).
pub(super) struct Handles {
    pub(super) dir: Arc<Dir>,
    pub(super) file: Arc<File>,
    pub(super) direct: Option<Arc<File>>,
}

/// A file being written by a worker.
pub(super) struct Open {
    pub(super) name: String,
    /// `None` while closed for room.
    pub(super) fds: Option<Handles>,
    /// The temporary file as it was when closed for room (inode, ctime;
    /// set by [`release`]): a reopened one must be the same file,
    /// unchanged since.
    pub(super) seen: (u64, i64, i64),
    pub(super) digest: OrderedDigest,
    /// Its digest's parked blocks, as counted into [`Shared::parked`].
    pub(super) parked: usize,
    pub(super) end: Option<u64>,
    pub(super) saved: u64,
    /// Chunks with writes in flight: only a file without any is closed
    /// for room.
    pub(super) writing: Vec<u64>,
    /// Its stamp in its worker's least-recently-used order.
    pub(super) used: u64,
}

impl Open {
    /// After its digest took a chunk or a hole: count the change in its
    /// parked blocks into the session's.
    pub(super) fn count_parked(&mut self, total: &AtomicUsize) {
        let now = self.digest.parked();
        if now > self.parked {
            total.fetch_add(now - self.parked, Ordering::Relaxed);
        } else {
            total.fetch_sub(self.parked - now, Ordering::Relaxed);
        }
        self.parked = now;
    }

    /// Its descriptors, which every caller holds by [`Worker::ensure_open`]
    /// or by a write in flight.
    pub(super) fn fds(&self) -> &Handles {
        self.fds
            .as_ref()
            .expect("a file in use holds its descriptors")
    }
}

/// What a writer worker hands its finisher: everything that touches a
/// file's metadata rather than its data (sidecar saves, the verify + sync +
/// rename of a complete file). These are journal
/// round trips (a rename or fdatasync costs milliseconds); done on the
/// writer thread they would leave the device idle between data writes.
/// One finisher per writer, fed in order, so a file's sidecar saves and
/// its completion happen in the order the writer decided them.
pub(super) enum Finish {
    /// Save the sidecar of `name` in `dir`.
    Save {
        dir: Arc<Dir>,
        name: String,
        state: PartState,
    },
    /// Every chunk is in and the sender's checksum arrived: verify, sync,
    /// rename into place (or fail naming the file).
    Complete { id: u32, open: Box<Open> },
}

/// The bytes of a file resumed from `from` that the sender does not send
/// again: it starts at the chunk `from` falls in.
pub(super) fn resumed_prefix(from: u64, size: u64) -> u64 {
    (from / CHUNK_SIZE * CHUNK_SIZE).min(size)
}

pub(super) fn finisher(rx: Receiver<Finish>, sh: Arc<Shared>) {
    for f in rx {
        match f {
            Finish::Save { dir, name, state } => {
                let _ = partial::save_state(&dir, &name, &state);
            }
            Finish::Complete { id, mut open } => {
                let x = sh.files[id as usize]
                    .as_ref()
                    .expect("the intake checked the id");
                match complete(x, &mut open) {
                    Ok(()) => {
                        let mut t = lock(&sh.totals);
                        t.files += 1;
                        t.file_bytes += x.entry.size;
                        t.resumed_bytes += resumed_prefix(x.from, x.entry.size);
                        t.done[id as usize] = true;
                    }
                    Err(e) => {
                        let dir = &open.fds().dir;
                        if matches!(e, DiskError::ChecksumMismatch { .. }) {
                            let _ = partial::discard(dir, &open.name);
                        } else {
                            let _ = partial::save_state(
                                dir,
                                &open.name,
                                &PartState::for_entry(&x.entry, open.digest.verified_offset()),
                            );
                        }
                        fail(&sh, x, e.code(), e.to_string());
                    }
                }
            }
        }
    }
}

pub(super) fn fail(sh: &Shared, x: &Expect, code: &str, error: String) {
    lock(&sh.totals).failures.push(FileFailure {
        id: x.entry.id,
        path: x.path.clone(),
        code: code.to_string(),
        error,
    });
}

/// Save the sidecar of `o` (by its finisher, in order); a file closed for
/// room has its directory opened again for it.
pub(super) fn save(sh: &Shared, fin: &SyncSender<Finish>, o: &Open, x: &Expect) {
    let dir = match &o.fds {
        Some(fds) => fds.dir.clone(),
        None => match sh.root.parent_of(&x.path, false) {
            Ok((d, _)) => Arc::new(d),
            Err(_) => return,
        },
    };
    let _ = fin.send(Finish::Save {
        dir,
        name: o.name.clone(),
        state: PartState::for_entry(&x.entry, o.digest.verified_offset()),
    });
}

/// Closes the descriptors of `o` for room, noting what its temporary file
/// looks like so that [`reopen`] can tell it was changed meanwhile.
pub(super) fn release(sh: &Shared, o: &mut Open) {
    let Some(Handles { dir, file, direct }) = o.fds.take() else {
        return;
    };
    sh.open_files.fetch_sub(1, Ordering::Relaxed);
    // Closed first, looked at after: whatever the kernel does at the last
    // close (IMA, for one, may rewrite an xattr, which moves the ctime) is
    // in what is noted.
    let ino = file.metadata().map(|m| m.ino()).ok();
    drop((file, direct));
    o.seen = match dir.stat(&partial::part_name(&o.name)) {
        Ok(Some(st)) if Some(st.st_ino) == ino => (st.st_ino, st.st_ctime, st.st_ctime_nsec),
        // Gone or replaced already: no reopen will match.
        _ => (0, 0, 0),
    };
}

/// Takes the exclusive lock on a temporary file: one writer per file across
/// processes too (the claims cover one server's sessions; two `get`s into
/// one --dest are two processes). The lock lives with the descriptor, past
/// the final rename.
pub(super) fn lock_part(file: &File, x: &Expect) -> Result<(), DiskError> {
    // SAFETY: flock on a descriptor we own; no memory involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        DiskError::InUse {
            path: x.path.clone(),
            by: "another process holds its temporary file".into(),
        }
    } else {
        DiskError::from_io(x.path.clone(), e)
    })
}

/// Opens again the temporary file of a file closed for room: the same file
/// (inode) and unchanged (ctime) since, else the chunks this session wrote
/// into it may not be there and its digest would vouch for other bytes.
pub(super) fn reopen(sh: &Shared, x: &Expect, seen: (u64, i64, i64)) -> Result<Handles, DiskError> {
    let io = |e: io::Error| DiskError::from_io(x.path.clone(), e);
    let changed = || DiskError::Io {
        path: x.path.clone(),
        source: io::Error::other(
            "its temporary file was replaced or changed by someone else while this session \
             had it closed (partial data kept)",
        ),
    };
    let (dir, name) = sh.root.parent_of(&x.path, false)?;
    let part = partial::part_name(name);
    let file = match dir.open_file(&part, libc::O_RDWR, 0) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(changed()),
        Err(e) => return Err(io(e)),
    };
    lock_part(&file, x)?;
    let m = file.metadata().map_err(io)?;
    if (m.ino(), m.ctime(), m.ctime_nsec()) != seen {
        return Err(changed());
    }
    let direct = if sh.direct {
        open_direct(&dir, &part)
    } else {
        None
    };
    Ok(Handles {
        dir: Arc::new(dir),
        file: Arc::new(file),
        direct: direct.map(Arc::new),
    })
}

/// Warn once per process that O_DIRECT was refused.
pub(super) static DIRECT_WARNED: AtomicBool = AtomicBool::new(false);

pub(super) fn open_part(sh: &Shared, x: &Expect) -> Result<Open, DiskError> {
    let io = |e: io::Error| DiskError::from_io(x.path.clone(), e);
    let (dir, name) = sh.root.parent_of(&x.path, true)?;
    let part = partial::part_name(name);
    let size = x.entry.size;
    let file = dir
        .open_file(&part, libc::O_RDWR | libc::O_CREAT, 0o600)
        .map_err(io)?;
    lock_part(&file, x)?;
    let mut digest = OrderedDigest::new(size);
    if x.from == 0 {
        file.set_len(0).map_err(io)?;
        if x.entry.sparse {
            file.set_len(size).map_err(io)?;
        } else {
            if let Err(e) = preallocate(&file, size) {
                // Nothing was written: leave no empty temporary behind.
                let _ = dir.unlink(&part);
                return Err(io(e));
            }
        }
    } else {
        file.set_len(size).map_err(io)?;
        let Some(mut buf) = sh.pool.get() else {
            return Err(DiskError::Io {
                path: x.path.clone(),
                source: io::Error::other("receiver shutting down"),
            });
        };
        let mut d = FileDigest::default();
        let chunks = (x.from / CHUNK_SIZE).min(chunk_count(size));
        let r = hash_prefix(&file, size, chunks, true, buf.as_mut_full(), &mut d);
        sh.pool.put(buf);
        r.map_err(io)?;
        digest = OrderedDigest::resume(size, chunks, d);
    }
    let direct = if sh.direct {
        open_direct(&dir, &part)
    } else {
        None
    };
    Ok(Open {
        name: name.to_string(),
        fds: Some(Handles {
            dir: Arc::new(dir),
            file: Arc::new(file),
            direct: direct.map(Arc::new),
        }),
        seen: (0, 0, 0),
        digest,
        parked: 0,
        end: None,
        saved: x.from,
        writing: Vec::new(),
        used: 0,
    })
}

pub(super) fn open_direct(dir: &Dir, part: &str) -> Option<File> {
    match dir.open_file(part, libc::O_WRONLY | libc::O_DIRECT, 0) {
        Ok(f) => Some(f),
        Err(e) => {
            if !DIRECT_WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "longhaul: warning: O_DIRECT refused for writing ({e}); using buffered IO"
                );
            }
            None
        }
    }
}

/// fallocate the whole file; file systems without it just get the size.
pub(super) fn preallocate(file: &File, size: u64) -> io::Result<()> {
    if size == 0 {
        return Ok(());
    }
    // SAFETY: valid descriptor, no memory passed.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => file.set_len(size),
        _ => Err(e),
    }
}

pub(super) fn complete(x: &Expect, o: &mut Open) -> Result<(), DiskError> {
    let fds = o.fds();
    let io = |e: io::Error| DiskError::from_io(x.path.clone(), e);
    if Some(o.digest.finish()) != o.end {
        return Err(DiskError::ChecksumMismatch {
            path: x.path.clone(),
        });
    }
    // SAFETY: valid descriptor.
    if unsafe { libc::fchmod(fds.file.as_raw_fd(), x.entry.mode as libc::mode_t) } != 0 {
        return Err(io(io::Error::last_os_error()));
    }
    safepath::set_mtime_fd(
        fds.file.as_raw_fd(),
        (x.entry.mtime_sec, x.entry.mtime_nsec),
    )
    .map_err(io)?;
    // A file under its final name must be on disk: after a power loss a
    // re-run trusts it by size and mtime. (Partial files need no sync: their
    // prefix is re-hashed against the source when resumed.)
    fds.file.sync_data().map_err(io)?;
    fds.dir
        .rename(&partial::part_name(&o.name), &o.name)
        .map_err(io)?;
    partial::remove_state(&fds.dir, &o.name).map_err(io)?;
    Ok(())
}
