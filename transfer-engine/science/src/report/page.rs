//! The report's HTML: sections of captioned figures, the tables of runs and
//! advice, escaping, and the page around them. One self-contained file:
//! inline SVG, no scripts, no external files.

use std::fmt::Write as _;

use longhaul_units::{format_bps, format_bytes};

use crate::results::{field, Run, SweepFile};

/// One figure of the page.
#[derive(Debug, Clone)]
pub struct Figure {
    pub id: String,
    pub svg: String,
    pub caption: String,
}

/// A titled group of figures.
#[derive(Debug, Clone, Default)]
pub struct Section {
    pub title: String,
    pub intro: String,
    pub figures: Vec<Figure>,
}

impl Section {
    /// The section's HTML (`extra`, e.g. a table, before the figures);
    /// nothing when it has neither figures nor extra.
    pub fn html(self, extra: &str) -> String {
        let mut out = String::new();
        if self.figures.is_empty() && extra.is_empty() {
            return out;
        }
        let _ = writeln!(out, "<section><h2>{}</h2>", esc(&self.title));
        if !self.intro.is_empty() {
            let _ = writeln!(out, "<p>{}</p>", self.intro);
        }
        out.push_str(extra);
        for fig in self.figures {
            let _ = writeln!(
                out,
                "<figure id=\"{}\">{}<figcaption>{}</figcaption></figure>",
                fig.id, fig.svg, fig.caption
            );
        }
        out.push_str("</section>\n");
        out
    }
}

/// How tables and figures name the `i`-th run.
pub fn run_label(i: usize) -> String {
    format!("#{}", i + 1)
}

/// The last path component (campaign runs are `<campaign>/<stamp>/<run>`).
pub fn short(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// Escapes text for HTML.
pub fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The table of transfer runs.
pub fn runs_table(runs: &[Run]) -> String {
    let mut t = String::from(
        "<table><tr><th>#</th><th>run</th><th>mode</th><th>direction</th><th>streams</th>\
         <th>started</th><th>seconds (asked)</th><th>throughput</th><th>retransmits</th>\
         <th>sender CPU sys / softirq</th><th>receiver CPU sys / softirq</th></tr>\n",
    );
    for (i, r) in runs.iter().enumerate() {
        let v = &r.result;
        let retrans: f64 = v["streams"]
            .as_array()
            .map(|s| s.iter().map(|s| field(s, "retransmits")).sum())
            .unwrap_or(0.0);
        let cpu = |k: &str| {
            format!(
                "{:.1}% / {:.1}%",
                field(&v["cpu"][k], "system_pct"),
                field(&v["cpu"][k], "softirq_pct")
            )
        };
        // The campaign's <run>.run.json says when the run started.
        let started = r
            .meta
            .as_ref()
            .and_then(|m| m["start"].as_str())
            .unwrap_or("");
        let _ = writeln!(
            t,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{:.2}{}</td><td>{}</td><td>{retrans}</td><td>{}</td><td>{}</td></tr>",
            i + 1,
            esc(&r.name),
            esc(v["mode"].as_str().unwrap_or("?")),
            esc(v["direction"].as_str().unwrap_or("?")),
            v["streams"].as_array().map(|s| s.len()).unwrap_or(0),
            esc(started),
            field(v, "seconds"),
            v["requested_seconds"]
                .as_f64()
                .map(|s| format!(" ({s})"))
                .unwrap_or_default(),
            format_bps(field(v, "throughput_bps")),
            cpu("sender"),
            cpu("receiver"),
        );
    }
    t.push_str("</table>\n");
    t
}

/// The table of tuning advice files.
pub fn advice_table(files: &[SweepFile]) -> String {
    let mut t = String::from(
        "<table><tr><th>file</th><th>target</th><th>RTT (median)</th><th>BDP</th>\
         <th>buffer limit</th><th>recommendation</th><th>sysctls to raise</th></tr>\n",
    );
    for a in files {
        let v = &a.value;
        let r = &v["recommendation"];
        let sysctl: Vec<String> = v["sysctl"]
            .as_array()
            .map(|l| {
                l.iter()
                    .map(|s| {
                        format!(
                            "{}: <code>{}</code>",
                            esc(s["host"].as_str().unwrap_or("?")),
                            esc(s["command"].as_str().unwrap_or("?"))
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(
            t,
            "<tr><td>{}</td><td>{}</td><td>{:.0} µs</td><td>{}</td><td>{}</td>\
             <td>{} x {}</td><td>{}</td></tr>",
            esc(&a.name),
            format_bps(field(v, "target_rate_bps")),
            field(v, "rtt_us"),
            format_bytes(field(v, "bdp_bytes") as u64),
            format_bytes(field(v, "buffer_limit_bytes") as u64),
            r["streams"],
            esc(r["buffer"].as_str().unwrap_or("?")),
            if sysctl.is_empty() {
                "none".to_string()
            } else {
                sysctl.join("<br>")
            }
        );
    }
    t.push_str("</table>\n");
    t
}

pub const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:960px;color:#222}\
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}\
figure{margin:1.5em 0}figcaption{font-size:.9em;color:#444;margin-top:.3em}\
svg{max-width:100%;height:auto;border:1px solid #eee}\
table{border-collapse:collapse;font-size:.85em;margin:1em 0}\
td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left}th{background:#f4f4f4}\
.notes{color:#844}code{font-size:.95em}";
