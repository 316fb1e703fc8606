//! A real Prometheus (Debian's /usr/bin/prometheus) scrapes the exporter;
//! promtool checks a live scrape of this host.

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;

/// Prometheus needs a few seconds to start and scrape at 1 s intervals.
pub(crate) const PROMETHEUS_WAIT: Duration = Duration::from_secs(60);

pub(crate) struct Prometheus {
    child: Child,
    pub(crate) addr: SocketAddr,
    _dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_prometheus(target: SocketAddr) -> Prometheus {
    start_prometheus_with(&format!(
        "  - job_name: longhaul\n    static_configs:\n      - targets: ['{target}']\n"
    ))
}

/// A Prometheus scraping every second with `jobs` (entries of
/// scrape_configs, YAML indented by two).
pub(crate) fn start_prometheus_with(jobs: &str) -> Prometheus {
    let dir = TempDir::new("prometheus");
    let config = dir.0.join("prometheus.yml");
    fs::write(
        &config,
        format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{jobs}"),
    )
    .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.0.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (Debian package prometheus) must be installed");
    Prometheus {
        child,
        addr,
        _dir: dir,
    }
}

/// Runs an instant query; returns the result array as JSON text when the
/// query answers with at least one series.
pub(crate) fn query(prom: SocketAddr, q: &str) -> Option<serde_json::Value> {
    let encoded: String = q
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let stream = std::net::TcpStream::connect(prom).ok()?;
    drop(stream);
    let r = get(prom, &format!("/api/v1/query?query={encoded}"), None);
    if r.status != 200 {
        return None;
    }
    let body = if r
        .head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(&r.body)
    } else {
        r.body
    };
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let result = v["data"]["result"].as_array()?;
    (!result.is_empty()).then(|| v["data"]["result"].clone())
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

#[test]
fn a_real_prometheus_scrapes_the_exporter() {
    let exp = Exporter::start(&fixture_args());
    let prom = start_prometheus(exp.addr);
    let up = wait_for(PROMETHEUS_WAIT, || {
        query(prom.addr, "up{job=\"longhaul\"} == 1")
    })
    .expect("up{job=\"longhaul\"} == 1 within 60 s");
    assert_eq!(up[0]["value"][1], "1");
    let disks = wait_for(PROMETHEUS_WAIT, || {
        query(
            prom.addr,
            "longhaul_controller_disks{job=\"longhaul\",controller=\"0000:03:00.0\"}",
        )
    })
    .expect("exporter metrics in Prometheus");
    assert_eq!(disks[0]["value"][1], "3");
    let success = query(
        prom.addr,
        "longhaul_exporter_collector_success{collector=\"raid\"}",
    )
    .expect("collector success series");
    assert_eq!(success[0]["value"][1], "1");
}

#[test]
fn promtool_accepts_a_live_scrape_of_this_host() {
    // Real /proc, /sys and sockets; a listener on a watched port so the tcp
    // collector has a flow to report.
    let (_client, server) = longhaul_testkit::loopback_pair();
    let port = server.local_addr().unwrap().port();
    let exp = Exporter::start(&[format!("--collector.tcp.ports={port}")]);
    let scrape = exp.scrape();
    assert!(
        scrape.contains(&format!(
            "longhaul_tcp_rtt_seconds{{remote=\"127.0.0.1\",ports=\"{port}\",flow=\"0\"}}"
        )),
        "{scrape}"
    );
    promtool_check(&scrape);
    let om = get(exp.addr, "/metrics", Some("application/openmetrics-text"));
    assert!(om.body.ends_with("# EOF\n"));
}
