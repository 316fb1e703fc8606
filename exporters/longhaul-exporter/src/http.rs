//! A small HTTP/1.1 server over std::net for `/metrics` and `/`.
//!
//! One thread per connection, one request per connection (`Connection:
//! close`), which is all Prometheus needs. Scrapes beyond `max_requests` in
//! flight get 503 at once; connections beyond [`MAX_CONNECTIONS`] are closed
//! unanswered. SIGTERM/SIGINT wake the accept loop through a self-pipe; the
//! server then stops accepting and waits (bounded) for running requests.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::collector::Exporter;
use crate::metrics::{self, Format};

/// Slow or idle clients are cut off after this; a scrape request is one
/// small packet.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Writing a scrape of a few hundred KB never takes this long on a live link.
const RESPONSE_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Request head size limit; real scrape requests are ~300 bytes.
const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// Open connections (threads) at most; beyond, new ones are dropped.
pub const MAX_CONNECTIONS: usize = 64;
/// How long shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Write end of the self-pipe the signal handler writes to (-1: none).
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

/// `:9743` means every interface (IPv6 and IPv4); otherwise HOST:PORT.
pub fn resolve_listen_address(s: &str) -> Result<Vec<SocketAddr>, String> {
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| format!("bad port {port:?}"))?;
        return Ok(vec![
            SocketAddr::from(([0u16; 8], port)),
            SocketAddr::from(([0u8; 4], port)),
        ]);
    }
    let addrs: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("not HOST:PORT ({e})"))?
        .collect();
    if addrs.is_empty() {
        return Err("resolves to no address".into());
    }
    Ok(addrs)
}

/// Binds the first address of `listen` that works.
pub fn bind(listen: &str) -> anyhow::Result<TcpListener> {
    let addrs = resolve_listen_address(listen).map_err(anyhow::Error::msg)?;
    let mut last = None;
    for a in addrs {
        match TcpListener::bind(a) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(anyhow::Error::new(e).context(format!("binding {a}"))),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("nothing to bind")))
}

extern "C" fn on_signal(_: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; the byte's value is irrelevant.
        unsafe {
            libc::write(fd, [1u8].as_ptr().cast(), 1);
        }
    }
}

/// Creates the self-pipe and installs SIGTERM/SIGINT handlers; returns the
/// read end.
fn install_signal_pipe() -> io::Result<i32> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a zeroed sigaction with a plain handler is valid.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: sa is initialised; the old action is not needed.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fds[0])
}

/// Serves until SIGTERM/SIGINT.
pub fn serve(
    listener: TcpListener,
    exporter: Arc<Exporter>,
    max_requests: usize,
) -> io::Result<()> {
    let sig_fd = install_signal_pipe()?;
    listener.set_nonblocking(true)?;
    let connections = Arc::new(AtomicUsize::new(0));
    let scrapes = Arc::new(AtomicUsize::new(0));
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sig_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of two pollfds.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents != 0 {
            crate::log("signal received, shutting down");
            break;
        }
        loop {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: log, back off, keep serving.
                    crate::log(&format!("accept failed: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                    break;
                }
            };
            if connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                connections.fetch_sub(1, Ordering::SeqCst);
                drop(stream);
                continue;
            }
            let exporter = Arc::clone(&exporter);
            let connections = Arc::clone(&connections);
            let scrapes = Arc::clone(&scrapes);
            let spawned = std::thread::Builder::new()
                .name("http".into())
                .spawn(move || {
                    let _ = handle(stream, &exporter, &scrapes, max_requests);
                    connections.fetch_sub(1, Ordering::SeqCst);
                });
            if spawned.is_err() {
                crate::log("cannot spawn a connection thread");
            }
        }
    }
    drop(listener);
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    while connections.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

struct Request {
    method: String,
    path: String,
    accept: Option<String>,
}

fn read_request(stream: &mut TcpStream) -> io::Result<Option<Request>> {
    stream.set_read_timeout(Some(REQUEST_READ_TIMEOUT))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Ok(None);
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("").to_string();
    let target = first.next().unwrap_or("").to_string();
    let accept = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("accept")
            .then(|| v.trim().to_string())
    });
    let path = target.split('?').next().unwrap_or("").to_string();
    Ok(Some(Request {
        method,
        path,
        accept,
    }))
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> io::Result<()> {
    stream.set_write_timeout(Some(RESPONSE_WRITE_TIMEOUT))?;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(body)?;
    }
    stream.flush()
}

const INDEX: &str = "<!DOCTYPE html>\n<html><head><title>longhaul-exporter</title></head><body>\n\
<h1>longhaul-exporter</h1>\n<p>Per-stream, per-TCP-flow and per-RAID-controller statistics for Prometheus.</p>\n\
<p><a href=\"/metrics\">Metrics</a></p>\n</body></html>\n";

/// Decrements the scrape counter however the scrape ends.
struct ScrapeSlot<'a>(&'a AtomicUsize);

impl Drop for ScrapeSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn handle(
    mut stream: TcpStream,
    exporter: &Exporter,
    scrapes: &AtomicUsize,
    max_requests: usize,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    let Some(req) = read_request(&mut stream)? else {
        return Ok(());
    };
    let head_only = req.method == "HEAD";
    if req.method != "GET" && !head_only {
        return respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            b"only GET and HEAD\n",
            false,
        );
    }
    match req.path.as_str() {
        "/" => respond(
            &mut stream,
            "200 OK",
            "text/html; charset=utf-8",
            INDEX.as_bytes(),
            head_only,
        ),
        "/metrics" => {
            if scrapes.fetch_add(1, Ordering::SeqCst) >= max_requests {
                scrapes.fetch_sub(1, Ordering::SeqCst);
                return respond(
                    &mut stream,
                    "503 Service Unavailable",
                    "text/plain; charset=utf-8",
                    format!("more than {max_requests} scrapes in flight; try again\n").as_bytes(),
                    head_only,
                );
            }
            let _slot = ScrapeSlot(scrapes);
            let format = Format::from_accept(req.accept.as_deref());
            let body = metrics::encode(&exporter.scrape(), format);
            respond(
                &mut stream,
                "200 OK",
                format.content_type(),
                body.as_bytes(),
                head_only,
            )
        }
        _ => respond(
            &mut stream,
            "404 Not Found",
            "text/plain; charset=utf-8",
            b"not found; metrics are at /metrics\n",
            false,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        let all = resolve_listen_address(":9743").unwrap();
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|a| a.port() == 9743));
        assert_eq!(
            resolve_listen_address("127.0.0.1:0").unwrap(),
            vec![SocketAddr::from(([127, 0, 0, 1], 0))]
        );
        assert!(resolve_listen_address(":x").is_err());
        assert!(resolve_listen_address("nohost").is_err());
    }
}
