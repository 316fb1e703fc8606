//! Optional controller model names from storcli/perccli JSON
//! (`--collector.raid.storcli-command`, e.g. `storcli64 /call show J`).
//!
//! Vendor tools can take seconds or hang on a busy controller, so the command
//! never runs inside a scrape: a scrape reads the last result and, when it is
//! older than the refresh interval, starts one background run (killed after
//! the timeout). The command line is split on whitespace, no shell.

use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

/// How often a running command is polled for exit.
const POLL: Duration = Duration::from_millis(20);

#[derive(Default)]
struct State {
    /// PCI address -> model name, from the last successful run.
    models: HashMap<String, String>,
    last_start: Option<Instant>,
    running: bool,
    last_error: Option<String>,
}

pub struct Storcli {
    argv: Vec<String>,
    timeout: Duration,
    interval: Duration,
    state: Arc<Mutex<State>>,
}

impl Storcli {
    pub fn new(command: &str, timeout: Duration, interval: Duration) -> Storcli {
        Storcli {
            argv: command.split_whitespace().map(str::to_string).collect(),
            timeout,
            interval,
            state: Arc::default(),
        }
    }

    /// The models known now; starts a background refresh when due.
    pub fn models(&self) -> HashMap<String, String> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let due = match st.last_start {
            None => true,
            Some(t) => t.elapsed() >= self.interval,
        };
        if due && !st.running {
            st.running = true;
            st.last_start = Some(Instant::now());
            let state = Arc::clone(&self.state);
            let argv = self.argv.clone();
            let timeout = self.timeout;
            std::thread::spawn(move || {
                let result = run(&argv, timeout).and_then(|out| parse_models(&out));
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                st.running = false;
                match result {
                    Ok(models) => {
                        if st.last_error.take().is_some() {
                            crate::log("storcli enrichment recovered");
                        }
                        st.models = models;
                    }
                    Err(e) => {
                        let msg = format!("{e:#}");
                        if st.last_error.as_deref() != Some(&msg) {
                            crate::log(&format!("storcli enrichment failed: {msg}"));
                        }
                        st.last_error = Some(msg);
                    }
                }
            });
        }
        st.models.clone()
    }
}

/// Runs argv with a timeout and returns its stdout.
fn run(argv: &[String], timeout: Duration) -> anyhow::Result<Vec<u8>> {
    let (prog, args) = argv.split_first().context("empty storcli command")?;
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {prog}"))?;
    let mut stdout = child.stdout.take().context("no stdout pipe")?;
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for storcli")? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{prog} did not finish within {timeout:?}; killed");
        }
        std::thread::sleep(POLL);
    };
    let out = reader.join().unwrap_or_default();
    if !status.success() {
        bail!("{prog} exited with {status}");
    }
    Ok(out)
}

/// Finds every object carrying a PCI address and a model/product name.
pub fn parse_models(json: &[u8]) -> anyhow::Result<HashMap<String, String>> {
    let v: Value = serde_json::from_slice(json).context("storcli output is not JSON")?;
    let mut models = HashMap::new();
    walk(&v, &mut models);
    Ok(models)
}

fn walk(v: &Value, out: &mut HashMap<String, String>) {
    match v {
        Value::Object(map) => {
            let pci = map
                .get("PCI Address")
                .and_then(Value::as_str)
                .and_then(normalize_pci);
            let model = ["Product Name", "Model"]
                .iter()
                .find_map(|k| map.get(*k).and_then(Value::as_str))
                .map(str::trim)
                .filter(|m| !m.is_empty());
            if let (Some(pci), Some(model)) = (pci, model) {
                out.insert(pci, model.to_string());
            }
            for child in map.values() {
                walk(child, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
        _ => {}
    }
}

/// storcli prints "00:03:00:00" (domain:bus:device:function, hex) or
/// "0000:03:00.0"; both become "0000:03:00.0".
pub fn normalize_pci(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase();
    if longhaul_topology::is_pci_address(&s) {
        return Some(s);
    }
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 4 {
        return None;
    }
    let n: Vec<u32> = parts
        .iter()
        .map(|p| u32::from_str_radix(p, 16).ok())
        .collect::<Option<_>>()?;
    Some(format!("{:04x}:{:02x}:{:02x}.{:x}", n[0], n[1], n[2], n[3]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_storcli_call_show() {
        let json = br#"{"Controllers":[
            {"Command Status":{"Controller":0,"Status":"Success"},
             "Response Data":{"Product Name":"PERC H730P Mini","PCI Address":"00:03:00:00"}},
            {"Command Status":{"Controller":1,"Status":"Success"},
             "Response Data":{"Basics":{"Model":"MR9361-8i","PCI Address":"00:81:00:00"}}}]}"#;
        let m = parse_models(json).unwrap();
        assert_eq!(m["0000:03:00.0"], "PERC H730P Mini");
        assert_eq!(m["0000:81:00.0"], "MR9361-8i");
        assert!(parse_models(b"not json").is_err());
        assert_eq!(normalize_pci("bogus"), None);
    }

    #[test]
    fn a_hanging_command_is_killed_and_never_blocks() {
        let s = Storcli::new(
            "sleep 30",
            Duration::from_millis(200),
            Duration::from_secs(3600),
        );
        let start = Instant::now();
        assert!(s.models().is_empty());
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "models() blocked"
        );
        assert!(run(&["sleep".into(), "30".into()], Duration::from_millis(100)).is_err());
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn runs_a_real_command() {
        let out = run(
            &[
                "echo".into(),
                r#"{"PCI Address":"0000:03:00.0","Model":"X"}"#.into(),
            ],
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(parse_models(&out).unwrap()["0000:03:00.0"], "X");
    }
}
