//! The stats API: a minimal HTTP/1.1 server answering
//! `GET /v1/sessions` with the registry's [`longhaul_stats_api::Snapshot`]
//! as JSON, 404 for other paths, 405 for other methods. One short-lived
//! thread per request, `Connection: close`: the only client is a scraper.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use crate::registry::Registry;

/// A scraper that does not finish its request line in this time is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest request head we read; a GET needs a few hundred bytes.
const MAX_REQUEST_HEAD: usize = 16 << 10;

/// Serves the API on `listener` from a background thread.
pub fn spawn(listener: TcpListener, registry: Arc<Registry>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("stats-api".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let registry = registry.clone();
                let _ = std::thread::Builder::new()
                    .name("stats-request".into())
                    .spawn(move || {
                        let _ = handle(conn, &registry);
                    });
            }
        })?;
    Ok(())
}

fn respond(conn: &mut TcpStream, status: &str, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

fn handle(mut conn: TcpStream, registry: &Registry) -> std::io::Result<()> {
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Skip headers up to the blank line, bounded.
    let mut seen = request_line.len();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line)?;
        seen += n;
        if n == 0 || line == "\r\n" || line == "\n" || seen > MAX_REQUEST_HEAD {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if path != longhaul_stats_api::SESSIONS_PATH {
        return respond(&mut conn, "404 Not Found", "text/plain", b"not found\n");
    }
    if method != "GET" && method != "HEAD" {
        return respond(
            &mut conn,
            "405 Method Not Allowed",
            "text/plain",
            b"only GET\n",
        );
    }
    let body = serde_json::to_vec(&registry.snapshot()).unwrap_or_default();
    respond(&mut conn, "200 OK", "application/json", &body)
}
