//! The two pipelines joined by loopback TCP pairs on the data workers,
//! without the session layer.

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::datapath::{Limit, SendBudget, Sink, Source};
use crate::messages::Role;
use longhaul_core::stream::{self, StreamStats, Work};

use super::plane::{DiskSink, DiskSource};
use super::reader::Feed;
use super::writer::Intake;

use super::source::SourceSet;
use super::wire::{DiskReport, FileFailure};
use super::writer::ReceivePipeline;
use super::{DiskOptions, CHUNK_SIZE};

struct Outcome {
    report: DiskReport,
    sender_failures: Vec<FileFailure>,
    sent: u64,
}

fn transfer(paths: &[PathBuf], root: &Path, dest: &str, opts: &DiskOptions) -> Outcome {
    transfer_source(SourceSet::build(paths, dest, opts).unwrap(), root, opts)
}

/// Sends an already built source set (the test may change the files in
/// between) over `opts.streams` socket pairs.
fn transfer_source(src: SourceSet, root: &Path, opts: &DiskOptions) -> Outcome {
    let (rx, plan) = ReceivePipeline::prepare(root, &src.manifest, opts, None).unwrap();
    let (tx, mut sender_failures) = src.start(&plan, opts);
    let sent = run_pairs(
        opts.streams,
        || {
            Box::new(DiskSource {
                feed: Feed::new(tx.clone()),
            })
        },
        || {
            Box::new(DiskSink {
                intake: Intake::new(rx.clone()),
            })
        },
    );
    sender_failures.extend(tx.finish());
    Outcome {
        report: rx.finish(),
        sender_failures,
        sent,
    }
}

/// Runs `n` streams over loopback pairs on the data workers, each a source
/// on one end and a sink on the other; returns the bytes the sources sent.
fn run_pairs(
    n: usize,
    source: impl Fn() -> Box<dyn Source>,
    sink: impl Fn() -> Box<dyn Sink>,
) -> u64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let (done_tx, done) = mpsc::channel();
    let mut streams = Vec::new();
    for i in 0..n as u32 {
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let budget = SendBudget::new(
            Limit::Bytes(u64::MAX),
            None,
            Arc::new(AtomicBool::new(false)),
        );
        for (sock, role, work) in [
            (a, Role::Send, Work::Send(source(), budget)),
            (b, Role::Receive, Work::Receive(sink())),
        ] {
            let tx = done_tx.clone();
            let finished: stream::Finished = Box::new(move |r| {
                let _ = tx.send((role, r));
            });
            streams.push((Arc::new(StreamStats::new(i, role, sock)), work, finished));
        }
    }
    stream::start(streams).unwrap();
    let mut sent = 0;
    for _ in 0..2 * n {
        let (role, r) = done
            .recv_timeout(Duration::from_secs(120))
            .expect("streams end");
        let bytes = r.unwrap();
        if role == Role::Send {
            sent += bytes;
        }
    }
    sent
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lh-rt-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Deterministic contents that differ in every 4 KiB block (cheap even in
/// debug builds: one small block, then copies with a stamped index).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let block: Vec<u8> = (0..4096u32)
        .map(|i| i.wrapping_mul(2_654_435_761).rotate_left(u32::from(seed)) as u8)
        .collect();
    let mut v = Vec::with_capacity(len + 4096);
    let mut n = 0u32;
    while v.len() < len {
        v.extend_from_slice(&block);
        let at = v.len() - 4096;
        v[at..at + 4].copy_from_slice(&n.to_le_bytes());
        n += 1;
    }
    v.truncate(len);
    v
}

/// Compare two trees: contents, modes, mtimes, empty dirs.
fn assert_same_tree(a: &Path, b: &Path) {
    let ma = fs::symlink_metadata(a).unwrap();
    let mb = fs::symlink_metadata(b).unwrap();
    assert_eq!(ma.is_dir(), mb.is_dir(), "{}", b.display());
    assert_eq!(
        ma.permissions().mode() & 0o7777,
        mb.permissions().mode() & 0o7777,
        "mode of {}",
        b.display()
    );
    assert_eq!(
        (ma.mtime(), ma.mtime_nsec()),
        (mb.mtime(), mb.mtime_nsec()),
        "mtime of {}",
        b.display()
    );
    if ma.is_dir() {
        let mut na: Vec<_> = fs::read_dir(a)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let mut nb: Vec<_> = fs::read_dir(b)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        na.sort();
        nb.sort();
        assert_eq!(na, nb, "entries of {}", b.display());
        for n in na {
            assert_same_tree(&a.join(&n), &b.join(&n));
        }
    } else {
        assert_eq!(ma.len(), mb.len());
        assert!(
            fs::read(a).unwrap() == fs::read(b).unwrap(),
            "contents of {}",
            b.display()
        );
    }
}

#[test]
fn many_more_streams_than_buffers_still_round_trip() {
    // 256 streams against a pool of 128 stream buffers on each end: streams
    // take turns for buffers; none may wait for a buffer that never comes.
    let base = tmp("crowd");
    let top = base.join("src/top");
    fs::create_dir_all(&top).unwrap();
    for i in 0..24u8 {
        let len = (i as usize % 5) * CHUNK_SIZE as usize + 4096 * i as usize + 1;
        fs::write(top.join(format!("f{i}")), pattern(len, i)).unwrap();
    }
    fs::write(top.join("big"), pattern(40 * CHUNK_SIZE as usize + 3, 99)).unwrap();
    let root = base.join("root");
    fs::create_dir_all(&root).unwrap();
    let opts = DiskOptions {
        streams: 256,
        resume: false,
        ..DiskOptions::default()
    };
    let pool = super::reader::pool_buffers(opts.streams, 1);
    assert!(
        pool <= super::reader::STREAM_BUFFERS_MAX + 16,
        "pool of {pool} buffers for {} streams",
        opts.streams
    );
    let (tx, rx) = mpsc::channel();
    let (t, r, o) = (top.clone(), root.clone(), opts.clone());
    std::thread::spawn(move || {
        let _ = tx.send(transfer(std::slice::from_ref(&t), &r, "crowd", &o));
    });
    let out = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the transfer finished (no stream starved of a buffer)");
    assert!(out.report.failures.is_empty(), "{:?}", out.report.failures);
    assert!(out.sender_failures.is_empty());
    assert_eq!(out.report.files, 25);
    assert_same_tree(&top, &root.join("crowd/top"));
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn tree_round_trips_bit_identical_and_resume_skips() {
    let base = tmp("tree");
    let top = base.join("src/top");
    fs::create_dir_all(top.join("empty/inner")).unwrap();
    let deep = top.join("d1/d2/d3/d4/d5/d6/d7/d8");
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("deep.bin"), pattern(4097, 1)).unwrap();
    fs::write(top.join("zero"), b"").unwrap();
    fs::write(top.join("one"), b"1").unwrap();
    fs::write(
        top.join("unaligned"),
        pattern(CHUNK_SIZE as usize * 3 + 7, 2),
    )
    .unwrap();
    fs::write(top.join("grüße-日本.txt"), "héllo").unwrap();
    let sparse = fs::File::create(top.join("sparse")).unwrap();
    sparse.set_len(64 * CHUNK_SIZE + 5).unwrap();
    sparse.write_at(b"middle", 20 * CHUNK_SIZE + 3).unwrap();
    sparse.write_at(b"end", 64 * CHUNK_SIZE + 2).unwrap();
    fs::set_permissions(top.join("one"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(top.join("empty"), fs::Permissions::from_mode(0o700)).unwrap();
    let root = base.join("root");
    fs::create_dir_all(&root).unwrap();
    let opts = DiskOptions {
        streams: 3,
        ..DiskOptions::default()
    };
    let out = transfer(std::slice::from_ref(&top), &root, "in/x", &opts);
    assert!(out.report.failures.is_empty(), "{:?}", out.report.failures);
    assert!(out.sender_failures.is_empty());
    assert_eq!(out.report.files, 6);
    assert_same_tree(&top, &root.join("in/x/top"));
    // Holes stay holes on the receiver and were not sent.
    let got = fs::metadata(root.join("in/x/top/sparse")).unwrap();
    assert!(
        got.blocks() * 512 < 8 * CHUNK_SIZE,
        "sparse file was filled: {} blocks",
        got.blocks()
    );
    assert!(out.sent < 8 * CHUNK_SIZE, "sent {}", out.sent);
    // Second run: everything complete, nothing sent.
    let again = transfer(std::slice::from_ref(&top), &root, "in/x", &opts);
    assert!(again.report.failures.is_empty());
    assert_eq!(again.sent, 0);
    assert_eq!(again.report.files, 6);
    fs::remove_dir_all(&base).unwrap();
}

/// The resume sidecar an interrupted run into `root` leaves for `src`, saying
/// `verified` bytes are written and hashed; returns what it wrote.
fn write_sidecar(src: &Path, root: &Path, verified: u64) -> String {
    let md = fs::metadata(src).unwrap();
    let st = super::partial::PartState {
        size: md.len(),
        mtime_sec: md.mtime(),
        mtime_nsec: md.mtime_nsec() as u32,
        chunk_size: CHUNK_SIZE,
        verified,
    };
    let name = src.file_name().unwrap().to_str().unwrap();
    let text = serde_json::to_string(&st).unwrap();
    fs::write(root.join(super::partial::state_name(name)), &text).unwrap();
    text
}

#[test]
fn partial_file_resumes_from_verified_offset() {
    let base = tmp("resume");
    let src = base.join("big");
    let data = pattern(40 * CHUNK_SIZE as usize + 11, 3);
    fs::write(&src, &data).unwrap();
    let root = base.join("root");
    fs::create_dir_all(&root).unwrap();
    let opts = DiskOptions {
        streams: 2,
        ..DiskOptions::default()
    };
    // Fake an interrupted run: the first 20 chunks are there and verified.
    fs::write(
        root.join(".big.longhaul-part"),
        &data[..20 * CHUNK_SIZE as usize],
    )
    .unwrap();
    let sidecar = write_sidecar(&src, &root, 20 * CHUNK_SIZE);
    let out = transfer(std::slice::from_ref(&src), &root, "", &opts);
    assert!(out.report.failures.is_empty(), "{:?}", out.report.failures);
    assert_eq!(out.sent, data.len() as u64 - 20 * CHUNK_SIZE);
    assert!(fs::read(root.join("big")).unwrap() == data);
    assert!(!root.join(".big.longhaul-state").exists());
    // A damaged prefix is caught by the checksum and named.
    fs::remove_file(root.join("big")).unwrap();
    let mut bad = data[..20 * CHUNK_SIZE as usize].to_vec();
    bad[5] ^= 1;
    fs::write(root.join(".big.longhaul-part"), &bad).unwrap();
    fs::write(root.join(".big.longhaul-state"), &sidecar).unwrap();
    let out = transfer(std::slice::from_ref(&src), &root, "", &opts);
    assert_eq!(out.report.failures.len(), 1);
    assert!(
        out.report.failures[0]
            .error
            .contains("checksum mismatch for big"),
        "{:?}",
        out.report.failures
    );
    assert!(!root.join("big").exists());
    // The damaged partial was discarded, so the next run starts over and works.
    let out = transfer(std::slice::from_ref(&src), &root, "", &opts);
    assert!(out.report.failures.is_empty());
    assert!(fs::read(root.join("big")).unwrap() == data);
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_resumed_short_last_chunk_is_sent_again_not_trusted() {
    // A sidecar that says the whole file was written (saved when its final
    // sync or rename failed), over a temporary file whose short last chunk
    // never reached the disk.
    let base = tmp("resume-tail");
    let src = base.join("f");
    let data = pattern(2 * CHUNK_SIZE as usize + 5000, 9);
    fs::write(&src, &data).unwrap();
    let root = base.join("root");
    fs::create_dir_all(&root).unwrap();
    let mut on_disk = data.clone();
    on_disk[2 * CHUNK_SIZE as usize..].fill(0);
    fs::write(root.join(".f.longhaul-part"), &on_disk).unwrap();
    write_sidecar(&src, &root, data.len() as u64);
    let out = transfer(
        std::slice::from_ref(&src),
        &root,
        "",
        &DiskOptions::default(),
    );
    assert!(out.report.failures.is_empty(), "{:?}", out.report.failures);
    assert_eq!(out.sent, 5000, "the short last chunk is sent again");
    assert!(fs::read(root.join("f")).unwrap() == data);
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn escaping_manifest_paths_are_refused_and_nothing_lands_outside() {
    let base = tmp("escape");
    let root = base.join("root");
    let outside = base.join("outside");
    fs::create_dir_all(&root).unwrap();
    fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let f = base.join("f");
    fs::write(&f, b"payload").unwrap();
    let opts = DiskOptions::default();
    let mut src = SourceSet::build(std::slice::from_ref(&f), "", &opts).unwrap();
    for evil in ["../outside/f", "/tmp/evil-longhaul", "link/f", "a/./b"] {
        src.manifest.entries[0].path = evil.into();
        let (rx, plan) = ReceivePipeline::prepare(&root, &src.manifest, &opts, None).unwrap();
        assert_eq!(plan.refused.len(), 1, "{evil} not refused");
        let report = rx.finish();
        assert_eq!(report.failures.len(), 1);
    }
    src.manifest.dest = "../outside".into();
    src.manifest.entries[0].path = "f".into();
    assert!(ReceivePipeline::prepare(&root, &src.manifest, &opts, None).is_err());
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert!(!Path::new("/tmp/evil-longhaul").exists());
    fs::remove_dir_all(&base).unwrap();
}

/// A listed file gone after the walk, or a FIFO put in its place (the
/// reader does not wait for a writer that never comes): that file fails,
/// named, and the others arrive.
#[test]
fn vanished_source_is_named_and_others_continue() {
    fn remove(f: &Path) {
        fs::remove_file(f).unwrap();
    }
    fn fifo(f: &Path) {
        fs::remove_file(f).unwrap();
        let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }
    for (how, change, says) in [
        ("vanish", remove as fn(&Path), "vanished"),
        ("fifo", fifo, "no longer a regular file"),
    ] {
        let base = tmp(how);
        let top = base.join("t");
        fs::create_dir_all(&top).unwrap();
        fs::write(top.join("a"), b"aaa").unwrap();
        fs::write(top.join("b"), b"bbb").unwrap();
        let root = base.join("root");
        fs::create_dir_all(&root).unwrap();
        let opts = DiskOptions::default();
        let src = SourceSet::build(std::slice::from_ref(&top), "", &opts).unwrap();
        change(&top.join("a"));
        let Outcome {
            report,
            sender_failures,
            ..
        } = transfer_source(src, &root, &opts);
        assert_eq!(sender_failures.len(), 1, "{how}: {sender_failures:?}");
        assert!(
            sender_failures[0].error.contains(says),
            "{how}: {sender_failures:?}"
        );
        assert_eq!(report.failures.len(), 1, "{how}: {report:?}");
        assert_eq!(fs::read(root.join("t/b")).unwrap(), b"bbb", "{how}");
        fs::remove_dir_all(&base).unwrap();
    }
}

/// Writes `bytes` to `path` with the mtime of `like`: a different file
/// that size and mtime cannot tell from it.
fn look_alike(path: &Path, bytes: &[u8], like: &Path) {
    fs::write(path, bytes).unwrap();
    let mtime = fs::metadata(like).unwrap().modified().unwrap();
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(
        fs::metadata(path).unwrap().len(),
        fs::metadata(like).unwrap().len()
    );
}

/// A pull walks the served tree, then reads it. Someone who can write in
/// that tree swaps one of its directories for a symlink to a directory
/// outside the root, holding a file of the same name, size and mtime.
#[test]
fn a_pull_reads_nothing_through_a_directory_swapped_for_a_symlink() {
    let base = tmp("swap");
    let served = base.join("served");
    fs::create_dir_all(served.join("run/sub")).unwrap();
    fs::write(served.join("run/a"), b"stays").unwrap();
    fs::write(served.join("run/sub/data"), b"public bytes").unwrap();
    let secret = base.join("secret");
    fs::create_dir_all(&secret).unwrap();
    look_alike(
        &secret.join("data"),
        b"secret bytes",
        &served.join("run/sub/data"),
    );
    let opts = DiskOptions::default();
    let walked = super::walk::walk_beneath(&served, &["run".to_string()]).unwrap();
    let src = SourceSet::from_walk(walked, "", &opts).unwrap();
    fs::rename(served.join("run/sub"), base.join("moved-away")).unwrap();
    std::os::unix::fs::symlink(&secret, served.join("run/sub")).unwrap();
    let root = base.join("root");
    fs::create_dir_all(&root).unwrap();
    let Outcome {
        report,
        sender_failures,
        ..
    } = transfer_source(src, &root, &opts);
    assert_eq!(
        fs::read(root.join("run/a")).unwrap(),
        b"stays",
        "{report:?}"
    );
    assert!(
        fs::read(root.join("run/sub/data")).is_err(),
        "the file behind the symlink arrived: {report:?}"
    );
    assert_eq!(sender_failures.len(), 1, "{sender_failures:?}");
    assert!(
        sender_failures[0].error.contains("symlink component 'sub'"),
        "{sender_failures:?}"
    );
    assert_eq!(report.failures.len(), 1, "{report:?}");
    fs::remove_dir_all(&base).unwrap();
}

/// A file that changed after the walk is not sent as the one listed: grown
/// in place, or replaced under its name by another file of the same size
/// and mtime.
#[test]
fn source_changed_before_reading_is_named() {
    fn grow(f: &Path) {
        fs::write(f, b"after, longer").unwrap();
    }
    fn replace(f: &Path) {
        let other = f.with_extension("other");
        look_alike(&other, b"OTHER!", f);
        fs::rename(&other, f).unwrap();
    }
    for (how, change) in [("grown", grow as fn(&Path)), ("replaced", replace)] {
        let base = tmp(&format!("changed-{how}"));
        let f = base.join("f");
        fs::write(&f, b"before").unwrap();
        let root = base.join("root");
        fs::create_dir_all(&root).unwrap();
        let opts = DiskOptions::default();
        let src = SourceSet::build(std::slice::from_ref(&f), "", &opts).unwrap();
        change(&f);
        let Outcome {
            report,
            sender_failures,
            ..
        } = transfer_source(src, &root, &opts);
        assert_eq!(sender_failures.len(), 1, "{how}: {sender_failures:?}");
        assert_eq!(sender_failures[0].code, "source_changed", "{how}");
        assert!(
            report.failures[0]
                .error
                .contains("source changed during read"),
            "{how}: {:?}",
            report.failures
        );
        assert!(!root.join("f").exists(), "{how}");
        fs::remove_dir_all(&base).unwrap();
    }
}

#[test]
fn each_device_group_is_read_by_its_own_workers_and_counted() {
    use super::devices::DeviceGroup;
    use super::reader::{SendItem, SendPipeline};
    use std::sync::atomic::Ordering;

    let base = tmp("groups");
    let mut items = Vec::new();
    for (id, (size, group)) in [(3 * CHUNK_SIZE, 0), (2 * CHUNK_SIZE + 1, 1), (5, 1)]
        .iter()
        .enumerate()
    {
        let p = base.join(format!("f{id}"));
        fs::write(&p, pattern(*size as usize, id as u8)).unwrap();
        let md = fs::metadata(&p).unwrap();
        items.push(SendItem {
            id: id as u32,
            rel: format!("f{id}"),
            src: super::walk::SourcePath::Local(p),
            size: *size,
            mtime: (md.mtime(), md.mtime_nsec() as u32),
            ino: md.ino(),
            sparse: false,
            group: *group,
            from: 0,
        });
    }
    let groups = vec![
        Arc::new(DeviceGroup::new("sda".into(), "0000:03:00.0".into())),
        Arc::new(DeviceGroup::new("sdb".into(), "0000:04:00.0".into())),
    ];
    let opts = DiskOptions {
        streams: 2,
        io_workers_per_device: 2,
        ..DiskOptions::default()
    };
    let p = SendPipeline::start(items, groups.clone(), &opts);
    let plane = longhaul_core::memory_plane::MemoryPlane::from_env().unwrap();
    let sent = run_pairs(
        2,
        || {
            Box::new(DiskSource {
                feed: Feed::new(p.clone()),
            })
        },
        || crate::datapath::DataPlane::sink(&plane, 0).unwrap(),
    );
    assert!(p.finish().is_empty());
    assert_eq!(sent, 5 * CHUNK_SIZE + 6);
    assert_eq!(groups[0].read_bytes.load(Ordering::Relaxed), 3 * CHUNK_SIZE);
    assert_eq!(
        groups[1].read_bytes.load(Ordering::Relaxed),
        2 * CHUNK_SIZE + 6
    );
    fs::remove_dir_all(&base).unwrap();
}

/// A manifest of one file, `size` bytes, as a client could send it.
fn manifest_of(path: &str, size: u64, sparse: bool) -> super::wire::Manifest {
    super::wire::Manifest {
        dest: String::new(),
        resume: false,
        chunk_size: CHUNK_SIZE,
        entries: vec![super::wire::ManifestEntry {
            id: 0,
            path: path.into(),
            dir: false,
            size,
            mode: 0o644,
            mtime_sec: 0,
            mtime_nsec: 0,
            sparse,
            device: "x".into(),
            checksum: None,
        }],
    }
}

/// Runs `rx`'s intake on one end of a loopback pair while `frames` writes
/// raw frames into the other; returns how the receiving stream ended.
fn receive_raw(
    rx: &Arc<ReceivePipeline>,
    frames: impl FnOnce(&mut std::io::BufWriter<TcpStream>) -> std::io::Result<()> + Send + 'static,
) -> longhaul_core::Result<u64> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    let sender = std::thread::spawn(move || {
        let mut out = std::io::BufWriter::new(a);
        // The receiver may hang up in the middle: that is the point.
        let _ = frames(&mut out).and_then(|()| std::io::Write::flush(&mut out));
    });
    let (tx, done) = mpsc::channel();
    let finished: stream::Finished = Box::new(move |r| {
        let _ = tx.send(r);
    });
    let sink = Box::new(DiskSink {
        intake: Intake::new(rx.clone()),
    });
    stream::start(vec![(
        Arc::new(StreamStats::new(0, Role::Receive, b)),
        Work::Receive(sink),
        finished,
    )])
    .unwrap();
    let r = done
        .recv_timeout(Duration::from_secs(120))
        .expect("the stream ends");
    sender.join().unwrap();
    r
}

/// A sender that never sends a file's first chunk, then a `Hole` frame for
/// each chunk after it: each would wait in the file's digest for chunk 0,
/// one B-tree entry per 32-byte frame. Past the session's bound the stream
/// fails with a protocol error naming the file, and what waits stays
/// within the bound.
#[test]
fn holes_ahead_of_a_missing_chunk_are_refused_past_the_bound() {
    use super::wire::{write_frame, FrameHeader, FrameKind};
    use super::writer::MAX_PARKED_BLOCKS;

    let base = tmp("hole-flood");
    let root = base.join("root");
    fs::create_dir_all(&root).unwrap();
    // Sparse: the receiver only sets its size (4 TiB, within ext4's 16).
    let manifest = manifest_of("huge", 4 << 40, true);
    let opts = DiskOptions::default();
    let (rx, plan) = ReceivePipeline::prepare(&root, &manifest, &opts, None).unwrap();
    assert!(plan.refused.is_empty(), "{plan:?}");
    let sent = MAX_PARKED_BLOCKS as u64 + 50_000;
    let r = receive_raw(&rx, move |out| {
        for k in 1..=sent {
            let mut h = FrameHeader::new(FrameKind::Hole, 0);
            h.offset = k * CHUNK_SIZE;
            h.value = CHUNK_SIZE;
            write_frame(out, &h, &[])?;
        }
        write_frame(out, &FrameHeader::new(FrameKind::EndOfStream, 0), &[])
    });
    let err = r.expect_err("the flood was taken whole").to_string();
    assert!(
        err.contains("block for huge refused") && err.contains("wait for earlier chunks"),
        "{err}"
    );
    // Beyond the bound only what the writer's queue held when the stream
    // failed (4 frames) got parked.
    let parked = rx.parked_blocks();
    assert!(
        (MAX_PARKED_BLOCKS..MAX_PARKED_BLOCKS + 16).contains(&parked),
        "{parked} blocks parked"
    );
    let report = rx.finish();
    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert_eq!(report.failures[0].path, "huge");
    fs::remove_dir_all(&base).unwrap();
}

/// Sizes come from the client: an entry beyond the largest file a receiver
/// takes is refused by name (a `Hole` frame over 2^62 bytes held a writer
/// for hours), one of exactly that size is not.
#[test]
fn a_manifest_entry_beyond_the_size_limit_is_refused_by_name() {
    use super::MAX_FILE_SIZE;

    let base = tmp("too-big");
    let root = base.join("root");
    fs::create_dir_all(&root).unwrap();
    let mut manifest = manifest_of("too-big", 1 << 62, true);
    let mut at_limit = manifest.entries[0].clone();
    at_limit.id = 1;
    at_limit.path = "at-limit".into();
    at_limit.size = MAX_FILE_SIZE;
    manifest.entries.push(at_limit);
    let opts = DiskOptions::default();
    let (rx, plan) = ReceivePipeline::prepare(&root, &manifest, &opts, None).unwrap();
    assert_eq!(plan.refused.len(), 1, "{plan:?}");
    let refused = &plan.refused[0];
    assert_eq!((refused.id, refused.code.as_str()), (0, "refused"));
    assert!(
        refused.error.contains("too-big")
            && refused.error.contains("largest file this receiver takes"),
        "{refused:?}"
    );
    let report = rx.finish();
    assert_eq!(report.failures.len(), 2, "{report:?}");
    fs::remove_dir_all(&base).unwrap();
}

/// Many streams reorder a file's chunks the most: 64 streams carrying a
/// sparse file (a hole frame between most data frames) and a file of many
/// chunks stay far below the parked-block bound and round-trip.
#[test]
fn sixty_four_streams_with_sparse_and_many_chunk_files_round_trip() {
    let base = tmp("many-streams");
    let top = base.join("src/top");
    fs::create_dir_all(&top).unwrap();
    fs::write(top.join("long"), pattern(200 * CHUNK_SIZE as usize + 9, 7)).unwrap();
    let sparse = fs::File::create(top.join("sparse")).unwrap();
    sparse.set_len(300 * CHUNK_SIZE + 5).unwrap();
    for i in (0..300).step_by(3) {
        sparse
            .write_at(&pattern(4096, i as u8), i * CHUNK_SIZE + 100)
            .unwrap();
    }
    let root = base.join("root");
    fs::create_dir_all(&root).unwrap();
    let opts = DiskOptions {
        streams: 64,
        resume: false,
        ..DiskOptions::default()
    };
    let out = transfer(std::slice::from_ref(&top), &root, "in", &opts);
    assert!(out.report.failures.is_empty(), "{:?}", out.report.failures);
    assert!(out.sender_failures.is_empty());
    assert_eq!(out.report.files, 2);
    assert_same_tree(&top, &root.join("in/top"));
    fs::remove_dir_all(&base).unwrap();
}

/// A manifest of `n` files `f0`.. of `size` bytes each.
fn files_manifest(n: usize, size: u64, sparse: bool) -> super::wire::Manifest {
    let mut m = manifest_of("f0", size, sparse);
    let first = m.entries[0].clone();
    m.entries = (0..n)
        .map(|i| super::wire::ManifestEntry {
            id: i as u32,
            path: format!("f{i}"),
            ..first.clone()
        })
        .collect();
    m
}

/// A manifest of `n` sparse files `f0`.. of one chunk and one byte each.
fn two_chunk_files(n: usize) -> super::wire::Manifest {
    files_manifest(n, CHUNK_SIZE + 1, true)
}

/// Writes what a sender of [`two_chunk_files`] sends for file `i` in one of
/// two passes: a hole over its first chunk, or its last byte and its end.
fn two_chunk_pass(
    out: &mut std::io::BufWriter<TcpStream>,
    n: usize,
    first_pass: bool,
) -> std::io::Result<()> {
    use super::checksum::{chunk_hash, zero_chunk_hash, FileDigest};
    use super::wire::{write_frame, FrameHeader, FrameKind};
    for i in 0..n as u32 {
        if first_pass {
            let mut h = FrameHeader::new(FrameKind::Hole, i);
            h.value = CHUNK_SIZE;
            write_frame(out, &h, &[])?;
            continue;
        }
        let byte = [i as u8 | 1];
        let mut h = FrameHeader::new(FrameKind::Data, i);
        h.offset = CHUNK_SIZE;
        h.len = 1;
        write_frame(out, &h, &byte)?;
        let mut d = FileDigest::default();
        d.push(zero_chunk_hash(CHUNK_SIZE));
        d.push(chunk_hash(&byte));
        let mut h = FrameHeader::new(FrameKind::End, i);
        h.value = d.finish();
        write_frame(out, &h, &[])?;
    }
    std::io::Write::flush(out)
}

/// A sender with more files in progress than a writer keeps open (a hole
/// for the first chunk of each of 3 x MAX_OPEN_FILES files, then the last
/// byte and the end of each): the writer never holds more than
/// MAX_OPEN_FILES open (before, one per file: a sender could open every
/// manifest entry and run the server out of descriptors), reopens the
/// files it closed for room, and every file arrives complete and verified.
#[test]
fn more_files_in_progress_than_a_writer_keeps_open_arrive_verified() {
    use super::wire::{write_frame, FrameHeader, FrameKind};
    use super::writer::MAX_OPEN_FILES;

    // One writer, and eight sharing the session's budget.
    for writers in [1, 8] {
        let base = tmp(&format!("wide-{writers}"));
        let root = base.join("root");
        fs::create_dir_all(&root).unwrap();
        let n = 3 * MAX_OPEN_FILES;
        let opts = DiskOptions {
            io_workers_per_device: writers,
            ..DiskOptions::default()
        };
        let (rx, plan) = ReceivePipeline::prepare(&root, &two_chunk_files(n), &opts, None).unwrap();
        assert!(plan.refused.is_empty(), "{plan:?}");
        assert_eq!(rx.writers(), writers);
        let r = receive_raw(&rx, move |out| {
            two_chunk_pass(out, n, true)?;
            two_chunk_pass(out, n, false)?;
            write_frame(out, &FrameHeader::new(FrameKind::EndOfStream, 0), &[])
        });
        r.expect("the stream ends well");
        let report = rx.finish();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.files, n as u64);
        let peak = rx.open_files_peak();
        assert!(
            peak <= MAX_OPEN_FILES && peak > MAX_OPEN_FILES / 2,
            "{peak} files open at once with {writers} writer(s)"
        );
        for i in 0..n {
            let got = fs::read(root.join(format!("f{i}"))).unwrap();
            assert_eq!(got.len() as u64, CHUNK_SIZE + 1, "f{i}");
            assert_eq!(got[CHUNK_SIZE as usize], i as u8 | 1, "f{i}");
            assert!(got[..CHUNK_SIZE as usize].iter().all(|&b| b == 0), "f{i}");
        }
        let leftovers: Vec<_> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|name| name.to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        fs::remove_dir_all(&base).unwrap();
    }
}

/// A chunk sent twice with other bytes, or data where a hole was sent: the
/// second frame's bytes would land on disk while the digest vouches for
/// the first's, so the file fails, named; an honest file beside them
/// arrives.
#[test]
fn a_chunk_sent_twice_fails_its_file() {
    use super::checksum::checksum_bytes;
    use super::wire::{write_frame, FrameHeader, FrameKind};

    let base = tmp("twice");
    let root = base.join("root");
    fs::create_dir_all(&root).unwrap();
    let manifest = files_manifest(3, 1, false);
    let opts = DiskOptions::default();
    let (rx, plan) = ReceivePipeline::prepare(&root, &manifest, &opts, None).unwrap();
    assert!(plan.refused.is_empty(), "{plan:?}");
    let r = receive_raw(&rx, move |out| {
        let data = |out: &mut std::io::BufWriter<TcpStream>, file: u32, byte: u8| {
            let mut h = FrameHeader::new(FrameKind::Data, file);
            h.len = 1;
            write_frame(out, &h, &[byte])
        };
        let end = |out: &mut std::io::BufWriter<TcpStream>, file: u32, byte: u8| {
            let mut h = FrameHeader::new(FrameKind::End, file);
            h.value = checksum_bytes(&[byte]);
            write_frame(out, &h, &[])
        };
        // f0: its chunk, then the same chunk with other bytes.
        data(out, 0, b'a')?;
        std::io::Write::flush(out)?;
        std::thread::sleep(Duration::from_millis(300));
        data(out, 0, b'b')?;
        end(out, 0, b'a')?;
        // f1: a hole over its chunk, then data there.
        let mut h = FrameHeader::new(FrameKind::Hole, 1);
        h.value = 1;
        write_frame(out, &h, &[])?;
        data(out, 1, b'c')?;
        end(out, 1, 0)?;
        // f2: honest.
        data(out, 2, b'd')?;
        end(out, 2, b'd')?;
        write_frame(out, &FrameHeader::new(FrameKind::EndOfStream, 0), &[])
    });
    r.expect("the stream ends well");
    let report = rx.finish();
    assert_eq!(report.files, 1, "{report:?}");
    let failed: Vec<_> = report.failures.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(failed, ["f0", "f1"], "{report:?}");
    for f in &report.failures {
        assert!(f.error.contains("sent chunk 0 again"), "{f:?}");
    }
    assert_eq!(fs::read(root.join("f2")).unwrap(), b"d");
    assert!(!root.join("f0").exists() && !root.join("f1").exists());
    fs::remove_dir_all(&base).unwrap();
}

/// A file closed for room whose temporary file someone writes into (or
/// replaces) before its next frame: its digest would vouch for bytes this
/// session did not write, so it fails, named; the others arrive.
#[test]
fn a_file_changed_while_closed_for_room_fails_by_name() {
    use super::partial::part_name;
    use super::wire::{write_frame, FrameHeader, FrameKind};
    use super::writer::MAX_OPEN_FILES;

    for replace in [false, true] {
        let base = tmp(if replace {
            "closed-replaced"
        } else {
            "closed-written"
        });
        let root = base.join("root");
        fs::create_dir_all(&root).unwrap();
        let n = MAX_OPEN_FILES + 1;
        let opts = DiskOptions::default();
        let (rx, plan) = ReceivePipeline::prepare(&root, &two_chunk_files(n), &opts, None).unwrap();
        assert!(plan.refused.is_empty(), "{plan:?}");
        let dir = root.clone();
        let r = receive_raw(&rx, move |out| {
            two_chunk_pass(out, n, true)?;
            // The last file's opening closed f0, the least recently used.
            let last = dir.join(part_name(&format!("f{}", n - 1)));
            let t0 = std::time::Instant::now();
            while !last.exists() {
                assert!(t0.elapsed() < Duration::from_secs(60), "never opened");
                std::thread::sleep(Duration::from_millis(5));
            }
            let f0 = dir.join(part_name("f0"));
            if replace {
                fs::remove_file(&f0).unwrap();
                fs::File::create(&f0)
                    .unwrap()
                    .set_len(CHUNK_SIZE + 1)
                    .unwrap();
            } else {
                fs::OpenOptions::new()
                    .write(true)
                    .open(&f0)
                    .unwrap()
                    .write_at(b"not ours", 100)
                    .unwrap();
            }
            two_chunk_pass(out, n, false)?;
            write_frame(out, &FrameHeader::new(FrameKind::EndOfStream, 0), &[])
        });
        r.expect("the stream ends well");
        let report = rx.finish();
        assert_eq!(report.files, n as u64 - 1, "replace={replace}");
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        let f = &report.failures[0];
        assert_eq!(f.path, "f0");
        assert!(
            f.error.contains("f0") && f.error.contains("changed by someone else"),
            "{f:?}"
        );
        assert!(!root.join("f0").exists(), "replace={replace}");
        fs::remove_dir_all(&base).unwrap();
    }
}
