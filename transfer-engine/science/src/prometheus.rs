//! Pulling the report's series from Prometheus (`report --prometheus URL
//! --from T --to T`): its build information first ([`reach`]), then the
//! HTTP API's `query_range`, one GET per figure, with ureq (docs/http.md),
//! each under one deadline and with a bounded answer. An
//! https Prometheus (site.yml's) is checked against a CA file (default: the
//! host's trust store, where site.yml installs its CA) with rustls and ring,
//! and asked with basic auth when a user is given (the password from a file,
//! never the command line).
//!
//! The queries use the exporter's and node_exporter's metric names
//! (DESIGN.md): session and per-stream throughput, CPU user/system/softirq
//! per host, disk IO per RAID controller and per device.

use std::io::ErrorKind;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::{Error, Result};
use base64::Engine;
use serde_json::Value;

/// Connecting, asking and reading one answer. A query_range over a
/// campaign's hour at 15 s steps answers in well under a second on the lab
/// host.
const HTTP_TIMEOUT: Duration = Duration::from_secs(20);

/// Largest answer read. A figure draws at most [`MAX_SERIES`] series; a
/// day at 15 s steps is 5,760 points, ~200 KB per series in JSON, so 64 MiB
/// holds any sane answer and stops an endless one.
const MAX_ANSWER: u64 = 64 << 20;

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

/// The routers' interfaces as Telegraf's SNMP input sees them (exposed to
/// Prometheus by Telegraf's prometheus_client output): what each interface
/// sends, bits/s. The aggregate figure of a campaign phase sets it beside
/// the engine's sum per direction.
pub const ROUTER_OUT: Query = Query {
    title: "Router interfaces, out",
    promql: "sum by (router, ifName) (rate(interface_ifHCOutOctets{job=\"telegraf\"}[1m])) * 8",
    labels: &["router", "ifName"],
    unit: Unit::BitsPerSecond,
};

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

/// The host's trust store (Debian's ca-certificates; site.yml adds its CA
/// there): the CA file of an https Prometheus without `--prometheus-ca`.
pub const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Largest CA or password file read.
const MAX_SECRET_FILE: u64 = 1 << 20;

/// Where Prometheus is and how to be let in.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// http://HOST:PORT or https://HOST:PORT
    pub url: String,
    /// PEM CA certificates an https Prometheus' certificate must chain to.
    pub ca_file: Option<PathBuf>,
    /// Basic auth user, with the first line of `password_file` as password.
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
}

fn read_small(path: &PathBuf, what: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| Error::io(format!("reading {what} {}", path.display()), e))?;
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {what} {}", path.display()), e))?;
    if bytes.len() as u64 > MAX_SECRET_FILE {
        return Err(Error::Usage(format!(
            "{what} {} is larger than 1 MiB",
            path.display()
        )));
    }
    Ok(bytes)
}

impl Source {
    /// What can be known before asking: the URL's form, the CA and password
    /// files. `report` checks it first, so a mistake is an error (exit 2),
    /// not a note per figure.
    pub fn check(&self) -> Result<()> {
        let url = &self.url;
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .ok_or_else(|| {
                Error::Usage(format!(
                    "--prometheus: '{url}' must start with http:// or https://"
                ))
            })?;
        // userinfo would be sent as basic auth and printed wherever the URL is
        if rest.split('/').next().unwrap_or("").contains('@') {
            return Err(Error::Usage(
                "--prometheus: give the user with --prometheus-user and the password with \
                 --prometheus-password-file, not in the URL"
                    .into(),
            ));
        }
        if !url.starts_with("https://") && (self.user.is_some() || self.ca_file.is_some()) {
            return Err(Error::Usage(format!(
                "--prometheus {url}: a password or a CA needs https:// (a password must not \
                 cross the network in clear)"
            )));
        }
        self.agent()?;
        self.authorization()?;
        Ok(())
    }

    /// The agent that asks this Prometheus: TLS roots (for https, and for an
    /// http URL's redirect, which is not followed anyway), the deadline.
    fn agent(&self) -> Result<ureq::Agent> {
        let mut config = ureq::Agent::config_builder()
            .timeout_global(Some(HTTP_TIMEOUT))
            .http_status_as_error(false)
            // Prometheus' API does not redirect; a redirect is refused, never
            // followed to another host with the password
            .max_redirects(0);
        if self.url.starts_with("https://") {
            let ca_file = self
                .ca_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(SYSTEM_CA_FILE));
            let what = if self.ca_file.is_some() {
                "the --prometheus-ca file"
            } else {
                "the host's trust store (no --prometheus-ca)"
            };
            let pem = read_small(&ca_file, what)?;
            let roots: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if roots.is_empty() {
                return Err(Error::Usage(format!(
                    "--prometheus-ca: {} holds no PEM certificate",
                    ca_file.display()
                )));
            }
            let tls = ureq::tls::TlsConfig::builder()
                .provider(ureq::tls::TlsProvider::Rustls)
                .root_certs(ureq::tls::RootCerts::Specific(Arc::new(roots)))
                .unversioned_rustls_crypto_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .build();
            config = config.tls_config(tls);
        }
        Ok(config.build().into())
    }

    /// The Authorization header's value, when a user is given.
    fn authorization(&self) -> Result<Option<String>> {
        let Some(user) = &self.user else {
            return Ok(None);
        };
        if user.contains(':') {
            return Err(Error::Usage(format!(
                "--prometheus-user '{user}': a basic-auth user cannot hold a colon"
            )));
        }
        let Some(file) = &self.password_file else {
            return Err(Error::Usage(
                "--prometheus-user needs --prometheus-password-file".into(),
            ));
        };
        let bytes = read_small(file, "the --prometheus-password-file")?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::Usage(format!("{} is not UTF-8 text", file.display())))?;
        let password = text.lines().next().unwrap_or("");
        if password.is_empty() {
            return Err(Error::Usage(format!(
                "--prometheus-password-file {}: its first line (the password) is empty",
                file.display()
            )));
        }
        Ok(Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )))
    }
}

/// One series: its name and (unix seconds, value) samples.
#[derive(Debug, Clone)]
pub struct PromSeries {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Nothing listening at the address, or no route to it.
fn unreachable(io: &std::io::Error) -> bool {
    matches!(
        io.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable
    )
}

/// The TLS error inside an I/O error (rustls reports a refused certificate
/// through the stream it wraps), said as what to do about it.
fn tls_refusal(io: &std::io::Error) -> Option<String> {
    let tls = io.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(match tls {
        rustls::Error::InvalidCertificate(why) => format!(
            "its certificate is refused ({why:?}): give the CA that signed it with \
             --prometheus-ca"
        ),
        other => format!("TLS failed: {other}"),
    })
}

/// GETs `url` of `source` with the query `params`; returns the body of a
/// 200 answer. What no other query would get past (a refused certificate,
/// a refused password, nothing listening) is [`Error::PrometheusRefused`]; the report
/// stops on it rather than note it under every figure (see [`reach`]).
fn get(source: &Source, url: &str, params: &[(&str, &str)]) -> Result<String> {
    if !url.starts_with("http://") && !url.starts_with("https://") {
        return Err(Error::Usage(format!(
            "--prometheus: '{url}' must start with http:// or https://"
        )));
    }
    let agent = source.agent()?;
    let authorization = source.authorization()?;
    let late = || {
        Error::PrometheusTimeout(format!(
            "Prometheus at {url}: no complete answer within {} s",
            HTTP_TIMEOUT.as_secs()
        ))
    };
    let fail = |e: ureq::Error| match e {
        ureq::Error::Io(io) => match tls_refusal(&io) {
            Some(why) => Error::PrometheusRefused(format!("Prometheus at {url}: {why}")),
            None if unreachable(&io) => {
                Error::PrometheusRefused(format!("Prometheus at {url}: {io}"))
            }
            None if matches!(io.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => late(),
            None => Error::io(format!("asking Prometheus at {url}"), io),
        },
        ureq::Error::Timeout(_) => late(),
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => {
            Error::PrometheusRefused(format!("Prometheus at {url}: {e}"))
        }
        other => Error::PrometheusAnswer {
            status: None,
            message: format!("Prometheus at {url}: {other}"),
        },
    };
    let mut request = agent.get(url).header("Accept", "application/json");
    if let Some(value) = &authorization {
        request = request.header("Authorization", value);
    }
    let mut answer = request
        .query_pairs(params.iter().copied())
        .call()
        .map_err(fail)?;
    let status = answer.status();
    let body = answer
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER)
        .read_to_string()
        .map_err(fail)?;
    if status == 401 {
        return Err(Error::PrometheusRefused(format!(
            "Prometheus at {url} wants a user and password (401): give --prometheus-user and \
             --prometheus-password-file, or check them"
        )));
    }
    if status != 200 {
        return Err(Error::PrometheusAnswer {
            status: Some(status.as_u16()),
            message: format!(
                "Prometheus answered {status}: {}",
                body.chars().take(300).collect::<String>()
            ),
        });
    }
    Ok(body)
}

/// Asks Prometheus once before any figure (its build information): what
/// stops this request stops the report (exit 1), rather than become a note
/// under every figure: nothing listening or no such host, no answer in
/// time, its certificate refused, a refused password (401), a plain-HTTP
/// request to its TLS port (400). Any other answer (a Prometheus still
/// loading its storage, 503; a store without this endpoint, 404) is
/// reached: its queries then become notes if they fail.
pub fn reach(source: &Source) -> Result<()> {
    let endpoint = format!(
        "{}/api/v1/status/buildinfo",
        source.url.trim_end_matches('/')
    );
    match get(source, &endpoint, &[]) {
        Ok(_) => Ok(()),
        Err(e @ Error::PrometheusRefused(_)) => Err(e),
        Err(Error::PrometheusAnswer {
            status: Some(400),
            message,
        }) => Err(Error::PrometheusRefused(format!(
            "Prometheus at {}: {message} (plain HTTP to a TLS port? site.yml's Prometheus \
             wants https://)",
            source.url
        ))),
        Err(Error::PrometheusAnswer {
            status: Some(_), ..
        }) => Ok(()),
        Err(e) => Err(Error::PrometheusRefused(format!(
            "Prometheus at {} cannot be asked: {e}",
            source.url
        ))),
    }
}

/// Runs one range query. `from`/`to` are anything Prometheus accepts
/// (RFC 3339 or Unix seconds), `step` seconds.
pub fn query_range(
    source: &Source,
    q: &Query,
    from: &str,
    to: &str,
    step: f64,
) -> Result<Vec<PromSeries>> {
    let endpoint = format!("{}/api/v1/query_range", source.url.trim_end_matches('/'));
    let step = step.to_string();
    let body = get(
        source,
        &endpoint,
        &[
            ("query", q.promql),
            ("start", from),
            ("end", to),
            ("step", &step),
        ],
    )?;
    parse_matrix(&body, q.labels)
}

/// Parses a query_range answer (`resultType` matrix).
pub fn parse_matrix(body: &str, labels: &[&str]) -> Result<Vec<PromSeries>> {
    let v: Value = serde_json::from_str(body).map_err(|e| Error::PrometheusAnswer {
        status: None,
        message: format!("Prometheus' answer is not JSON: {e}"),
    })?;
    if v["status"] != "success" {
        return Err(Error::PrometheusAnswer {
            status: None,
            message: format!(
                "Prometheus query failed: {}",
                v["error"].as_str().unwrap_or("unknown error")
            ),
        });
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
    fn parses_a_matrix() {
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"direction":"receive"},"values":[[100,"8e9"],[115,"9e9"],[130,"NaN"]]}]}}"#;
        let s = parse_matrix(body, &["direction"]).unwrap();
        assert_eq!(s[0].name, "direction receive");
        assert_eq!(s[0].points, vec![(100.0, 8e9), (115.0, 9e9)]);
        assert!(parse_matrix(r#"{"status":"error","error":"bad"}"#, &[]).is_err());
    }
}
