//! The report's figures, from result files and Prometheus: throughput
//! over time, per stream, CPU and disk IO of transfers; heatmap and curves
//! of window x streams sweeps; latency, throughput and CPU per message of
//! message-length sweeps; a campaign phase's aggregate per direction, the
//! engine's beside the router's; Prometheus series of a time range. Each is drawn
//! with [`crate::charts`] and captioned for the page.

use crate::{Error, Result};
use longhaul_units::{format_bps, format_bytes, size_arg};
use serde_json::Value;

use crate::charts::{bar_chart, byte_rate_unit, heatmap, line_chart, rate_unit, Axis, Bar, Series};
use crate::prometheus::{self, PromSeries, Unit, MAX_SERIES, QUERIES, ROUTER_OUT};
use crate::results::{field, Run, SweepFile};

use super::page::{esc, run_label, short, Figure};

/// Runs drawn in the throughput-over-time figure and runs that get a
/// per-stream figure: beyond a dozen the figures stop being readable.
pub const MAX_RUNS_DRAWN: usize = 12;

/// The shortest line drawn as a step of its own, as a share of the run's
/// typical (median) line.
const SLIVER: f64 = 0.25;

/// One run's throughput over time as steps `(start, end, bits/s)` from its
/// `--interval` lines, ending at the run's measured duration: the last
/// line before it is stretched or cut to end there and carries the bytes
/// the lines did not count (the run ends between two ticks), and lines
/// after it (ticks while the ends exchange their totals) are left out, so
/// no tail toward zero is drawn; a line over a sliver of the interval
/// joins the one before. `None` without lines.
pub fn throughput_steps(run: &Run) -> Option<Vec<(f64, f64, f64)>> {
    if run.intervals.is_empty() {
        return None;
    }
    let seconds = field(&run.result, "seconds");
    let all = run
        .intervals
        .iter()
        .map(|i| (field(i, "start"), field(i, "end"), field(i, "bytes")));
    let mut steps: Vec<(f64, f64, f64)> = if seconds > 0.0 {
        all.filter(|s| s.0 < seconds).collect()
    } else {
        all.collect()
    };
    let counted: f64 = steps.iter().map(|s| s.2).sum();
    let rest = (field(&run.result, "bytes") - counted).max(0.0);
    if let Some(last) = steps.last_mut() {
        if seconds > 0.0 {
            last.1 = seconds;
        }
        last.2 += rest;
    }
    // Lines over a sliver of the interval join the line before them: an
    // engine before ticks.rs drew one of microseconds after a late tick on
    // a busy host (its bytes made a spike of millions of Tb/s), and a line
    // of a tenth of the interval after a late tick still has its
    // acknowledgements in bursts.
    let mut lengths: Vec<f64> = steps.iter().map(|s| s.1 - s.0).collect();
    lengths.sort_by(f64::total_cmp);
    let typical = lengths.get(lengths.len() / 2).copied().unwrap_or(0.0);
    let shortest = typical * SLIVER;
    let mut joined: Vec<(f64, f64, f64)> = Vec::with_capacity(steps.len());
    for s in steps {
        match joined.last_mut() {
            Some(prev) if s.1 - s.0 < shortest => {
                prev.1 = s.1;
                prev.2 += s.2;
            }
            _ => joined.push(s),
        }
    }
    let mut steps = joined;
    // A sliver of an interval at the end (the run ended just after a tick)
    // joins the one before: over a few ms, acknowledgements come in bursts.
    if let [.., prev, last] = steps.as_slice() {
        if last.1 - last.0 < 0.5 * (prev.1 - prev.0) {
            let merged = (prev.0, last.1, prev.2 + last.2);
            steps.truncate(steps.len() - 2);
            steps.push(merged);
        }
    }
    Some(
        steps
            .into_iter()
            .map(|(a, b, bytes)| (a, b, bytes * 8.0 / (b - a).max(1e-9)))
            .collect(),
    )
}

/// Whether a run's interval lines count delivered bytes (the receiver's
/// acknowledgements or reads) rather than bytes the sender wrote, as
/// versions before the `counts` field did.
fn counts_delivered(run: &Run) -> bool {
    run.intervals.iter().all(|i| i["counts"] == "delivered")
}

/// Why a run took longer than the `--time` it asked for, or `None` when
/// it did not (or asked for an amount of data).
pub fn duration_note(run: &Run) -> Option<String> {
    let asked = run.result["requested_seconds"].as_f64()?;
    let took = field(&run.result, "seconds");
    let extra = took - asked;
    if extra.abs() < 0.5 {
        return Some(format!("asked for {asked} s and took {took:.1} s"));
    }
    let after: f64 = throughput_steps(run)
        .unwrap_or_default()
        .iter()
        .map(|&(a, b, bps)| bps / 8.0 * (b - a.max(asked)).max(0.0))
        .sum();
    let mut note = format!(
        "asked for {asked} s and took {took:.1} s: the sender stops writing after {asked} s, \
         then waits until the receiver has read every byte"
    );
    if after > 0.0 {
        note.push_str(&format!(
            "; {} written before then was still in socket buffers and router queues, \
             and took the last {extra:.1} s to arrive",
            format_bytes(after as u64)
        ));
    }
    Some(note)
}

/// Throughput of each run over time.
pub fn fig_throughput_time(runs: &[Run]) -> Result<Option<Figure>> {
    if runs.is_empty() {
        return Ok(None);
    }
    let drawn = &runs[..runs.len().min(MAX_RUNS_DRAWN)];
    // Each interval is a step over [start, end]; a run without intervals
    // is one step at its average.
    let steps: Vec<Vec<(f64, f64, f64)>> = drawn
        .iter()
        .map(|r| {
            throughput_steps(r).unwrap_or_else(|| {
                let secs = field(&r.result, "seconds");
                vec![(0.0, secs, field(&r.result, "throughput_bps"))]
            })
        })
        .collect();
    let max = steps.iter().flatten().map(|s| s.2).fold(0.0, f64::max);
    let (div, unit) = rate_unit(max);
    let series: Vec<Series> = drawn
        .iter()
        .zip(&steps)
        .enumerate()
        .map(|(i, (r, st))| Series {
            name: format!(
                "{} {}{}",
                run_label(i),
                short(&r.name),
                if r.intervals.is_empty() {
                    " (average)"
                } else {
                    ""
                }
            ),
            points: st
                .iter()
                .flat_map(|&(a, b, v)| [(a, v / div), (b, v / div)])
                .collect(),
            dashed: false,
            color: i,
            markers: false,
        })
        .collect();
    let svg = line_chart(
        "Throughput over time",
        (Axis::Linear, "time since start (s)"),
        (Axis::Linear, &format!("delivered throughput ({unit})")),
        &series,
    )?;
    let mut caption = format!(
        "Delivered throughput per run in {unit}: per <code>--interval</code>, the bytes \
         the receiver acknowledged (TCP) or read, so the first seconds do not count socket \
         buffers filling; each line ends at the run's measured duration"
    );
    if drawn.iter().any(|r| r.intervals.is_empty()) {
        caption.push_str("; runs without --interval lines are drawn at their average");
    }
    let written: Vec<String> = drawn
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.intervals.is_empty() && !counts_delivered(r))
        .map(|(i, _)| run_label(i))
        .collect();
    if !written.is_empty() {
        caption.push_str(&format!(
            "; {} come from an older longhaul whose interval lines count bytes written \
             by the sender, which run ahead of the path while socket buffers fill",
            written.join(", ")
        ));
    }
    if runs.len() > MAX_RUNS_DRAWN {
        caption.push_str(&format!("; first {MAX_RUNS_DRAWN} of {} runs", runs.len()));
    }
    caption.push('.');
    for (i, r) in drawn.iter().enumerate() {
        if let Some(note) = duration_note(r) {
            caption.push_str(&format!(" {} {}.", run_label(i), note));
        }
    }
    Ok(Some(Figure {
        id: "fig-throughput-time".into(),
        svg,
        caption: caption + &steps_table(drawn, &steps),
    }))
}

/// The drawn steps as a collapsed table (`id="fig-throughput-time-data"`),
/// for readers who want the numbers and for tests.
fn steps_table(runs: &[Run], steps: &[Vec<(f64, f64, f64)>]) -> String {
    let mut t = String::from(
        "<details><summary>numbers</summary><table id=\"fig-throughput-time-data\">\
         <tr><th>run</th><th>from (s)</th><th>to (s)</th><th>bits/s</th></tr>",
    );
    for (i, (r, st)) in runs.iter().zip(steps).enumerate() {
        for &(a, b, v) in st {
            t.push_str(&format!(
                "<tr><td>{} {}</td><td>{a:.3}</td><td>{b:.3}</td><td>{v:.0}</td></tr>",
                run_label(i),
                esc(short(&r.name))
            ));
        }
    }
    t.push_str("</table></details>");
    t
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
    let shared: Vec<String> = runs
        .iter()
        .take(MAX_RUNS_DRAWN)
        .enumerate()
        .filter(|(_, r)| {
            let id = |k: &str| r.result["cpu"][k]["kernel_boot_id"].as_u64().unwrap_or(0);
            id("sender") != 0 && id("sender") == id("receiver")
        })
        .map(|(i, _)| run_label(i))
        .collect();
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
        caption: format!(
            "User, system and softirq time of each end's machine over the data phase \
             (/proc/stat), percent of all its CPUs. Run numbers as in the table above.{}",
            if shared.is_empty() {
                String::new()
            } else {
                format!(
                    " <strong>{}: both ends ran on one machine</strong> (the same kernel boot \
                     id: containers on one host, or loopback), so their bars are the same \
                     machine's CPU counted twice, not one end each.",
                    shared.join(", ")
                )
            }
        ),
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

/// A messages file's curve label: its load, and its file's name where
/// another file has the same load.
fn message_label(files: &[&SweepFile], m: &SweepFile) -> String {
    let load = m.value["load_streams"].as_u64().unwrap_or(0);
    let base = if load == 0 {
        "no load".to_string()
    } else {
        format!("load {load} streams")
    };
    let same = files
        .iter()
        .filter(|o| o.value["load_streams"].as_u64().unwrap_or(0) == load)
        .count();
    if same > 1 {
        format!("{base} ({})", short(&m.name))
    } else {
        base
    }
}

/// A messages file's (message length, `key` / `div`) points, of its cells
/// without an error and with a positive `key`.
fn message_points(m: &SweepFile, key: &str, div: f64) -> Vec<(f64, f64)> {
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
}

/// The unit of the latency axis and its divisor: WAN latencies read better
/// in ms, LAN ones in µs.
fn latency_unit(files: &[&SweepFile]) -> (f64, &'static str) {
    let max_lat = files
        .iter()
        .flat_map(|m| message_points(m, "latency_p99_us", 1.0))
        .map(|p| p.1)
        .fold(0.0, f64::max);
    if max_lat >= 10_000.0 {
        (1000.0, "ms")
    } else {
        (1.0, "µs")
    }
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
    let label = |m: &SweepFile| message_label(&usable, m);
    let points = message_points;
    let mut lat = Vec::new();
    let mut tput = Vec::new();
    let mut cpu = Vec::new();
    let max_tput = usable
        .iter()
        .flat_map(|m| points(m, "stream_throughput_bps", 1.0))
        .map(|p| p.1)
        .fold(0.0, f64::max);
    let (div, unit) = rate_unit(max_tput);
    let (lat_div, lat_unit) = latency_unit(&usable);
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

/// The Prometheus figures of a time range; failed queries become notes,
/// except a Prometheus that refuses to be asked (its certificate, the
/// password, nothing listening): the report stops with that error.
pub fn fig_prometheus(
    source: &prometheus::Source,
    from: &str,
    to: &str,
    step: f64,
    notes: &mut Vec<String>,
) -> Result<Vec<Figure>> {
    let mut figs = Vec::new();
    for (n, q) in QUERIES.iter().enumerate() {
        let series = match prometheus::query_range(source, q, from, to, step) {
            Ok(s) => s,
            Err(e @ Error::PrometheusRefused(_)) => return Err(e),
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
    Ok(figs)
}

/// One run's throughput over absolute time: its [`throughput_steps`] (or
/// the whole run at its average), scaled by `share`.
fn run_steps(run: &Run, share: f64) -> Vec<(f64, f64, f64)> {
    let t0 = field(&run.result, "started_unix");
    match throughput_steps(run) {
        Some(steps) => steps
            .into_iter()
            .map(|(a, b, bps)| (t0 + a, t0 + b, bps * share))
            .collect(),
        None => {
            let secs = field(&run.result, "seconds");
            vec![(t0, t0 + secs, field(&run.result, "throughput_bps") * share)]
        }
    }
}

/// The sum of overlapping steps as one step line, in seconds since `t0`.
fn summed_steps(steps: &[(f64, f64, f64)], t0: f64) -> Vec<(f64, f64)> {
    let mut edges: Vec<f64> = steps.iter().flat_map(|s| [s.0, s.1]).collect();
    edges.sort_by(f64::total_cmp);
    edges.dedup();
    let mut points = Vec::new();
    for w in edges.windows(2) {
        let mid = (w[0] + w[1]) / 2.0;
        let v: f64 = steps
            .iter()
            .filter(|s| s.0 <= mid && mid < s.1)
            .map(|s| s.2)
            .sum();
        points.push((w[0] - t0, v));
        points.push((w[1] - t0, v));
    }
    points
}

/// Figure 5 of FDT's memory-to-memory page for one campaign phase: the
/// aggregate throughput of each direction over time, the engine's (the sum
/// of its runs' interval lines, a bidir run split by what it moved each
/// way) as solid lines, and beside them, dashed, what the routers'
/// interfaces sent over the same time (`router`: series from
/// [`ROUTER_OUT`], time in Unix seconds).
pub fn fig_phase_aggregate(
    n: usize,
    phase: &SweepFile,
    runs: &[Run],
    router: &[PromSeries],
) -> Result<Option<Figure>> {
    let v = &phase.value;
    let name = v["phase"].as_str().unwrap_or(&phase.name);
    let t0 = field(v, "started_unix");
    let dir = phase.name.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
    let run_named = |run: &str| {
        let want = if dir.is_empty() {
            run.to_string()
        } else {
            format!("{dir}/{run}")
        };
        runs.iter().find(|r| r.name == want)
    };
    let mut series = Vec::new();
    let directions = v["directions"].as_object().cloned().unwrap_or_default();
    for (i, (key, d)) in directions.iter().enumerate() {
        let mut steps = Vec::new();
        for (run, moved) in d["run_bytes"].as_object().into_iter().flatten() {
            let Some(r) = run_named(run) else { continue };
            let total = field(&r.result, "bytes");
            let share = if total > 0.0 {
                moved.as_f64().unwrap_or(0.0) / total
            } else {
                0.0
            };
            steps.extend(run_steps(r, share));
        }
        if steps.is_empty() {
            continue;
        }
        series.push(Series {
            name: format!("{key} engine"),
            points: summed_steps(&steps, t0),
            dashed: false,
            color: i,
            markers: false,
        });
    }
    if series.is_empty() {
        return Ok(None);
    }
    let end = field(v, "ended_unix");
    for (j, s) in router.iter().take(MAX_SERIES).enumerate() {
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.0 >= t0 - 30.0 && p.0 <= end + 30.0)
            .map(|&(t, b)| (t - t0, b))
            .collect();
        if points.is_empty() {
            continue;
        }
        series.push(Series {
            name: format!("router {}", s.name),
            points,
            dashed: true,
            color: directions.len() + j,
            markers: true,
        });
    }
    let max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let (div, unit) = rate_unit(max);
    for s in &mut series {
        for p in &mut s.points {
            p.1 /= div;
        }
    }
    let svg = line_chart(
        &format!("Phase {name}: aggregate per direction"),
        (Axis::Linear, "seconds since the phase started"),
        (Axis::Linear, &format!("throughput ({unit})")),
        &series,
    )?;
    let mut caption = format!(
        "Phase <code>{}</code>: each direction's aggregate in {unit}, the sum of its runs' \
         interval lines (solid), started {:.3} s apart",
        esc(name),
        field(v, "start_spread_seconds")
    );
    if router.is_empty() {
        caption.push_str("; with --prometheus the routers' interfaces are drawn beside them");
    } else {
        caption.push_str(&format!(
            "; dashed: what the routers' interfaces sent (<code>{}</code>)",
            esc(ROUTER_OUT.promql)
        ));
    }
    Ok(Some(Figure {
        id: format!("fig-phase-{}", n + 1),
        svg,
        caption: caption + ".",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(result: Value, intervals: &[(f64, f64, u64)]) -> Run {
        Run {
            name: "r".into(),
            result,
            intervals: intervals
                .iter()
                .map(|&(s, e, b)| json!({"type": "interval", "counts": "delivered", "start": s, "end": e, "bytes": b}))
                .collect(),
            meta: None,
        }
    }

    #[test]
    fn steps_end_at_the_measured_duration_without_a_tail() {
        // Ticks every second; the run ends at 3.05 s; a tick at 4 s came
        // while the ends exchanged totals; 50 bytes arrived after the last
        // counted tick.
        let r = run(
            json!({"seconds": 3.05, "bytes": 350}),
            &[
                (0.0, 1.0, 100),
                (1.0, 2.0, 100),
                (2.0, 3.0, 100),
                (3.0, 4.0, 0),
            ],
        );
        let steps = throughput_steps(&r).unwrap();
        assert_eq!(steps.len(), 3, "{steps:?}");
        assert_eq!(steps[2].0, 2.0);
        assert_eq!(steps[2].1, 3.05);
        // The sliver [3.0, 3.05] joined [2.0, 3.0] with the 50 uncounted bytes.
        assert!((steps[2].2 - 150.0 * 8.0 / 1.05).abs() < 1e-6, "{steps:?}");
        let total: f64 = steps.iter().map(|s| s.2 / 8.0 * (s.1 - s.0)).sum();
        assert!((total - 350.0).abs() < 1e-6);
    }

    #[test]
    fn a_line_over_almost_no_time_joins_the_one_before() {
        // A CI run's lines after a late tick: 41.6-43.748, then a catch-up
        // tick at 43.748 with 26.8 kB in a few microseconds.
        let r = run(
            json!({"seconds": 45.0, "bytes": 3_000_000}),
            &[
                (41.6, 43.748, 2_000_000),
                (43.748, 43.748_001, 26_844),
                (43.748_001, 45.0, 973_156),
            ],
        );
        let steps = throughput_steps(&r).unwrap();
        assert_eq!(steps.len(), 2, "{steps:?}");
        assert_eq!((steps[0].0, steps[0].1), (41.6, 43.748_001));
        assert!(steps.iter().all(|s| s.2 < 10e6), "{steps:?}");
        let total: f64 = steps.iter().map(|s| s.2 / 8.0 * (s.1 - s.0)).sum();
        assert!((total - 3_000_000.0).abs() < 1e-3, "{total}");
        // And a tenth of a second after a late tick joins too.
        let r = run(
            json!({"seconds": 13.0, "bytes": 300}),
            &[
                (9.0, 10.9, 100),
                (10.9, 11.0, 100),
                (11.0, 12.0, 50),
                (12.0, 13.0, 50),
            ],
        );
        let steps = throughput_steps(&r).unwrap();
        assert_eq!(steps.len(), 3, "{steps:?}");
        assert_eq!((steps[0].0, steps[0].1), (9.0, 11.0));
        // Lines of 40 ms (--interval 40ms) are all steps of their own.
        let lines: Vec<(f64, f64, u64)> = (0..250)
            .map(|i| (i as f64 * 0.04, (i + 1) as f64 * 0.04, 1000))
            .collect();
        let r = run(json!({"seconds": 10.0, "bytes": 250_000}), &lines);
        assert_eq!(throughput_steps(&r).unwrap().len(), 250);
    }

    #[test]
    fn a_longer_run_explains_the_difference() {
        let r = run(
            json!({"seconds": 4.0, "bytes": 400, "requested_seconds": 2.0}),
            &[
                (0.0, 1.0, 100),
                (1.0, 2.0, 100),
                (2.0, 3.0, 100),
                (3.0, 4.0, 100),
            ],
        );
        let note = duration_note(&r).unwrap();
        assert!(note.starts_with("asked for 2 s and took 4.0 s"), "{note}");
        assert!(note.contains("200 B written before then"), "{note}");
        let on_time = run(
            json!({"seconds": 2.1, "bytes": 1, "requested_seconds": 2.0}),
            &[],
        );
        assert_eq!(
            duration_note(&on_time).unwrap(),
            "asked for 2 s and took 2.1 s"
        );
        assert!(duration_note(&run(json!({"seconds": 2.0}), &[])).is_none());
    }
}
