//! Pulling the report's series from Prometheus (`report --prometheus URL
//! --from T --to T`): the HTTP API's `query_range`, over a plain HTTP/1.0
//! GET (the monitoring host speaks HTTP on the lab network; no client
//! library needed for one GET per figure).
//!
//! The queries use the exporter's and node_exporter's metric names
//! (DESIGN.md): session and per-stream throughput, CPU user/system/softirq
//! per host, disk IO per RAID controller and per device.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::Value;

use crate::error::{Error, Result};

/// Connecting and reading one answer. A query_range over a campaign's
/// hour at 15 s steps answers in well under a second on the lab host.
const HTTP_TIMEOUT: Duration = Duration::from_secs(20);

/// Most series drawn per figure (label cardinality is bounded by the
/// exporter, but 256 streams in one legend are unreadable).
pub const MAX_SERIES: usize = 12;

/// What a series' values are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unit {
    BitsPerSecond,
    BytesPerSecond,
    Percent,
}

/// One figure's query.
#[derive(Debug, Clone, Copy)]
pub struct Query {
    pub title: &'static str,
    pub promql: &'static str,
    /// Labels that name a series, in order.
    pub labels: &'static [&'static str],
    pub unit: Unit,
}

/// The figures pulled from Prometheus.
pub const QUERIES: &[Query] = &[
    Query {
        title: "Throughput by direction (Prometheus)",
        promql: "sum by (direction) (rate(longhaul_session_bytes_total[1m])) * 8",
        labels: &["direction"],
        unit: Unit::BitsPerSecond,
    },
    Query {
        title: "Per-stream throughput (Prometheus)",
        // The receiving end of each stream: the stats API lists both ends.
        promql: "sum by (session, stream) (rate(longhaul_stream_bytes_total{direction=\"receive\"}[1m])) * 8",
        labels: &["stream"],
        unit: Unit::BitsPerSecond,
    },
    Query {
        title: "CPU user/system/softirq per host (Prometheus)",
        promql: "avg by (instance, mode) (rate(node_cpu_seconds_total{mode=~\"user|system|softirq\"}[1m])) * 100",
        labels: &["instance", "mode"],
        unit: Unit::Percent,
    },
    Query {
        title: "Disk IO per RAID controller (Prometheus)",
        promql: "sum by (instance, controller) (rate(longhaul_controller_read_bytes_total[1m]) + rate(longhaul_controller_written_bytes_total[1m]))",
        labels: &["instance", "controller"],
        unit: Unit::BytesPerSecond,
    },
    Query {
        title: "Disk IO per device (Prometheus)",
        promql: "sum by (instance, device) (rate(node_disk_read_bytes_total{device!~\"(loop|ram|dm-|md).*\"}[1m]) + rate(node_disk_written_bytes_total{device!~\"(loop|ram|dm-|md).*\"}[1m]))",
        labels: &["instance", "device"],
        unit: Unit::BytesPerSecond,
    },
];

/// One series: its name and (unix seconds, value) samples.
#[derive(Debug, Clone)]
pub struct PromSeries {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Percent-encodes a query string value.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Splits `http://host:port/prefix` into (host:port, prefix).
fn split_url(url: &str) -> Result<(String, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::Usage(format!("--prometheus: '{url}' must start with http://")))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let host = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    Ok((host, path.to_string()))
}

/// GET `path` from `host`; returns the body of a 200 answer.
fn http_get(host: &str, path: &str) -> Result<String> {
    let addr = host
        .to_socket_addrs()
        .map_err(|e| Error::Refused(format!("cannot resolve {host}: {e}")))?
        .next()
        .ok_or_else(|| Error::Refused(format!("{host} resolves to no address")))?;
    let mut sock = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)
        .map_err(|e| Error::io(format!("connecting to Prometheus at {host}"), e))?;
    let _ = sock.set_read_timeout(Some(HTTP_TIMEOUT));
    // HTTP/1.0: the answer ends when the server closes, never chunked.
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: application/json\r\n\r\n");
    sock.write_all(request.as_bytes())
        .map_err(|e| Error::io("asking Prometheus", e))?;
    let mut raw = Vec::new();
    sock.read_to_end(&mut raw)
        .map_err(|e| Error::io("reading Prometheus' answer", e))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::Protocol("Prometheus' answer has no HTTP header".into()))?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200") {
        return Err(Error::Protocol(format!(
            "Prometheus answered '{status}': {}",
            body.chars().take(300).collect::<String>()
        )));
    }
    Ok(body.to_string())
}

/// Runs one range query. `from`/`to` are anything Prometheus accepts
/// (RFC 3339 or Unix seconds), `step` seconds.
pub fn query_range(
    url: &str,
    q: &Query,
    from: &str,
    to: &str,
    step: f64,
) -> Result<Vec<PromSeries>> {
    let (host, prefix) = split_url(url)?;
    let path = format!(
        "{prefix}/api/v1/query_range?query={}&start={}&end={}&step={}",
        encode(q.promql),
        encode(from),
        encode(to),
        step
    );
    let body = http_get(&host, &path)?;
    parse_matrix(&body, q.labels)
}

/// Parses a query_range answer (`resultType` matrix).
pub fn parse_matrix(body: &str, labels: &[&str]) -> Result<Vec<PromSeries>> {
    let v: Value = serde_json::from_str(body)
        .map_err(|e| Error::Protocol(format!("Prometheus' answer is not JSON: {e}")))?;
    if v["status"] != "success" {
        return Err(Error::Protocol(format!(
            "Prometheus query failed: {}",
            v["error"].as_str().unwrap_or("unknown error")
        )));
    }
    let mut out = Vec::new();
    for r in v["data"]["result"].as_array().cloned().unwrap_or_default() {
        let name: Vec<String> = labels
            .iter()
            .filter_map(|l| r["metric"][*l].as_str().map(str::to_string))
            .collect();
        // One label: say which ("stream 3"); several: their values.
        let name = match (labels, name.as_slice()) {
            ([label], [value]) => vec![format!("{label} {value}")],
            _ => name,
        };
        let points = r["values"]
            .as_array()
            .map(|vals| {
                vals.iter()
                    .filter_map(|p| {
                        let t = p.get(0)?.as_f64()?;
                        let v: f64 = p.get(1)?.as_str()?.parse().ok()?;
                        v.is_finite().then_some((t, v))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(PromSeries {
            name: if name.is_empty() {
                "total".into()
            } else {
                name.join(" ")
            },
            points,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_encoding() {
        assert_eq!(
            split_url("http://mon:9090/prom/").unwrap(),
            ("mon:9090".into(), "/prom".into())
        );
        assert_eq!(
            split_url("http://mon").unwrap(),
            ("mon:80".into(), "".into())
        );
        assert!(split_url("https://x").is_err());
        assert_eq!(encode("rate(x[1m]) * 8"), "rate%28x%5B1m%5D%29%20%2A%208");
    }

    #[test]
    fn parses_a_matrix() {
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"direction":"receive"},"values":[[100,"8e9"],[115,"9e9"],[130,"NaN"]]}]}}"#;
        let s = parse_matrix(body, &["direction"]).unwrap();
        assert_eq!(s[0].name, "direction receive");
        assert_eq!(s[0].points, vec![(100.0, 8e9), (115.0, 9e9)]);
        assert!(parse_matrix(r#"{"status":"error","error":"bad"}"#, &[]).is_err());
    }
}
