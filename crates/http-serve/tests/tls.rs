//! The server over TLS, against real sockets on loopback and a real
//! rustls client: answers, the plain-HTTP client told what went wrong, and
//! handshakes that never finish held to the same deadline and eviction as
//! slow request heads.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_http_serve::rustls::crypto::ring::default_provider;
use longhaul_http_serve::rustls::pki_types::pem::PemObject;
use longhaul_http_serve::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use longhaul_http_serve::rustls::ServerConfig;
use longhaul_http_serve::{Limits, Response, Server};
use longhaul_testkit::tls::{https, Issued, TestCa};

fn server_config(id: &Issued) -> Arc<ServerConfig> {
    let chain = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes()).unwrap();
    Arc::new(
        ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    )
}

fn start(limits: Limits, ca: &TestCa) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let tls = server_config(&ca.issue(&["localhost", "127.0.0.1"]));
    Server::spawn_tls(
        listener,
        "test-https",
        limits,
        Some(tls),
        Arc::new(|req| Response::text(200, &format!("{} {}\n", req.method(), req.path()))),
        None,
    )
    .unwrap()
}

const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";

#[test]
fn answers_over_tls_and_tells_a_plain_http_client_why_not() {
    let ca = TestCa::new("test CA");
    let server = start(Limits::default(), &ca);
    for name in ["localhost", "127.0.0.1"] {
        let got = https(server.local_addr(), name, ca.client(None), GET).unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.ends_with("GET /metrics\n"), "{got}");
    }
    // Plain HTTP to the TLS port: a plain answer saying so, not silence.
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(GET).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.0 400"), "{out}");
    assert!(
        out.contains("Client sent an HTTP request to an HTTPS server"),
        "{out}"
    );
    assert!(!out.contains("GET /metrics"), "the handler answered: {out}");
    // The server is still fine.
    let got = https(server.local_addr(), "localhost", ca.client(None), GET).unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    server.shutdown(Duration::from_secs(1));
}

/// A client that opens a handshake and stops: its connection counts as
/// pending (evictable, oldest first) and is closed at the head's deadline.
#[test]
fn stalled_handshakes_are_cut_at_the_deadline_and_pushed_out() {
    let ca = TestCa::new("test CA");
    let limits = Limits {
        pending: longhaul_admission::Limits {
            capacity: 8,
            per_source: 8,
        },
        header_deadline: Duration::from_millis(1500),
        ..Limits::default()
    };
    let server = start(limits, &ca);
    // The first bytes of a TLS record header, then nothing, twenty times:
    // more than the pending pool holds.
    let stalled: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = TcpStream::connect(server.local_addr()).unwrap();
            s.write_all(&[22, 3, 1]).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let got = https(server.local_addr(), "localhost", ca.client(None), GET).unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // The oldest was pushed out at once; the newest is cut at the deadline.
    // Closed: an end of stream, or a reset (the server dropped it with the
    // bytes unread); a timeout is not.
    let closed_within = |mut s: &TcpStream, limit: Duration| {
        s.set_read_timeout(Some(limit)).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    };
    assert!(closed_within(&stalled[0], Duration::from_millis(300)));
    let newest = stalled.last().unwrap();
    assert!(closed_within(newest, Duration::from_secs(3)), "never cut");
    server.shutdown(Duration::from_secs(1));
}
