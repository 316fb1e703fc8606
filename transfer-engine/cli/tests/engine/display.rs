//! What `send` shows: for scripts (stdout not a terminal) the interval
//! lines and the final report keep their shape, in text and JSON; on a
//! terminal a progress bar (bytes, rate, ETA; files in disk mode) replaces
//! the interval lines.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// Keys of the final JSON object, in the order they are written.
const FINAL_KEYS: &[&str] = &[
    "type",
    "ok",
    "mode",
    "direction",
    "bytes",
    "seconds",
    "throughput_bps",
    "bytes_sent",
    "bytes_received",
    "streams",
    "cpu",
    "session",
    "peer",
    "started",
    "started_unix",
    "requested_seconds",
];

/// Keys of an interval line, in order.
const INTERVAL_KEYS: &[&str] = &[
    "type",
    "counts",
    "start",
    "end",
    "bytes",
    "throughput_bps",
    "streams",
];

/// `keys` appear in `line` as top-level JSON keys, in this order, and no
/// other key does.
fn keys_in_order(line: &str, keys: &[&str]) {
    let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
    let got: Vec<&String> = v.as_object().expect("an object").keys().collect();
    assert_eq!(got.len(), keys.len(), "{line}");
    let mut at = 0;
    for k in keys {
        let needle = format!("\"{k}\":");
        let pos = line[at..]
            .find(&needle)
            .unwrap_or_else(|| panic!("{k} missing or out of order: {line}"));
        at += pos + needle.len();
    }
}

/// `[   0.00-   1.00 s]    1.10 GiB    9.41 Gb/s  2 streams  retrans 0  rtt 31 us`
fn is_interval_line(line: &str, streams: usize) -> bool {
    let Some(rest) = line.strip_prefix('[') else {
        return false;
    };
    let Some((span, rest)) = rest.split_once(" s]") else {
        return false;
    };
    let times: Vec<&str> = span.split('-').map(str::trim).collect();
    times.len() == 2
        && times
            .iter()
            .all(|t| t.parse::<f64>().is_ok() && t.contains('.'))
        && rest.contains(&format!("  {streams} streams  retrans "))
        && rest.ends_with(" us")
        && rest.contains("b/s")
}

#[test]
fn scripts_get_interval_lines_and_the_summary() {
    let server = Server::start(&[]);
    let out = ok(&[
        "send",
        "--to",
        &server.addr(),
        "--streams",
        "2",
        "--time",
        "2.5",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    let intervals = lines.iter().take_while(|l| l.starts_with('[')).count();
    assert!(intervals >= 2, "one line a second by default:\n{out}");
    for l in &lines[..intervals] {
        assert!(is_interval_line(l, 2), "not an interval line: {l:?}");
    }
    let summary = &lines[intervals..];
    assert_eq!(summary.len(), 3, "{out}");
    assert!(summary[0].starts_with("memory send: "), "{out}");
    assert!(summary[0].contains(" over 2 streams, "), "{out}");
    assert!(summary[1].starts_with("  sender CPU:   user "), "{out}");
    assert!(summary[2].starts_with("  receiver CPU: user "), "{out}");
    assert!(!out.contains('\u{1b}'), "no terminal escapes for scripts");
}

#[test]
fn json_lines_keep_their_keys_and_order() {
    let server = Server::start(&[]);
    let out = ok(&[
        "send",
        "--to",
        &server.addr(),
        "--time",
        "1.5",
        "--interval",
        "0.5",
        "--json",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 3, "{out}");
    let (last, intervals) = lines.split_last().unwrap();
    for l in intervals {
        keys_in_order(l, INTERVAL_KEYS);
    }
    keys_in_order(last, FINAL_KEYS);
    // --json alone: the final object only.
    let out = ok(&["send", "--to", &server.addr(), "--time", "1", "--json"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    keys_in_order(out.trim(), FINAL_KEYS);
}

/// Runs `longhaul ARGS` with stdout on a pseudo-terminal; returns what the
/// terminal showed and the exit code.
fn on_a_terminal(args: &[&str]) -> (String, Option<i32>) {
    let (mut master, mut slave) = (0, 0);
    let size = libc::winsize {
        ws_row: 24,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: out-pointers to locals; no name buffer; a valid winsize.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty returned two descriptors we now own.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::from(slave))
        .stderr(Stdio::piped())
        .spawn()
        .expect("start longhaul");
    let reader = std::thread::spawn(move || {
        let mut file = std::fs::File::from(master);
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once the child (the last holder of the slave) is gone.
        while let Ok(n) = file.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&seen).into_owned()
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "longhaul did not finish");
        std::thread::sleep(Duration::from_millis(50));
    };
    (reader.join().unwrap(), status.code())
}

#[test]
fn a_terminal_gets_a_progress_bar_instead_of_interval_lines() {
    let server = Server::start(&[]);
    let (shown, code) = on_a_terminal(&["send", "--to", &server.addr(), "--time", "3"]);
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("ETA"), "a progress bar: {shown:?}");
    assert!(shown.contains("b/s"), "with the rate: {shown:?}");
    assert!(shown.contains('%'), "and how far: {shown:?}");
    assert!(!shown.contains("s] "), "no interval lines: {shown:?}");
    assert!(
        shown.contains("memory send: "),
        "then the summary: {shown:?}"
    );
    // An explicit --interval keeps the lines on a terminal too.
    let (shown, code) = on_a_terminal(&[
        "send",
        "--to",
        &server.addr(),
        "--time",
        "1.5",
        "--interval",
        "0.5",
    ]);
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("s] "), "{shown:?}");
    assert!(!shown.contains("ETA"), "{shown:?}");
}

#[test]
fn a_disk_send_on_a_terminal_counts_files() {
    let t = Scratch::new("display");
    let src = t.0.join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..5 {
        std::fs::write(src.join(format!("f{i}")), vec![i as u8 + 1; 3 << 20]).unwrap();
    }
    let root = t.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let server = Server::with_root(&root);
    let (shown, code) = on_a_terminal(&[
        "send",
        "--to",
        &server.addr(),
        "--rate",
        "40M",
        src.to_str().unwrap(),
        "--dest",
        "d",
    ]);
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains("files "),
        "files done of files total: {shown:?}"
    );
    assert!(shown.contains("/5"), "{shown:?}");
    assert!(shown.contains("files: 5"), "then the summary: {shown:?}");
}
