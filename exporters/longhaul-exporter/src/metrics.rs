//! The metric model collectors fill in, and its two wire encodings:
//! OpenMetrics 1.0 (`# EOF`, counter families named without `_total`) and
//! the Prometheus text format 0.0.4.
//!
//! Deliberately tiny: a scrape is a list of families, a family a list of
//! samples with owned label values. Collectors build it fresh every
//! collection, so there is no registry state to go stale. [`encode`] writes
//! it in one pass (a scrape of 10,000 streams is ~15,000 series): label
//! values and help text escaped as both formats want, integral values as
//! integers, others as the shortest decimal that reads back the same
//! (dtoa, as prometheus-client wrote them before).

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

/// One sample: label pairs (names are static, values owned) and a value,
/// as [`Family::samples`] hands them back.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// All samples of one metric name. The samples' labels are kept as they
/// will be written, values escaped, one after the other: a collection of
/// 50,000 streams pushes some 80,000 samples, and a string per label value
/// (240,000 of them, allocated, read back scattered by [`encode`], freed)
/// cost more than reading the engine's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Full sample name; counters end in `_total`.
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricType,
    /// Every sample's label names, one after the other.
    names: Vec<&'static str>,
    /// Every sample's label values, escaped, one after the other...
    values: String,
    /// ...and where each ends in `values` (one per name).
    value_ends: Vec<usize>,
    /// Each sample: where its labels end in `names`, and its value.
    samples: Vec<(usize, f64)>,
}

impl Family {
    pub fn counter(name: &'static str, help: &'static str) -> Family {
        debug_assert!(name.ends_with("_total"), "{name}: counters end in _total");
        Family::new(name, help, MetricType::Counter)
    }

    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family::new(name, help, MetricType::Gauge)
    }

    fn new(name: &'static str, help: &'static str, kind: MetricType) -> Family {
        Family {
            name,
            help,
            kind,
            names: Vec::new(),
            values: String::new(),
            value_ends: Vec::new(),
            samples: Vec::new(),
        }
    }

    /// Adds a sample; `labels` pairs are (name, value).
    pub fn push<V: Into<f64>>(&mut self, labels: &[(&'static str, &str)], value: V) {
        for (name, v) in labels {
            self.names.push(name);
            escaped(&mut self.values, v, true);
            self.value_ends.push(self.values.len());
        }
        self.samples.push((self.names.len(), value.into()));
    }

    /// Adds a u64 counter/gauge value (exact up to 2^53, like every
    /// Prometheus sample).
    pub fn push_u64(&mut self, labels: &[(&'static str, &str)], value: u64) {
        self.push(labels, value as f64);
    }

    /// Makes room for `samples` more samples of `labels` labels each
    /// (values of up to 16 bytes), so a large family grows once.
    pub fn reserve(&mut self, samples: usize, labels: usize) {
        self.samples.reserve(samples);
        self.names.reserve(samples * labels);
        self.value_ends.reserve(samples * labels);
        self.values.reserve(samples * labels * 16);
    }

    /// How many samples the family has.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The samples as they were pushed (label values unescaped).
    pub fn samples(&self) -> Vec<Sample> {
        let mut first = 0;
        self.samples
            .iter()
            .map(|&(end, value)| {
                let labels = (first..end)
                    .map(|i| (self.names[i], unescaped(self.value(i))))
                    .collect();
                first = end;
                Sample { labels, value }
            })
            .collect()
    }

    /// Label value `i` of `names`, escaped.
    fn value(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.value_ends[i - 1] };
        &self.values[start..self.value_ends[i]]
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

/// What [`escaped`] made of a label value, back as it was.
fn unescaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// Appends `text` with the characters the formats escape escaped:
/// backslash and newline, and in label values the double quote.
fn escaped(out: &mut String, text: &str, quote: bool) {
    if !text
        .bytes()
        .any(|b| b == b'\\' || b == b'\n' || (quote && b == b'"'))
    {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

fn value(out: &mut String, v: f64) {
    if v == v.trunc() && v.abs() < EXACT_INTEGER {
        // Most values are whole numbers (counters, bytes): written digit by
        // digit, without the formatting machinery.
        let mut n = v.abs() as u64;
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        if v < 0.0 {
            out.push('-');
        }
        out.push_str(std::str::from_utf8(&digits[at..]).expect("ASCII digits"));
    } else if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        out.push_str(dtoa::Buffer::new().format(v));
    }
}

/// Encodes a scrape; families without samples are left out.
pub fn encode(families: &[Family], format: Format) -> String {
    let series: usize = families.iter().map(|f| f.len()).sum();
    let mut out = String::with_capacity(series * 128 + families.len() * 160);
    for fam in families.iter().filter(|f| !f.is_empty()) {
        let (name, kind) = match fam.kind {
            MetricType::Counter => (
                match format {
                    Format::Text => fam.name,
                    Format::OpenMetrics => fam.name.strip_suffix("_total").unwrap_or(fam.name),
                },
                "counter",
            ),
            MetricType::Gauge => (fam.name, "gauge"),
        };
        out.push_str("# HELP ");
        out.push_str(name);
        out.push(' ');
        escaped(&mut out, fam.help, false);
        out.push_str("\n# TYPE ");
        out.push_str(name);
        out.push(' ');
        out.push_str(kind);
        out.push('\n');
        let mut first = 0;
        for &(end, v) in &fam.samples {
            out.push_str(fam.name);
            if first < end {
                out.push('{');
                for i in first..end {
                    if i > first {
                        out.push(',');
                    }
                    out.push_str(fam.names[i]);
                    out.push_str("=\"");
                    out.push_str(fam.value(i));
                    out.push('"');
                }
                out.push('}');
            }
            first = end;
            out.push(' ');
            value(&mut out, v);
            out.push('\n');
        }
    }
    if format == Format::OpenMetrics {
        out.push_str("# EOF\n");
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
        let text = encode(&sample_families(), Format::Text);
        assert_eq!(
            text,
            "# HELP x_bytes_total Bytes \\\\ moved.\\nTwo lines.\n# TYPE x_bytes_total counter\n\
             x_bytes_total{a=\"q\\\"uo\\\\te\\nnl\"} 3\n\
             # HELP x_rtt_seconds RTT.\n# TYPE x_rtt_seconds gauge\nx_rtt_seconds{k=\"a\"} 0.25\n\
             x_rtt_seconds{k=\"v\"} 2\n# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"
        );
    }

    #[test]
    fn samples_come_back_as_they_were_pushed() {
        let fams = sample_families();
        assert_eq!(
            fams[0].samples(),
            [Sample {
                labels: vec![("a", "q\"uo\\te\nnl".to_string())],
                value: 3.0
            }]
        );
        let g = &fams[1];
        assert_eq!(g.len(), 2);
        assert_eq!(
            g.samples()
                .iter()
                .map(|s| (s.labels.clone(), s.value))
                .collect::<Vec<_>>(),
            [
                (vec![("k", "a".to_string())], 0.25),
                (vec![("k", "v".to_string())], 2.0)
            ]
        );
        assert!(fams[2].is_empty() && fams[2].samples().is_empty());
        assert_eq!(fams[3].samples()[0].labels, []);
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
        let mut g = Family::gauge("v", "Values.");
        for (i, v) in [0.0, 1.0, -2.0, 1.5e-6, 12345678901234.0, 1e300, 0.093]
            .into_iter()
            .enumerate()
        {
            g.push(&[("i", &i.to_string())], v);
        }
        let text = encode(&[g], Format::Text);
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
