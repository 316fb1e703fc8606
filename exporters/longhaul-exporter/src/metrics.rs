//! The metric model collectors fill in, and its two wire encodings,
//! written by prometheus-client: OpenMetrics 1.0 (`# EOF`, counter
//! families named without `_total`) and the Prometheus text format 0.0.4.
//!
//! Deliberately tiny: a scrape is a list of families, a family a list of
//! samples with owned label values. Collectors build it fresh every scrape,
//! so there is no registry state to go stale; at encoding time the scrape
//! is one prometheus-client [`Collector`].
//!
//! prometheus-client writes OpenMetrics only. The text format differs from
//! it in two places, which [`encode`] adjusts: a counter family is named
//! with its `_total` (`# TYPE x_total counter`), and there is no `# EOF`.
//! The crate escapes label values but not help text, which [`escape_help`]
//! does.

use std::collections::HashSet;
use std::fmt::Write as _;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType as WireType;
use prometheus_client::registry::Registry;

/// Content type of the Prometheus text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Content type of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
}

/// One sample: label pairs (names are static, values owned) and a value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// All samples of one metric name.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Full sample name; counters end in `_total`.
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricType,
    pub samples: Vec<Sample>,
}

impl Family {
    pub fn counter(name: &'static str, help: &'static str) -> Family {
        debug_assert!(name.ends_with("_total"), "{name}: counters end in _total");
        Family {
            name,
            help,
            kind: MetricType::Counter,
            samples: Vec::new(),
        }
    }

    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind: MetricType::Gauge,
            samples: Vec::new(),
        }
    }

    /// Adds a sample; `labels` pairs are (name, value).
    pub fn push<V: Into<f64>>(&mut self, labels: &[(&'static str, &str)], value: V) {
        self.samples.push(Sample {
            labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            value: value.into(),
        });
    }

    /// Adds a u64 counter/gauge value (exact up to 2^53, like every
    /// Prometheus sample).
    pub fn push_u64(&mut self, labels: &[(&'static str, &str)], value: u64) {
        self.push(labels, value as f64);
    }
}

/// Output format, chosen from the request's Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the client lists `application/openmetrics-text`
    /// (Prometheus does when its scrape protocols allow it), text otherwise.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => TEXT_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// Largest integer a sample value holds exactly (Prometheus samples are
/// float64); integral values up to it are written as integers.
const EXACT_INTEGER: f64 = (1u64 << 53) as f64;

/// Help text as the exposition formats want it: backslash and newline
/// escaped.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// One scrape, as prometheus-client's collector.
#[derive(Debug)]
struct Scrape(Vec<Family>);

fn encode_value(encoder: MetricEncoder<'_>, kind: MetricType, v: f64) -> std::fmt::Result {
    let integral = v == v.trunc() && v.abs() < EXACT_INTEGER;
    match kind {
        MetricType::Counter if integral && v >= 0.0 => ConstCounter::new(v as u64).encode(encoder),
        MetricType::Counter => ConstCounter::new(v).encode(encoder),
        MetricType::Gauge if integral => ConstGauge::new(v as i64).encode(encoder),
        MetricType::Gauge => ConstGauge::new(v).encode(encoder),
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        for fam in self.0.iter().filter(|f| !f.samples.is_empty()) {
            let (name, wire) = match fam.kind {
                MetricType::Counter => (
                    fam.name.strip_suffix("_total").unwrap_or(fam.name),
                    WireType::Counter,
                ),
                MetricType::Gauge => (fam.name, WireType::Gauge),
            };
            let help = escape_help(fam.help);
            let mut family = encoder.encode_descriptor(name, &help, None, wire)?;
            match fam.samples.as_slice() {
                [only] if only.labels.is_empty() => {
                    encode_value(family, fam.kind, only.value)?;
                }
                samples => {
                    for s in samples {
                        let labels: Vec<(&str, &str)> =
                            s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                        encode_value(family.encode_family(&labels)?, fam.kind, s.value)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Encodes a scrape; families without samples are left out.
pub fn encode(families: Vec<Family>, format: Format) -> String {
    let counters: HashSet<&'static str> = families
        .iter()
        .filter(|f| f.kind == MetricType::Counter)
        .filter_map(|f| f.name.strip_suffix("_total"))
        .collect();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(families)));
    let mut open_metrics = String::new();
    prometheus_client::encoding::text::encode(&mut open_metrics, &registry)
        .expect("writing to a String cannot fail");
    match format {
        Format::OpenMetrics => open_metrics,
        Format::Text => text_format(&open_metrics, &counters),
    }
}

/// OpenMetrics text as Prometheus text format 0.0.4: counter families
/// carry their `_total`, and no `# EOF`.
fn text_format(open_metrics: &str, counters: &HashSet<&str>) -> String {
    let mut out = String::with_capacity(open_metrics.len() + 16 * counters.len());
    for line in open_metrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let comment = line
            .strip_prefix("# HELP ")
            .map(|r| ("# HELP ", r))
            .or_else(|| line.strip_prefix("# TYPE ").map(|r| ("# TYPE ", r)));
        match comment {
            Some((tag, rest)) => {
                let (name, after) = rest.split_once(' ').unwrap_or((rest, ""));
                let total = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                let _ = writeln!(out, "{tag}{name}{total} {after}");
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_families() -> Vec<Family> {
        let mut c = Family::counter("x_bytes_total", "Bytes \\ moved.\nTwo lines.");
        c.push(&[("a", "q\"uo\\te\nnl")], 3.0);
        let mut g = Family::gauge("x_rtt_seconds", "RTT.");
        g.push(&[("k", "a")], 0.25);
        g.push(&[("k", "v")], 2.0);
        let mut one = Family::gauge("x_up", "Up.");
        one.push(&[], 1.0);
        let empty = Family::gauge("x_empty", "Never shown.");
        vec![c, g, empty, one]
    }

    #[test]
    fn text_format_escapes_and_skips_empty_families() {
        let text = encode(sample_families(), Format::Text);
        assert_eq!(
            text,
            "# HELP x_bytes_total Bytes \\\\ moved.\\nTwo lines.\n# TYPE x_bytes_total counter\n\
             x_bytes_total{a=\"q\\\"uo\\\\te\\nnl\"} 3\n\
             # HELP x_rtt_seconds RTT.\n# TYPE x_rtt_seconds gauge\nx_rtt_seconds{k=\"a\"} 0.25\n\
             x_rtt_seconds{k=\"v\"} 2\n# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"
        );
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let text = encode(sample_families(), Format::OpenMetrics);
        assert!(text.contains("# TYPE x_bytes counter\nx_bytes_total{"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn accept_header_selects_format() {
        assert_eq!(Format::from_accept(None), Format::Text);
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::from_accept(Some("*/*")), Format::Text);
    }

    #[test]
    fn values() {
        let mut g = Family::gauge("v", "Values.");
        for (i, v) in [0.0, 1.0, -2.0, 1.5e-6, 12345678901234.0, 1e300, 0.093]
            .into_iter()
            .enumerate()
        {
            g.push(&[("i", &i.to_string())], v);
        }
        let text = encode(vec![g], Format::Text);
        let values: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit(' ').next().unwrap())
            .collect();
        assert_eq!(
            values,
            [
                "0",
                "1",
                "-2",
                "0.0000015",
                "12345678901234",
                "1e300",
                "0.093"
            ]
        );
    }
}
