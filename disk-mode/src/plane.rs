//! Disk mode inside a session: the manifest/plan exchange on the control
//! connection and the [`DataPlane`]s that put the reader and writer
//! pipelines behind the engine's stream workers.
//!
//! The files go one way in a session, and the end that has them is the
//! [`SenderPlane`], the end that writes them the [`ReceiverPlane`]. A push
//! (`longhaul send PATH...`) has the sender on the client; a pull
//! (`longhaul get PATH...`) has it on the server, which reads the PATHs
//! beneath its `--root`. Push exchange (between `SessionRequest` and
//! `SessionAccepted`):
//!
//! ```text
//! client                                         server
//!   SessionRequest {mode: disk, mode_params: DiskParams}  ->
//!   ModeData {disk: manifest, entries: [...]}  x n        ->   (validate, mkdir, resume check)
//!                                   <-  ModeData {disk: plan, ..., last}  x m
//!                                   <-  SessionAccepted
//! ```
//!
//! A pull is the same exchange the other way round: the client asks with
//! [`PullParams`] (direction `receive`), the server walks the PATHs and
//! answers `ModeData {disk: offer}` and the manifest, the client plans it
//! against its local `--dest` and answers the plan, then `SessionAccepted`.
//!
//! While an end checks files before it can answer (the receiver reading its
//! existing copies for the plan, a pull's server walking and hashing its
//! tree), it sends `ModeData {disk: working}` every [`WORKING_EVERY`], so
//! the other end, which gives each message the handshake timeout, waits
//! as long as the work goes on and no longer than that once it stops.
//!
//! Both lists are cut into messages of at most [`MESSAGE_BUDGET`] bytes, so
//! a tree of any size fits through the 1 MiB control frame limit. Each end's
//! `Done` carries its summary (sender: its failures and read counters;
//! receiver: verified files, failures, written counters); the client merges
//! them with [`final_fields`] and fails with [`check`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::connection::Connection;
use crate::datapath::{
    DataPlane, DeviceCounters, ModeReport, PlaneProgress, Progress, SendBudget, Sink, Source,
    StreamIo,
};
use crate::error::{Error, Result};
use crate::limits::HANDSHAKE_TIMEOUT;
use crate::messages::{Direction, Message, SessionRequest};

use super::claims::Claimant;
use super::devices::DeviceGroup;
use super::reader::{Feed, SendPipeline};
use super::source::SourceSet;
use super::walk::Walk;
use super::wire::{DiskReport, FileFailure, Manifest, ManifestEntry, Plan};
use super::writer::{Intake, ReceivePipeline};
use super::{DiskError, DiskOptions, CHUNK_SIZE};

/// Target size of one ModeData message: half the control frame limit, so
/// even an entry with a 4 KiB path never overflows a frame.
pub(crate) const MESSAGE_BUDGET: usize = crate::frame::MAX_FRAME_LEN / 2;

/// Most manifest entries a server accepts in one session. The manifest is
/// held in memory (~250 bytes an entry), so this bounds what one client can
/// make the server allocate.
pub(crate) const MAX_MANIFEST_ENTRIES: u64 = 4 << 20;

/// Failed files named one by one in the server log; the rest are counted.
const LOGGED_FAILURES: usize = 5;

/// Most writer workers per device a client may ask the server for.
pub const MAX_IO_WORKERS_PER_DEVICE: u32 = 64;

/// `SessionRequest::mode_params` of a disk session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct DiskParams {
    /// `--dest`, relative to the server's `--root`.
    pub(crate) dest: String,
    pub(crate) resume: bool,
    pub(crate) io_workers_per_device: u32,
    pub(crate) direct: bool,
    /// Number of manifest entries that follow.
    pub(crate) entries: u64,
    pub(crate) chunk_size: u64,
    /// `--checksum`: manifest entries carry checksums; skips compare content.
    #[serde(default)]
    pub(crate) checksum: bool,
}

/// `SessionRequest::mode_params` of a pull: a disk session in direction
/// `receive`, the server sending.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PullParams {
    /// What to send, relative to the server's `--root`; each lands under
    /// its last component, like `send`'s PATHs.
    pub(crate) paths: Vec<String>,
    /// `--checksum`: the server hashes every file before the session so the
    /// client compares what it already has by content.
    pub(crate) checksum: bool,
    pub(crate) io_workers_per_device: u32,
    pub(crate) direct: bool,
}

/// Disk-mode control messages, carried as `ModeData`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "disk", rename_all = "snake_case")]
pub enum DiskMessage {
    /// Pull: the server's manifest follows, this many entries.
    Offer {
        entries: u64,
        chunk_size: u64,
    },
    Manifest {
        entries: Vec<ManifestEntry>,
    },
    Plan {
        plan: Plan,
        last: bool,
    },
    /// Still checking files; the answer follows ([`keep_alive`]).
    Working,
}

/// How often an end that checks files says so: a few times within the
/// handshake timeout its peer gives each message.
pub(crate) const WORKING_EVERY: Duration =
    Duration::from_millis(HANDSHAKE_TIMEOUT.as_millis() as u64 / 4);

/// Runs `work` while a thread tells the peer every `every` that we are
/// working; returns `work`'s result once the thread stopped writing, so
/// the caller's next message cannot interleave with a `Working`.
pub(crate) fn keep_alive<T>(
    conn: &Connection,
    every: Duration,
    work: impl FnOnce() -> T,
) -> Result<T> {
    let mut socket = conn
        .socket()
        .try_clone()
        .map_err(|e| Error::io("control connection", e))?;
    let frame = mode_message(&DiskMessage::Working)?.to_frame()?;
    let (done, stop) = std::sync::mpsc::channel::<()>();
    Ok(std::thread::scope(|scope| {
        scope.spawn(move || {
            // Until `done` is dropped; a failed write ends the ticking, and
            // the caller's next message finds the connection's state. A
            // tick whose predecessor the peer has not acknowledged is
            // skipped: one `working` in flight says it, and a peer that
            // reads nothing cannot make this thread wait to write.
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
                if !crate::sockopt::drained(&socket) {
                    continue;
                }
                if frame.write_to(&mut socket).is_err() {
                    break;
                }
            }
        });
        let out = work();
        drop(done);
        out
    }))
}

/// The library error for a file-level failure.
pub(crate) fn to_error(e: DiskError) -> Error {
    match e {
        DiskError::DiskFull { .. } => Error::DiskFull(e.to_string()),
        DiskError::ChecksumMismatch { .. } => Error::ChecksumMismatch(e.to_string()),
        DiskError::Refused { .. } => Error::Refused(e.to_string()),
        DiskError::Io { path, source } => Error::io(path, source),
        other => Error::Io {
            context: other.to_string(),
            source: std::io::Error::other(other.code()),
        },
    }
}

/// A disk message as the `ModeData` control message that carries it.
fn mode_message(m: &DiskMessage) -> Result<Message> {
    serde_json::to_value(m)
        .map(Message::ModeData)
        .map_err(|e| Error::Protocol(format!("encoding disk message: {e}")))
}

fn send_mode(conn: &mut Connection, m: &DiskMessage) -> Result<()> {
    conn.send(&mode_message(m)?)
}

/// A `ModeData` body as a disk message.
pub fn decode_disk_message(v: Value) -> Result<DiskMessage> {
    serde_json::from_value(v).map_err(|e| Error::Protocol(format!("malformed disk message: {e}")))
}

/// The next disk message. `Working` is skipped where the peer may be busy
/// before it answers (`busy_ok`: the plan, a pull's offer) and refused
/// elsewhere: a push's manifest is walked and hashed before the client
/// connects, so a client saying it is working there only holds the slot.
fn recv_mode(conn: &mut Connection, busy_ok: bool) -> Result<DiskMessage> {
    loop {
        match conn.recv()? {
            Message::ModeData(v) => match decode_disk_message(v)? {
                DiskMessage::Working if busy_ok => {}
                DiskMessage::Working => {
                    return Err(Error::Protocol(
                        "'working' where the answer was due at once".into(),
                    ))
                }
                m => return Ok(m),
            },
            other => {
                return Err(Error::Protocol(format!(
                    "expected a disk-mode message, got {:?}",
                    other.kind()
                )))
            }
        }
    }
}

/// Rough JSON size of a value, for cutting lists into messages.
fn json_len<T: Serialize>(v: &T) -> usize {
    serde_json::to_vec(v)
        .map(|b| b.len() + 1)
        .unwrap_or(MESSAGE_BUDGET)
}

// ---------------------------------------------------------------- sender

/// The end that has the files: built from its PATHs before the exchange,
/// started once the receiver's plan arrives. The client of a push, the
/// server of a pull.
pub struct SenderPlane {
    params: DiskParams,
    opts: DiskOptions,
    source: Mutex<Option<SourceSet>>,
    groups: Vec<Arc<DeviceGroup>>,
    pipeline: OnceLock<Arc<SendPipeline>>,
    refused: Mutex<Vec<FileFailure>>,
    plan_counts: Mutex<(u64, u64)>,
}

impl SenderPlane {
    /// Push: walk `paths` for `--dest dest`; prints what the walk skipped.
    pub fn push(
        req: &SessionRequest,
        paths: &[PathBuf],
        dest: &str,
        opts: &DiskOptions,
    ) -> Result<SenderPlane> {
        if req.direction != Direction::Send {
            return Err(Error::Usage(
                "sending files goes client to server: --reverse/--bidir do not apply (longhaul get pulls files from the server)".into(),
            ));
        }
        let walked = super::walk::walk(paths, opts.follow_symlinks);
        let plane = SenderPlane::walk(req, walked, dest, opts).map_err(|e| match e {
            DiskError::Refused { .. } => Error::Usage(e.to_string()),
            other => to_error(other),
        })?;
        for w in plane.warnings() {
            eprintln!("longhaul: {w}");
        }
        Ok(plane)
    }

    fn walk(
        req: &SessionRequest,
        walked: Result<Walk, DiskError>,
        dest: &str,
        opts: &DiskOptions,
    ) -> Result<SenderPlane, DiskError> {
        let mut opts = opts.clone();
        opts.streams = req.streams as usize;
        let src = SourceSet::from_walk(walked?, dest, &opts)?;
        let params = DiskParams {
            dest: dest.to_string(),
            resume: opts.resume,
            io_workers_per_device: opts.io_workers_per_device as u32,
            direct: opts.direct,
            entries: src.manifest.entries.len() as u64,
            chunk_size: CHUNK_SIZE,
            checksum: opts.checksum,
        };
        Ok(SenderPlane {
            params,
            groups: src.groups().to_vec(),
            opts,
            source: Mutex::new(Some(src)),
            pipeline: OnceLock::new(),
            refused: Mutex::new(Vec::new()),
            plan_counts: Mutex::new((0, 0)),
        })
    }

    fn warnings(&self) -> Vec<String> {
        lock(&self.source)
            .as_ref()
            .map(|s| s.warnings.clone())
            .unwrap_or_default()
    }

    /// For `SessionRequest::mode_params`.
    pub(crate) fn params(&self) -> Value {
        serde_json::to_value(&self.params).unwrap_or(Value::Null)
    }

    /// Send the manifest (a pull announces it with an `Offer` first), read
    /// the plan, start the readers.
    pub(crate) fn negotiate(&self, conn: &mut Connection, announce: bool) -> Result<()> {
        let src = lock(&self.source)
            .take()
            .ok_or_else(|| Error::Protocol("disk negotiation ran twice".into()))?;
        if announce {
            send_mode(
                conn,
                &DiskMessage::Offer {
                    entries: src.manifest.entries.len() as u64,
                    chunk_size: CHUNK_SIZE,
                },
            )?;
        }
        send_manifest(conn, &src.manifest.entries)?;
        let plan = recv_plan(conn)?;
        *lock(&self.plan_counts) = (plan.skip.len() as u64, plan.resume.len() as u64);
        let (pipeline, refused) = src.start(&plan, &self.opts);
        *lock(&self.refused) = refused;
        let _ = self.pipeline.set(pipeline);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The manifest's entries in messages of at most [`MESSAGE_BUDGET`].
fn send_manifest(conn: &mut Connection, entries: &[ManifestEntry]) -> Result<()> {
    let mut batch = Vec::new();
    let mut size = 0;
    for e in entries {
        let n = json_len(e);
        if size + n > MESSAGE_BUDGET && !batch.is_empty() {
            send_mode(
                conn,
                &DiskMessage::Manifest {
                    entries: std::mem::take(&mut batch),
                },
            )?;
            size = 0;
        }
        batch.push(e.clone());
        size += n;
    }
    if !batch.is_empty() {
        send_mode(conn, &DiskMessage::Manifest { entries: batch })?;
    }
    Ok(())
}

/// Exactly `count` manifest entries, however many messages carry them.
fn recv_manifest(conn: &mut Connection, count: u64) -> Result<Vec<ManifestEntry>> {
    if count > MAX_MANIFEST_ENTRIES {
        return Err(Error::Unsupported(format!(
            "{count} entries in one session; at most {MAX_MANIFEST_ENTRIES} are taken"
        )));
    }
    let mut entries = Vec::with_capacity(count as usize);
    while (entries.len() as u64) < count {
        match recv_mode(conn, false)? {
            DiskMessage::Manifest { entries: e } => entries.extend(e),
            other => {
                return Err(Error::Protocol(format!(
                    "expected manifest entries, got {other:?}"
                )))
            }
        }
        if entries.len() as u64 > count {
            return Err(Error::Protocol(
                "more manifest entries than announced".into(),
            ));
        }
    }
    Ok(entries)
}

/// The receiver's whole plan, however many messages carry it.
fn recv_plan(conn: &mut Connection) -> Result<Plan> {
    let mut plan = Plan::default();
    loop {
        match recv_mode(conn, true)? {
            DiskMessage::Plan { plan: p, last } => {
                plan.skip.extend(p.skip);
                plan.resume.extend(p.resume);
                plan.refused.extend(p.refused);
                if last {
                    return Ok(plan);
                }
            }
            _ => return Err(Error::Protocol("expected the receiver's plan".into())),
        }
    }
}

/// A sending stream of a disk session: frames from the reader pipeline.
pub(super) struct DiskSource {
    pub(super) feed: Feed,
}

impl Source for DiskSource {
    fn send(&mut self, io: &StreamIo<'_>, budget: &mut SendBudget) -> Result<Progress> {
        self.feed
            .send(io, budget)
            .map_err(|e| Error::io("sending file blocks", e))
    }
}

impl DataPlane for SenderPlane {
    fn source(&self, _stream_id: u32) -> Result<Box<dyn Source>> {
        let pipeline = self
            .pipeline
            .get()
            .cloned()
            .ok_or_else(|| Error::Protocol("disk plan not received".into()))?;
        Ok(Box::new(DiskSource {
            feed: Feed::new(pipeline),
        }))
    }

    fn sink(&self, _stream_id: u32) -> Result<Box<dyn Sink>> {
        Err(Error::Unsupported(
            "disk mode: the end with the files only sends".into(),
        ))
    }

    fn mode_params(&self) -> Option<Value> {
        Some(self.params())
    }

    /// Push client: the manifest count travels in the parameters.
    fn negotiate(&self, conn: &mut Connection) -> Result<()> {
        SenderPlane::negotiate(self, conn, false)
    }

    fn devices(&self) -> Vec<Arc<dyn DeviceCounters>> {
        counters(&self.groups)
    }

    /// `local` is the sender's summary.
    fn report(&self, local: Option<&Value>, remote: Option<&Value>) -> ModeReport {
        mode_report(local, remote)
    }

    /// `local` is the sender's summary.
    fn check(&self, local: Option<&Value>, remote: Option<&Value>) -> Result<()> {
        check(local, remote)
    }

    fn idle_streams_are_normal(&self) -> bool {
        true
    }

    fn progress(&self) -> Option<PlaneProgress> {
        let pipeline = self.pipeline.get()?;
        let (files_total, bytes_total) = pipeline.totals();
        Some(PlaneProgress {
            bytes_total: Some(bytes_total),
            files_done: pipeline.files_sent(),
            files_total,
        })
    }

    fn summary(&self) -> Result<Option<Value>> {
        let mut failures = lock(&self.refused).clone();
        if let Some(p) = self.pipeline.get() {
            failures.extend(p.finish());
        }
        let (skipped, resumed) = *lock(&self.plan_counts);
        Ok(Some(json!({
            "sender": {
                "entries": self.params.entries,
                "checksum": self.params.checksum,
                "skipped": skipped,
                "resumed": resumed,
                "failures": failures,
                "devices": super::devices::snapshot(&self.groups),
            }
        })))
    }
}

// ---------------------------------------------------------------- receiver

/// The end that writes the files: the server of a push (beneath `--root`),
/// the client of a pull (beneath its local `--dest`, once the server's
/// manifest is in).
pub struct ReceiverPlane {
    pipeline: OnceLock<Arc<ReceivePipeline>>,
    /// Pull client: where the files land and how, for [`Self::negotiate`].
    pull: Option<(PullParams, PathBuf, DiskOptions)>,
    /// The server names failed files in its log.
    log_failures: bool,
}

impl ReceiverPlane {
    pub(crate) fn groups(&self) -> &[Arc<DeviceGroup>] {
        self.pipeline.get().map(|p| p.groups()).unwrap_or(&[])
    }

    /// Pull client: `paths` (beneath the server's `--root`) into the local
    /// directory `dest` (made if missing).
    pub fn pull(
        req: &SessionRequest,
        paths: &[String],
        dest: &Path,
        opts: &DiskOptions,
    ) -> Result<ReceiverPlane> {
        if req.direction != Direction::Receive {
            return Err(Error::Usage(
                "pulling files goes server to client: --bidir does not apply".into(),
            ));
        }
        if paths.is_empty() {
            return Err(Error::Usage(
                "nothing to pull: give PATHs or --file-list".into(),
            ));
        }
        for p in paths {
            super::safepath::components(p).map_err(|e| Error::Usage(e.to_string()))?;
        }
        std::fs::create_dir_all(dest)
            .map_err(|e| Error::io(format!("creating {}", dest.display()), e))?;
        let params = PullParams {
            paths: paths.to_vec(),
            checksum: opts.checksum,
            io_workers_per_device: opts.io_workers_per_device as u32,
            direct: opts.direct,
        };
        if json_len(&params) > MESSAGE_BUDGET {
            return Err(Error::Usage(format!(
                "{} paths are too many for one pull request ({} KiB at most); split the list",
                paths.len(),
                MESSAGE_BUDGET >> 10
            )));
        }
        let mut opts = opts.clone();
        opts.streams = req.streams as usize;
        Ok(ReceiverPlane {
            pipeline: OnceLock::new(),
            pull: Some((params, dest.to_path_buf(), opts)),
            log_failures: false,
        })
    }

    /// Pull client: read the server's manifest, plan it locally, answer.
    fn negotiate_pull(&self, conn: &mut Connection) -> Result<()> {
        let Some((_, dest, opts)) = &self.pull else {
            return Ok(());
        };
        let (count, chunk_size) = match recv_mode(conn, true)? {
            DiskMessage::Offer {
                entries,
                chunk_size,
            } => (entries, chunk_size),
            _ => return Err(Error::Protocol("expected the server's offer".into())),
        };
        let manifest = Manifest {
            dest: String::new(),
            resume: opts.resume,
            chunk_size,
            entries: recv_manifest(conn, count)?,
        };
        let pipeline = answer_plan(conn, WORKING_EVERY, || {
            ReceivePipeline::prepare(dest, &manifest, opts, None)
        })?;
        let _ = self.pipeline.set(pipeline);
        Ok(())
    }

    fn pipeline(&self) -> Result<&Arc<ReceivePipeline>> {
        self.pipeline
            .get()
            .ok_or_else(|| Error::Protocol("disk manifest not received".into()))
    }
}

/// The server's disk plane for a requested session: the receiver of a
/// push, the sender of a pull.
pub fn server_plane(
    req: &SessionRequest,
    root: Option<&Path>,
    conn: &mut Connection,
    claimant: &Claimant,
) -> Result<Arc<dyn DataPlane>> {
    let Some(root) = root else {
        return Err(Error::Unsupported(
            "this server has no --root: disk mode is off".into(),
        ));
    };
    match req.direction {
        Direction::Send => Ok(Arc::new(receive_push(req, root, conn, claimant)?)),
        Direction::Receive => Ok(Arc::new(serve_pull(req, root, conn)?)),
        Direction::Bidir => Err(Error::Unsupported(
            "disk mode moves files one way: push (send) or pull (get), not both".into(),
        )),
    }
}

fn decode_params<T: serde::de::DeserializeOwned>(req: &SessionRequest) -> Result<T> {
    req.mode_params
        .clone()
        .ok_or_else(|| Error::Protocol("disk session without parameters".into()))
        .and_then(|v| {
            serde_json::from_value(v)
                .map_err(|e| Error::Protocol(format!("bad disk parameters: {e}")))
        })
}

/// Push: read the manifest, plan it beneath `root`, answer with the plan.
fn receive_push(
    req: &SessionRequest,
    root: &Path,
    conn: &mut Connection,
    claimant: &Claimant,
) -> Result<ReceiverPlane> {
    let params: DiskParams = decode_params(req)?;
    let entries = recv_manifest(conn, params.entries)?;
    let opts = DiskOptions {
        io_workers_per_device: params
            .io_workers_per_device
            .clamp(1, MAX_IO_WORKERS_PER_DEVICE) as usize,
        direct: params.direct,
        resume: params.resume,
        streams: req.streams as usize,
        ..DiskOptions::default()
    };
    let manifest = Manifest {
        dest: params.dest,
        resume: params.resume,
        chunk_size: params.chunk_size,
        entries,
    };
    let pipeline = answer_plan(conn, WORKING_EVERY, || {
        ReceivePipeline::prepare(root, &manifest, &opts, Some(claimant))
    })?;
    let plane = ReceiverPlane {
        pipeline: OnceLock::new(),
        pull: None,
        log_failures: true,
    };
    let _ = plane.pipeline.set(pipeline);
    Ok(plane)
}

/// Pull: resolve the asked paths beneath `root` (refusing any that leaves
/// it), walk them, offer the manifest and start reading what the client's
/// plan still needs.
fn serve_pull(req: &SessionRequest, root: &Path, conn: &mut Connection) -> Result<SenderPlane> {
    let params: PullParams = decode_params(req)?;
    let refused = |e: DiskError| match e {
        DiskError::Refused { .. } => Error::Refused(e.to_string()),
        other => to_error(other),
    };
    let opts = DiskOptions {
        io_workers_per_device: params
            .io_workers_per_device
            .clamp(1, MAX_IO_WORKERS_PER_DEVICE) as usize,
        direct: params.direct,
        checksum: params.checksum,
        // The served tree's symlinks are never followed out of the root.
        follow_symlinks: false,
        ..DiskOptions::default()
    };
    // Walking a big tree, and hashing it for --checksum, takes a while.
    let plane = keep_alive(conn, WORKING_EVERY, || {
        let walked = super::walk::walk_beneath(root, &params.paths);
        SenderPlane::walk(req, walked, "", &opts)
    })?
    .map_err(refused)?;
    for w in plane.warnings() {
        crate::logline::server(format!("pull: {w}"));
    }
    plane.negotiate(conn, true)?;
    Ok(plane)
}

/// The receiver's side of the exchange once it has the manifest: `prepare`
/// (which checks what is already there, reading existing files for
/// `--checksum` and resume) while the peer hears `Working`, then the plan.
fn answer_plan(
    conn: &mut Connection,
    every: Duration,
    prepare: impl FnOnce() -> Result<(Arc<ReceivePipeline>, Plan), DiskError>,
) -> Result<Arc<ReceivePipeline>> {
    let (pipeline, plan) = keep_alive(conn, every, prepare)?.map_err(to_error)?;
    send_plan(conn, plan)?;
    Ok(pipeline)
}

fn send_plan(conn: &mut Connection, plan: Plan) -> Result<()> {
    let mut part = Plan::default();
    let mut size = 0;
    let flush = |conn: &mut Connection, part: &mut Plan, last: bool| {
        send_mode(
            conn,
            &DiskMessage::Plan {
                plan: std::mem::take(part),
                last,
            },
        )
    };
    for id in plan.skip {
        if size > MESSAGE_BUDGET {
            flush(conn, &mut part, false)?;
            size = 0;
        }
        part.skip.push(id);
        size += 11;
    }
    for r in plan.resume {
        if size > MESSAGE_BUDGET {
            flush(conn, &mut part, false)?;
            size = 0;
        }
        part.resume.push(r);
        size += 32;
    }
    for f in plan.refused {
        let n = json_len(&f);
        if size + n > MESSAGE_BUDGET {
            flush(conn, &mut part, false)?;
            size = 0;
        }
        part.refused.push(f);
        size += n;
    }
    flush(conn, &mut part, true)
}

/// A receiving stream of a disk session: frames into the writer pipeline.
pub(super) struct DiskSink {
    pub(super) intake: Intake,
}

impl Sink for DiskSink {
    fn receive(&mut self, io: &StreamIo<'_>) -> Result<Progress> {
        self.intake.receive(io).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => Error::Protocol(e.to_string()),
            _ => Error::io("receiving file blocks", e),
        })
    }
}

impl DataPlane for ReceiverPlane {
    fn source(&self, _stream_id: u32) -> Result<Box<dyn Source>> {
        Err(Error::Unsupported(
            "disk mode: the end that writes the files only receives".into(),
        ))
    }

    fn sink(&self, _stream_id: u32) -> Result<Box<dyn Sink>> {
        Ok(Box::new(DiskSink {
            intake: Intake::new(self.pipeline()?.clone()),
        }))
    }

    fn mode_params(&self) -> Option<Value> {
        self.pull
            .as_ref()
            .and_then(|(params, _, _)| serde_json::to_value(params).ok())
    }

    fn negotiate(&self, conn: &mut Connection) -> Result<()> {
        self.negotiate_pull(conn)
    }

    fn devices(&self) -> Vec<Arc<dyn DeviceCounters>> {
        counters(self.groups())
    }

    /// The peer's summary is the sender's.
    fn report(&self, local: Option<&Value>, remote: Option<&Value>) -> ModeReport {
        mode_report(remote, local)
    }

    /// The peer's summary is the sender's.
    fn check(&self, local: Option<&Value>, remote: Option<&Value>) -> Result<()> {
        check(remote, local)
    }

    fn idle_streams_are_normal(&self) -> bool {
        true
    }

    fn summary(&self) -> Result<Option<Value>> {
        let report = self.pipeline()?.finish();
        if self.log_failures {
            // The operator sees failed files in the server log too.
            for f in report.failures.iter().take(LOGGED_FAILURES) {
                crate::logline::server(format!("disk: {}", f.error));
            }
            if report.failures.len() > LOGGED_FAILURES {
                let more = report.failures.len() - LOGGED_FAILURES;
                crate::logline::server(format!("disk: ... and {more} more failed files"));
            }
        }
        Ok(Some(json!({ "receiver": report })))
    }
}

/// The client's fields of the final report, from the sender's summary and
/// the receiver's, whichever end each is.
fn mode_report(sender: Option<&Value>, receiver: Option<&Value>) -> ModeReport {
    let (files, devices) = final_fields(sender, receiver);
    ModeReport {
        human: human_lines(&files, &devices),
        files: Some(files),
        devices: Some(devices),
        ..ModeReport::default()
    }
}

// ---------------------------------------------------------------- result

fn counters(groups: &[Arc<DeviceGroup>]) -> Vec<Arc<dyn DeviceCounters>> {
    groups
        .iter()
        .map(|g| g.clone() as Arc<dyn DeviceCounters>)
        .collect()
}

fn failures_of(v: Option<&Value>, side: &str) -> Vec<FileFailure> {
    v.and_then(|v| v.get(side))
        .and_then(|s| s.get("failures"))
        .and_then(|f| serde_json::from_value(f.clone()).ok())
        .unwrap_or_default()
}

/// Every failed file of the session, sender's first, one per file.
pub(crate) fn all_failures(local: Option<&Value>, remote: Option<&Value>) -> Vec<FileFailure> {
    let mut out = failures_of(local, "sender");
    for f in failures_of(remote, "receiver") {
        if !out.iter().any(|o| o.id == f.id) {
            out.push(f);
        }
    }
    out
}

/// The `files` and `devices` fields of the client's final JSON, from the
/// sender's summary (`local`) and the receiver's (`remote`).
pub(crate) fn final_fields(local: Option<&Value>, remote: Option<&Value>) -> (Value, Value) {
    let report: DiskReport = remote
        .and_then(|v| v.get("receiver"))
        .and_then(|r| serde_json::from_value(r.clone()).ok())
        .unwrap_or_default();
    let sender = local
        .and_then(|v| v.get("sender"))
        .cloned()
        .unwrap_or(Value::Null);
    let failures = all_failures(local, remote);
    let sent = report.files.saturating_sub(report.skipped);
    // Of the files sent: every byte verified, the resumed prefixes (read
    // again from the receiver's disk) included, but only the rest sent.
    let completed_bytes = report.file_bytes.saturating_sub(report.skipped_bytes);
    let sent_bytes = completed_bytes.saturating_sub(report.resumed_bytes);
    // Skipped on size and mtime alone: nobody compared their content.
    let unverified = report.skipped.saturating_sub(report.skipped_by_checksum);
    let mut files = json!({
        "count": report.files,
        "bytes": report.file_bytes,
        "verified": failures.is_empty() && unverified == 0,
        "sent": sent,
        "sent_bytes": sent_bytes,
        "verified_bytes": completed_bytes + report.skipped_by_checksum_bytes,
        "skipped": sender.get("skipped").cloned().unwrap_or(json!(report.skipped)),
        "skipped_unverified": unverified,
        "skip_check": if sender.get("checksum").and_then(Value::as_bool).unwrap_or(false) {
            "checksum"
        } else {
            "size_mtime"
        },
        "resumed": sender.get("resumed").cloned().unwrap_or(json!(0)),
    });
    if !failures.is_empty() {
        files["failures"] = json!(failures);
    }
    let mut devices = Vec::new();
    if let Some(list) = sender.get("devices").and_then(|d| d.as_array()) {
        for d in list {
            devices.push(json!({
                "side": "sender",
                "device": d.get("device"),
                "controller": d.get("controller"),
                "read_bytes": d.get("read_bytes"),
            }));
        }
    }
    for d in &report.devices {
        devices.push(json!({
            "side": "receiver",
            "device": d.device,
            "controller": d.controller,
            "written_bytes": d.written_bytes,
        }));
    }
    (files, Value::Array(devices))
}

/// Extra lines of the human summary: files and per-device IO.
pub(crate) fn human_lines(files: &Value, devices: &Value) -> String {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let skipped = match (n(&files["skipped"]), n(&files["skipped_unverified"])) {
        (0, _) => "0".to_string(),
        (all, 0) => format!("{all} (same content, compared with --checksum)"),
        (all, _) => {
            format!("{all} (same size and mtime; content not compared: --checksum compares it)")
        }
    };
    let mut out = format!(
        "\n  files: {} ({}), verified: {}; sent and verified: {}, resumed: {}, skipped (already there): {skipped}",
        n(&files["count"]),
        longhaul_units::format_bytes(n(&files["bytes"])),
        if files["verified"].as_bool().unwrap_or(false) { "yes" } else { "no" },
        n(&files["sent"]),
        n(&files["resumed"]),
    );
    for d in devices.as_array().into_iter().flatten() {
        let (what, bytes) = match d.get("read_bytes") {
            Some(b) => ("read", n(b)),
            None => ("written", n(&d["written_bytes"])),
        };
        out.push_str(&format!(
            "\n  {} device {} (controller {}): {} {what}",
            d["side"].as_str().unwrap_or("?"),
            d["device"].as_str().unwrap_or("?"),
            d["controller"].as_str().unwrap_or("?"),
            longhaul_units::format_bytes(bytes),
        ));
    }
    out
}

/// Fail the session when any file failed, naming every one (the first
/// failure's cause picks the error kind: disk full, checksum mismatch, ...).
pub(crate) fn check(local: Option<&Value>, remote: Option<&Value>) -> Result<()> {
    let failures = all_failures(local, remote);
    let Some(first) = failures.first() else {
        return Ok(());
    };
    const SHOWN: usize = 5;
    let mut msg: Vec<String> = failures
        .iter()
        .take(SHOWN)
        .map(|f| f.error.clone())
        .collect();
    if failures.len() > SHOWN {
        msg.push(format!("and {} more", failures.len() - SHOWN));
    }
    let text = format!("{} file(s) failed: {}", failures.len(), msg.join("; "));
    Err(match first.code.as_str() {
        "disk_full" => Error::DiskFull(text),
        "checksum" => Error::ChecksumMismatch(text),
        "refused" => Error::Refused(text),
        "in_use" => Error::Busy(text),
        _ => Error::Incomplete(text),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    /// A receiver that takes longer to plan than the handshake timeout its
    /// peer gives each message: told it is working, the peer waits for the
    /// plan; planning the same way in silence, the peer gives up.
    #[test]
    fn a_slow_plan_kept_alive_arrives_and_a_silent_one_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut waiting =
            Connection::new(TcpStream::connect(l.local_addr().unwrap()).unwrap()).unwrap();
        let working = Connection::new(l.accept().unwrap().0).unwrap();
        waiting
            .set_timeout(Some(Duration::from_millis(600)))
            .unwrap();
        let base = std::env::temp_dir().join(format!("lh-plane-slow-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let manifest = Manifest {
            dest: String::new(),
            resume: true,
            chunk_size: CHUNK_SIZE,
            entries: Vec::new(),
        };
        let answer = |mut conn: Connection, every: Duration| {
            let (base, manifest) = (base.clone(), manifest.clone());
            std::thread::spawn(move || {
                answer_plan(&mut conn, every, || {
                    std::thread::sleep(Duration::from_secs(2));
                    ReceivePipeline::prepare(&base, &manifest, &DiskOptions::default(), None)
                })
                .map(|_| conn)
            })
        };
        let started = Instant::now();
        let working = answer(working, Duration::from_millis(100));
        recv_plan(&mut waiting).unwrap();
        assert!(started.elapsed() >= Duration::from_secs(2));
        // Told less often than the peer's timeout: as good as silent.
        let working = answer(working.join().unwrap().unwrap(), Duration::from_secs(60));
        let started = Instant::now();
        let err = recv_plan(&mut waiting).unwrap_err();
        assert!(matches!(err, Error::Timeout(_)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        let _ = working.join();
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Where the answer is due at once (a push's manifest), `working` is a
    /// protocol error, not a way to hold the server's slot.
    #[test]
    fn working_where_the_manifest_is_due_is_refused() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client =
            Connection::new(TcpStream::connect(l.local_addr().unwrap()).unwrap()).unwrap();
        let mut server = Connection::new(l.accept().unwrap().0).unwrap();
        send_mode(&mut client, &DiskMessage::Working).unwrap();
        let err = recv_manifest(&mut server, 1).unwrap_err();
        assert!(err.to_string().contains("'working'"), "{err}");
    }
}
