//! Which CPUs the data workers run on: `--cpus LIST` parsing, the online
//! CPUs and NUMA nodes from sysfs, and the placement of each worker.
//!
//! Placement rules ([`place`]):
//!
//! - `--cpus LIST`: worker `i` is pinned to the `i`-th CPU of the list
//!   (round-robin when there are more workers than CPUs); the default
//!   worker count is then the list's length.
//! - no `--cpus`, more than one NUMA node: worker `i` is confined to the
//!   CPUs of node `i % nodes`, so the workers spread evenly over the nodes
//!   and the memory a worker touches first (its buffers, its sockets' skbs
//!   on the send path) stays on its node. The scheduler still balances
//!   inside a node.
//! - otherwise: no affinity at all; the scheduler places the workers.

use std::path::Path;

use crate::error::{Error, Result};

/// Most CPUs a list may name (and the largest CPU number + 1 we accept):
/// the size of the kernel's default `cpu_set_t`.
pub(crate) const MAX_CPUS: usize = libc::CPU_SETSIZE as usize;

/// Parses a CPU list as the kernel writes them: `0-3,8,10-11`.
pub fn parse_list(text: &str) -> std::result::Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!("empty element in CPU list '{text}'"));
        }
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (number(a, text)?, number(b, text)?),
            None => {
                let n = number(part, text)?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(format!("range {part} runs backwards in CPU list '{text}'"));
        }
        if hi >= MAX_CPUS {
            return Err(format!(
                "CPU {hi} is beyond the largest supported ({})",
                MAX_CPUS - 1
            ));
        }
        for cpu in lo..=hi {
            if !cpus.contains(&cpu) {
                cpus.push(cpu);
            }
        }
    }
    Ok(cpus)
}

fn number(s: &str, text: &str) -> std::result::Result<usize, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a CPU number in CPU list '{text}'"))
}

/// The CPUs and NUMA nodes of this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Topology {
    pub(crate) online: Vec<usize>,
    /// Each node's online CPUs; empty when sysfs shows no nodes.
    pub(crate) nodes: Vec<Vec<usize>>,
}

impl Topology {
    /// Reads `<sysfs>/devices/system/cpu/online` and
    /// `<sysfs>/devices/system/node/node*/cpulist`. Without sysfs, the CPUs
    /// this process may run on.
    pub(crate) fn read(sysfs: &Path) -> Topology {
        let online = std::fs::read_to_string(sysfs.join("devices/system/cpu/online"))
            .ok()
            .and_then(|t| parse_list(&t).ok())
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| (0..available_parallelism()).collect());
        let mut nodes: Vec<(usize, Vec<usize>)> = Vec::new();
        if let Ok(dir) = std::fs::read_dir(sysfs.join("devices/system/node")) {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(id) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("node"))
                    .and_then(|n| n.parse::<usize>().ok())
                else {
                    continue;
                };
                let cpus = std::fs::read_to_string(entry.path().join("cpulist"))
                    .ok()
                    .and_then(|t| parse_list(&t).ok())
                    .unwrap_or_default();
                let cpus: Vec<usize> = cpus.into_iter().filter(|c| online.contains(c)).collect();
                if !cpus.is_empty() {
                    nodes.push((id, cpus));
                }
            }
        }
        nodes.sort();
        Topology {
            online,
            nodes: nodes.into_iter().map(|(_, c)| c).collect(),
        }
    }

    /// This machine, from `/sys`.
    pub(crate) fn here() -> Topology {
        Topology::read(Path::new("/sys"))
    }
}

fn available_parallelism() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Where one worker may run: `None` = anywhere.
pub(crate) type Affinity = Option<Vec<usize>>;

/// The workers and where each runs, from `--threads` and `--cpus`.
pub(crate) fn place(
    threads: Option<usize>,
    cpus: Option<&[usize]>,
    topo: &Topology,
) -> Result<Vec<Affinity>> {
    if let Some(list) = cpus {
        if list.is_empty() {
            return Err(Error::Usage("--cpus: the list names no CPU".into()));
        }
        if let Some(c) = list.iter().find(|c| !topo.online.contains(c)) {
            return Err(Error::Usage(format!(
                "--cpus: CPU {c} is not online here (online: {})",
                format_list(&topo.online)
            )));
        }
    }
    let count = match (threads, cpus) {
        (Some(0), _) => return Err(Error::Usage("--threads must be at least 1".into())),
        (Some(n), _) => n,
        (None, Some(list)) => list.len(),
        (None, None) => topo.online.len().max(1),
    };
    Ok((0..count)
        .map(|i| match cpus {
            Some(list) => Some(vec![list[i % list.len()]]),
            None if topo.nodes.len() > 1 => Some(topo.nodes[i % topo.nodes.len()].clone()),
            None => None,
        })
        .collect())
}

/// A CPU list in the kernel's notation (`0-3,8`).
pub(crate) fn format_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// Confines the calling thread to `cpus`.
pub(crate) fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: c < MAX_CPUS (checked by parse_list / read from sysfs).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: set is a valid cpu_set_t of the size we pass; 0 = this thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The CPUs the calling thread may run on.
#[cfg(test)]
pub(crate) fn current_affinity() -> Vec<usize> {
    // SAFETY: as above; sched_getaffinity fills the set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer of the size we pass.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    // SAFETY: reading bits of an initialised set.
    (0..MAX_CPUS)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_like_the_kernels() {
        assert_eq!(
            parse_list("0-3,8,10-11").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_list("1\n").unwrap(), vec![1]);
        assert_eq!(parse_list("2,2,1-2").unwrap(), vec![2, 1]);
        for (bad, needle) in [
            ("", "empty"),
            ("1,,2", "empty"),
            ("a", "'a'"),
            ("3-1", "backwards"),
            ("0-99999", "beyond"),
        ] {
            let e = parse_list(bad).unwrap_err();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
        assert_eq!(format_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    }

    fn topo(online: &[usize], nodes: &[&[usize]]) -> Topology {
        Topology {
            online: online.to_vec(),
            nodes: nodes.iter().map(|n| n.to_vec()).collect(),
        }
    }

    #[test]
    fn workers_follow_threads_and_cpus() {
        let one_node = topo(&[0, 1], &[&[0, 1]]);
        assert_eq!(place(None, None, &one_node).unwrap(), vec![None, None]);
        assert_eq!(place(Some(5), None, &one_node).unwrap().len(), 5);
        assert_eq!(
            place(None, Some(&[1]), &one_node).unwrap(),
            vec![Some(vec![1])]
        );
        assert_eq!(
            place(Some(3), Some(&[0, 1]), &one_node).unwrap(),
            vec![Some(vec![0]), Some(vec![1]), Some(vec![0])]
        );
        let e = place(None, Some(&[7]), &one_node).unwrap_err();
        assert!(e.to_string().contains("CPU 7 is not online"), "{e}");
        assert!(place(Some(0), None, &one_node).is_err());
    }

    #[test]
    fn workers_spread_over_numa_nodes() {
        let two = topo(&[0, 1, 2, 3], &[&[0, 1], &[2, 3]]);
        assert_eq!(
            place(None, None, &two).unwrap(),
            vec![
                Some(vec![0, 1]),
                Some(vec![2, 3]),
                Some(vec![0, 1]),
                Some(vec![2, 3])
            ]
        );
    }

    #[test]
    fn topology_reads_sysfs() {
        let dir = std::env::temp_dir().join(format!("longhaul-cpus-{}", std::process::id()));
        let cpu = dir.join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), "0-3\n").unwrap();
        for (n, list) in [(0, "0-1"), (1, "2-3")] {
            let node = dir.join(format!("devices/system/node/node{n}"));
            std::fs::create_dir_all(&node).unwrap();
            std::fs::write(node.join("cpulist"), format!("{list}\n")).unwrap();
        }
        let t = Topology::read(&dir);
        assert_eq!(t.online, vec![0, 1, 2, 3]);
        assert_eq!(t.nodes, vec![vec![0, 1], vec![2, 3]]);
        std::fs::remove_dir_all(&dir).unwrap();
        let here = Topology::here();
        assert!(!here.online.is_empty());
    }

    #[test]
    fn pinning_confines_the_thread() {
        let first = Topology::here().online[0];
        std::thread::spawn(move || {
            pin_current_thread(&[first]).unwrap();
            assert_eq!(current_affinity(), vec![first]);
        })
        .join()
        .unwrap();
    }
}
