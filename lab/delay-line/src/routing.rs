//! Policy routing that steers the two sites' traffic through the delay line
//! on a router, and takes it out again.
//!
//! For site interfaces `ethA`, `ethB` and TUN devices `tunA`, `tunB`:
//!
//! ```text
//! ip route replace default dev tunA table TA
//! ip rule add iif ethA lookup TA priority P   # from site A -> into tunA
//! ip route replace default dev tunB table TB
//! ip rule add iif ethB lookup TB priority P   # from site B -> into tunB
//! ```
//!
//! The delay line reads site A's packets from `tunA` and writes them to
//! `tunB`; the kernel sees them arrive on `tunB`, no rule matches, and the
//! main table forwards them out of `ethB` (and the mirror image for B->A).
//! Packets addressed to the router itself never enter the delay line: the
//! `local` table rule (priority 0) matches them first.
//!
//! Sysctls: `net.ipv4.ip_forward=1`; `rp_filter=0` on both TUN devices
//! (packets from site A arriving on `tunB` fail a strict reverse-path
//! check), and `all.rp_filter` strict (1) is relaxed to loose (2) because
//! the kernel uses the maximum of `all` and the device. Changed sysctls are
//! restored on teardown. IPv4 only: IPv6 is routed normally, undelayed.

use crate::error::{Error, Result};
use crate::tun::interface_exists;
use std::process::Command;

/// How many stale copies of our rules (left by a killed run) to remove.
const MAX_STALE_RULES: usize = 16;

/// What to install: the site interfaces and the TUN devices they map to.
#[derive(Debug, Clone)]
pub struct Plan {
    pub site_a: String,
    pub site_b: String,
    pub tun_a: String,
    pub tun_b: String,
    pub table_a: u32,
    pub table_b: u32,
    pub priority: u32,
}

/// Installed routing; [`Installed::remove`] undoes it (also on drop).
pub struct Installed {
    undo: Vec<Undo>,
}

enum Undo {
    Ip(Vec<String>),
    Sysctl { path: String, value: String },
}

fn ip(args: &[String]) -> Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::Command {
            command: format!("ip {}", args.join(" ")),
            detail: e.to_string(),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            command: format!("ip {}", args.join(" ")),
            detail: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn sysctl_path(key: &str) -> String {
    format!("/proc/sys/{}", key.replace('.', "/"))
}

/// Reads a sysctl such as `net.ipv4.ip_forward`.
pub fn read_sysctl(key: &str) -> Result<String> {
    let path = sysctl_path(key);
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|source| Error::Sysctl { path, source })
}

fn write_sysctl(key: &str, value: &str) -> Result<()> {
    let path = sysctl_path(key);
    std::fs::write(&path, value).map_err(|source| Error::Sysctl { path, source })
}

/// Sysctl keys name devices with dots replaced by slashes; device names
/// with dots (VLANs such as eth0.100) keep them.
fn device_sysctl(device: &str, leaf: &str) -> String {
    format!("net.ipv4.conf.{}.{leaf}", device.replace('.', "/"))
}

impl Installed {
    /// Makes sure `key` holds one of `acceptable`; writes `target` (and
    /// remembers the old value for teardown) only when it does not. Writing
    /// nothing when the value is already fine matters in containers, whose
    /// /proc/sys is read-only (the lab starts its router with forwarding on
    /// and rp_filter off).
    fn ensure_sysctl(
        &mut self,
        key: &str,
        acceptable: &[&str],
        target: &str,
        undo: bool,
    ) -> Result<()> {
        let old = read_sysctl(key)?;
        if acceptable.contains(&old.as_str()) {
            return Ok(());
        }
        write_sysctl(key, target)?;
        if undo {
            self.undo.push(Undo::Sysctl {
                path: key.to_string(),
                value: old,
            });
        }
        Ok(())
    }

    /// Removes everything that was installed, newest first; returns the
    /// failures (teardown goes on past them).
    pub fn remove(&mut self) -> Vec<Error> {
        let mut errors = Vec::new();
        while let Some(step) = self.undo.pop() {
            let result = match step {
                Undo::Ip(args) => ip(&args),
                Undo::Sysctl { path, value } => write_sysctl(&path, &value),
            };
            if let Err(e) = result {
                errors.push(e);
            }
        }
        errors
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        for e in self.remove() {
            crate::log(format_args!("teardown: {e}"));
        }
    }
}

/// Installs the plan (the TUN devices must exist and be up). On error,
/// whatever was installed so far is removed again.
pub fn install(plan: &Plan) -> Result<Installed> {
    for site in [&plan.site_a, &plan.site_b] {
        if !interface_exists(site) {
            return Err(Error::Usage(format!(
                "site interface '{site}' does not exist"
            )));
        }
    }
    let mut installed = Installed { undo: Vec::new() };
    installed.ensure_sysctl("net.ipv4.ip_forward", &["1"], "1", true)?;
    // Strict reverse-path filtering (1) drops site A's packets arriving on
    // tun B; off (0) or loose (2) lets them in. The kernel applies the
    // maximum of `all` and the device.
    for tun in [&plan.tun_a, &plan.tun_b] {
        // The device vanishes on exit, so its own sysctl needs no undo.
        installed.ensure_sysctl(&device_sysctl(tun, "rp_filter"), &["0", "2"], "0", false)?;
    }
    installed.ensure_sysctl("net.ipv4.conf.all.rp_filter", &["0", "2"], "2", true)?;
    let legs = [
        (&plan.site_a, &plan.tun_a, plan.table_a),
        (&plan.site_b, &plan.tun_b, plan.table_b),
    ];
    for (site, tun, table) in legs {
        let table = table.to_string();
        let priority = plan.priority.to_string();
        let rule = |verb: &str| {
            strings(&[
                "rule", verb, "iif", site, "lookup", &table, "priority", &priority,
            ])
        };
        for _ in 0..MAX_STALE_RULES {
            if ip(&rule("del")).is_err() {
                break;
            }
        }
        ip(&strings(&[
            "route", "replace", "default", "dev", tun, "table", &table,
        ]))?;
        installed.undo.push(Undo::Ip(strings(&[
            "route", "del", "default", "dev", tun, "table", &table,
        ])));
        ip(&rule("add"))?;
        installed.undo.push(Undo::Ip(rule("del")));
    }
    Ok(installed)
}
