//! The metric model collectors fill in, and its two wire encodings:
//! Prometheus text format 0.0.4 and OpenMetrics 1.0 (`# EOF`, counter
//! families named without `_total`).
//!
//! Deliberately tiny: a scrape is a list of families, a family a list of
//! samples with owned label values. Collectors build it fresh every scrape,
//! so there is no registry state to go stale.

use std::fmt::Write as _;

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

/// Encodes families; families without samples are left out.
pub fn encode(families: &[Family], format: Format) -> String {
    let mut out = String::with_capacity(families.iter().map(|f| f.samples.len() * 96).sum());
    for fam in families.iter().filter(|f| !f.samples.is_empty()) {
        let type_name = match fam.kind {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
        };
        let family_name = match (format, fam.kind) {
            (Format::OpenMetrics, MetricType::Counter) => {
                fam.name.strip_suffix("_total").unwrap_or(fam.name)
            }
            _ => fam.name,
        };
        out.push_str("# HELP ");
        out.push_str(family_name);
        out.push(' ');
        escape_help(&mut out, fam.help);
        out.push('\n');
        let _ = writeln!(out, "# TYPE {family_name} {type_name}");
        for s in &fam.samples {
            out.push_str(fam.name);
            if !s.labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in s.labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(k);
                    out.push_str("=\"");
                    escape_label(&mut out, v);
                    out.push('"');
                }
                out.push('}');
            }
            out.push(' ');
            write_value(&mut out, s.value);
            out.push('\n');
        }
    }
    if format == Format::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
}

fn escape_help(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_label(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v == v.trunc() && v.abs() < 1e15 {
        let _ = write!(out, "{}", v as i64);
    } else if v.abs() >= 1e15 || v.abs() < 1e-4 {
        let _ = write!(out, "{v:e}");
    } else {
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_families() -> Vec<Family> {
        let mut c = Family::counter("x_bytes_total", "Bytes \\ moved.\nTwo lines.");
        c.push(&[("a", "q\"uo\\te\nnl")], 3.0);
        let mut g = Family::gauge("x_rtt_seconds", "RTT.");
        g.push(&[], 0.25);
        g.push(&[("k", "v")], f64::INFINITY);
        let empty = Family::gauge("x_empty", "Never shown.");
        vec![c, g, empty]
    }

    #[test]
    fn text_format_escapes_and_skips_empty_families() {
        let text = encode(&sample_families(), Format::Text);
        assert_eq!(
            text,
            "# HELP x_bytes_total Bytes \\\\ moved.\\nTwo lines.\n# TYPE x_bytes_total counter\n\
             x_bytes_total{a=\"q\\\"uo\\\\te\\nnl\"} 3\n\
             # HELP x_rtt_seconds RTT.\n# TYPE x_rtt_seconds gauge\nx_rtt_seconds 0.25\n\
             x_rtt_seconds{k=\"v\"} +Inf\n"
        );
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let text = encode(&sample_families(), Format::OpenMetrics);
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
        let mut s = String::new();
        for v in [0.0, 1.0, -2.0, 1.5e-6, 12345678901234.0, 1e300, f64::NAN] {
            write_value(&mut s, v);
            s.push(' ');
        }
        assert_eq!(s, "0 1 -2 1.5e-6 12345678901234 1e300 NaN ");
    }
}
