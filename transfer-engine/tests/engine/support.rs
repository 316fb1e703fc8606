//! Helpers: a server child process that reports its ports, a `send` runner
//! with a timeout, JSON parsing and a tiny HTTP GET.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_longhaul");

/// Upper bound for any single `send` in the tests.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(40);

pub struct ServerProc {
    child: Child,
    pub port: u16,
    pub stats_port: u16,
    stderr: Arc<Mutex<String>>,
}

fn collect(reader: impl Read + Send + 'static, into: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            let mut s = into.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
}

impl ServerProc {
    pub fn start(extra: &[&str]) -> ServerProc {
        let mut child = Command::new(BIN)
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
        let stdout = child.stdout.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        collect(child.stderr.take().unwrap(), stderr.clone());
        let mut line = String::new();
        let mut reader = BufReader::new(stdout);
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
        ServerProc {
            child,
            port: ports[0],
            stats_port: ports[1],
            stderr,
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

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

    /// Kills the server (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A running `longhaul` child with its output collected.
pub struct Running {
    pub child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Running {
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
                    "longhaul did not finish within {timeout:?}; stderr: {}",
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Let the collector threads see EOF.
        std::thread::sleep(Duration::from_millis(50));
        Output {
            code,
            stdout: self.stdout.lock().unwrap().clone(),
            stderr: self.stderr.lock().unwrap().clone(),
        }
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn spawn(args: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start longhaul");
    let stdout = Arc::new(Mutex::new(String::new()));
    let stderr = Arc::new(Mutex::new(String::new()));
    collect(child.stdout.take().unwrap(), stdout.clone());
    collect(child.stderr.take().unwrap(), stderr.clone());
    Running {
        child,
        stdout,
        stderr,
    }
}

/// Runs `longhaul ARGS...` to completion.
pub fn run(args: &[&str]) -> Output {
    spawn(args).wait(SEND_TIMEOUT)
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

pub fn last_json(stdout: &str) -> serde_json::Value {
    let line = stdout.lines().last().expect("some output");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
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

pub fn snapshot(port: u16) -> longhaul_stats_api::Snapshot {
    let (status, body) = http_get(port, longhaul_stats_api::SESSIONS_PATH);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("snapshot JSON")
}

/// Writes a token file in a fresh temp dir and returns its path.
pub fn token_file(name: &str, token: &str) -> String {
    let dir = std::env::temp_dir().join(format!("longhaul-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path.to_string_lossy().into_owned()
}
