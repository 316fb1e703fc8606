//! The report's figures, from result files and Prometheus: throughput
//! over time, per stream, CPU and disk IO of transfers; heatmap and curves
//! of window x streams sweeps; latency, throughput and CPU per message of
//! message-length sweeps; Prometheus series of a time range. Each is drawn
//! with [`crate::charts`] and captioned for the page.

use longhaul_engine::Result;
use longhaul_units::{format_bps, size_arg};
use serde_json::Value;

use crate::charts::{bar_chart, byte_rate_unit, heatmap, line_chart, rate_unit, Axis, Bar, Series};
use crate::prometheus::{self, Unit, MAX_SERIES, QUERIES};
use crate::results::{field, Run, SweepFile};

use super::page::{esc, run_label, short, Figure};

/// Runs drawn in the throughput-over-time figure and runs that get a
/// per-stream figure: beyond a dozen the figures stop being readable.
pub const MAX_RUNS_DRAWN: usize = 12;

/// Throughput of each run over time.
pub fn fig_throughput_time(runs: &[Run]) -> Result<Option<Figure>> {
    if runs.is_empty() {
        return Ok(None);
    }
    let max = runs
        .iter()
        .flat_map(|r| {
            r.intervals
                .iter()
                .map(|i| field(i, "throughput_bps"))
                .chain(std::iter::once(field(&r.result, "throughput_bps")))
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
                let avg = field(&r.result, "throughput_bps") / div;
                (
                    vec![(0.0, avg), (field(&r.result, "seconds"), avg)],
                    " (average)",
                )
            } else {
                let pts = r
                    .intervals
                    .iter()
                    .flat_map(|iv| {
                        let v = field(iv, "throughput_bps") / div;
                        [(field(iv, "start"), v), (field(iv, "end"), v)]
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

pub fn fig_per_stream(i: usize, run: &Run) -> Result<Option<Figure>> {
    let streams = run.result["streams"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let secs = field(&run.result, "seconds").max(1e-9);
    if streams.is_empty() {
        return Ok(None);
    }
    let max = streams
        .iter()
        .map(|s| field(s, "bytes") * 8.0 / secs)
        .fold(0.0, f64::max);
    let (div, unit) = rate_unit(max);
    let bars: Vec<Bar> = streams
        .iter()
        .map(|s| {
            let v = field(s, "bytes") * 8.0 / secs / div;
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

pub fn fig_cpu(runs: &[Run]) -> Result<Option<Figure>> {
    if runs.is_empty() {
        return Ok(None);
    }
    let mut bars = Vec::new();
    for (i, r) in runs.iter().enumerate().take(MAX_RUNS_DRAWN) {
        for (side, key) in [("snd", "sender"), ("rcv", "receiver")] {
            let c = &r.result["cpu"][key];
            bars.push(Bar {
                label: format!("{} {side}", run_label(i)),
                parts: vec![
                    field(c, "user_pct"),
                    field(c, "system_pct"),
                    field(c, "softirq_pct"),
                ],
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
pub fn fig_disk(runs: &[Run]) -> Result<Vec<Figure>> {
    let mut per_device = Vec::new();
    let mut per_ctrl: Vec<(String, f64, f64)> = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let Some(devs) = r.result["devices"].as_array() else {
            continue;
        };
        let secs = field(&r.result, "seconds").max(1e-9);
        for d in devs {
            let read = field(d, "read_bytes") / secs;
            let written = field(d, "written_bytes") / secs;
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
pub fn fig_sweep(n: usize, sweep: &SweepFile) -> Result<Vec<Figure>> {
    let cells = sweep.value["cells"].as_array().cloned().unwrap_or_default();
    let ok: Vec<&Value> = cells.iter().filter(|c| c["error"].is_null()).collect();
    if ok.is_empty() {
        return Ok(Vec::new());
    }
    let buffers = sorted_unique(ok.iter().filter_map(|c| c["buffer_bytes"].as_u64()));
    let streams = sorted_unique(ok.iter().filter_map(|c| c["streams"].as_u64()));
    let max = ok
        .iter()
        .map(|c| field(c, "throughput_bps"))
        .fold(0.0, f64::max);
    let (div, unit) = rate_unit(max);
    let find = |s: u64, b: u64| {
        ok.iter()
            .find(|c| c["streams"].as_u64() == Some(s) && c["buffer_bytes"].as_u64() == Some(b))
            .map(|c| field(c, "throughput_bps") / div)
    };
    let values: Vec<Vec<Option<f64>>> = streams
        .iter()
        .map(|&s| buffers.iter().map(|&b| find(s, b)).collect())
        .collect();
    let blabels: Vec<String> = buffers.iter().map(|&b| size_arg(b)).collect();
    let slabels: Vec<String> = streams.iter().map(|s| s.to_string()).collect();
    let load = sweep.value["load_streams"].as_u64().unwrap_or(0);
    let time = field(&sweep.value, "time_s");
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
            format_bps(field(best, "throughput_bps"))
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
pub fn fig_messages(files: &[SweepFile]) -> Result<Vec<Figure>> {
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
                    .filter(|c| c["error"].is_null() && field(c, key) > 0.0)
                    .map(|c| (field(c, "length"), field(c, key) / div))
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

/// The Prometheus figures of a time range; failed queries become notes.
pub fn fig_prometheus(
    url: &str,
    from: &str,
    to: &str,
    step: f64,
    notes: &mut Vec<String>,
) -> Vec<Figure> {
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
