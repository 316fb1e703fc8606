//! `/metrics` and `/` over HTTP, served by `longhaul-http-serve` (hyper on
//! a small tokio runtime): the request head is bounded (`431` beyond
//! [`MAX_REQUEST_HEAD`]) and must arrive within [`HEADER_DEADLINE`],
//! connections still sending their head are pushed out oldest-first when
//! too many pile up, so slow or silent clients cannot keep Prometheus out,
//! and more than `--web.max-requests` requests at once, or more than half
//! of them from one source, get `503`. Scrapes that arrive while a
//! collection runs wait for its result (scrape.rs), each within its own
//! deadline.
//! SIGTERM/SIGINT (taken through tokio's signal handling, `Termination`)
//! wake the main thread; the server then stops accepting and waits (bounded)
//! for requests in flight.

use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use longhaul_http_serve::{Limits, Response, Server, Termination};

use longhaul_web_config::{guard, WebConfig};

use crate::metrics::Format;
use crate::scrape::Exporter;

/// Request head size limit; real scrape requests are ~300 bytes.
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// The whole request head must arrive within this; a scrape request is one
/// small packet.
pub const HEADER_DEADLINE: Duration = Duration::from_secs(5);
/// Connections still sending their request head: beyond, the oldest of
/// the biggest source are closed. Each costs a few KiB in the runtime.
pub const MAX_PENDING: usize = 512;
/// One source's share of the pending connections.
pub const MAX_PENDING_PER_SOURCE: usize = 256;
/// Open connections at most (pending ones included); beyond, new ones wait
/// in the kernel's accept queue.
pub const MAX_CONNECTIONS: usize = 1024;
/// Bytes of scrapes that connections may hold while their clients read
/// them (a scrape of 10,000 streams is ~2 MiB; scrapes of one collection
/// share one body, but are counted once each), within the exporter's
/// 30 MiB; one source may hold half.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// The handlers one source may hold: half of `--web.max-requests` (at
/// least one), so a source that floods leaves the rest to Prometheus, which
/// sends one scrape at a time.
pub fn per_source_requests(max_requests: usize) -> usize {
    (max_requests / 2).max(1)
}

/// A connection's whole life: head, scrape and response. Prometheus'
/// default scrape timeout is 10 s.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// How long shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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

/// Serves until SIGTERM/SIGINT.
pub fn serve(
    listener: TcpListener,
    exporter: Arc<Exporter>,
    web: WebConfig,
    max_requests: usize,
) -> io::Result<()> {
    let termination = Termination::listen()?;
    let limits = Limits {
        max_header_bytes: MAX_REQUEST_HEAD,
        header_deadline: HEADER_DEADLINE,
        connection_deadline: CONNECTION_DEADLINE,
        pending: longhaul_admission::Limits {
            capacity: MAX_PENDING,
            per_source: MAX_PENDING_PER_SOURCE,
        },
        max_connections: MAX_CONNECTIONS,
        max_in_flight: max_requests.max(1),
        max_in_flight_per_source: per_source_requests(max_requests),
        max_response_bytes: MAX_RESPONSE_BYTES,
        max_response_bytes_per_source: MAX_RESPONSE_BYTES / 2,
    };
    let (handler, precheck) = guard(web.auth, Arc::new(move |req| answer(req, &exporter)));
    let server = Server::spawn_tls(listener, "http", limits, web.tls, handler, precheck)?;
    let signal = termination.wait();
    crate::log(&format!("signal received, shutting down ({signal})"));
    server.shutdown(SHUTDOWN_GRACE);
    Ok(())
}

/// How long a scrape waits for a collection that is already running when
/// the scraper does not say (Prometheus sends its scrape timeout, by
/// default 10 s, as X-Prometheus-Scrape-Timeout-Seconds).
pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(10);

/// The scrape's own deadline: Prometheus' header, at most the connection's.
fn patience(req: &longhaul_http_serve::Request) -> Duration {
    req.header("x-prometheus-scrape-timeout-seconds")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| Duration::from_secs_f64(s).min(CONNECTION_DEADLINE))
        .unwrap_or(DEFAULT_PATIENCE)
}

const INDEX: &str = "<!DOCTYPE html>\n<html><head><title>longhaul-exporter</title></head><body>\n\
<h1>longhaul-exporter</h1>\n<p>Per-stream, per-TCP-flow and per-RAID-controller statistics for Prometheus.</p>\n\
<p><a href=\"/metrics\">Metrics</a></p>\n</body></html>\n";

fn answer(req: &longhaul_http_serve::Request, exporter: &Exporter) -> Response {
    if req.method() != "GET" && req.method() != "HEAD" {
        return Response::text(405, "only GET and HEAD\n");
    }
    match req.path() {
        "/" => Response::new(200, "text/html; charset=utf-8", INDEX),
        "/metrics" => {
            let format = Format::from_accept(req.header("accept"));
            match exporter.shared(patience(req)) {
                Some(collection) => {
                    Response::new(200, format.content_type(), collection.encoded(format))
                }
                None => Response::text(
                    503,
                    "the collection in progress did not finish within this scrape's timeout\n",
                ),
            }
        }
        _ => Response::text(404, "not found; metrics are at /metrics\n"),
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
