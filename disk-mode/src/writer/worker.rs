//! A writer worker: takes its queue's work, opens its files, submits their
//! writes, folds their chunk hashes and hands completions to its finisher.

use super::*;

pub(super) fn write_worker(queue: Arc<WorkQueue>, io: IoQueue<WriteTag>, sh: Arc<Shared>) {
    let (fin_tx, fin_rx) = sync_channel::<Finish>(sh.finish_queue);
    let fin = {
        let sh = sh.clone();
        std::thread::Builder::new()
            .name("lh-disk-finish".into())
            .spawn(move || finisher(fin_rx, sh))
            .expect("spawn finisher thread")
    };
    write_loop(&queue, io, &sh, &fin_tx);
    drop(fin_tx);
    let _ = fin.join();
}

/// Writes each writer worker keeps in flight ([`crate::ioqueue`]). A worker owns
/// its files' state while the device always has the next block queued as
/// one completes (and while the worker opens the next file). Blocks of one
/// file land at distinct offsets and the [`OrderedDigest`] takes chunks in
/// any order; a chunk counts as written only once its write returned.
pub(crate) const WRITE_DEPTH: usize = crate::ioqueue::DEPTH;

/// What a write in flight belongs to.
pub(super) struct WriteTag {
    pub(super) file: u32,
    pub(super) offset: u64,
    pub(super) hash: u64,
}

/// The state of one writer worker.
pub(super) struct Worker<'a> {
    pub(super) sh: &'a Arc<Shared>,
    pub(super) fin: &'a SyncSender<Finish>,
    pub(super) open: HashMap<u32, Open>,
    // Files that failed or completed: any later frame for them is dropped
    // (a confused or hostile sender cannot reopen a finished file).
    pub(super) closed: HashSet<u32>,
    /// The files of `open` that hold descriptors, least recently used
    /// first (by [`Open::used`]).
    pub(super) lru: BTreeMap<u64, u32>,
    pub(super) clock: u64,
    pub(super) io: IoQueue<WriteTag>,
}

pub(super) fn write_loop(
    queue: &WorkQueue,
    io: IoQueue<WriteTag>,
    sh: &Arc<Shared>,
    fin: &SyncSender<Finish>,
) {
    let mut w = Worker {
        sh,
        fin,
        open: HashMap::new(),
        closed: HashSet::new(),
        lru: BTreeMap::new(),
        clock: 0,
        io,
    };
    loop {
        while !w.io.full() {
            match queue.pop() {
                Some(work) => w.handle(work),
                None => break,
            }
        }
        if queue.finished() && w.io.in_flight() == 0 {
            break;
        }
        // Until a write completes or a stream queues work (its kick).
        for d in w.io.wait(None) {
            w.written(d);
        }
    }
    // Streams are done: keep what arrived for resume.
    for id in w.open.keys().copied().collect::<Vec<_>>() {
        if let Some(o) = w.close(id) {
            if let Some(x) = sh.files[id as usize].as_ref() {
                save(sh, fin, &o, x);
            }
        }
    }
}

impl Worker<'_> {
    pub(super) fn handle(&mut self, work: Work) {
        let sh = self.sh;
        let id = work.file();
        let x = sh.files[id as usize]
            .as_ref()
            .expect("the intake checked the id");
        if self.closed.contains(&id) {
            if let Work::Data { buf, .. } = work {
                sh.pool.put(buf);
            }
            return;
        }
        if let Work::Fail { message, .. } = work {
            if let Some(o) = self.close(id) {
                save(sh, self.fin, &o, x);
            }
            let (code, msg) = message.split_once('\t').unwrap_or(("source", &message));
            fail(sh, x, code, msg.to_string());
            self.closed.insert(id);
            return;
        }
        // Chunks this frame covers, beyond a resumed prefix.
        let chunks = match &work {
            Work::Data { offset, .. } if *offset >= x.from => {
                Some((offset / CHUNK_SIZE, offset / CHUNK_SIZE + 1))
            }
            Work::Hole { offset, len, .. } => Some((
                (offset / CHUNK_SIZE).max(x.from / CHUNK_SIZE),
                chunk_count(offset + len),
            )),
            _ => None,
        };
        // A chunk sent twice, or data where a hole was (or the reverse),
        // would leave other bytes on disk than the digest vouches for.
        if let (Some((first, end)), Some(o)) = (chunks, self.open.get(&id)) {
            if o.digest.holds_any(first, end)
                || o.writing.iter().any(|&i| (first..end).contains(&i))
            {
                let e = format!(
                    "{}: the sender sent chunk {first} again (or data where it sent a hole)",
                    x.path
                );
                return self.give_up(id, x, work, "protocol", e);
            }
        }
        // Only a write needs the file open: holes, ends and a resumed
        // prefix only change the digest, so a file closed for room is
        // opened again for them only if it completes ([`Self::progressed`]).
        let writes = matches!(work, Work::Data { offset, .. } if offset >= x.from)
            || !self.open.contains_key(&id);
        if let Err(e) = if writes {
            self.ensure_open(id, x)
        } else {
            Ok(())
        } {
            // No sidecar save: its temporary file may not be the one this
            // session wrote (a resume re-hashes the prefix either way).
            return self.give_up(id, x, work, e.code(), e.to_string());
        }
        self.apply(id, x, work);
    }

    /// File `id` failed: `work`'s buffer back to the pool, the file closed
    /// and failed with `code` and `why`; its later frames are dropped.
    pub(super) fn give_up(&mut self, id: u32, x: &Expect, work: Work, code: &str, why: String) {
        if let Work::Data { buf, .. } = work {
            self.sh.pool.put(buf);
        }
        self.close(id);
        fail(self.sh, x, code, why);
        self.closed.insert(id);
    }

    /// `work` on open file `id`: a write submitted, or the digest (a
    /// resumed prefix, a hole) or the end marker taken in.
    pub(super) fn apply(&mut self, id: u32, x: &Expect, work: Work) {
        let sh = self.sh;
        let o = self.open.get_mut(&id).expect("opened above");
        match work {
            Work::Data {
                offset, buf, hash, ..
            } => {
                if offset < x.from {
                    // Already verified on this side (a resumed prefix).
                    sh.pool.put(buf);
                    o.digest.data(offset / CHUNK_SIZE, hash);
                    o.count_parked(&sh.parked);
                } else {
                    let aligned = buf.len() % DIRECT_ALIGN == 0;
                    let fds = o.fds();
                    let target = match &fds.direct {
                        Some(d) if aligned => d.clone(),
                        _ => fds.file.clone(),
                    };
                    let len = buf.len();
                    o.writing.push(offset / CHUNK_SIZE);
                    self.io.submit(Op {
                        file: target,
                        offset,
                        buf,
                        len,
                        need: len,
                        write: true,
                        tag: WriteTag {
                            file: id,
                            offset,
                            hash,
                        },
                    });
                    return;
                }
            }
            Work::Hole { offset, len, .. } => {
                let first = offset / CHUNK_SIZE;
                let count = chunk_count(offset + len) - first;
                o.digest.zeros(first, count);
                o.count_parked(&sh.parked);
            }
            Work::End { checksum, .. } => o.end = Some(checksum),
            Work::Fail { .. } => unreachable!("handled above"),
        }
        self.progressed(id);
    }

    /// Makes file `id` hold its descriptors, most recently used: opens it
    /// (the first frame) or reopens it (closed for room), closing the least
    /// recently used file without writes in flight when this worker holds
    /// its share of [`MAX_OPEN_FILES`].
    pub(super) fn ensure_open(&mut self, id: u32, x: &Expect) -> Result<(), DiskError> {
        let holds = self.open.get(&id).map(|o| o.fds.is_some());
        if holds != Some(true) {
            self.make_room();
            match self.open.get_mut(&id) {
                None => {
                    let o = open_part(self.sh, x)?;
                    self.open.insert(id, o);
                }
                Some(o) => o.fds = Some(reopen(self.sh, x, o.seen)?),
            }
            let open = self.sh.open_files.fetch_add(1, Ordering::Relaxed) + 1;
            self.sh.open_files_peak.fetch_max(open, Ordering::Relaxed);
        }
        let o = self.open.get_mut(&id).expect("opened above");
        self.lru.remove(&o.used);
        self.clock += 1;
        o.used = self.clock;
        self.lru.insert(o.used, id);
        Ok(())
    }

    /// Below its share of [`MAX_OPEN_FILES`]: closes the least recently used files that
    /// have no write in flight (at most the queue depth are skipped).
    pub(super) fn make_room(&mut self) {
        while self.lru.len() >= self.sh.open_per_writer {
            let Some((&stamp, &id)) = self
                .lru
                .iter()
                .find(|(_, id)| self.open.get(id).is_some_and(|o| o.writing.is_empty()))
            else {
                return;
            };
            self.lru.remove(&stamp);
            if let Some(o) = self.open.get_mut(&id) {
                release(self.sh, o);
            }
        }
    }

    /// Stops writing file `id`: its parked blocks and descriptors no
    /// longer count.
    pub(super) fn close(&mut self, id: u32) -> Option<Open> {
        let o = self.open.remove(&id)?;
        self.sh.parked.fetch_sub(o.parked, Ordering::Relaxed);
        if o.fds.is_some() {
            self.lru.remove(&o.used);
            self.sh.open_files.fetch_sub(1, Ordering::Relaxed);
        }
        // Its descriptors stay with the returned file (a save or the
        // finisher may need them); it just no longer counts.
        Some(o)
    }

    /// A write completed.
    pub(super) fn written(&mut self, d: crate::ioqueue::Done<WriteTag>) {
        let sh = self.sh;
        let t = d.tag;
        let len = d.buf.len() as u64;
        sh.pool.put(d.buf);
        if let Some(o) = self.open.get_mut(&t.file) {
            let index = t.offset / CHUNK_SIZE;
            o.writing.retain(|&i| i != index);
        }
        if self.closed.contains(&t.file) {
            return;
        }
        let x = sh.files[t.file as usize]
            .as_ref()
            .expect("the intake checked the id");
        if let Err(e) = d.result {
            let e = DiskError::from_io(x.path.clone(), e);
            if let Some(o) = self.close(t.file) {
                save(sh, self.fin, &o, x);
            }
            fail(sh, x, e.code(), e.to_string());
            self.closed.insert(t.file);
            return;
        }
        sh.written.fetch_add(len, Ordering::Relaxed);
        sh.groups[x.group].add_written(len);
        if let Some(o) = self.open.get_mut(&t.file) {
            o.digest.data(t.offset / CHUNK_SIZE, t.hash);
            o.count_parked(&sh.parked);
        }
        self.progressed(t.file);
    }

    /// After the digest of `id` grew: save the sidecar now and then, and
    /// hand a complete file to the finisher.
    pub(super) fn progressed(&mut self, id: u32) {
        let x = self.sh.files[id as usize]
            .as_ref()
            .expect("the intake checked the id");
        let Some(o) = self.open.get(&id) else {
            return;
        };
        if o.digest.complete() && o.end.is_some() {
            if let Err(e) = self.ensure_open(id, x) {
                self.close(id);
                fail(self.sh, x, e.code(), e.to_string());
                self.closed.insert(id);
                return;
            }
            let o = self.close(id).expect("looked up above");
            self.closed.insert(id);
            let _ = self.fin.send(Finish::Complete {
                id,
                open: Box::new(o),
            });
            return;
        }
        let o = self.open.get_mut(&id).expect("looked up above");
        let v = o.digest.verified_offset();
        if v >= o.saved + STATE_SAVE_BYTES && v < x.entry.size {
            o.saved = v;
            save(self.sh, self.fin, o, x);
        }
    }
}
