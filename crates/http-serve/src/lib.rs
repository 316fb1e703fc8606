//! The HTTP server behind the engine's stats API and the exporter's
//! `/metrics`: hyper's HTTP/1.1 on a small tokio runtime of its own, with
//! every limit a hostile or broken client could otherwise abuse.
//!
//! - The request head is bounded ([`Limits::max_header_bytes`]; hyper answers
//!   `431 Request Header Fields Too Large` beyond it) and must arrive within
//!   [`Limits::header_deadline`] in total, however slowly it trickles.
//! - Connections whose request head is not complete yet are *pending*; they
//!   live in a [`longhaul_admission::PendingSet`], which pushes out the
//!   oldest pending connections of the biggest source when it is full, so
//!   slow or silent clients cannot keep a scraper out.
//! - All connections together are bounded ([`Limits::max_connections`]) and
//!   each has a total deadline ([`Limits::connection_deadline`]).
//! - Handlers are plain blocking functions run on tokio's blocking pool, at
//!   most [`Limits::max_in_flight`] at once, and at most
//!   [`Limits::max_in_flight_per_source`] for one source (an IPv4 address
//!   or an IPv6 /64, as [`longhaul_admission::SourceKey`] counts them);
//!   more get `503` at once. So one source that floods cannot take every
//!   handler: a scraper at another address is still answered.
//! - The responses connections hold while their clients read them are
//!   bounded in bytes ([`Limits::max_response_bytes`], and
//!   [`Limits::max_response_bytes_per_source`] for one source): a client
//!   that sends a request and reads nothing holds its response until the
//!   connection's deadline, so beyond the budget a big answer becomes a
//!   small `503`.
//! - One request per connection (`Connection: close`), which is all a
//!   scraper needs and keeps every connection's life bounded.
//! - With TLS ([`Server::spawn_tls`], rustls), the handshake is part of the
//!   request head: it counts against [`Limits::header_deadline`] and the
//!   connection is pending (evictable) until its head is complete. A client
//!   that speaks plain HTTP to the TLS port gets a plain `400` saying so.
//! - A [`Precheck`] answers requests before they take a handler slot (basic
//!   auth turning strangers away), on the server's thread.
//!
//! Why hyper and tokio: docs/http.md.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use longhaul_admission::{EntryId, PendingSet, SourceKey};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{oneshot, Semaphore};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

mod termination;
pub use termination::Termination;

/// The rustls this server speaks: build [`Server::spawn_tls`]'s
/// configuration with it.
pub use tokio_rustls::rustls;

/// The limits of one server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Request line plus headers, bytes; `431` beyond.
    pub max_header_bytes: usize,
    /// Time for the whole request head to arrive, from accept.
    pub header_deadline: Duration,
    /// Time for a whole connection: head, handler and response.
    pub connection_deadline: Duration,
    /// Connections whose request head is not complete yet.
    pub pending: longhaul_admission::Limits,
    /// Connections in all states; beyond, new ones wait in the kernel's
    /// accept queue.
    pub max_connections: usize,
    /// Handler calls at once; beyond, `503`.
    pub max_in_flight: usize,
    /// Handler calls at once from one source; beyond, `503` for that
    /// source.
    pub max_in_flight_per_source: usize,
    /// Bytes of responses held by connections still writing them; a
    /// response that does not fit is answered `503` instead (answers of up
    /// to [`SMALL_RESPONSE`] bytes are not counted).
    pub max_response_bytes: usize,
    /// The same for the connections of one source.
    pub max_response_bytes_per_source: usize,
}

/// Answers this small (a `503`, a health check) go out outside the
/// [`Limits::max_response_bytes`] budget.
pub const SMALL_RESPONSE: usize = 16 << 10;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            // A scrape request is ~300 bytes; 16 KiB leaves room for proxies'
            // headers.
            max_header_bytes: 16 << 10,
            // A scraper sends its request in one packet; 5 s is generous even
            // across a congested WAN.
            header_deadline: Duration::from_secs(5),
            // Prometheus' default scrape timeout is 10 s; a response still
            // being written after 30 s has no reader.
            connection_deadline: Duration::from_secs(30),
            pending: longhaul_admission::Limits {
                capacity: 512,
                per_source: 256,
            },
            max_connections: 1024,
            max_in_flight: 4,
            // Half: a source that floods leaves the other half to the rest.
            max_in_flight_per_source: 2,
            // Scrapes of a host with 1,024 streams are a few MiB; this is
            // room for several at once, and what 1,024 clients that read
            // nothing can make the process hold.
            max_response_bytes: 64 << 20,
            max_response_bytes_per_source: 32 << 20,
        }
    }
}

/// A request as handlers see it.
pub struct Request {
    parts: hyper::http::request::Parts,
    /// The client's address.
    pub peer: SocketAddr,
}

impl Request {
    pub fn method(&self) -> &str {
        self.parts.method.as_str()
    }

    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.parts.uri.path()
    }

    /// The query, without the `?` (None: no query).
    pub fn query(&self) -> Option<&str> {
        self.parts.uri.query()
    }

    /// A header's value, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.parts.headers.get(name)?.to_str().ok()
    }
}

/// A handler's answer. HEAD requests get the same status and headers
/// without the body (hyper drops it). The body is shared, not copied, when
/// several answers carry the same one (the exporter's scrapes of one
/// collection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: String,
    pub body: Bytes,
    /// More header lines (name, value), e.g. `WWW-Authenticate`.
    pub headers: Vec<(String, String)>,
}

impl Response {
    pub fn new(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response {
        Response {
            status,
            content_type: content_type.to_string(),
            body: body.into(),
            headers: Vec::new(),
        }
    }

    /// The same answer with one more header line.
    pub fn with_header(mut self, name: &str, value: &str) -> Response {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn text(status: u16, body: &str) -> Response {
        Response::new(
            status,
            "text/plain; charset=utf-8",
            Bytes::copy_from_slice(body.as_bytes()),
        )
    }
}

/// What each source holds now, and all of them together: handlers in
/// flight and KiB of responses being written. A source's entry goes when
/// it holds nothing.
struct Ledger {
    limits: Limits,
    state: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: Share,
    by_source: HashMap<SourceKey, Share>,
}

#[derive(Default, Clone, Copy)]
struct Share {
    handlers: usize,
    kib: u64,
}

/// Something a source holds, given back on drop.
struct Hold {
    ledger: Arc<Ledger>,
    source: SourceKey,
    share: Share,
}

impl Ledger {
    /// Takes `want` for `source` if both its share and the total allow.
    fn take(self: &Arc<Ledger>, source: SourceKey, want: Share) -> Option<Hold> {
        let l = &self.limits;
        let mut held = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Held { total, by_source } = &mut *held;
        let mine = by_source.get(&source).copied().unwrap_or_default();
        let fits = |have: Share, handlers: usize, kib: u64| {
            (want.handlers == 0 || have.handlers + want.handlers <= handlers)
                && (want.kib == 0 || have.kib + want.kib <= kib)
        };
        if !fits(
            *total,
            l.max_in_flight.max(1),
            kib(l.max_response_bytes).into(),
        ) || !fits(
            mine,
            l.max_in_flight_per_source.max(1),
            kib(l.max_response_bytes_per_source).into(),
        ) {
            return None;
        }
        for s in [total, by_source.entry(source).or_default()] {
            s.handlers += want.handlers;
            s.kib += want.kib;
        }
        Some(Hold {
            ledger: Arc::clone(self),
            source,
            share: want,
        })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut held = self.ledger.state.lock().unwrap_or_else(|e| e.into_inner());
        let Held { total, by_source } = &mut *held;
        total.handlers -= self.share.handlers;
        total.kib -= self.share.kib;
        if let Some(s) = by_source.get_mut(&self.source) {
            s.handlers -= self.share.handlers;
            s.kib -= self.share.kib;
            if s.handlers == 0 && s.kib == 0 {
                by_source.remove(&self.source);
            }
        }
    }
}

/// What answers requests.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Looked at before a request takes a handler slot, on the server's own
/// thread, so it must be quick and never block: `Some(answer)` is the
/// answer, and no handler runs. A server with basic auth turns strangers
/// away here (no credentials, a refused password it remembers, a source
/// slowed down), so their requests never hold a slot a scraper needs.
pub type Precheck = Arc<dyn Fn(&Request) -> Option<Response> + Send + Sync>;

/// A running server; [`Server::shutdown`] stops it.
pub struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<Duration>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Serves `listener` in plain HTTP on a thread named `name` until shut
    /// down.
    pub fn spawn(
        listener: TcpListener,
        name: &str,
        limits: Limits,
        handler: Handler,
    ) -> std::io::Result<Server> {
        Server::spawn_tls(listener, name, limits, None, handler, None)
    }

    /// The same, over TLS when `tls` is given: every connection must
    /// complete its handshake (with `tls`'s certificate resolver and client
    /// verifier) within [`Limits::header_deadline`] of its accept; and with
    /// `precheck`, requests it answers take no handler slot.
    pub fn spawn_tls(
        listener: TcpListener,
        name: &str,
        limits: Limits,
        tls: Option<Arc<ServerConfig>>,
        handler: Handler,
        precheck: Option<Precheck>,
    ) -> std::io::Result<Server> {
        let tls = tls.map(TlsAcceptor::from);
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(limits.max_in_flight.max(1))
            .thread_name(format!("{name}-handler"))
            .build()?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                runtime.block_on(serve(listener, limits, tls, handler, precheck, stopped))
            })?;
        Ok(Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets connections in flight finish for at most
    /// `grace`, and returns once the server thread is gone.
    pub fn shutdown(mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(grace);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Pending connections: a cancel handle per connection still waiting for
/// its request head.
type Pending = Arc<Mutex<PendingSet<oneshot::Sender<()>>>>;

fn leave(pending: &Pending, id: EntryId) {
    pending.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
}

async fn serve(
    listener: TcpListener,
    limits: Limits,
    tls: Option<TlsAcceptor>,
    handler: Handler,
    precheck: Option<Precheck>,
    mut stopped: oneshot::Receiver<Duration>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("http-serve: cannot serve: {e}");
            return;
        }
    };
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let ledger = Arc::new(Ledger {
        limits,
        state: Mutex::default(),
    });
    let pending: Pending = Arc::new(Mutex::new(PendingSet::new(limits.pending)));
    let grace = loop {
        let permit = tokio::select! {
            grace = &mut stopped => break grace.unwrap_or_default(),
            p = connections.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            grace = &mut stopped => break grace.unwrap_or_default(),
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(_) => {
                    // EMFILE and friends: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let (cancel, cancelled) = oneshot::channel();
        let (id, evicted) = pending.lock().unwrap_or_else(|e| e.into_inner()).insert(
            peer.ip(),
            Instant::now() + limits.header_deadline,
            cancel,
        );
        for c in evicted {
            let _ = c.send(());
        }
        let conn = Connection {
            id,
            peer,
            tls: tls.clone(),
            pending: pending.clone(),
            ledger: ledger.clone(),
            handler: handler.clone(),
            precheck: precheck.clone(),
        };
        tokio::spawn(async move {
            conn.run(stream, limits, cancelled).await;
            drop(permit);
        });
    };
    drop(listener);
    // Connections in flight hold permits; wait until all are back.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(grace, connections.acquire_many(all)).await;
}

struct Connection {
    id: EntryId,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    pending: Pending,
    ledger: Arc<Ledger>,
    handler: Handler,
    precheck: Option<Precheck>,
}

/// Whole KiB that hold `bytes`, as semaphore permits.
fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

impl Connection {
    async fn run(
        self,
        stream: tokio::net::TcpStream,
        limits: Limits,
        mut cancelled: oneshot::Receiver<()>,
    ) {
        let accepted = tokio::time::Instant::now();
        let Connection {
            id,
            peer,
            tls,
            pending,
            ledger,
            handler,
            precheck,
        } = self;
        let head_pending = pending.clone();
        let source = SourceKey::of(peer.ip());
        // Both budgets' smaller: one response always fits an empty budget.
        let budget = kib(ledger
            .limits
            .max_response_bytes
            .min(ledger.limits.max_response_bytes_per_source));
        // This connection's share of the response budget: the service holds
        // it, so it returns when the connection ends (its response written,
        // or its deadline passed).
        let holds: Arc<Mutex<Option<Hold>>> = Arc::default();
        let service = service_fn(move |req: hyper::Request<Incoming>| {
            // The head is complete: the connection stops being pending.
            leave(&head_pending, id);
            let (parts, _body) = req.into_parts();
            let request = Request { parts, peer };
            let early = precheck.as_ref().and_then(|p| p(&request));
            let handler = handler.clone();
            let ledger = ledger.clone();
            let holds = holds.clone();
            async move {
                if let Some(answer) = early {
                    return Ok::<_, Infallible>(to_hyper(answer));
                }
                let handlers = Share {
                    handlers: 1,
                    kib: 0,
                };
                let answer = match ledger.take(source, handlers) {
                    Some(permit) => {
                        let handled = tokio::task::spawn_blocking(move || {
                            let answer = handler(&request);
                            drop(permit);
                            answer
                        })
                        .await;
                        handled.unwrap_or_else(|_| Response::text(500, "handler failed\n"))
                    }
                    None => Response::text(503, "too many requests in flight; try again\n"),
                };
                let answer = if answer.body.len() <= SMALL_RESPONSE {
                    answer
                } else {
                    let need = Share {
                        handlers: 0,
                        kib: kib(answer.body.len()).min(budget).into(),
                    };
                    match ledger.take(source, need) {
                        Some(permit) => {
                            *holds.lock().unwrap_or_else(|e| e.into_inner()) = Some(permit);
                            answer
                        }
                        None => Response::text(
                            503,
                            "too many responses still being read by their clients; try again\n",
                        ),
                    }
                };
                Ok::<_, Infallible>(to_hyper(answer))
            }
        });
        let head_by = accepted + limits.header_deadline;
        let over_by = accepted + limits.connection_deadline;
        match tls {
            None => exchange(stream, service, &limits, head_by, over_by, &mut cancelled).await,
            Some(acceptor) => {
                let shaken = tokio::select! {
                    s = tokio::time::timeout_at(head_by, handshake(&acceptor, stream)) => {
                        s.ok().flatten()
                    }
                    Ok(()) = &mut cancelled => None,
                };
                if let Some(stream) = shaken {
                    exchange(stream, service, &limits, head_by, over_by, &mut cancelled).await;
                }
            }
        }
        leave(&pending, id);
    }
}

/// Reads one request from `io` and writes its answer, within the head's and
/// the connection's deadlines, unless the connection is evicted first.
async fn exchange<I, S>(
    io: I,
    service: S,
    limits: &Limits,
    head_by: tokio::time::Instant,
    over_by: tokio::time::Instant,
    cancelled: &mut oneshot::Receiver<()>,
) where
    I: AsyncRead + AsyncWrite + Unpin,
    S: hyper::service::HttpService<Incoming, ResBody = Full<Bytes>, Error = Infallible>,
{
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(head_by.saturating_duration_since(tokio::time::Instant::now()))
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(false);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::select! {
        _ = tokio::time::timeout_at(over_by, conn) => {}
        // Only an eviction sends; leaving the pool drops the sender.
        Ok(()) = cancelled => {}
    }
}

/// What a client that speaks plain HTTP to the TLS port is told (Go's
/// servers, Prometheus' among them, say the same).
const PLAIN_TO_TLS: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// What a plain-HTTP client may still send after its answer.
const MAX_DRAINED: usize = 64 << 10;

/// The TLS handshake; None when it fails. A first byte that does not open
/// a TLS handshake record (22) is a plain-HTTP client: it gets
/// [`PLAIN_TO_TLS`].
async fn handshake(
    acceptor: &TlsAcceptor,
    mut stream: tokio::net::TcpStream,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) if first[0] == 22 => {}
        Ok(1) => {
            let _ = stream.write_all(PLAIN_TO_TLS).await;
            let _ = stream.shutdown().await;
            // Read what the client sent (bounded, within the caller's
            // deadline) before closing: closing with it unread would reset
            // the connection, and the client could lose the answer.
            let mut sink = [0u8; 4096];
            let mut left = MAX_DRAINED;
            while left > 0 {
                match tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
            return None;
        }
        _ => return None,
    }
    acceptor.accept(stream).await.ok()
}

fn to_hyper(r: Response) -> hyper::Response<Full<Bytes>> {
    // Explicit, so HEAD answers carry it too (hyper sends no body for them).
    let length = hyper::header::HeaderValue::from(r.body.len());
    let mut answer = hyper::Response::new(Full::new(r.body.clone()));
    *answer.status_mut() =
        hyper::StatusCode::from_u16(r.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = hyper::header::HeaderValue::from_str(&r.content_type) {
        answer.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    answer
        .headers_mut()
        .insert(hyper::header::CONTENT_LENGTH, length);
    for (name, value) in &r.headers {
        if let (Ok(n), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(name.as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) {
            answer.headers_mut().append(n, v);
        }
    }
    answer
}
