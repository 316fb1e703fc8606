//! CPU accounting of the data phase: machine-wide user/system/softirq from
//! /proc/stat deltas and the process's own CPU time from getrusage, and
//! which kernel counted them (its boot id), so a report can tell when both
//! ends read one machine's /proc/stat.

use crate::messages::CpuReport;

/// One reading of the counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSnapshot {
    /// user, nice, system, idle, iowait, irq, softirq, steal (jiffies).
    stat: [u64; 8],
    cpus: u32,
    process_user: f64,
    process_system: f64,
}

fn read_proc_stat() -> ([u64; 8], u32) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let mut total = [0u64; 8];
    let mut cpus = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("cpu ") {
            for (slot, v) in total.iter_mut().zip(rest.split_whitespace()) {
                *slot = v.parse().unwrap_or(0);
            }
        } else if line.starts_with("cpu") {
            cpus += 1;
        }
    }
    (total, cpus)
}

/// The first 48 bits of the kernel's boot id (`/proc/sys/kernel/random/boot_id`,
/// a UUID drawn at boot): the same for every process and container on one
/// kernel. 0 when it cannot be read.
pub(crate) fn kernel_boot_id() -> u64 {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: String = text
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(12)
        .collect();
    u64::from_str_radix(&hex, 16).unwrap_or(0)
}

fn rusage_self() -> (f64, f64) {
    // SAFETY: zeroed rusage is valid; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid out-pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

fn round_ms(seconds: f64) -> f64 {
    (seconds.max(0.0) * 1000.0).round() / 1000.0
}

impl CpuSnapshot {
    pub fn now() -> CpuSnapshot {
        let (stat, cpus) = read_proc_stat();
        let (process_user, process_system) = rusage_self();
        CpuSnapshot {
            stat,
            cpus,
            process_user,
            process_system,
        }
    }

    /// CPU use between `self` (start) and `end`.
    pub fn report_until(&self, end: &CpuSnapshot) -> CpuReport {
        let d: Vec<f64> = (0..8)
            .map(|i| end.stat[i].saturating_sub(self.stat[i]) as f64)
            .collect();
        let total: f64 = d.iter().sum();
        let pct = |v: f64| {
            if total > 0.0 {
                (v / total * 10000.0).round() / 100.0
            } else {
                0.0
            }
        };
        CpuReport {
            user_pct: pct(d[0] + d[1]),
            system_pct: pct(d[2]),
            softirq_pct: pct(d[6]),
            iowait_pct: pct(d[4]),
            process_user_seconds: round_ms(end.process_user - self.process_user),
            process_system_seconds: round_ms(end.process_system - self.process_system),
            cpus: end.cpus,
            kernel_boot_id: kernel_boot_id(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_id_is_read_and_stable() {
        let id = kernel_boot_id();
        assert_ne!(id, 0, "/proc/sys/kernel/random/boot_id unreadable");
        assert_eq!(id, kernel_boot_id());
        assert!(id < 1 << 48);
    }

    #[test]
    fn busy_loop_shows_up_as_process_cpu() {
        let start = CpuSnapshot::now();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 50 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let r = start.report_until(&CpuSnapshot::now());
        assert!(r.cpus >= 1 && x > 0);
        assert!(r.process_user_seconds + r.process_system_seconds > 0.0);
    }
}
