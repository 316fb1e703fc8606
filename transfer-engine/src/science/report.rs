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
//! - optionally the same kinds of series from Prometheus for a time range.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::units::format_bps;

use super::advise::size_arg;
use super::figures::{
    bar_chart, byte_rate_unit, heatmap, line_chart, rate_unit, Axis, Bar, Series,
};
use super::prometheus::{self, Unit, MAX_SERIES, QUERIES};
use super::results::{Results, Run, SweepFile};

/// Runs drawn in the throughput-over-time figure and runs that get a
/// per-stream figure: beyond a dozen the figures stop being readable.
const MAX_RUNS_DRAWN: usize = 12;

/// Default Prometheus step when `--step` is not given: the scrape interval
/// of the lab's Prometheus.
const DEFAULT_STEP: f64 = 15.0;

/// `longhaul report` options.
#[derive(Debug, Clone, Default)]
pub struct ReportOptions {
    pub dir: PathBuf,
    /// Default: RESULTS_DIR/report.html.
    pub out: Option<PathBuf>,
    pub title: Option<String>,
    pub prometheus: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub step: Option<f64>,
}

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

fn f(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn run_label(i: usize) -> String {
    format!("#{}", i + 1)
}

/// Throughput of each run over time.
fn fig_throughput_time(runs: &[Run]) -> Result<Option<Figure>> {
    if runs.is_empty() {
        return Ok(None);
    }
    let max = runs
        .iter()
        .flat_map(|r| {
            r.intervals
                .iter()
                .map(|i| f(i, "throughput_bps"))
                .chain(std::iter::once(f(&r.result, "throughput_bps")))
        })
        .fold(0.0, f64::max);
    let (div, unit) = rate_unit(max);
    let mut any_flat = false;
    let series: Vec<Series> = runs
        .iter()
        .take(MAX_RUNS_DRAWN)
        .enumerate()
        .map(|(i, r)| {
            // Each interval is a step over [start, end]; a run without
            // intervals is one step at its average.
            let (points, suffix) = if r.intervals.is_empty() {
                any_flat = true;
                let avg = f(&r.result, "throughput_bps") / div;
                (
                    vec![(0.0, avg), (f(&r.result, "seconds"), avg)],
                    " (average)",
                )
            } else {
                let pts = r
                    .intervals
                    .iter()
                    .flat_map(|iv| {
                        let v = f(iv, "throughput_bps") / div;
                        [(f(iv, "start"), v), (f(iv, "end"), v)]
                    })
                    .collect();
                (pts, "")
            };
            Series {
                name: format!("{} {}{suffix}", run_label(i), short(&r.name)),
                points,
                dashed: false,
                color: i,
                markers: false,
            }
        })
        .collect();
    let svg = line_chart(
        "Throughput over time",
        (Axis::Linear, "time since start (s)"),
        (Axis::Linear, &format!("throughput ({unit})")),
        &series,
    )?;
    let mut caption = format!("Payload throughput per run in {unit}");
    if any_flat {
        caption.push_str("; runs without --interval lines are drawn at their average");
    }
    if runs.len() > MAX_RUNS_DRAWN {
        caption.push_str(&format!("; first {MAX_RUNS_DRAWN} of {} runs", runs.len()));
    }
    Ok(Some(Figure {
        id: "fig-throughput-time".into(),
        svg,
        caption: caption + ".",
    }))
}

/// The last path component (campaign runs are `<campaign>/<stamp>/<run>`).
fn short(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn fig_per_stream(i: usize, run: &Run) -> Result<Option<Figure>> {
    let streams = run.result["streams"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let secs = f(&run.result, "seconds").max(1e-9);
    if streams.is_empty() {
        return Ok(None);
    }
    let max = streams
        .iter()
        .map(|s| f(s, "bytes") * 8.0 / secs)
        .fold(0.0, f64::max);
    let (div, unit) = rate_unit(max);
    let bars: Vec<Bar> = streams
        .iter()
        .map(|s| {
            let v = f(s, "bytes") * 8.0 / secs / div;
            let receive = s["direction"] == "receive";
            Bar {
                label: s["id"].to_string(),
                parts: if receive { vec![0.0, v] } else { vec![v, 0.0] },
            }
        })
        .collect();
    let bidir = streams.iter().any(|s| s["direction"] == "receive");
    let parts: &[&str] = if bidir {
        &["client -> server", "server -> client"]
    } else {
        &["throughput"]
    };
    let title = format!(
        "Per-stream throughput, {} {}",
        run_label(i),
        short(&run.name)
    );
    let svg = bar_chart(
        &title,
        ("stream id", &format!("throughput ({unit})")),
        parts,
        &bars,
        None,
    )?;
    Ok(Some(Figure {
        id: format!("fig-per-stream-{}", i + 1),
        svg,
        caption: format!(
            "{}: average throughput of each of its {} streams over {:.1} s, {unit}.",
            esc(&run.name),
            streams.len(),
            secs
        ),
    }))
}

fn fig_cpu(runs: &[Run]) -> Result<Option<Figure>> {
    if runs.is_empty() {
        return Ok(None);
    }
    let mut bars = Vec::new();
    for (i, r) in runs.iter().enumerate().take(MAX_RUNS_DRAWN) {
        for (side, key) in [("snd", "sender"), ("rcv", "receiver")] {
            let c = &r.result["cpu"][key];
            bars.push(Bar {
                label: format!("{} {side}", run_label(i)),
                parts: vec![f(c, "user_pct"), f(c, "system_pct"), f(c, "softirq_pct")],
            });
        }
    }
    let svg = bar_chart(
        "CPU of both ends (whole machine)",
        (
            "run and end (snd = sender, rcv = receiver)",
            "CPU (% of all cores)",
        ),
        &["user", "system", "softirq"],
        &bars,
        Some(100.0),
    )?;
    Ok(Some(Figure {
        id: "fig-cpu".into(),
        svg,
        caption: "User, system and softirq time of each end's machine over the data phase \
                  (/proc/stat), percent of all its CPUs. Run numbers as in the table above."
            .into(),
    }))
}

/// Disk IO of disk-mode runs, per device and per controller.
fn fig_disk(runs: &[Run]) -> Result<Vec<Figure>> {
    let mut per_device = Vec::new();
    let mut per_ctrl: Vec<(String, f64, f64)> = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let Some(devs) = r.result["devices"].as_array() else {
            continue;
        };
        let secs = f(&r.result, "seconds").max(1e-9);
        for d in devs {
            let read = f(d, "read_bytes") / secs;
            let written = f(d, "written_bytes") / secs;
            let dev = d["device"].as_str().unwrap_or("?");
            let ctrl = d["controller"].as_str().unwrap_or("?");
            let side = if d["side"] == "receiver" {
                "rcv"
            } else {
                "snd"
            };
            per_device.push((format!("{} {side} {dev}", run_label(i)), read, written));
            let key = format!("{} {side} {ctrl}", run_label(i));
            match per_ctrl.iter_mut().find(|c| c.0 == key) {
                Some(c) => {
                    c.1 += read;
                    c.2 += written;
                }
                None => per_ctrl.push((key, read, written)),
            }
        }
    }
    if per_device.is_empty() {
        return Ok(Vec::new());
    }
    let max = per_device.iter().map(|d| d.1 + d.2).fold(0.0, f64::max);
    let max = per_ctrl.iter().map(|d| d.1 + d.2).fold(max, f64::max);
    let (div, unit) = byte_rate_unit(max);
    let to_bars = |v: &[(String, f64, f64)]| -> Vec<Bar> {
        v.iter()
            .map(|(l, r, w)| Bar {
                label: l.clone(),
                parts: vec![r / div, w / div],
            })
            .collect()
    };
    let mut out = Vec::new();
    for (id, title, x, list) in [
        (
            "fig-disk-device",
            "Disk IO per device",
            "run, end, device",
            &per_device,
        ),
        (
            "fig-disk-controller",
            "Disk IO per controller",
            "run, end, controller",
            &per_ctrl,
        ),
    ] {
        let svg = bar_chart(
            title,
            (x, &format!("IO ({unit})")),
            &["read", "written"],
            &to_bars(list),
            None,
        )?;
        out.push(Figure {
            id: id.into(),
            svg,
            caption: format!(
                "Average {unit} read by the sender and written by the receiver over each \
                 disk run's data phase."
            ),
        });
    }
    Ok(out)
}

fn sorted_unique(values: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut v: Vec<u64> = values.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Heatmap and throughput-vs-streams lines of one sweep file.
fn fig_sweep(n: usize, sweep: &SweepFile) -> Result<Vec<Figure>> {
    let cells = sweep.value["cells"].as_array().cloned().unwrap_or_default();
    let ok: Vec<&Value> = cells.iter().filter(|c| c["error"].is_null()).collect();
    if ok.is_empty() {
        return Ok(Vec::new());
    }
    let buffers = sorted_unique(ok.iter().filter_map(|c| c["buffer_bytes"].as_u64()));
    let streams = sorted_unique(ok.iter().filter_map(|c| c["streams"].as_u64()));
    let max = ok
        .iter()
        .map(|c| f(c, "throughput_bps"))
        .fold(0.0, f64::max);
    let (div, unit) = rate_unit(max);
    let find = |s: u64, b: u64| {
        ok.iter()
            .find(|c| c["streams"].as_u64() == Some(s) && c["buffer_bytes"].as_u64() == Some(b))
            .map(|c| f(c, "throughput_bps") / div)
    };
    let values: Vec<Vec<Option<f64>>> = streams
        .iter()
        .map(|&s| buffers.iter().map(|&b| find(s, b)).collect())
        .collect();
    let blabels: Vec<String> = buffers.iter().map(|&b| size_arg(b)).collect();
    let slabels: Vec<String> = streams.iter().map(|s| s.to_string()).collect();
    let load = sweep.value["load_streams"].as_u64().unwrap_or(0);
    let time = f(&sweep.value, "time_s");
    let about = format!(
        "{}: {} s per cell{}",
        esc(&sweep.name),
        time,
        if load > 0 {
            format!(", {load} background streams")
        } else {
            String::new()
        }
    );
    let digits = if max / div >= 100.0 { 0 } else { 2 };
    let heat = heatmap(
        &format!("Throughput ({unit}), TCP buffer x streams"),
        ("socket buffer (--buffer)", &blabels),
        ("streams", &slabels),
        &values,
        &|v| format!("{v:.digits$}"),
    )?;
    let series: Vec<Series> = buffers
        .iter()
        .enumerate()
        .map(|(i, &b)| Series {
            name: format!("buffer {}", size_arg(b)),
            points: streams
                .iter()
                .filter_map(|&s| find(s, b).map(|v| (s as f64, v)))
                .collect(),
            dashed: false,
            color: i,
            markers: true,
        })
        .collect();
    let lines = line_chart(
        "Throughput against streams, one line per buffer",
        (Axis::Log2Count, "streams"),
        (Axis::Linear, &format!("throughput ({unit})")),
        &series,
    )?;
    let best = &sweep.value["best"];
    let best_text = if best.is_object() {
        format!(
            " Best cell: {} streams x {} = {}.",
            best["streams"],
            best["buffer"].as_str().unwrap_or("?"),
            format_bps(f(best, "throughput_bps"))
        )
    } else {
        String::new()
    };
    Ok(vec![
        Figure {
            id: format!("fig-heatmap-{}", n + 1),
            svg: heat,
            caption: format!(
                "{about}. Each cell is one memory-to-memory run; darker is faster.{best_text}"
            ),
        },
        Figure {
            id: format!("fig-sweep-streams-{}", n + 1),
            svg: lines,
            caption: format!(
                "{about}. With small buffers each stream is window-limited (buffer / RTT), so \
                 throughput grows linearly with streams until the path is full."
            ),
        },
    ])
}

/// Message-length curves over all messages files, one curve per file
/// (labelled by its load).
fn fig_messages(files: &[SweepFile]) -> Result<Vec<Figure>> {
    let mut usable: Vec<&SweepFile> = files
        .iter()
        .filter(|m| {
            m.value["cells"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["error"].is_null()))
        })
        .collect();
    // No load first: it is the baseline the loaded curves are read against.
    usable.sort_by_key(|m| m.value["load_streams"].as_u64().unwrap_or(0));
    if usable.is_empty() {
        return Ok(Vec::new());
    }
    let label = |m: &SweepFile| {
        let load = m.value["load_streams"].as_u64().unwrap_or(0);
        let base = if load == 0 {
            "no load".to_string()
        } else {
            format!("load {load} streams")
        };
        let same = usable
            .iter()
            .filter(|o| o.value["load_streams"].as_u64().unwrap_or(0) == load)
            .count();
        if same > 1 {
            format!("{base} ({})", short(&m.name))
        } else {
            base
        }
    };
    let points = |m: &SweepFile, key: &str, div: f64| -> Vec<(f64, f64)> {
        m.value["cells"]
            .as_array()
            .map(|cells| {
                cells
                    .iter()
                    .filter(|c| c["error"].is_null() && f(c, key) > 0.0)
                    .map(|c| (f(c, "length"), f(c, key) / div))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut lat = Vec::new();
    let mut tput = Vec::new();
    let mut cpu = Vec::new();
    let max_tput = usable
        .iter()
        .flat_map(|m| points(m, "stream_throughput_bps", 1.0))
        .map(|p| p.1)
        .fold(0.0, f64::max);
    let (div, unit) = rate_unit(max_tput);
    // WAN latencies read better in ms, LAN ones in µs.
    let max_lat = usable
        .iter()
        .flat_map(|m| points(m, "latency_p99_us", 1.0))
        .map(|p| p.1)
        .fold(0.0, f64::max);
    let (lat_div, lat_unit) = if max_lat >= 10_000.0 {
        (1000.0, "ms")
    } else {
        (1.0, "µs")
    };
    for (i, m) in usable.iter().enumerate() {
        let l = label(m);
        let s = |name: String, pts, dashed| Series {
            name,
            points: pts,
            dashed,
            color: i,
            markers: true,
        };
        lat.push(s(
            format!("{l} p50"),
            points(m, "latency_p50_us", lat_div),
            false,
        ));
        lat.push(s(
            format!("{l} p99"),
            points(m, "latency_p99_us", lat_div),
            true,
        ));
        tput.push(s(l.clone(), points(m, "stream_throughput_bps", div), false));
        cpu.push(s(
            format!("{l} sender"),
            points(m, "sender_cpu_us_per_message", 1.0),
            false,
        ));
        cpu.push(s(
            format!("{l} receiver"),
            points(m, "receiver_cpu_us_per_message", 1.0),
            true,
        ));
    }
    let x = (Axis::Log2Bytes, "message length");
    Ok(vec![
        Figure {
            id: "fig-msg-latency".into(),
            svg: line_chart(
                "Request/response latency against message length",
                x,
                (Axis::Log10, &format!("latency ({lat_unit}, log scale)")),
                &lat,
            )?,
            caption: "Time from writing a message of the given length to reading the server's \
                      8-byte acknowledgement; p50 thick, p99 thin, one colour per load level."
                .into(),
        },
        Figure {
            id: "fig-msg-throughput".into(),
            svg: line_chart(
                "Streaming throughput against message length",
                x,
                (Axis::Linear, &format!("throughput ({unit})")),
                &tput,
            )?,
            caption: "Messages written back to back on one stream (one send per message, one \
                      receive loop per message on the server)."
                .into(),
        },
        Figure {
            id: "fig-msg-cpu".into(),
            svg: line_chart(
                "CPU time per message (overhead)",
                x,
                (Axis::Log10, "CPU per message (µs, log scale)"),
                &cpu,
            )?,
            caption: "CPU time of the sending and receiving worker threads divided by the \
                      messages they moved while streaming; sender thick, receiver thin."
                .into(),
        },
    ])
}

fn fig_prometheus(opts: &ReportOptions, notes: &mut Vec<String>) -> Vec<Figure> {
    let (Some(url), Some(from), Some(to)) = (&opts.prometheus, &opts.from, &opts.to) else {
        return Vec::new();
    };
    let step = opts.step.unwrap_or(DEFAULT_STEP);
    let mut figs = Vec::new();
    for (n, q) in QUERIES.iter().enumerate() {
        let series = match prometheus::query_range(url, q, from, to, step) {
            Ok(s) => s,
            Err(e) => {
                notes.push(format!("Prometheus, {}: {e}", q.title));
                continue;
            }
        };
        if series.iter().all(|s| s.points.is_empty()) {
            notes.push(format!("Prometheus, {}: no data in the range", q.title));
            continue;
        }
        let t0 = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .fold(f64::INFINITY, f64::min);
        let max = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max);
        let (div, unit) = match q.unit {
            Unit::BitsPerSecond => rate_unit(max),
            Unit::BytesPerSecond => byte_rate_unit(max),
            Unit::Percent => (1.0, "%"),
        };
        let drawn: Vec<Series> = series
            .iter()
            .take(MAX_SERIES)
            .enumerate()
            .map(|(i, s)| Series {
                name: s.name.clone(),
                points: s.points.iter().map(|&(t, v)| (t - t0, v / div)).collect(),
                dashed: false,
                color: i,
                markers: true,
            })
            .collect();
        let y = match q.unit {
            Unit::Percent => "CPU (% of all cores)".to_string(),
            Unit::BitsPerSecond => format!("throughput ({unit})"),
            Unit::BytesPerSecond => format!("IO ({unit})"),
        };
        let svg = match line_chart(
            q.title,
            (Axis::Linear, &format!("seconds since {from}")),
            (Axis::Linear, &y),
            &drawn,
        ) {
            Ok(s) => s,
            Err(e) => {
                notes.push(format!("Prometheus, {}: {e}", q.title));
                continue;
            }
        };
        let mut caption = format!("<code>{}</code>, step {step} s", esc(q.promql));
        if series.len() > MAX_SERIES {
            caption.push_str(&format!("; first {MAX_SERIES} of {} series", series.len()));
        }
        figs.push(Figure {
            id: format!("fig-prom-{}", n + 1),
            svg,
            caption,
        });
    }
    figs
}

fn runs_table(runs: &[Run]) -> String {
    let mut t = String::from(
        "<table><tr><th>#</th><th>run</th><th>mode</th><th>direction</th><th>streams</th>\
         <th>started</th><th>seconds</th><th>throughput</th><th>retransmits</th>\
         <th>sender CPU sys / softirq</th><th>receiver CPU sys / softirq</th></tr>\n",
    );
    for (i, r) in runs.iter().enumerate() {
        let v = &r.result;
        let retrans: f64 = v["streams"]
            .as_array()
            .map(|s| s.iter().map(|s| f(s, "retransmits")).sum())
            .unwrap_or(0.0);
        let cpu = |k: &str| {
            format!(
                "{:.1}% / {:.1}%",
                f(&v["cpu"][k], "system_pct"),
                f(&v["cpu"][k], "softirq_pct")
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
             <td>{:.2}</td><td>{}</td><td>{retrans}</td><td>{}</td><td>{}</td></tr>",
            i + 1,
            esc(&r.name),
            esc(v["mode"].as_str().unwrap_or("?")),
            esc(v["direction"].as_str().unwrap_or("?")),
            v["streams"].as_array().map(|s| s.len()).unwrap_or(0),
            esc(started),
            f(v, "seconds"),
            format_bps(f(v, "throughput_bps")),
            cpu("sender"),
            cpu("receiver"),
        );
    }
    t.push_str("</table>\n");
    t
}

fn advice_table(files: &[SweepFile]) -> String {
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
            format_bps(f(v, "target_rate_bps")),
            f(v, "rtt_us"),
            crate::units::format_bytes(f(v, "bdp_bytes") as u64),
            crate::units::format_bytes(f(v, "buffer_limit_bytes") as u64),
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

/// Builds every section from the results (and Prometheus when asked).
pub fn sections(r: &Results, opts: &ReportOptions, notes: &mut Vec<String>) -> Result<String> {
    let mut body = String::new();
    let mut push = |s: Section, extra: &str| {
        if s.figures.is_empty() && extra.is_empty() {
            return;
        }
        let _ = writeln!(body, "<section><h2>{}</h2>", esc(&s.title));
        if !s.intro.is_empty() {
            let _ = writeln!(body, "<p>{}</p>", s.intro);
        }
        body.push_str(extra);
        for fig in s.figures {
            let _ = writeln!(
                body,
                "<figure id=\"{}\">{}<figcaption>{}</figcaption></figure>",
                fig.id, fig.svg, fig.caption
            );
        }
        body.push_str("</section>\n");
    };
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
    push(
        Section {
            title: "Prometheus".into(),
            intro: match (&opts.prometheus, &opts.from, &opts.to) {
                (Some(u), Some(a), Some(b)) => {
                    format!("{} from {} to {}.", esc(u), esc(a), esc(b))
                }
                _ => String::new(),
            },
            figures: fig_prometheus(opts, notes),
        },
        "",
    );
    Ok(body)
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:960px;color:#222}\
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}\
figure{margin:1.5em 0}figcaption{font-size:.9em;color:#444;margin-top:.3em}\
svg{max-width:100%;height:auto;border:1px solid #eee}\
table{border-collapse:collapse;font-size:.85em;margin:1em 0}\
td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left}th{background:#f4f4f4}\
.notes{color:#844}code{font-size:.95em}";

/// Renders the whole page.
pub fn render(opts: &ReportOptions) -> Result<String> {
    let results = Results::load(&opts.dir)?;
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
        crate::SOFTWARE_VERSION,
        super::sweep::utc_stamp(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        ),
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
            let _ = writeln!(html, "<li>{}</li>", esc(n));
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
