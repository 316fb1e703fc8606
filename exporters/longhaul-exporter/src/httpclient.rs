//! A minimal HTTP/1.1 GET client for the engine's stats API, with one
//! deadline for connect + request + response so a hung engine cannot hold a
//! scrape. Handles Content-Length, chunked and read-to-close bodies.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Bodies larger than this are refused: 1,000 streams of JSON are ~300 KB,
/// so 64 MiB means something is wrong, and we must not eat the host's memory.
const MAX_BODY: usize = 64 << 20;

/// An `http://host:port/prefix` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    /// Path prefix without trailing slash ("" for none).
    pub prefix: String,
}

impl Url {
    pub fn parse(s: &str) -> Result<Url, String> {
        let rest = s
            .strip_prefix("http://")
            .ok_or("only http:// URLs are supported")?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err("missing host".into());
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or("unclosed [ in host")?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| format!("bad port {p:?}"))?,
                None if after.is_empty() => 80,
                None => return Err(format!("junk after host: {after:?}")),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse().map_err(|_| format!("bad port {p:?}"))?,
                ),
                None => (authority.to_string(), 80),
            }
        };
        if host.is_empty() {
            return Err("missing host".into());
        }
        Ok(Url {
            host,
            port,
            prefix: path.trim_end_matches('/').to_string(),
        })
    }

    fn host_header(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// GETs `url.prefix + path` and returns the body of a 200 answer.
pub fn get(url: &Url, path: &str, timeout: Duration) -> anyhow::Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let addrs: Vec<SocketAddr> = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {}", url.host))?
        .collect();
    let mut last_err = None;
    let mut stream = None;
    for addr in addrs {
        let left = remaining(deadline)?;
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => {
                last_err = Some(anyhow::Error::new(e).context(format!("connecting to {addr}")))
            }
        }
    }
    let mut stream = match stream {
        Some(s) => s,
        None => {
            return Err(
                last_err.unwrap_or_else(|| anyhow::anyhow!("{} resolves to nothing", url.host))
            )
        }
    };
    stream.set_write_timeout(Some(remaining(deadline)?))?;
    let request = format!(
        "GET {}{} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nUser-Agent: longhaul-exporter/{}\r\nConnection: close\r\n\r\n",
        url.prefix,
        path,
        url.host_header(),
        env!("CARGO_PKG_VERSION")
    );
    stream
        .write_all(request.as_bytes())
        .context("sending request")?;
    let mut raw = Vec::with_capacity(16 * 1024);
    let mut buf = [0u8; 16 * 1024];
    loop {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if raw.len() > MAX_BODY {
                    bail!("answer larger than {MAX_BODY} bytes");
                }
                if response_complete(&raw) {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                bail!("no complete answer within {timeout:?}")
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(anyhow::Error::new(e).context("reading answer")),
        }
    }
    parse_response(&raw)
}

fn remaining(deadline: Instant) -> anyhow::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        bail!("timed out");
    }
    Ok(left)
}

fn split_head(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some((&raw[..i], &raw[i + 4..]))
}

/// True once a Content-Length body is complete, so we need not wait for
/// the server to close (keep-alive servers would otherwise run the clock out).
fn response_complete(raw: &[u8]) -> bool {
    let Some((head, body)) = split_head(raw) else {
        return false;
    };
    let head = String::from_utf8_lossy(head);
    header(&head, "content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| body.len() >= n)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn parse_response(raw: &[u8]) -> anyhow::Result<Vec<u8>> {
    let (head, body) = split_head(raw).context("answer is not HTTP (no header end)")?;
    let head = String::from_utf8_lossy(head);
    let status_line = head.lines().next().unwrap_or("");
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or("");
    let code = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        bail!("answer is not HTTP: {:?}", truncate(status_line));
    }
    if code != "200" {
        bail!("HTTP status {:?}", truncate(status_line));
    }
    if header(&head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return dechunk(body);
    }
    if let Some(len) = header(&head, "content-length") {
        let n: usize = len
            .parse()
            .with_context(|| format!("bad Content-Length {len:?}"))?;
        if body.len() < n {
            bail!("answer cut short: {} of {n} bytes", body.len());
        }
        return Ok(body[..n].to_vec());
    }
    Ok(body.to_vec())
}

fn dechunk(mut body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    loop {
        let i = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("chunked body cut short")?;
        let size_text = String::from_utf8_lossy(&body[..i]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        body = &body[i + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size + 2 {
            bail!("chunked body cut short");
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    #[test]
    fn urls() {
        let u = Url::parse("http://127.0.0.1:7401").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.prefix.as_str()),
            ("127.0.0.1", 7401, "")
        );
        let u = Url::parse("http://[::1]:9/api/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.prefix.as_str()),
            ("::1", 9, "/api")
        );
        assert_eq!(Url::parse("http://h").unwrap().port, 80);
        for bad in ["https://x", "http://", "http://h:x", "x"] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn responses() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(parse_response(ok).unwrap(), b"{}");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{\"\r\n1;x=y\r\n}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), b"{\"}");
        assert!(parse_response(b"HTTP/1.1 500 Oops\r\n\r\n").is_err());
        assert!(parse_response(b"garbage").is_err());
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(response_complete(ok));
    }

    proptest::proptest! {
        /// Whatever an engine (or an impostor on its port) answers, parsing
        /// never panics and never yields more than it was given.
        #[test]
        fn any_answer_parses_or_fails_cleanly(
            raw in proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
                "HTTP/1\\.1 200 OK\r\n([A-Za-z-]{1,20}: [0-9a-z;= ]{0,20}\r\n){0,4}\r\n[0-9a-f\r\n;{}]{0,200}"
                    .prop_map(String::into_bytes),
            ]
        ) {
            let _ = response_complete(&raw);
            if let Ok(body) = parse_response(&raw) {
                proptest::prop_assert!(body.len() <= raw.len());
            }
        }
    }
}
