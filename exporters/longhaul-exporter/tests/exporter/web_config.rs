//! `--web.config.file`: the exporter over TLS with basic auth, scraped by a
//! real Prometheus with credentials while one without gets 401; mutual
//! TLS; a renewed certificate served without a restart; bad files refused
//! at start naming the problem.

use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_testkit::tls::{https, https_over, TestCa};

use crate::common::*;
use crate::prometheus::{query, start_prometheus_with, PROMETHEUS_WAIT};

const PASSWORD: &str = "correct horse: battery staple";

fn basic(user: &str, password: &str) -> String {
    // RFC 7617: base64 of "user:password", written out here so the test
    // does not share the server's decoder.
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let raw = format!("{user}:{password}");
    let mut out = String::new();
    for chunk in raw.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    format!("Authorization: Basic {out}\r\n")
}

fn request(auth: &str) -> Vec<u8> {
    format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{auth}\r\n").into_bytes()
}

/// A web config in `dir` naming its files relative to it (as Prometheus'
/// servers read them).
fn write_config(dir: &Path, extra_tls: &str, users: &str) -> String {
    let path = dir.join("web.yml");
    fs::write(
        &path,
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n{extra_tls}{users}"
        ),
    )
    .unwrap();
    format!("--web.config.file={}", path.display())
}

fn start_with(flag: String) -> Exporter {
    let mut args = fixture_args();
    args.push(flag);
    Exporter::start(&args)
}

#[test]
fn prometheus_with_credentials_scrapes_over_tls_and_strangers_get_401() {
    let dir = TempDir::new("web-tls");
    let ca = TestCa::new("longhaul test CA");
    ca.issue(&["localhost", "127.0.0.1"])
        .write(&dir.0, "server");
    fs::write(dir.0.join("ca.crt"), ca.pem()).unwrap();
    let hash = bcrypt::hash(PASSWORD, 4).unwrap();
    let exp = start_with(write_config(
        &dir.0,
        "",
        &format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
    ));
    assert!(exp.logged("(https, basic auth,"), "{}", exp.log_text());

    let client = ca.client(None);
    let ok = https(
        exp.addr,
        "localhost",
        client.clone(),
        &request(&basic("prometheus", PASSWORD)),
    )
    .unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("longhaul_controller_disks{"), "{ok}");
    for (who, auth) in [
        ("no credentials", String::new()),
        ("a wrong password", basic("prometheus", "guess")),
        ("an unknown user", basic("admin", PASSWORD)),
    ] {
        let got = https(exp.addr, "localhost", client.clone(), &request(&auth)).unwrap();
        assert!(got.starts_with("HTTP/1.1 401"), "{who}: {got}");
        assert!(
            got.to_ascii_lowercase().contains("www-authenticate: basic"),
            "{who}: {got}"
        );
        assert!(!got.contains("longhaul_"), "{who} read metrics: {got}");
    }
    // The index page is behind the same door.
    let index = https(
        exp.addr,
        "localhost",
        client,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    assert!(index.starts_with("HTTP/1.1 401"), "{index}");
    // Plain HTTP gets no metrics, with or without the password.
    let mut plain = std::net::TcpStream::connect(exp.addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain
        .write_all(&request(&basic("prometheus", PASSWORD)))
        .unwrap();
    let mut answer = String::new();
    let _ = plain.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.0 400"), "{answer}");
    assert!(!answer.contains("longhaul_"), "{answer}");

    // A real Prometheus: the job with the CA and the password is up, the
    // one without credentials is down with the 401 it got.
    let ca_file = dir.0.join("ca.crt");
    let target = exp.addr;
    let prom = start_prometheus_with(&format!(
        "  - job_name: trusted\n    scheme: https\n    tls_config:\n      ca_file: {ca}\n\
         \x20   basic_auth:\n      username: prometheus\n      password: '{PASSWORD}'\n\
         \x20   static_configs:\n      - targets: ['{target}']\n\
         \x20 - job_name: stranger\n    scheme: https\n    tls_config:\n      ca_file: {ca}\n\
         \x20   static_configs:\n      - targets: ['{target}']\n",
        ca = ca_file.display()
    ));
    let disks = wait_for(PROMETHEUS_WAIT, || {
        query(
            prom.addr,
            "longhaul_controller_disks{job=\"trusted\",controller=\"0000:03:00.0\"}",
        )
    })
    .expect("the trusted job's samples in Prometheus");
    assert_eq!(disks[0]["value"][1], "3");
    let down = wait_for(PROMETHEUS_WAIT, || {
        query(prom.addr, "up{job=\"stranger\"} == 0")
    })
    .expect("up{job=\"stranger\"} == 0");
    assert_eq!(down[0]["value"][1], "0");
    assert!(
        query(prom.addr, "longhaul_controller_disks{job=\"stranger\"}").is_none(),
        "the job without credentials stored samples"
    );
}

/// bcrypt costs ~0.1 s of a core per guess at the cost users run:
/// strangers guessing from two addresses in many connections at once must
/// not take the handlers the scraper needs. Its first login may wait for
/// bcrypt (`503` while it is busy); once its password is remembered, every
/// scrape is answered.
#[test]
fn strangers_guessing_passwords_do_not_keep_the_scraper_out() {
    let dir = TempDir::new("web-guess");
    let ca = TestCa::new("longhaul test CA");
    ca.issue(&["localhost"]).write(&dir.0, "server");
    let hash = bcrypt::hash(PASSWORD, 11).unwrap();
    let exp = start_with(write_config(
        &dir.0,
        "",
        &format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
    ));
    let client = ca.client(None);
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(
        std::collections::BTreeMap::<String, usize>::new(),
    ));
    let strangers: Vec<_> = (0..24)
        .map(|i| {
            let (stop, answers, client, addr) =
                (stop.clone(), answers.clone(), client.clone(), exp.addr);
            std::thread::spawn(move || {
                let from = std::net::SocketAddr::from(([127, 0, 0, 2 + (i % 2) as u8], 0));
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let Ok(tcp) = longhaul_testkit::connect_from(from, addr) else {
                        continue;
                    };
                    let guess = request(&basic("prometheus", &format!("guess{i}-{n}")));
                    if let Ok(a) = https_over(tcp, "localhost", client.clone(), &guess) {
                        let status = a.get(9..12).unwrap_or("?").to_string();
                        assert_ne!(status, "200", "a guess got in: {a}");
                        *answers.lock().unwrap().entry(status).or_default() += 1;
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let scrape = || {
        let t = Instant::now();
        let got = https(
            exp.addr,
            "localhost",
            client.clone(),
            &request(&basic("prometheus", PASSWORD)),
        )
        .unwrap();
        (got, t.elapsed())
    };
    // The first login: bcrypt may be busy with the guesses.
    let first = wait_for(Duration::from_secs(20), || {
        let (got, _) = scrape();
        (!got.starts_with("HTTP/1.1 503")).then_some(got)
    })
    .expect("the scraper's first login never had its turn");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let (got, took) = scrape();
        assert!(
            got.starts_with("HTTP/1.1 200"),
            "the scraper was kept out: {got}"
        );
        slowest = slowest.max(took);
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for s in strangers {
        s.join().unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    // Most guesses are turned away without bcrypt: slowed down (429).
    assert!(answers.get("429").copied().unwrap_or(0) > 10, "{answers:?}");
    assert!(answers.get("401").copied().unwrap_or(0) >= 8, "{answers:?}");
    assert!(
        slowest < Duration::from_secs(5),
        "a scrape took {slowest:?}"
    );
}

/// `min_version: TLS13` refuses a client that offers only TLS 1.2;
/// `VerifyClientCertIfGiven` answers a client without a certificate and
/// refuses one with a certificate of another CA.
#[test]
fn the_tls_version_and_optional_client_certificates_are_honoured() {
    let dir = TempDir::new("web-versions");
    let ca = TestCa::new("longhaul test CA");
    ca.issue(&["localhost"]).write(&dir.0, "server");
    fs::write(dir.0.join("clients.crt"), ca.pem()).unwrap();
    let exp = start_with(write_config(
        &dir.0,
        "  min_version: TLS13\n  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: clients.crt\n",
        "",
    ));
    use longhaul_http_serve::rustls::version::{TLS12, TLS13};
    let tls12 = ca.client_speaking(None, &[&TLS12]);
    assert!(https(exp.addr, "localhost", tls12, &request("")).is_err());
    let tls13 = ca.client_speaking(None, &[&TLS13]);
    let got = https(exp.addr, "localhost", tls13, &request("")).unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let ours = ca.issue(&["prometheus"]);
    let got = https(exp.addr, "localhost", ca.client(Some(&ours)), &request("")).unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let other = TestCa::new("another CA").issue(&["prometheus"]);
    assert!(https(exp.addr, "localhost", ca.client(Some(&other)), &request("")).is_err());
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate_of_the_ca() {
    let dir = TempDir::new("web-mtls");
    let ca = TestCa::new("longhaul test CA");
    ca.issue(&["localhost"]).write(&dir.0, "server");
    fs::write(dir.0.join("clients.crt"), ca.pem()).unwrap();
    let exp = start_with(write_config(
        &dir.0,
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients.crt\n",
        "",
    ));
    let ours = ca.issue(&["prometheus"]);
    let got = https(exp.addr, "localhost", ca.client(Some(&ours)), &request("")).unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        https(exp.addr, "localhost", ca.client(None), &request("")).is_err(),
        "answered a client without a certificate"
    );
    let other = TestCa::new("another CA").issue(&["prometheus"]);
    assert!(
        https(exp.addr, "localhost", ca.client(Some(&other)), &request("")).is_err(),
        "answered a client whose certificate another CA signed"
    );
}

#[test]
fn a_renewed_certificate_is_served_without_a_restart() {
    let dir = TempDir::new("web-renew");
    let old_ca = TestCa::new("old CA");
    old_ca.issue(&["localhost"]).write(&dir.0, "server");
    let exp = start_with(write_config(&dir.0, "", ""));
    let get_with = |ca: &TestCa| https(exp.addr, "localhost", ca.client(None), &request(""));
    assert!(get_with(&old_ca).unwrap().starts_with("HTTP/1.1 200"));

    let new_ca = TestCa::new("new CA");
    new_ca.issue(&["localhost"]).write(&dir.0, "server");
    let renewed = wait_for(Duration::from_secs(10), || {
        get_with(&new_ca)
            .ok()
            .filter(|a| a.starts_with("HTTP/1.1 200"))
    });
    assert!(
        renewed.is_some(),
        "the renewed certificate was never served"
    );
    assert!(
        get_with(&old_ca).is_err(),
        "still serving the old certificate"
    );

    // A renewal that cannot be used (its key belongs to another
    // certificate) leaves the one in service, and says so.
    let keeping = "keeping the certificate in service";
    let said = || {
        let log = exp.log.lock().unwrap();
        log.iter().filter(|l| l.contains(keeping)).count()
    };
    let before = said();
    let stray = new_ca.issue(&["localhost"]);
    fs::write(dir.0.join("server.key"), stray.key_pem).unwrap();
    // The files are looked at again on a handshake at least a second on.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(get_with(&new_ca).unwrap().starts_with("HTTP/1.1 200"));
    let more = wait_for(LOG_LAG, || (said() > before).then_some(()));
    assert!(more.is_some(), "{}", exp.log_text());
}

#[test]
fn a_bad_web_config_stops_the_start_naming_the_file_and_the_problem() {
    let dir = TempDir::new("web-bad");
    let ca = TestCa::new("test CA");
    ca.issue(&["localhost"]).write(&dir.0, "server");
    let other = ca.issue(&["localhost"]);
    fs::write(dir.0.join("other.key"), &other.key_pem).unwrap();
    let good_hash = bcrypt::hash("x", 4).unwrap();
    let cases: Vec<(String, &str)> = vec![
        ("tls_server_config:\n  cert_fil: server.crt\n".into(), "unknown key \"cert_fil\""),
        ("tls_server_config:\n  cert_file: server.crt\n".into(), "key_file is missing"),
        (
            "tls_server_config:\n  cert_file: nosuch.crt\n  key_file: server.key\n".into(),
            "nosuch.crt",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n".into(),
            "do not belong together",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS10\n"
                .into(),
            "TLS10 is not offered",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n"
                .into(),
            "needs client_ca_file",
        ),
        ("basic_auth_users:\n  alice: plaintext\n".into(), "basic_auth_users.alice: not a bcrypt hash"),
        (format!("basic_auth_users:\n  alice: '{good_hash}'\nextra: 1\n"), "unknown key \"extra\""),
    ];
    let web = dir.0.join("web.yml");
    for (text, needle) in cases {
        fs::write(&web, &text).unwrap();
        let out = std::process::Command::new(BIN)
            .arg("--web.listen-address=127.0.0.1:0")
            .arg(format!("--web.config.file={}", web.display()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}: {err}");
        assert!(
            err.contains(&format!("web config {}", web.display())),
            "{text}: {err}"
        );
        assert!(err.contains(needle), "{text}: wanted {needle:?} in {err}");
        assert!(
            !err.contains("listening on"),
            "{text}: served anyway: {err}"
        );
    }
    let missing = dir.0.join("nosuch.yml");
    let out = std::process::Command::new(BIN)
        .arg(format!("--web.config.file={}", missing.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("nosuch.yml: cannot read"), "{err}");
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The value of the one sample of `name` whose labels contain `labels`.
fn sample(scrape: &str, name: &str, labels: &str) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .next()
}

/// The certificates collector exports when each certificate of the host
/// stops being valid: the one the exporter serves (from its web config)
/// and the files it is told of, each certificate of a chain; a renewal
/// shows at the next scrape; a file that is not a certificate fails the
/// collector, naming it, and leaves the others' series.
#[test]
fn certificate_expiry_is_exported_for_the_served_and_the_listed_files() {
    let dir = TempDir::new("web-expiry");
    let ca = TestCa::new("expiry CA");
    let in_10_days = now() + 10 * 86400;
    ca.issue_until(&["localhost"], Some(in_10_days))
        .write(&dir.0, "server");
    let in_40_days = now() + 40 * 86400;
    let other = ca.issue_until(&["influxdb.example"], Some(in_40_days));
    let chain = dir.0.join("influxdb-chain.pem");
    fs::write(&chain, format!("{}{}", other.cert_pem, ca.pem())).unwrap();
    let garbage = dir.0.join("garbage.pem");
    fs::write(&garbage, "not a certificate\n").unwrap();
    let mut args = fixture_args();
    args.push(write_config(&dir.0, "", ""));
    args.push(format!(
        "--collector.certificates.files={},{}",
        chain.display(),
        garbage.display()
    ));
    let exp = Exporter::start(&args);
    let scrape = https(exp.addr, "localhost", ca.client(None), &request("")).unwrap();
    let name = "longhaul_certificate_not_after_timestamp_seconds";
    let served = dir.0.join("server.crt").display().to_string();
    assert_eq!(
        sample(
            &scrape,
            name,
            &format!("file=\"{served}\",position=\"0\",subject=\"CN=localhost\"")
        ),
        Some(in_10_days as f64),
        "{scrape}"
    );
    let listed = chain.display().to_string();
    assert_eq!(
        sample(&scrape, name, &format!("file=\"{listed}\",position=\"0\"")),
        Some(in_40_days as f64),
        "{scrape}"
    );
    // The CA after it: rcgen's default validity, far off.
    let ca_expiry = sample(
        &scrape,
        name,
        &format!("file=\"{listed}\",position=\"1\",subject=\"CN=expiry CA\""),
    )
    .expect("the chain's CA");
    assert!(ca_expiry > (now() + 365 * 86400) as f64, "{ca_expiry}");
    assert_eq!(
        sample(
            &scrape,
            "longhaul_exporter_collector_success",
            "collector=\"certificates\""
        ),
        Some(0.0),
        "{scrape}"
    );
    assert!(
        exp.logged(&garbage.display().to_string()),
        "{}",
        exp.log_text()
    );

    // Renewed: the next scrape has the new date.
    let in_90_days = now() + 90 * 86400;
    ca.issue_until(&["influxdb.example"], Some(in_90_days))
        .write(&dir.0, "renewed");
    fs::copy(dir.0.join("renewed.crt"), &chain).unwrap();
    let scrape = https(exp.addr, "localhost", ca.client(None), &request("")).unwrap();
    assert_eq!(
        sample(&scrape, name, &format!("file=\"{listed}\",position=\"0\"")),
        Some(in_90_days as f64),
        "{scrape}"
    );
}
