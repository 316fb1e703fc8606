//! Reading a results directory for `longhaul report`.
//!
//! Walks RESULTS_DIR recursively (sorted, so the report is stable) and sorts
//! every `*.json` file into what it holds:
//!
//! - a run: the output of `longhaul send --json` (one final object with
//!   `"type": "result"`, after it optionally `--interval` JSON lines with
//!   `"type": "interval"`). Campaign directories
//!   (`results/<campaign>/<timestamp>/<run>.json`) hold these, with
//!   `<run>.run.json` beside them (hosts, command, times), which is attached
//!   to its run;
//! - a window x streams sweep (`sweep.json`, `"kind": "sweep"`);
//! - a message-length sweep (`messages*.json`, `"kind": "messages"`);
//! - `longhaul sweep --json` output (`"type": "sweep"` with `matrix` and/or
//!   `messages`) and `longhaul advise --json` output (`"type": "advice"`);
//! - a campaign phase's summary (`<phase>.phase.json`, `"type": "phase"`,
//!   written by ansible/campaign.yml beside its runs).
//!
//! Anything else is listed as skipped, with the reason, in the report.
//!
//! Also the small readers every consumer of result files needs: a number at
//! a JSON path ([`num`], [`field`]) and the results' UTC time stamp
//! ([`utc_stamp`]).

use std::path::{Path, PathBuf};

use crate::{Error, Result};
use serde_json::Value;

/// Largest file read (a long `--interval 0.1` run is a few MB).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// One `longhaul send --json` run.
#[derive(Debug, Clone)]
pub struct Run {
    /// Path relative to RESULTS_DIR without `.json`.
    pub name: String,
    pub result: Value,
    pub intervals: Vec<Value>,
    /// The campaign's `<run>.run.json`, when present.
    pub meta: Option<Value>,
}

/// A sweep file (`kind` sweep or messages).
#[derive(Debug, Clone)]
pub struct SweepFile {
    pub name: String,
    pub value: Value,
}

#[derive(Debug, Clone, Default)]
pub struct Results {
    pub runs: Vec<Run>,
    pub sweeps: Vec<SweepFile>,
    pub messages: Vec<SweepFile>,
    pub advice: Vec<SweepFile>,
    /// Campaign phase summaries.
    pub phases: Vec<SweepFile>,
    pub skipped: Vec<(String, String)>,
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let ft = e.file_type()?;
        if ft.is_dir() {
            walk(&path, out)?;
        } else if ft.is_file() && path.extension().is_some_and(|x| x == "json") {
            out.push(path);
        }
    }
    Ok(())
}

/// Parses a file as one JSON value or, failing that, as JSON lines.
fn parse_values(text: &str) -> Option<Vec<Value>> {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Some(vec![v]);
    }
    let v: Option<Vec<Value>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).ok())
        .collect();
    v.filter(|v| !v.is_empty())
}

/// The number at `path` under `v`; 0 when absent or not a number.
pub fn num(v: Option<&Value>, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = cur.and_then(|c| c.get(p));
    }
    cur.and_then(Value::as_f64).unwrap_or(0.0)
}

/// The number of `v`'s field `key`; 0 when absent or not a number.
pub fn field(v: &Value, key: &str) -> f64 {
    num(Some(v), &[key])
}

/// `YYYYmmddTHHMMSSZ`, the campaign results' time stamp (directory names,
/// `started` fields).
pub fn utc_stamp(t: jiff::Timestamp) -> String {
    t.strftime("%Y%m%dT%H%M%SZ").to_string()
}

fn kind(v: &Value) -> &str {
    v.get("kind")
        .or_else(|| v.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

impl Results {
    /// Loads every result under `dir`.
    pub fn load(dir: &Path) -> Result<Results> {
        let mut files = Vec::new();
        walk(dir, &mut files).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        let mut r = Results::default();
        let mut metas = Vec::new();
        for path in files {
            let rel = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            let name = rel.strip_suffix(".json").unwrap_or(&rel).to_string();
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            if size > MAX_FILE_BYTES {
                r.skipped
                    .push((rel, format!("larger than {MAX_FILE_BYTES} bytes")));
                continue;
            }
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    r.skipped.push((rel, e.to_string()));
                    continue;
                }
            };
            let Some(values) = parse_values(&text) else {
                r.skipped.push((rel, "not JSON or JSON lines".into()));
                continue;
            };
            if let Some(stem) = name.strip_suffix(".run") {
                metas.push((stem.to_string(), values[0].clone()));
                continue;
            }
            r.add(name, rel, values);
        }
        for (stem, meta) in metas {
            if let Some(run) = r.runs.iter_mut().find(|run| run.name == stem) {
                run.meta = Some(meta);
            }
        }
        Ok(r)
    }

    fn add(&mut self, name: String, rel: String, values: Vec<Value>) {
        let last = values.last().cloned().unwrap_or(Value::Null);
        match kind(&last) {
            "result" => {
                let intervals = values
                    .iter()
                    .filter(|v| kind(v) == "interval")
                    .cloned()
                    .collect();
                self.runs.push(Run {
                    name,
                    result: last,
                    intervals,
                    meta: None,
                });
            }
            "sweep" if last.get("cells").is_some() => {
                self.sweeps.push(SweepFile { name, value: last })
            }
            "messages" => self.messages.push(SweepFile { name, value: last }),
            "sweep" => {
                // `longhaul sweep --json` output wraps both kinds.
                if let Some(m) = last.get("matrix") {
                    self.sweeps.push(SweepFile {
                        name: format!("{name} (matrix)"),
                        value: m.clone(),
                    });
                }
                if let Some(m) = last.get("messages") {
                    self.messages.push(SweepFile {
                        name: format!("{name} (messages)"),
                        value: m.clone(),
                    });
                }
            }
            "advice" => self.advice.push(SweepFile { name, value: last }),
            "phase" => self.phases.push(SweepFile { name, value: last }),
            _ => self
                .skipped
                .push((rel, "not a longhaul result, sweep or advice".into())),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
            && self.sweeps.is_empty()
            && self.messages.is_empty()
            && self.advice.is_empty()
            && self.phases.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        let at = |s: i64| utc_stamp(jiff::Timestamp::from_second(s).unwrap());
        assert_eq!(at(0), "19700101T000000Z");
        assert_eq!(at(951_782_400), "20000229T000000Z");
        assert_eq!(at(1_795_251_430), "20261121T085710Z");
    }

    #[test]
    fn numbers_at_paths() {
        let v = serde_json::json!({"a": {"b": 2.5}, "c": "x"});
        assert_eq!(num(Some(&v), &["a", "b"]), 2.5);
        assert_eq!(num(Some(&v), &["a", "z"]), 0.0);
        assert_eq!(field(&v, "c"), 0.0);
        assert_eq!(num(None, &["a"]), 0.0);
    }

    #[test]
    fn sorts_files_by_what_they_hold() {
        let dir = std::env::temp_dir().join(format!("longhaul-results-{}", std::process::id()));
        let camp = dir.join("mem-35x2M/20261121T080000Z");
        std::fs::create_dir_all(&camp).unwrap();
        let result = r#"{"type":"result","mode":"memory","bytes":10,"seconds":1.0,"throughput_bps":80.0,"streams":[]}"#;
        let interval = r#"{"type":"interval","start":0.0,"end":1.0,"bytes":10,"throughput_bps":80.0,"streams":[]}"#;
        std::fs::write(camp.join("a-to-b.json"), format!("{interval}\n{result}\n")).unwrap();
        std::fs::write(camp.join("a-to-b.run.json"), r#"{"campaign":"mem-35x2M"}"#).unwrap();
        std::fs::write(dir.join("sweep.json"), r#"{"kind":"sweep","cells":[]}"#).unwrap();
        std::fs::write(
            dir.join("messages.json"),
            r#"{"kind":"messages","cells":[]}"#,
        )
        .unwrap();
        std::fs::write(dir.join("other.json"), r#"{"x":1}"#).unwrap();
        let r = Results::load(&dir).unwrap();
        assert_eq!(r.runs.len(), 1);
        assert_eq!(r.runs[0].name, "mem-35x2M/20261121T080000Z/a-to-b");
        assert_eq!(r.runs[0].intervals.len(), 1);
        assert!(r.runs[0].meta.is_some());
        assert_eq!((r.sweeps.len(), r.messages.len()), (1, 1));
        assert_eq!(r.skipped.len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
