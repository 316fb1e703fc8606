//! Shared by the integration test binaries (`engine`, `science`, `disk`):
//! a `longhaul serve` child on loopback port 0 that reports its ports and is
//! killed on drop, `longhaul` runners with a timeout, JSON and stats API
//! helpers, and a scratch directory that removes itself.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_longhaul");

/// Upper bound for one `longhaul` command (a `send`, a `sweep`...) in the
/// tests.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Collects a child's output line by line, as it comes.
fn collect(reader: impl Read + Send + 'static) -> (Arc<Mutex<String>>, JoinHandle<()>) {
    let out = Arc::new(Mutex::new(String::new()));
    let into = out.clone();
    let handle = std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            let mut s = into.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    (out, handle)
}

/// `longhaul serve` on 127.0.0.1:0 (control and stats API), killed on drop.
pub struct Server {
    child: Child,
    pub port: u16,
    pub stats_port: u16,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_under(&[], extra)
    }

    /// The server started through `wrapper` (e.g. `setpriv --reuid ...`), which
    /// execs its last argument, the engine binary.
    pub fn start_under(wrapper: &[&str], extra: &[&str]) -> Server {
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let mut child = command
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--stats-listen",
                "127.0.0.1:0",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start longhaul serve");
        let (stderr, _) = collect(child.stderr.take().unwrap());
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .expect("server prints its ports");
        // "listening on 127.0.0.1:NNNN, stats on 127.0.0.1:MMMM"
        let ports: Vec<u16> = line
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter_map(|w| w.rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
            .collect();
        assert_eq!(ports.len(), 2, "unexpected startup line: {line:?}");
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = reader.read_to_string(&mut sink);
        });
        Server {
            child,
            port: ports[0],
            stats_port: ports[1],
            stderr,
        }
    }

    /// `longhaul serve --root ROOT` (disk mode).
    pub fn with_root(root: &Path) -> Server {
        Server::start(&["--root", root.to_str().expect("UTF-8 root")])
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's log so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the server's log contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self.stderr().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The stats API's sessions snapshot, as untyped JSON.
    pub fn sessions(&self) -> serde_json::Value {
        let (status, body) = http_get(self.stats_port, longhaul_stats_api::SESSIONS_PATH);
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("stats API answer {body:?}: {e}"))
    }

    /// Kills the server (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A running `longhaul` child with its output collected; killed on drop.
pub struct Running {
    pub child: Child,
    args: Vec<String>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    collectors: Vec<JoinHandle<()>>,
}

impl Running {
    /// Waits for the exit (killed and a panic after `timeout`) and for all
    /// of its output.
    pub fn wait(mut self, timeout: Duration) -> Output {
        let end = Instant::now() + timeout;
        let code = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status.code();
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "longhaul {:?} did not finish within {timeout:?}; stderr: {}",
                    self.args,
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for c in self.collectors.drain(..) {
            let _ = c.join();
        }
        Output {
            code,
            stdout: self.stdout(),
            stderr: self.stderr.lock().unwrap().clone(),
        }
    }

    /// Its stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits until a `send --interval` prints its first interval line (data
    /// flows); panics after 10 s.
    pub fn wait_until_flowing(&self) {
        let t = Instant::now();
        while !self.stdout().contains("b/s") {
            assert!(t.elapsed() < Duration::from_secs(10), "no progress");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `longhaul ARGS...`.
pub fn spawn(args: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start longhaul");
    let (stdout, c_out) = collect(child.stdout.take().unwrap());
    let (stderr, c_err) = collect(child.stderr.take().unwrap());
    Running {
        child,
        args: args.iter().map(|a| a.to_string()).collect(),
        stdout,
        stderr,
        collectors: vec![c_out, c_err],
    }
}

/// Runs `longhaul ARGS...` to completion (killed after [`RUN_TIMEOUT`]).
pub fn run(args: &[&str]) -> Output {
    spawn(args).wait(RUN_TIMEOUT)
}

/// Runs and asserts success; returns stdout.
pub fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(
        o.code,
        Some(0),
        "longhaul {args:?} failed\nstdout: {}\nstderr: {}",
        o.stdout,
        o.stderr
    );
    o.stdout
}

/// Runs `longhaul send --to ADDR ARGS... --json`, asserts success and
/// returns the final JSON object.
pub fn send_json(addr: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["send", "--to", addr, "--json"];
    all.extend_from_slice(args);
    let out = run(&all);
    assert_eq!(
        out.code,
        Some(0),
        "send {args:?} failed: {}{}",
        out.stderr,
        out.stdout
    );
    last_json(&out.stdout)
}

/// The last line of stdout as JSON.
pub fn last_json(stdout: &str) -> serde_json::Value {
    let line = stdout.lines().last().expect("some output");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// A loopback port nothing listens on right now (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// GET a path from the stats API; returns (status code, body).
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("stats API answers");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The stats API's sessions snapshot, typed.
pub fn snapshot(port: u16) -> longhaul_stats_api::Snapshot {
    let (status, body) = http_get(port, longhaul_stats_api::SESSIONS_PATH);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("snapshot JSON")
}

/// A directory under the system temp dir, unique to this process and call,
/// removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("longhaul-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a token file in a fresh temp dir and returns its path.
pub fn token_file(name: &str, token: &str) -> String {
    let dir = std::env::temp_dir().join(format!("longhaul-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path.to_string_lossy().into_owned()
}

/// Says Hello and proves no token (the test servers run without one, on
/// loopback) over `sock`: a control connection just past `AuthOk`, for
/// tests that speak the protocol by hand.
pub fn authenticate(
    sock: TcpStream,
) -> longhaul_engine::Result<longhaul_engine::connection::Connection> {
    use longhaul_engine::auth::{random_bytes, to_hex, NONCE_LEN};
    use longhaul_engine::messages::{Auth, Hello, Message};
    let mut conn = longhaul_engine::connection::Connection::new(sock)?;
    conn.set_timeout(Some(Duration::from_secs(10)))?;
    conn.send(&Message::Hello(Hello {
        version: longhaul_engine::PROTOCOL_VERSION,
        client_nonce: to_hex(&random_bytes::<NONCE_LEN>()),
        software: "test".into(),
    }))?;
    assert!(matches!(conn.recv()?, Message::Challenge(_)));
    conn.send(&Message::Auth(Auth { proof: None }))?;
    assert!(matches!(conn.recv()?, Message::AuthOk(_)));
    Ok(conn)
}

/// A disk-mode SessionRequest as a client sends it, one stream, 10 s:
/// `direction` is the client's (`Send` pushes, `Receive` pulls), `params`
/// its mode parameters.
pub fn disk_request(
    direction: longhaul_engine::messages::Direction,
    params: serde_json::Value,
) -> longhaul_engine::messages::SessionRequest {
    longhaul_engine::messages::SessionRequest {
        mode: longhaul_engine::messages::Mode::Disk,
        direction,
        streams: 1,
        bytes: None,
        seconds: Some(10.0),
        buffer: 1 << 20,
        cc: None,
        rate_bps: None,
        mode_params: Some(params),
        client_host: None,
        campaign: None,
        run: None,
    }
}
