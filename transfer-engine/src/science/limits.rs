//! A host's socket buffer limits, read from /proc/sys.
//!
//! `net.core.wmem_max` / `rmem_max` cap what SO_SNDBUF / SO_RCVBUF (the
//! engine's `--buffer`) can get; `net.ipv4.tcp_wmem` / `tcp_rmem` bound
//! TCP's autotuning, which tools that set no buffer (iperf3 without `-w`)
//! live with.

use std::path::Path;

use crate::messages::SocketLimits;

/// The four sysctls, by their `sysctl` names.
pub const RMEM_MAX: &str = "net.core.rmem_max";
pub const WMEM_MAX: &str = "net.core.wmem_max";
pub const TCP_RMEM: &str = "net.ipv4.tcp_rmem";
pub const TCP_WMEM: &str = "net.ipv4.tcp_wmem";

fn read_values(root: &Path, name: &str) -> Option<Vec<u64>> {
    let path = root.join(name.replace('.', "/"));
    let text = std::fs::read_to_string(path).ok()?;
    let v: Option<Vec<u64>> = text.split_whitespace().map(|w| w.parse().ok()).collect();
    v.filter(|v| !v.is_empty())
}

fn triple(v: Option<Vec<u64>>) -> Option<[u64; 3]> {
    v.and_then(|v| v.try_into().ok())
}

/// Reads the limits under `root` (normally `/proc/sys`).
pub fn read_from(root: &Path) -> SocketLimits {
    SocketLimits {
        rmem_max: read_values(root, RMEM_MAX).map(|v| v[0]),
        wmem_max: read_values(root, WMEM_MAX).map(|v| v[0]),
        tcp_rmem: triple(read_values(root, TCP_RMEM)),
        tcp_wmem: triple(read_values(root, TCP_WMEM)),
    }
}

/// This host's limits.
pub fn local() -> SocketLimits {
    read_from(Path::new("/proc/sys"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_fake_proc_sys() {
        let dir = std::env::temp_dir().join(format!("longhaul-limits-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("net/core")).unwrap();
        std::fs::create_dir_all(dir.join("net/ipv4")).unwrap();
        std::fs::write(dir.join("net/core/rmem_max"), "4194304\n").unwrap();
        std::fs::write(dir.join("net/ipv4/tcp_wmem"), "4096\t16384\t4194304\n").unwrap();
        let l = read_from(&dir);
        assert_eq!(l.rmem_max, Some(4 << 20));
        assert_eq!(l.wmem_max, None);
        assert_eq!(l.tcp_wmem, Some([4096, 16384, 4 << 20]));
        assert_eq!(l.tcp_rmem, None);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
