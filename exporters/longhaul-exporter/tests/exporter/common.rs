//! Helpers: start the exporter binary, fake engines, HTTP GET, scrape parsing.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_longhaul-exporter");

/// The fixture disk server shared with crates/topology.
pub fn server_fixture() -> PathBuf {
    longhaul_testkit::package_dir().join("../../tests/fixtures/sysfs-server")
}

pub fn exporter_fixtures() -> PathBuf {
    longhaul_testkit::package_dir().join("tests/fixtures")
}

/// Flags pointing the exporter at the fixture server.
pub fn fixture_args() -> Vec<String> {
    let f = server_fixture();
    vec![
        format!("--path.sysfs={}", f.join("sys").display()),
        format!("--path.procfs={}", f.join("proc").display()),
        format!("--path.pciids={}", f.join("pci.ids").display()),
    ]
}

/// A running exporter, killed on drop.
pub struct Exporter {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Exporter {
    pub fn start<S: AsRef<str>>(args: &[S]) -> Exporter {
        let mut child = Command::new(BIN)
            .arg("--web.listen-address=127.0.0.1:0")
            .args(args.iter().map(AsRef::as_ref))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start exporter");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                log2.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("exporter printed its address")
            .parse()
            .expect("address parses");
        Exporter { child, addr, log }
    }

    pub fn get(&self, path: &str) -> Response {
        get(self.addr, path, None)
    }

    pub fn scrape(&self) -> String {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    }

    /// Lines of the log holding `needle`. The log is read from the
    /// exporter's stderr by a thread that may lag behind a scrape, so this
    /// waits up to [`LOG_LAG`] for the first such line.
    pub fn log_lines(&self, needle: &str) -> usize {
        let count = || {
            self.log
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(needle))
                .count()
        };
        wait_for(LOG_LAG, || Some(count()).filter(|&n| n > 0)).unwrap_or_else(count)
    }

    /// Whether the log holds `needle` (waiting up to [`LOG_LAG`] for it).
    pub fn logged(&self, needle: &str) -> bool {
        self.log_lines(needle) > 0
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: String,
}

pub fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> Response {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read answer");
    let text = String::from_utf8(raw).expect("utf-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("http answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    Response {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

/// What a fake engine does with each connection.
#[derive(Clone)]
pub enum Behaviour {
    /// 200 with this body.
    Body(String),
    /// An engine from before the rows view: 400 to `?view=rows`, 200 with
    /// this body to any other request.
    WithoutRows(String),
    /// As `WithoutRows`, but its first answer to another request is 503
    /// (the engine busy just after it refused).
    WithoutRowsBusyOnce(String),
    /// 200 with this body, after this long (the engine busy answering).
    Slow(String, Duration),
    /// These raw bytes, then close.
    Raw(Vec<u8>),
    /// Accept, read, never answer (until the fake is dropped).
    Hang,
    /// 200 and a chunked body that never ends (until the client leaves):
    /// these bytes, then these bytes again and again.
    Endless(Vec<u8>, Vec<u8>),
}

/// A fake engine stats API on 127.0.0.1:0, stopped on drop.
pub struct FakeEngine {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
}

impl FakeEngine {
    pub fn start(behaviour: Behaviour) -> FakeEngine {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let requests = Arc::new(AtomicUsize::new(0));
        let requests2 = Arc::clone(&requests);
        std::thread::spawn(move || {
            let mut held = Vec::new();
            let mut busy_once = true;
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(Duration::from_millis(500)))
                            .unwrap();
                        let mut buf = [0u8; 4096];
                        let n = s.read(&mut buf).unwrap_or(0);
                        requests2.fetch_add(1, Ordering::SeqCst);
                        let line = String::from_utf8_lossy(&buf[..n]);
                        let line = line.lines().next().unwrap_or("");
                        match &behaviour {
                            Behaviour::WithoutRows(_) | Behaviour::WithoutRowsBusyOnce(_)
                                if line.contains("view=rows") =>
                            {
                                let _ = s.write_all(
                                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 13\r\n\r\nunknown view\n",
                                );
                            }
                            Behaviour::WithoutRowsBusyOnce(_) if busy_once => {
                                busy_once = false;
                                let _ = s.write_all(
                                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\n\r\nbusy\n",
                                );
                            }
                            Behaviour::Body(b)
                            | Behaviour::WithoutRows(b)
                            | Behaviour::WithoutRowsBusyOnce(b) => {
                                let _ = write!(
                                    s,
                                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                                    b.len()
                                );
                            }
                            Behaviour::Slow(b, delay) => {
                                let (b, delay) = (b.clone(), *delay);
                                std::thread::spawn(move || {
                                    std::thread::sleep(delay);
                                    let _ = write!(
                                        s,
                                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                                        b.len()
                                    );
                                });
                            }
                            Behaviour::Raw(r) => {
                                let _ = s.write_all(r);
                            }
                            Behaviour::Hang => held.push(s),
                            Behaviour::Endless(prefix, fill) => {
                                let (prefix, fill) = (prefix.clone(), fill.clone());
                                std::thread::spawn(move || {
                                    let chunk: Vec<u8> = fill
                                        .iter()
                                        .copied()
                                        .cycle()
                                        .take(fill.len() << 14)
                                        .collect();
                                    let _ = s.write_all(
                                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                                    );
                                    let _ = write!(s, "{:x}\r\n", prefix.len().max(1))
                                        .and_then(|_| {
                                            s.write_all(if prefix.is_empty() {
                                                b" "
                                            } else {
                                                &prefix
                                            })
                                        })
                                        .and_then(|_| s.write_all(b"\r\n"));
                                    while write!(s, "{:x}\r\n", chunk.len())
                                        .and_then(|_| s.write_all(&chunk))
                                        .and_then(|_| s.write_all(b"\r\n"))
                                        .is_ok()
                                    {}
                                });
                            }
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeEngine {
            addr,
            stop,
            requests,
        }
    }

    /// Requests the fake has been sent so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("--engine.url=http://{}", self.addr)
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Parses text-format samples into "name{labels}" -> value.
pub fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("sample line");
            (k.to_string(), v.parse().expect("sample value"))
        })
        .collect()
}

/// The value of label `name` in a "metric{a="x",b="y"}" key.
pub fn label(key: &str, name: &str) -> Option<String> {
    let inner = key.split_once('{')?.1.strip_suffix('}')?;
    inner.split("\",").find_map(|kv| {
        let (k, v) = kv.split_once("=\"")?;
        (k == name).then(|| v.trim_end_matches('"').to_string())
    })
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "longhaul-exporter-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `promtool check metrics` on a scrape; panics with its output on
/// failure.
pub fn promtool_check(scrape: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus) must be installed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How long the exporter's stderr may take to reach the test's log reader
/// on a loaded machine.
pub const LOG_LAG: Duration = Duration::from_secs(10);

/// Polls `f` until it returns Some or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
