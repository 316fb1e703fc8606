//! The server against real sockets on loopback: routing through the
//! handler, HEAD, 431, the head deadline, eviction of pending connections
//! and the in-flight limit.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_http_serve::{Handler, Limits, Response, Server};

fn start(limits: Limits, handler: Handler) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    Server::spawn(listener, "test-http", limits, handler).unwrap()
}

fn echo() -> Handler {
    Arc::new(|req| {
        if req.path() == "/slow" {
            std::thread::sleep(Duration::from_millis(800));
        }
        Response::text(200, &format!("{} {}\n", req.method(), req.path()))
    })
}

/// Sends `raw` and reads the whole answer (the server closes).
fn exchange(server: &Server, raw: &[u8]) -> String {
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn answers_get_and_head_and_closes() {
    let server = start(Limits::default(), echo());
    let got = exchange(&server, b"GET /a?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with("GET /a\n"), "{got}");
    let head = exchange(&server, b"HEAD /a HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("content-length: 8"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD got a body: {head}");
    server.shutdown(Duration::from_secs(1));
}

#[test]
fn an_oversized_head_gets_431() {
    let server = start(Limits::default(), echo());
    let mut raw = b"GET /".to_vec();
    raw.extend(std::iter::repeat_n(b'a', 64 << 10));
    raw.extend_from_slice(b" HTTP/1.1\r\n\r\n");
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may close before it has read everything: ignore that.
    let _ = s.write_all(&raw);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let got = String::from_utf8_lossy(&out);
    assert!(got.starts_with("HTTP/1.1 431"), "{got}");
}

#[test]
fn a_trickled_head_is_cut_at_the_deadline() {
    let limits = Limits {
        header_deadline: Duration::from_millis(600),
        ..Limits::default()
    };
    let server = start(limits, echo());
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    let start = Instant::now();
    // One byte every 100 ms: every read is "recent", only a total deadline
    // stops it.
    let mut closed = false;
    for b in b"GET / HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter() {
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        let mut probe = [0u8; 256];
        s.set_nonblocking(true).unwrap();
        let r = s.read(&mut probe);
        s.set_nonblocking(false).unwrap();
        if r.is_ok() {
            closed = true;
            break;
        }
    }
    assert!(closed, "the trickling client was never cut off");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "cut after {:?}",
        start.elapsed()
    );
}

#[test]
fn pending_connections_are_pushed_out_not_the_newcomer() {
    let limits = Limits {
        pending: longhaul_admission::Limits {
            capacity: 8,
            per_source: 8,
        },
        header_deadline: Duration::from_secs(30),
        ..Limits::default()
    };
    let server = start(limits, echo());
    // Twenty silent connections: more than the pool holds.
    let silent: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(server.local_addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let got = exchange(&server, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(t.elapsed() < Duration::from_secs(2));
    // The oldest silent ones were closed by the server.
    let mut first = &silent[0];
    first
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(first.read(&mut b), Ok(0) | Err(_)));
}

#[test]
fn handlers_beyond_the_in_flight_limit_get_503() {
    let limits = Limits {
        max_in_flight: 1,
        ..Limits::default()
    };
    let server = start(limits, echo());
    let addr = server.local_addr();
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    });
    std::thread::sleep(Duration::from_millis(300));
    let busy = exchange(&server, b"GET /x HTTP/1.1\r\n\r\n");
    assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
    assert!(slow.join().unwrap().starts_with("HTTP/1.1 200"));
    let after = exchange(&server, b"GET /x HTTP/1.1\r\n\r\n");
    assert!(after.starts_with("HTTP/1.1 200"), "{after}");
}

#[test]
fn responses_nobody_reads_are_bounded_in_bytes() {
    // Bigger than the kernel takes into a socket whose reader reads nothing
    // (tcp_wmem's 4 MiB at most), so the rest stays with the server.
    const BIG: usize = 12 << 20;
    let limits = Limits {
        max_response_bytes: 2 * BIG,
        ..Limits::default()
    };
    let handler: Handler = Arc::new(|req| {
        if req.path() == "/big" {
            Response::new(200, "application/octet-stream", vec![b'x'; BIG])
        } else {
            Response::text(200, "small\n")
        }
    });
    let server = start(limits, handler);
    // Two clients that ask for the big answer and read nothing hold the
    // whole budget.
    let silent: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(server.local_addr()).unwrap();
            s.write_all(b"GET /big HTTP/1.1\r\n\r\n").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let refused = exchange(&server, b"GET /big HTTP/1.1\r\n\r\n");
    assert!(
        refused.starts_with("HTTP/1.1 503"),
        "{}",
        &refused[..refused.len().min(200)]
    );
    // Small answers still go out.
    let small = exchange(&server, b"GET /small HTTP/1.1\r\n\r\n");
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    // Once those clients are gone, the budget is back.
    drop(silent);
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let big = exchange(&server, b"GET /big HTTP/1.1\r\n\r\n");
        if big.starts_with("HTTP/1.1 200") {
            assert!(big.len() > BIG, "{}", big.len());
            break;
        }
        assert!(Instant::now() < end, "the budget did not come back");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends `raw` from `source` (a loopback address) and reads the answer.
fn exchange_from(server: &Server, source: &str, raw: &[u8]) -> String {
    let from = std::net::SocketAddr::new(source.parse().unwrap(), 0);
    let mut s = longhaul_testkit::connect_from(from, server.local_addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// One source sending more requests at once than its share gets 503 for
/// the rest, and another source is still answered: a flood from one
/// address cannot take every handler (issue 40). Before, the flood's
/// requests took all four and the other source got 503.
#[test]
fn one_source_cannot_take_every_handler() {
    let limits = Limits {
        max_in_flight: 4,
        max_in_flight_per_source: 2,
        ..Limits::default()
    };
    let server = Arc::new(start(limits, echo()));
    let flood: Vec<_> = (0..4)
        .map(|_| {
            let server = Arc::clone(&server);
            std::thread::spawn(move || {
                exchange_from(&server, "127.0.0.1", b"GET /slow HTTP/1.1\r\n\r\n")
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let other = exchange_from(&server, "127.0.0.2", b"GET /slow HTTP/1.1\r\n\r\n");
    assert!(other.starts_with("HTTP/1.1 200"), "{other}");
    let mut statuses: Vec<String> = flood
        .into_iter()
        .map(|t| t.join().unwrap()[..12].to_string())
        .collect();
    statuses.sort();
    assert_eq!(
        statuses,
        [
            "HTTP/1.1 200",
            "HTTP/1.1 200",
            "HTTP/1.1 503",
            "HTTP/1.1 503"
        ]
    );
}

/// Clients of one source that ask for big answers and read nothing hold
/// at most their source's share of the response budget: a big answer to
/// another source still goes out.
#[test]
fn one_source_cannot_hold_every_response_byte() {
    const BIG: usize = 12 << 20;
    let limits = Limits {
        max_response_bytes: 4 * BIG,
        max_response_bytes_per_source: 2 * BIG,
        ..Limits::default()
    };
    let handler: Handler =
        Arc::new(|_| Response::new(200, "application/octet-stream", vec![b'x'; BIG]));
    let server = start(limits, handler);
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(server.local_addr()).unwrap();
            s.write_all(b"GET /big HTTP/1.1\r\n\r\n").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let same = exchange_from(&server, "127.0.0.1", b"GET /big HTTP/1.1\r\n\r\n");
    assert!(
        same.starts_with("HTTP/1.1 503"),
        "{}",
        &same[..same.len().min(200)]
    );
    let other = exchange_from(&server, "127.0.0.2", b"GET /big HTTP/1.1\r\n\r\n");
    assert!(
        other.starts_with("HTTP/1.1 200"),
        "{}",
        &other[..other.len().min(200)]
    );
    assert!(other.len() > BIG);
    drop(silent);
}

/// A request the precheck answers takes no handler slot: with the only
/// slot held by a slow request, it is still answered at once (not 503).
#[test]
fn a_precheck_answers_without_a_handler_slot() {
    let limits = Limits {
        max_in_flight: 1,
        max_in_flight_per_source: 1,
        ..Limits::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let precheck: longhaul_http_serve::Precheck =
        Arc::new(|req| (req.path() == "/deny").then(|| Response::text(401, "no\n")));
    let server =
        Server::spawn_tls(listener, "test-http", limits, None, echo(), Some(precheck)).unwrap();
    let addr = server.local_addr();
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    });
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let denied = exchange(&server, b"GET /deny HTTP/1.1\r\n\r\n");
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    // Without the precheck's answer, the slot is taken: 503.
    let other = exchange(&server, b"GET /other HTTP/1.1\r\n\r\n");
    assert!(other.starts_with("HTTP/1.1 503"), "{other}");
    assert!(slow.join().unwrap().starts_with("HTTP/1.1 200"));
    server.shutdown(Duration::from_secs(1));
}
