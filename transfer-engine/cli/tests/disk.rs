//! Disk-to-disk integration tests: the real `longhaul` binary on loopback,
//! port 0. Every test builds its own trees under a temp dir, starts its own
//! server and cleans up after itself (servers are killed on drop, mounts are
//! unmounted on drop).

// A test reads as one scenario, top to bottom: the workspace's bound on a
// function's length (clippy.toml) is for the code under test.
#![allow(clippy::too_many_lines)]

mod support;

use std::fs::{self, File, FileTimes};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{Output, Running, Scratch, Server, RUN_TIMEOUT};

const MIB: u64 = 1 << 20;

// ------------------------------------------------------------ helpers

impl Output {
    /// The last JSON line of stdout (`send --json`).
    fn json(&self) -> serde_json::Value {
        let last = self
            .stdout
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap_or_else(|| {
                panic!(
                    "no JSON in stdout {:?}; stderr {:?}",
                    self.stdout, self.stderr
                )
            });
        serde_json::from_str(last).unwrap()
    }
}

/// Starts `longhaul send ARGS...`.
fn spawn_send(args: &[&str]) -> Running {
    let mut all = vec!["send"];
    all.extend_from_slice(args);
    support::spawn(&all)
}

/// Runs `longhaul send ARGS...` to completion.
fn send(args: &[&str]) -> Output {
    spawn_send(args).wait(RUN_TIMEOUT)
}

/// Deterministic, chunk-varying contents.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn set_mtime(path: &Path, secs: u64, nanos: u32) {
    let t = UNIX_EPOCH + Duration::new(secs, nanos);
    File::open(path)
        .unwrap()
        .set_times(FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

fn same_contents(a: &Path, b: &Path) -> bool {
    let (fa, fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    let (mut ba, mut bb) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    let mut off = 0;
    loop {
        let na = fa.read_at(&mut ba, off).unwrap();
        let nb = fb.read_at(&mut bb, off).unwrap();
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
        off += na as u64;
    }
}

/// Contents, sizes, modes, mtimes (to the nanosecond) and entries of two
/// trees are equal.
fn assert_same_tree(a: &Path, b: &Path) {
    let (ma, mb) = (
        fs::symlink_metadata(a).unwrap(),
        fs::symlink_metadata(b).unwrap(),
    );
    let what = b.display();
    assert_eq!(ma.is_dir(), mb.is_dir(), "kind of {what}");
    assert_eq!(
        ma.permissions().mode() & 0o7777,
        mb.permissions().mode() & 0o7777,
        "mode of {what}"
    );
    assert_eq!(
        (ma.mtime(), ma.mtime_nsec()),
        (mb.mtime(), mb.mtime_nsec()),
        "mtime of {what}"
    );
    if ma.is_dir() {
        let names = |p: &Path| {
            let mut v: Vec<_> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        let (na, nb) = (names(a), names(b));
        assert_eq!(na, nb, "entries of {what}");
        for n in na {
            assert_same_tree(&a.join(&n), &b.join(&n));
        }
    } else {
        assert_eq!(ma.len(), mb.len(), "size of {what}");
        assert!(same_contents(a, b), "contents of {what}");
    }
}

// ------------------------------------------------------------ tests

#[test]
fn tree_with_edge_cases_arrives_bit_identical() {
    let t = Scratch::new("tree");
    let top = t.0.join("src/tree");
    let deep = top.join("d01/d02/d03/d04/d05/d06/d07/d08/d09/d10/d11/d12");
    fs::create_dir_all(&deep).unwrap();
    fs::create_dir_all(top.join("empty-dir/also-empty")).unwrap();
    fs::write(top.join("zero-bytes"), b"").unwrap();
    fs::write(top.join("one-byte"), b"x").unwrap();
    fs::write(top.join("unaligned.bin"), pattern((MIB + 7) as usize, 1)).unwrap();
    fs::write(top.join("Grüße, 世界 🚀.txt"), "unicode name\n").unwrap();
    fs::write(deep.join("deep.bin"), pattern(4099, 2)).unwrap();
    // 1 GiB apparent size, a few real bytes: holes must not cross the wire.
    let sparse = File::create(top.join("sparse.img")).unwrap();
    sparse.set_len(1 << 30).unwrap();
    sparse.write_at(b"head", 0).unwrap();
    sparse.write_at(b"middle", 300 * MIB + 5).unwrap();
    sparse.write_at(b"tail", (1 << 30) - 4).unwrap();
    drop(sparse);
    fs::set_permissions(top.join("one-byte"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(top.join("unaligned.bin"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(top.join("empty-dir"), fs::Permissions::from_mode(0o750)).unwrap();
    for (i, f) in ["zero-bytes", "one-byte", "unaligned.bin", "sparse.img"]
        .iter()
        .enumerate()
    {
        set_mtime(&top.join(f), 1_600_000_000 + i as u64, 123_456_789);
    }
    set_mtime(&top.join("empty-dir/also-empty"), 1_500_000_000, 7);
    set_mtime(&top.join("empty-dir"), 1_500_000_001, 8);
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let out = send(&[
        "--to",
        &server.addr(),
        "--streams",
        "4",
        // O_DIRECT on both ends (buffered where the file system refuses):
        // unaligned tails and holes must survive it.
        "--direct",
        "--json",
        top.to_str().unwrap(),
        "--dest",
        "in/coming",
    ]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let j = out.json();
    assert_eq!(j["mode"], "disk");
    assert_eq!(j["files"]["verified"], true, "{j}");
    assert_eq!(j["files"]["count"], 6, "{j}");
    assert!(
        j["bytes"].as_u64().unwrap() < 16 * MIB,
        "holes were sent: {j}"
    );
    let devices = j["devices"].as_array().unwrap();
    assert!(
        devices.iter().any(|d| d["side"] == "sender"
            && d["controller"].is_string()
            && d["read_bytes"].as_u64() > Some(MIB)),
        "{j}"
    );
    assert!(
        devices.iter().any(|d| d["side"] == "receiver"
            && d["controller"].is_string()
            && d["written_bytes"].as_u64() > Some(MIB)),
        "{j}"
    );
    // The stats API keeps the finished session, with its device counters.
    let snap = server.sessions();
    let session = &snap["sessions"][0];
    assert_eq!(session["mode"], "disk", "{snap}");
    let dev = &session["devices"][0];
    assert!(
        dev["controller"].is_string() && dev["written_bytes"].as_u64() > Some(MIB),
        "{snap}"
    );
    let got = root.join("in/coming/tree");
    assert_same_tree(&top, &got);
    let blocks = fs::metadata(got.join("sparse.img")).unwrap().blocks();
    assert!(
        blocks * 512 < 64 * MIB,
        "the sparse file was filled on the receiver ({blocks} blocks)"
    );
    // No temporary files or sidecars are left behind.
    let leftovers = walk_names(&root)
        .into_iter()
        .filter(|n| n.contains(".longhaul-"))
        .count();
    assert_eq!(leftovers, 0);
}

fn walk_names(p: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir(p).unwrap() {
        let e = e.unwrap();
        out.push(e.file_name().to_string_lossy().into_owned());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk_names(&e.path()));
        }
    }
    out
}

/// Three files of ~24 MiB under `top` (contents seeded by `seed`) for the
/// resume tests; returns their total size.
fn resume_sources(top: &Path, seed: u32) -> u64 {
    fs::create_dir_all(top).unwrap();
    let sizes = [24 * MIB + 3, 24 * MIB, 24 * MIB + MIB / 2];
    for (i, s) in sizes.iter().enumerate() {
        fs::write(
            top.join(format!("f{i}.bin")),
            pattern(*s as usize, i as u32 + seed),
        )
        .unwrap();
    }
    sizes.iter().sum()
}

/// Kills `server` as soon as the receiver saved progress under `written`
/// (a resume sidecar), and checks that the transfer `first` then fails.
fn kill_once_progress_is_saved(server: &mut Server, first: Running, written: &Path) {
    let end = Instant::now() + Duration::from_secs(20);
    let has_sidecar = || {
        written.exists()
            && walk_names(written)
                .iter()
                .any(|n| n.ends_with(".longhaul-state"))
    };
    while !has_sidecar() {
        assert!(Instant::now() < end, "no progress was saved");
        std::thread::sleep(Duration::from_millis(5));
    }
    server.kill();
    let first = first.wait(RUN_TIMEOUT);
    assert_eq!(
        first.code,
        Some(1),
        "the first run must fail: {}",
        first.stderr
    );
}

#[test]
fn resume_after_receiver_kill_sends_less() {
    let t = Scratch::new("resume");
    let top = t.0.join("src/data");
    let total = resume_sources(&top, 10);
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let mut server = Server::with_root(&root);
    // 400 Mb/s: the 72 MiB take ~1.5 s, so the kill lands mid-transfer.
    let first = spawn_send(&[
        "--to",
        &server.addr(),
        "--streams",
        "3",
        "--rate",
        "400M",
        "--json",
        top.to_str().unwrap(),
    ]);
    kill_once_progress_is_saved(&mut server, first, &root);
    // Restart the receiver on the same root and run the same command again.
    let server = Server::with_root(&root);
    let second = send(&[
        "--to",
        &server.addr(),
        "--streams",
        "3",
        "--json",
        top.to_str().unwrap(),
    ]);
    assert_eq!(second.code, Some(0), "stderr: {}", second.stderr);
    let j = second.json();
    // A file the first run completed is skipped on size and mtime: it is
    // there, but this run did not compare its content, so only a run that
    // sent (or compared) everything may say "verified".
    let unverified = j["files"]["skipped_unverified"].as_u64().unwrap();
    assert_eq!(j["files"]["verified"], unverified == 0, "{j}");
    assert_eq!(j["files"]["count"], 3);
    assert_eq!(
        j["files"]["sent"].as_u64().unwrap() + j["files"]["skipped"].as_u64().unwrap(),
        3,
        "{j}"
    );
    let sent = j["bytes"].as_u64().unwrap();
    assert!(
        sent < total,
        "resume sent {sent} of {total} bytes: nothing was resumed ({j})"
    );
    assert!(
        j["files"]["resumed"].as_u64().unwrap() + j["files"]["skipped"].as_u64().unwrap() >= 1,
        "{j}"
    );
    assert_same_tree(&top, &root.join("data"));
    assert!(!walk_names(&root).iter().any(|n| n.contains(".longhaul-")));
    // --checksum compares every file's content: nothing to send, verified.
    let third = send(&[
        "--to",
        &server.addr(),
        "--checksum",
        "--json",
        top.to_str().unwrap(),
    ]);
    assert_eq!(third.code, Some(0), "stderr: {}", third.stderr);
    let j = third.json();
    assert_eq!(j["files"]["verified"], true, "{j}");
    assert_eq!(j["files"]["skipped"], 3, "{j}");
    assert_eq!(j["files"]["skip_check"], "checksum", "{j}");
    assert_eq!(j["bytes"], 0, "{j}");
}

#[test]
fn leftover_temporary_files_are_not_sent() {
    // A tree that holds what an interrupted transfer into it left behind.
    let t = Scratch::new("leftovers");
    let top = t.0.join("src/data");
    fs::create_dir_all(&top).unwrap();
    let data = pattern(3 * MIB as usize + 7, 11);
    fs::write(top.join("big"), &data).unwrap();
    fs::write(top.join(".big.longhaul-part"), &data[..MIB as usize]).unwrap();
    fs::write(top.join(".big.longhaul-state"), b"{\"verified\": 1048576}").unwrap();
    fs::write(top.join(".big.longhaul-state.tmp"), b"{").unwrap();
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let out = send(&["--to", &server.addr(), "--json", top.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains(".big.longhaul-part (a temporary file"),
        "{}",
        out.stderr
    );
    let j = out.json();
    assert_eq!(j["files"]["count"], 1, "{j}");
    assert_eq!(j["files"]["verified"], true, "{j}");
    assert!(fs::read(root.join("data/big")).unwrap() == data);
    assert_eq!(walk_names(&root.join("data")), ["big"]);
}

/// Threads of process `pid` named `name` (their `comm`).
fn threads_named(pid: u32, name: &str) -> usize {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

#[test]
fn a_killed_pushing_client_leaves_no_writer_behind() {
    let t = Scratch::new("killed-pusher");
    let top = t.0.join("src");
    fs::create_dir_all(&top).unwrap();
    let data = pattern(48 * MIB as usize + 5, 7);
    fs::write(top.join("big.bin"), &data).unwrap();
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let writers = || threads_named(server.pid(), "lh-disk-write");
    // 100 Mb/s: the 48 MiB take ~4 s; the client dies a second into them.
    let mut first = spawn_send(&[
        "--to",
        &server.addr(),
        "--streams",
        "3",
        "--rate",
        "100M",
        top.to_str().unwrap(),
    ]);
    let end = Instant::now() + Duration::from_secs(20);
    while writers() == 0 {
        assert!(Instant::now() < end, "the server started no disk writer");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_secs(1));
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    // The session fails on the server: its writers end (before, they waited
    // for more work forever, holding the buffer pool and the open file), and
    // save what arrived for resume first.
    let end = Instant::now() + Duration::from_secs(15);
    while writers() > 0 {
        assert!(
            Instant::now() < end,
            "{} disk writer thread(s) outlived the failed session",
            writers()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let state = root.join("src/.big.bin.longhaul-state");
    let saved: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&state).expect("a resume sidecar")).unwrap();
    assert!(saved["verified"].as_u64().unwrap() > 0, "{saved}");
    // The next run resumes from there and completes the file.
    let second = send(&[
        "--to",
        &server.addr(),
        "--streams",
        "3",
        "--json",
        top.to_str().unwrap(),
    ]);
    assert_eq!(second.code, Some(0), "stderr: {}", second.stderr);
    let j = second.json();
    assert_eq!(j["files"]["resumed"], 1, "{j}");
    assert_eq!(j["files"]["verified"], true, "{j}");
    assert!(fs::read(root.join("src/big.bin")).unwrap() == data);
}

/// A tmpfs mounted for one test, unmounted on drop.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn full_filesystem_names_the_file_and_server_survives() {
    let t = Scratch::new("full");
    let root = t.0.join("root");
    let small = root.join("small");
    fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&small)
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        longhaul_testkit::cannot_run("cannot mount a tmpfs here (needs root)");
        return;
    }
    let _mount = Mount(small.clone());
    let src = t.0.join("src/big");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("part-a.bin"), pattern((6 * MIB) as usize, 3)).unwrap();
    fs::write(src.join("part-b.bin"), pattern((14 * MIB) as usize, 4)).unwrap();
    let mut server = Server::with_root(&root);
    let out = send(&[
        "--to",
        &server.addr(),
        "--streams",
        "2",
        "--json",
        src.to_str().unwrap(),
        "--dest",
        "small",
    ]);
    assert_eq!(
        out.code,
        Some(1),
        "stdout {} stderr {}",
        out.stdout,
        out.stderr
    );
    // The final object says why and what landed: every file not named
    // among the failures arrived verified.
    let j = out.json();
    assert_eq!(j["ok"], false, "{j}");
    assert_eq!(j["error"]["kind"], "disk_full", "{j}");
    let failed = failed_paths(&j);
    assert!(
        failed.iter().any(|f| f.ends_with("part-b.bin")),
        "{failed:?}: {j}"
    );
    assert_eq!(
        j["files"]["count"].as_u64().unwrap() + failed.len() as u64,
        2,
        "{j}"
    );
    for name in ["part-a.bin", "part-b.bin"] {
        if !failed.iter().any(|f| f.ends_with(name)) {
            assert!(same_contents(
                &src.join(name),
                &small.join("big").join(name)
            ));
        }
    }
    let err = out.stderr.to_lowercase();
    assert!(
        err.contains("disk full") && err.contains("no space"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("part-b.bin"),
        "the error must name the file: {}",
        out.stderr
    );
    // The server keeps serving.
    assert!(server.is_running(), "server died: {}", server.stderr());
    let ok = send(&[
        "--to",
        &server.addr(),
        src.join("part-a.bin").to_str().unwrap(),
        "--dest",
        "elsewhere",
    ]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    assert!(same_contents(
        &src.join("part-a.bin"),
        &root.join("elsewhere/part-a.bin")
    ));
}

/// The paths of the failed files a final object lists.
fn failed_paths(j: &serde_json::Value) -> Vec<String> {
    j["files"]["failures"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| f["path"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// One file of a tree grows while it is being read (as a log being
/// written): that file fails, named on stderr and in the final object,
/// and the other seven land verified, as rsync goes on past a file that
/// vanished. Before, the `Fail` frame's message counted as stream bytes
/// on the sender only, and the whole tree failed on a byte count.
#[test]
fn a_file_that_grows_while_it_is_sent_fails_alone_and_is_named() {
    let t = Scratch::new("grows");
    let top = t.0.join("src/tree");
    fs::create_dir_all(&top).unwrap();
    // f3 is larger than what the sender reads ahead (its buffer pool), so
    // it is still being read when it grows.
    for i in 0..8u64 {
        let len = if i == 3 { 48 * MIB } else { MIB + i };
        let name = top.join(format!("f{i}"));
        fs::write(name, pattern(len as usize, 60 + i as u32)).unwrap();
    }
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let run = spawn_send(&[
        "--to",
        &server.addr(),
        "--streams",
        "2",
        "--rate",
        "150M",
        "--json",
        top.to_str().unwrap(),
    ]);
    // f3 is on its way once its temporary file is on the receiver.
    let part = root.join("tree/.f3.longhaul-part");
    let end = Instant::now() + Duration::from_secs(20);
    while !part.exists() {
        assert!(Instant::now() < end, "f3 never started");
        std::thread::sleep(Duration::from_millis(2));
    }
    let grown = fs::OpenOptions::new()
        .append(true)
        .open(top.join("f3"))
        .unwrap();
    (&grown).write_all(b"one more line\n").unwrap();
    drop(grown);
    let out = run.wait(RUN_TIMEOUT);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("tree/f3") && out.stderr.contains("source changed"),
        "stderr must name the file: {}",
        out.stderr
    );
    let j = out.json();
    assert_eq!(j["ok"], false, "{j}");
    assert_eq!(j["error"]["kind"], "incomplete", "{j}");
    assert!(
        j["error"]["message"].as_str().unwrap().contains("tree/f3"),
        "{j}"
    );
    assert_eq!(failed_paths(&j), ["tree/f3"], "{j}");
    assert_eq!(j["files"]["failures"][0]["code"], "source_changed", "{j}");
    assert_eq!(j["files"]["count"], 7, "{j}");
    for i in (0..8).filter(|&i| i != 3) {
        let name = format!("f{i}");
        assert!(
            same_contents(&top.join(&name), &root.join("tree").join(&name)),
            "{name}"
        );
    }
    assert!(!root.join("tree/f3").exists());
}

/// `sent_bytes` counts what this run sent: a 256 MiB file resumed after
/// the receiver was killed reports only the rest (it reported the whole
/// file), while `verified_bytes` still covers all of it.
#[test]
fn a_resumed_file_reports_only_the_bytes_this_run_sent() {
    let t = Scratch::new("resumed-bytes");
    let top = t.0.join("src/big");
    fs::create_dir_all(&top).unwrap();
    let size = 256 * MIB;
    fs::write(top.join("f.bin"), pattern(size as usize, 77)).unwrap();
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let mut server = Server::with_root(&root);
    let args = |addr: &str| -> Vec<String> {
        ["--to", addr, "--json", top.to_str().unwrap()]
            .map(str::to_string)
            .to_vec()
    };
    let mut first = args(&server.addr());
    first.extend(["--rate".to_string(), "800M".to_string()]);
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    kill_once_progress_is_saved(&mut server, spawn_send(&first), &root);
    let server = Server::with_root(&root);
    let second = args(&server.addr());
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    let out = send(&second);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let j = out.json();
    assert_eq!(j["ok"], true, "{j}");
    assert_eq!(j["files"]["resumed"], 1, "{j}");
    assert_eq!(j["files"]["verified"], true, "{j}");
    assert_eq!(j["files"]["verified_bytes"], size, "{j}");
    let sent = j["files"]["sent_bytes"].as_u64().unwrap();
    assert_eq!(sent, j["bytes"].as_u64().unwrap(), "{j}");
    assert!(sent < size && sent > 0, "{j}");
    assert!(same_contents(&top.join("f.bin"), &root.join("big/f.bin")));
}

/// Speaks the control protocol by hand to send manifests the real client
/// never would.
mod crafted {
    use super::*;
    use longhaul_engine::connection::Connection;
    use longhaul_engine::messages::{Direction, Message};
    use serde_json::json;

    fn handshake(port: u16) -> longhaul_engine::Result<Connection> {
        support::authenticate(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
    }

    /// A pull of `paths` the real client would refuse to ask for; returns
    /// the server's first answer (its offer, or its error).
    pub fn pull(port: u16, paths: &[&str]) -> longhaul_engine::Result<serde_json::Value> {
        let mut conn = handshake(port)?;
        conn.send(&Message::SessionRequest(support::disk_request(
            Direction::Receive,
            json!({"paths": paths, "checksum": false,
                "io_workers_per_device": 1, "direct": false}),
        )))?;
        match conn.recv()? {
            Message::ModeData(v) => Ok(v),
            other => panic!("expected the offer, got {:?}", other.kind()),
        }
    }

    /// Handshake, then a disk SessionRequest and one manifest message of
    /// 5-byte files; returns the server's answer (the plan, or its error).
    pub fn ask(
        port: u16,
        dest: &str,
        paths: &[&str],
    ) -> longhaul_engine::Result<serde_json::Value> {
        let files: Vec<(&str, u64)> = paths.iter().map(|p| (*p, 5)).collect();
        ask_sized(port, dest, &files)
    }

    /// Handshake and a disk push's SessionRequest for `entries` files into
    /// `dest`: the server waits for the manifest next.
    pub fn request_push(
        port: u16,
        dest: &str,
        entries: usize,
    ) -> longhaul_engine::Result<Connection> {
        let mut conn = handshake(port)?;
        conn.send(&Message::SessionRequest(support::disk_request(
            Direction::Send,
            json!({"dest": dest, "resume": true, "io_workers_per_device": 1,
                "direct": false, "entries": entries, "chunk_size": 1 << 20}),
        )))?;
        Ok(conn)
    }

    /// As [`ask`], with (path, size) entries, sparse when beyond 1 MiB.
    pub fn ask_sized(
        port: u16,
        dest: &str,
        files: &[(&str, u64)],
    ) -> longhaul_engine::Result<serde_json::Value> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let entries: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(i, (p, size))| {
                json!({"id": i, "path": p, "dir": false, "size": size, "mode": 0o644,
                       "mtime_sec": now, "mtime_nsec": 0, "sparse": *size > 1 << 20,
                       "device": "x"})
            })
            .collect();
        let mut conn = request_push(port, dest, entries.len())?;
        conn.send(&Message::ModeData(
            json!({"disk": "manifest", "entries": entries}),
        ))?;
        match conn.recv()? {
            Message::ModeData(v) => Ok(v),
            other => panic!("expected the plan, got {:?}", other.kind()),
        }
    }
}

#[test]
fn crafted_manifests_escaping_the_root_are_refused() {
    let t = Scratch::new("escape");
    let root = t.0.join("root");
    let outside = t.0.join("outside");
    fs::create_dir_all(&root).unwrap();
    fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let server = Server::with_root(&root);
    let abs = outside.join("abs").display().to_string();
    let evil = [
        "../outside/dotdot",
        &abs,
        "link/through-symlink",
        "ok/../../outside/x",
        "nul\0byte",
        "a//b",
        "",
        // longhaul's own temporary names: their writers would truncate,
        // rename or delete them under another file's "verified".
        ".fine.longhaul-part",
        "d/.f.longhaul-state",
        ".x.longhaul-state.tmp/y",
    ];
    let mut paths = vec!["fine/file"];
    paths.extend(evil.iter().copied());
    let plan = crafted::ask(server.port, "", &paths).unwrap();
    assert_eq!(plan["disk"], "plan");
    let refused: Vec<u64> = plan["plan"]["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        refused,
        (1..paths.len() as u64).collect::<Vec<_>>(),
        "{plan}"
    );
    assert!(
        plan["plan"]["refused"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["code"] == "refused"),
        "{plan}"
    );
    // A --dest that escapes fails the whole session, with the cause.
    let err = crafted::ask(server.port, "../outside", &["f"]).unwrap_err();
    assert!(err.to_string().contains("escapes the root"), "{err}");
    let plan = crafted::ask(server.port, "link", &["f"]).unwrap();
    let refused = &plan["plan"]["refused"][0];
    assert!(
        refused["error"].as_str().unwrap().contains("symlink"),
        "{plan}"
    );
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "something was written outside the root"
    );
    assert!(root.join("fine").is_dir());
}

/// Sizes come from the client: a sparse entry of 2^62 bytes, which a single
/// `Hole` frame over it made the server's writer fold chunk by chunk for
/// hours, is refused by name; the others are planned.
#[test]
fn crafted_manifest_entries_beyond_the_largest_file_are_refused() {
    let t = Scratch::new("too-big");
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let files = [("fine", 5), ("huge", 1 << 62), ("big-but-fine", 1 << 40)];
    let plan = crafted::ask_sized(server.port, "in", &files).unwrap();
    assert_eq!(plan["disk"], "plan");
    let refused = plan["plan"]["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{plan}");
    assert_eq!(refused[0]["id"], 1, "{plan}");
    let error = refused[0]["error"].as_str().unwrap();
    assert!(
        error.contains("in/huge") && error.contains("largest file this receiver takes"),
        "{plan}"
    );
}

/// A disk session is listed from its request on: while the server waits
/// for its manifest (or, for an honest client, checks its files for the
/// plan) it shows in the stats API in the handshake state, as a disk
/// receive; and one that fails there is counted failed (before, neither:
/// such a session held a slot unseen).
#[test]
fn a_session_still_planning_is_listed_and_its_failure_counted() {
    use longhaul_stats_api::{EngineDirection, Mode, State};

    let t = Scratch::new("planning");
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let conn = crafted::request_push(server.port, "in", 3).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let listed = loop {
        let snap = support::snapshot(server.stats_port);
        if let Some(s) = snap.sessions.into_iter().next() {
            break s;
        }
        assert!(Instant::now() < deadline, "the session was never listed");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(listed.state, State::Handshake, "{listed:?}");
    assert_eq!(
        (listed.mode, listed.direction),
        (Mode::Disk, EngineDirection::Receive)
    );
    // The client goes away instead of sending its manifest.
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let snap = support::snapshot(server.stats_port);
        if snap.engine.sessions_failed_total == 1 {
            assert_eq!(snap.sessions.len(), 1, "{snap:?}");
            assert_eq!(snap.sessions[0].state, State::Failed, "{snap:?}");
            break;
        }
        assert!(Instant::now() < deadline, "never counted failed: {snap:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ------------------------------------------------------------ "verified" never lies

/// Two sessions send different content to the same destination file at the
/// same time, twenty times over: a session may exit 0 only if the final
/// file is its own source byte for byte, and one of them always succeeds.
/// The loser is told which session holds the file, and the server logs its
/// session as failed.
#[test]
fn racing_sessions_never_both_claim_one_file() {
    let t = Scratch::new("race");
    let sources: Vec<PathBuf> = (0..2)
        .map(|i| {
            let dir = t.0.join(format!("src{i}/data"));
            fs::create_dir_all(&dir).unwrap();
            // 16 MiB at 200 Mb/s: each session lasts ~0.7 s, so they overlap.
            fs::write(dir.join("f.bin"), pattern(16 * MIB as usize, 40 + i)).unwrap();
            dir
        })
        .collect();
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let dest = root.join("data/f.bin");
    for round in 0..20 {
        let _ = fs::remove_file(&dest);
        let runs: Vec<Running> = sources
            .iter()
            .map(|src| {
                spawn_send(&[
                    "--to",
                    &server.addr(),
                    "--streams",
                    "2",
                    "--rate",
                    "200M",
                    "--no-resume",
                    "--json",
                    src.to_str().unwrap(),
                ])
            })
            .collect();
        let outs: Vec<Output> = runs.into_iter().map(|r| r.wait(RUN_TIMEOUT)).collect();
        let winners: Vec<usize> = (0..2).filter(|&i| outs[i].code == Some(0)).collect();
        assert!(
            !winners.is_empty(),
            "round {round}: neither session succeeded: {:?} / {:?}",
            outs[0].stderr,
            outs[1].stderr
        );
        for &w in &winners {
            assert!(
                same_contents(&sources[w].join("f.bin"), &dest),
                "round {round}: session {w} exited 0 but the file holds other bytes"
            );
            assert_eq!(outs[w].json()["ok"], true, "round {round}");
        }
        for (i, o) in outs.iter().enumerate() {
            if o.code != Some(0) {
                assert_eq!(o.code, Some(1), "round {round}: {}", o.stderr);
                assert!(
                    o.stderr.contains("being written by another session"),
                    "round {round} session {i}: {}",
                    o.stderr
                );
                // The loser's final object says so too, naming the file.
                let j = o.json();
                assert_eq!(j["ok"], false, "round {round}: {j}");
                assert_eq!(j["error"]["kind"], "busy", "round {round}: {j}");
                assert_eq!(j["files"]["count"], 0, "round {round}: {j}");
                assert_eq!(
                    j["files"]["failures"][0]["code"], "in_use",
                    "round {round}: {j}"
                );
                assert!(failed_paths(&j)[0].ends_with("f.bin"), "round {round}: {j}");
            }
        }
    }
    assert!(
        server.wait_log("failed: server busy", Duration::from_secs(5)),
        "{}",
        server.stderr()
    );
}

/// A file on the receiver with the sender's size and mtime but other bytes
/// is skipped by the quick check, and then the run must not say
/// "verified"; `--checksum` compares content, re-sends it and verifies.
#[test]
fn a_changed_file_with_the_same_size_and_mtime_is_not_verified() {
    let t = Scratch::new("changed");
    let top = t.0.join("src/data");
    fs::create_dir_all(&top).unwrap();
    let src = top.join("f.bin");
    fs::write(&src, pattern(3 * MIB as usize + 5, 7)).unwrap();
    set_mtime(&src, 1_600_000_000, 5);
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let addr = server.addr();
    let run = |extra: &[&str]| {
        let mut args = vec!["--to", addr.as_str(), "--json"];
        args.extend_from_slice(extra);
        args.push(top.to_str().unwrap());
        let out = send(&args);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        out.json()
    };
    let first = run(&[]);
    assert_eq!(first["files"]["verified"], true, "{first}");
    assert_eq!(first["files"]["sent"], 1, "{first}");
    // Change bytes on the receiver, keep size and mtime.
    let dest = root.join("data/f.bin");
    let f = fs::OpenOptions::new().write(true).open(&dest).unwrap();
    f.write_all_at(b"CHANGED", MIB).unwrap();
    drop(f);
    set_mtime(&dest, 1_600_000_000, 5);
    let quick = run(&[]);
    assert_eq!(quick["files"]["verified"], false, "{quick}");
    assert_eq!(quick["files"]["skipped"], 1, "{quick}");
    assert_eq!(quick["files"]["skipped_unverified"], 1, "{quick}");
    assert_eq!(quick["files"]["skip_check"], "size_mtime", "{quick}");
    let checked = run(&["--checksum"]);
    assert_eq!(checked["files"]["verified"], true, "{checked}");
    assert_eq!(checked["files"]["sent"], 1, "{checked}");
    assert!(same_contents(&src, &dest));
}

/// A session whose file cannot be written fails on both ends: the server
/// logs it as failed, not finished.
#[test]
fn a_session_with_a_failed_file_is_logged_failed() {
    let t = Scratch::new("logfail");
    let top = t.0.join("src/data");
    fs::create_dir_all(&top).unwrap();
    fs::write(top.join("f.bin"), pattern(MIB as usize, 3)).unwrap();
    let root = t.0.join("root");
    // A directory where the file must land: the rename into place fails.
    fs::create_dir_all(root.join("data/f.bin/occupied")).unwrap();
    let server = Server::with_root(&root);
    let out = send(&["--to", &server.addr(), top.to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        server.wait_log("failed:", Duration::from_secs(5)),
        "{}",
        server.stderr()
    );
    let log = server.stderr();
    assert!(!log.contains("finished"), "{log}");
}

/// One `longhaul serve` per root: a second one on the same root refuses
/// to start, so claims in one process cover every writer.
#[test]
fn a_second_server_on_the_same_root_refuses_to_start() {
    let t = Scratch::new("rootlock");
    let _first = Server::with_root(t.path());
    let out = support::run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--stats-listen",
        "127.0.0.1:0",
        "--root",
        t.path().to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("another longhaul serve"),
        "{}",
        out.stderr
    );
}

// ------------------------------------------------------------ pull and file lists

/// Runs `longhaul get ARGS...` to completion.
fn get(args: &[&str]) -> Output {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    support::spawn(&all).wait(RUN_TIMEOUT)
}

/// A tree of a few files under `top`, with fixed mtimes and modes.
fn small_tree(top: &Path) {
    fs::create_dir_all(top.join("sub/empty")).unwrap();
    fs::write(top.join("a.bin"), pattern((3 * MIB + 11) as usize, 21)).unwrap();
    fs::write(top.join("sub/b.txt"), "bee\n").unwrap();
    fs::write(top.join("zero"), b"").unwrap();
    fs::set_permissions(top.join("a.bin"), fs::Permissions::from_mode(0o640)).unwrap();
    set_mtime(&top.join("a.bin"), 1_600_000_100, 42);
}

/// `get` pulls a tree from the server's --root bit-identical and verified;
/// a second pull with --checksum compares every file and moves nothing.
#[test]
fn pull_brings_a_tree_home_verified() {
    let t = Scratch::new("pull");
    let root = t.0.join("root");
    small_tree(&root.join("runs/r7"));
    let server = Server::with_root(&root);
    let local = t.0.join("local");
    let out = get(&[
        "--from",
        &server.addr(),
        "--streams",
        "3",
        "--strict",
        "--json",
        "runs/r7",
        "--dest",
        local.to_str().unwrap(),
    ]);
    // --strict: 3 files on 3 streams may leave one idle; disk mode says
    // that is normal, so the run passes.
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let j = out.json();
    assert_eq!(j["mode"], "disk", "{j}");
    assert_eq!(j["direction"], "receive", "{j}");
    assert_eq!(j["files"]["verified"], true, "{j}");
    assert_eq!(j["files"]["count"], 3, "{j}");
    assert_eq!(j["files"]["verified_bytes"], 3 * MIB + 11 + 4, "{j}");
    assert!(j["devices"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["side"] == "receiver" && d["written_bytes"].as_u64() > Some(MIB)));
    assert_same_tree(&root.join("runs/r7"), &local.join("r7"));
    assert!(!walk_names(&local).iter().any(|n| n.contains(".longhaul-")));
    let again = get(&[
        "--from",
        &server.addr(),
        "--checksum",
        "--json",
        "runs/r7",
        "--dest",
        local.to_str().unwrap(),
    ]);
    assert_eq!(again.code, Some(0), "stderr: {}", again.stderr);
    let j = again.json();
    assert_eq!(j["files"]["verified"], true, "{j}");
    assert_eq!(j["files"]["skipped"], 3, "{j}");
    assert_eq!(j["files"]["skip_check"], "checksum", "{j}");
    assert_eq!(j["bytes"], 0, "{j}");
    // A local copy changed behind the same size and mtime: --checksum
    // finds it and pulls it again.
    let copy = local.join("r7/a.bin");
    let f = fs::OpenOptions::new().write(true).open(&copy).unwrap();
    f.write_all_at(b"CHANGED", MIB).unwrap();
    drop(f);
    set_mtime(&copy, 1_600_000_100, 42);
    let fixed = get(&[
        "--from",
        &server.addr(),
        "--checksum",
        "--json",
        "runs/r7",
        "--dest",
        local.to_str().unwrap(),
    ]);
    assert_eq!(fixed.code, Some(0), "stderr: {}", fixed.stderr);
    assert_eq!(fixed.json()["files"]["sent"], 1, "{}", fixed.stdout);
    assert_same_tree(&root.join("runs/r7"), &local.join("r7"));
}

/// A pull that loses its server mid-transfer keeps what it verified; the
/// same command against the restarted server resumes and ends verified.
#[test]
fn a_pull_leaves_a_file_another_process_is_writing_alone() {
    let t = Scratch::new("pull-locked");
    let root = t.0.join("root");
    small_tree(&root.join("runs/r7"));
    let server = Server::with_root(&root);
    let local = t.0.join("local");
    // Another `get` into the same --dest holds a.bin's temporary file.
    fs::create_dir_all(local.join("r7")).unwrap();
    let theirs = local.join("r7/.a.bin.longhaul-part");
    fs::write(&theirs, b"another run's bytes").unwrap();
    let held = File::open(&theirs).unwrap();
    // SAFETY: flock on a descriptor we own.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) },
        0
    );
    let out = get(&[
        "--from",
        &server.addr(),
        "--json",
        "runs/r7",
        "--dest",
        local.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "stderr: {}", out.stderr);
    assert!(
        out.stderr
            .contains("another process holds its temporary file"),
        "{}",
        out.stderr
    );
    assert_eq!(fs::read(&theirs).unwrap(), b"another run's bytes");
    assert!(!local.join("r7/a.bin").exists());
    // The other files arrived; once the other run is gone, a.bin does too.
    assert!(local.join("r7/sub/b.txt").exists());
    drop(held);
    let out = get(&[
        "--from",
        &server.addr(),
        "--json",
        "runs/r7",
        "--dest",
        local.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    assert_same_tree(&root.join("runs/r7"), &local.join("r7"));
}

#[test]
fn pull_resumes_after_the_server_is_killed() {
    let t = Scratch::new("pullresume");
    let root = t.0.join("root");
    let top = root.join("data");
    let total = resume_sources(&top, 30);
    let local = t.0.join("local");
    let mut server = Server::with_root(&root);
    // 400 Mb/s: the 72 MiB take ~1.5 s, so the kill lands mid-transfer.
    let first = support::spawn(&[
        "get",
        "--from",
        &server.addr(),
        "--streams",
        "3",
        "--rate",
        "400M",
        "--json",
        "data",
        "--dest",
        local.to_str().unwrap(),
    ]);
    kill_once_progress_is_saved(&mut server, first, &local);
    let server = Server::with_root(&root);
    let second = get(&[
        "--from",
        &server.addr(),
        "--streams",
        "3",
        "--checksum",
        "--json",
        "data",
        "--dest",
        local.to_str().unwrap(),
    ]);
    assert_eq!(second.code, Some(0), "stderr: {}", second.stderr);
    let j = second.json();
    assert_eq!(j["files"]["verified"], true, "{j}");
    assert_eq!(j["files"]["count"], 3, "{j}");
    let sent = j["bytes"].as_u64().unwrap();
    assert!(sent < total, "resume moved {sent} of {total} bytes ({j})");
    assert!(
        j["files"]["resumed"].as_u64().unwrap() + j["files"]["skipped"].as_u64().unwrap() >= 1,
        "{j}"
    );
    assert_same_tree(&top, &local.join("data"));
    assert!(!walk_names(&local).iter().any(|n| n.contains(".longhaul-")));
}

/// Paths that leave the served root are refused, by the client when it
/// can tell and by the server whatever it is asked; a missing path is an
/// error naming it; nothing lands locally and the server keeps serving.
#[test]
fn pull_refuses_paths_leaving_the_root() {
    let t = Scratch::new("pullescape");
    let root = t.0.join("root");
    small_tree(&root.join("ok"));
    fs::write(t.0.join("secret"), "outside the root\n").unwrap();
    std::os::unix::fs::symlink(&t.0, root.join("up")).unwrap();
    std::os::unix::fs::symlink(t.0.join("secret"), root.join("ok/secret-link")).unwrap();
    let mut server = Server::with_root(&root);
    let local = t.0.join("local");
    let dest = local.to_str().unwrap();
    for (path, code, needle) in [
        ("../secret", 2, "'..' escapes the root"),
        ("/etc/passwd", 2, "absolute path"),
        ("ok/../../secret", 2, "'..' escapes the root"),
        ("up/secret", 1, "symlink component 'up'"),
        ("ok/secret-link", 1, "symlink"),
        ("ok/missing.bin", 1, "ok/missing.bin"),
    ] {
        let out = get(&["--from", &server.addr(), path, "--dest", dest]);
        assert_eq!(out.code, Some(code), "{path}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{path}: {}", out.stderr);
    }
    // The server refuses what a crafted client asks, before any offer.
    for path in ["../secret", "/etc/passwd", "a/./b", "up/secret"] {
        let err = crafted::pull(server.port, &[path]).unwrap_err().to_string();
        assert!(err.contains("refused"), "{path}: {err}");
    }
    assert!(!walk_names(&local).iter().any(|n| n.contains("secret")));
    assert!(server.is_running(), "{}", server.stderr());
    let out = get(&["--from", &server.addr(), "ok", "--dest", dest]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(same_contents(
        &root.join("ok/a.bin"),
        &local.join("ok/a.bin")
    ));
}

/// `--file-list` names what to move instead of the command line, for
/// `send` and `get` (`-` reads standard input); a missing file in the list,
/// an unreadable list and an empty one are errors naming them.
#[test]
fn file_lists_name_what_to_move() {
    let t = Scratch::new("filelist");
    let src = t.0.join("src");
    small_tree(&src.join("tree"));
    fs::write(src.join("loose.txt"), "loose\n").unwrap();
    let root = t.0.join("root");
    fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let list = t.0.join("list");
    fs::write(
        &list,
        format!(
            "{}\n\n{}\n",
            src.join("tree").display(),
            src.join("loose.txt").display()
        ),
    )
    .unwrap();
    let out = send(&[
        "--to",
        &server.addr(),
        "--json",
        "--file-list",
        list.to_str().unwrap(),
        "--dest",
        "in",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.json()["files"]["verified"], true, "{}", out.stdout);
    assert_same_tree(&src.join("tree"), &root.join("in/tree"));
    assert!(same_contents(
        &src.join("loose.txt"),
        &root.join("in/loose.txt")
    ));
    // get --file-list - reads the list from standard input.
    let local = t.0.join("local");
    let mut child = Command::new(support::BIN)
        .args([
            "get",
            "--from",
            &server.addr(),
            "--json",
            "--file-list",
            "-",
        ])
        .arg("--dest")
        .arg(&local)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"in/tree/sub\nin/loose.txt\n").unwrap();
    }
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{stderr}");
    let j: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&done.stdout)
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(j["files"]["verified"], true, "{j}");
    assert_eq!(j["files"]["count"], 2, "{j}");
    assert_same_tree(&src.join("tree/sub"), &local.join("sub"));
    assert!(same_contents(
        &src.join("loose.txt"),
        &local.join("loose.txt")
    ));
    // A file in the list that does not exist: nothing is sent, the error
    // names it.
    let gone = src.join("not-there.bin");
    fs::write(
        &list,
        format!("{}\n{}\n", src.join("loose.txt").display(), gone.display()),
    )
    .unwrap();
    let out = send(&[
        "--to",
        &server.addr(),
        "--file-list",
        list.to_str().unwrap(),
        "--dest",
        "missing",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("not-there.bin"), "{}", out.stderr);
    assert!(!root.join("missing").exists());
    // Unreadable, empty, and a list given with PATHs: usage errors.
    let empty = t.0.join("empty");
    fs::write(&empty, "\n\n").unwrap();
    let nowhere = t.0.join("no-such-list");
    for (args, needle) in [
        (
            vec![
                "send",
                "--to",
                "127.0.0.1:9",
                "--file-list",
                nowhere.to_str().unwrap(),
            ],
            "no-such-list",
        ),
        (
            vec![
                "get",
                "--from",
                "127.0.0.1:9",
                "--file-list",
                t.0.to_str().unwrap(),
            ],
            "--file-list",
        ),
        (
            vec![
                "get",
                "--from",
                "127.0.0.1:9",
                "--file-list",
                empty.to_str().unwrap(),
            ],
            "names no paths",
        ),
        (
            vec![
                "send",
                "--to",
                "127.0.0.1:9",
                "--file-list",
                list.to_str().unwrap(),
                "x",
            ],
            "cannot be used with",
        ),
        (vec!["get", "--from", "127.0.0.1:9"], "nothing to pull"),
    ] {
        let out = support::run(&args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
    }
}
