//! `longhaul report RESULTS_DIR`: one self-contained HTML page (inline SVG,
//! no scripts, no external files) with the figures a campaign is read from:
//!
//! - throughput over time (from `--interval` lines, else each run's
//!   average drawn flat over its duration), per-stream throughput, CPU
//!   (user/system/softirq) of both ends, disk IO per device and per
//!   controller (disk runs);
//! - the window x streams heatmap and throughput against streams per
//!   window (sweep files);
//! - message-length curves: latency p50/p99, streaming throughput and CPU
//!   per message against message length, one curve per load level;
//! - per campaign phase (`<phase>.phase.json`), the aggregate of each
//!   direction over time, engine beside router (with `--prometheus`);
//! - optionally the same kinds of series from Prometheus for a time range.
//!
//! [`results`](crate::results) reads the files, [`figures`] draws,
//! [`page`] writes the HTML; this module puts the sections together.

pub mod figures;
pub mod page;

use std::path::{Path, PathBuf};

use crate::{Error, Result};

use crate::results::{self, Results};

use self::figures::{
    fig_cpu, fig_disk, fig_messages, fig_per_stream, fig_phase_aggregate, fig_prometheus,
    fig_sweep, fig_throughput_time, MAX_RUNS_DRAWN,
};
use self::page::{advice_table, esc, runs_table, Figure, Section, STYLE};

/// Default Prometheus step when `--step` is not given: the scrape interval
/// of the lab's Prometheus.
const DEFAULT_STEP: f64 = 15.0;

/// Prometheus step of the routers' series in a phase figure: a phase lasts
/// tens of seconds, so the scrape interval's 15 s would leave two points.
const PHASE_STEP: f64 = 5.0;

/// `longhaul report` options.
#[derive(Debug, Clone, Default)]
pub struct ReportOptions {
    pub dir: PathBuf,
    /// Default: RESULTS_DIR/report.html.
    pub out: Option<PathBuf>,
    pub title: Option<String>,
    pub prometheus: Option<crate::prometheus::Source>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub step: Option<f64>,
}

/// Builds every section from the results (and Prometheus when asked).
pub fn sections(r: &Results, opts: &ReportOptions, notes: &mut Vec<String>) -> Result<String> {
    let mut body = String::new();
    let mut push = |s: Section, extra: &str| body.push_str(&s.html(extra));
    if !r.runs.is_empty() {
        let mut figs: Vec<Figure> = fig_throughput_time(&r.runs)?.into_iter().collect();
        for (i, run) in r.runs.iter().enumerate().take(MAX_RUNS_DRAWN) {
            figs.extend(fig_per_stream(i, run)?);
        }
        figs.extend(fig_cpu(&r.runs)?);
        figs.extend(fig_disk(&r.runs)?);
        push(
            Section {
                title: "Transfers".into(),
                intro: format!(
                    "{} run(s) of <code>longhaul send --json</code>.",
                    r.runs.len()
                ),
                figures: figs,
            },
            &runs_table(&r.runs),
        );
    }
    if !r.phases.is_empty() {
        let mut figs = Vec::new();
        for (n, phase) in r.phases.iter().enumerate() {
            let router = match &opts.prometheus {
                Some(source) => router_series(source, &phase.value, opts.step, notes)?,
                None => Vec::new(),
            };
            figs.extend(fig_phase_aggregate(n, phase, &r.runs, &router)?);
        }
        push(
            Section {
                title: "Phases".into(),
                intro: format!(
                    "{} campaign phase(s): runs started together, summed per direction.",
                    r.phases.len()
                ),
                figures: figs,
            },
            "",
        );
    }
    let mut sweep_figs = Vec::new();
    for (n, s) in r.sweeps.iter().enumerate() {
        sweep_figs.extend(fig_sweep(n, s)?);
    }
    push(
        Section {
            title: "Window x streams".into(),
            intro: String::new(),
            figures: sweep_figs,
        },
        "",
    );
    push(
        Section {
            title: "Message length".into(),
            intro: "From <code>longhaul sweep --messages</code>, with and without \
                    <code>--load</code>."
                .into(),
            figures: fig_messages(&r.messages)?,
        },
        "",
    );
    if !r.advice.is_empty() {
        push(
            Section {
                title: "Tuning advice".into(),
                ..Section::default()
            },
            &advice_table(&r.advice),
        );
    }
    if let (Some(source), Some(from), Some(to)) = (&opts.prometheus, &opts.from, &opts.to) {
        let step = opts.step.unwrap_or(DEFAULT_STEP);
        push(
            Section {
                title: "Prometheus".into(),
                intro: format!("{} from {} to {}.", esc(&source.url), esc(from), esc(to)),
                figures: fig_prometheus(source, from, to, step, notes)?,
            },
            "",
        );
    }
    Ok(body)
}

/// The routers' interfaces over a phase's time (and half a minute either
/// side); a failed query is a note, not an error, unless Prometheus refuses
/// to be asked at all (see [`crate::prometheus`]).
fn router_series(
    source: &crate::prometheus::Source,
    phase: &serde_json::Value,
    step: Option<f64>,
    notes: &mut Vec<String>,
) -> Result<Vec<crate::prometheus::PromSeries>> {
    let from = results::field(phase, "started_unix") - 30.0;
    let to = results::field(phase, "ended_unix") + 30.0;
    let step = step.unwrap_or(PHASE_STEP);
    match crate::prometheus::query_range(
        source,
        &crate::prometheus::ROUTER_OUT,
        &format!("{from:.3}"),
        &format!("{to:.3}"),
        step,
    ) {
        Ok(s) => Ok(s),
        Err(e @ Error::PrometheusRefused(_)) => Err(e),
        Err(e) => {
            notes.push(format!("Prometheus, routers during phase: {e}"));
            Ok(Vec::new())
        }
    }
}

/// Renders the whole page.
pub fn render(opts: &ReportOptions) -> Result<String> {
    if let Some(source) = &opts.prometheus {
        source.check()?;
    }
    let results = Results::load(&opts.dir)?;
    if let Some(source) = &opts.prometheus {
        crate::prometheus::reach(source)?;
    }
    if results.is_empty() && opts.prometheus.is_none() {
        return Err(Error::Usage(format!(
            "{} holds no longhaul results (send --json output, sweep.json, messages*.json)",
            opts.dir.display()
        )));
    }
    let mut notes = Vec::new();
    let body = sections(&results, opts, &mut notes)?;
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| format!("longhaul report: {}", opts.dir.display()));
    let mut html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{t}</title><style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n\
         <p>Generated by longhaul {} at {} UTC from <code>{}</code>.</p>\n",
        longhaul_engine::SOFTWARE_VERSION,
        results::utc_stamp(jiff::Timestamp::now()),
        esc(&opts.dir.display().to_string()),
        t = esc(&title),
    );
    html.push_str(&body);
    for (file, why) in &results.skipped {
        notes.push(format!("skipped {file}: {why}"));
    }
    if !notes.is_empty() {
        html.push_str("<section><h2>Notes</h2><ul class=\"notes\">\n");
        for n in &notes {
            html.push_str(&format!("<li>{}</li>\n", esc(n)));
        }
        html.push_str("</ul></section>\n");
    }
    html.push_str("</body></html>\n");
    Ok(html)
}

/// Where the report goes.
pub fn out_path(opts: &ReportOptions) -> PathBuf {
    opts.out
        .clone()
        .unwrap_or_else(|| opts.dir.join("report.html"))
}

/// `longhaul report`: writes the page and returns its path.
pub fn run(opts: &ReportOptions) -> Result<PathBuf> {
    let html = render(opts)?;
    let path = out_path(opts);
    write(&path, &html)?;
    Ok(path)
}

fn write(path: &Path, html: &str) -> Result<()> {
    std::fs::write(path, html).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
