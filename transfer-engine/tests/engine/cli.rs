//! Command-line errors: exit code 2 with a message naming the problem;
//! unreachable peers: exit code 1 naming the cause.

use crate::support::*;

fn usage_error(args: &[&str], needle: &str) {
    let out = run(args);
    assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
    assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
}

#[test]
fn bad_flags_exit_2_naming_the_problem() {
    usage_error(
        &["send", "--to", "127.0.0.1:1", "--frobnicate"],
        "--frobnicate",
    );
    usage_error(&["send", "--to", "127.0.0.1:1", "--buffer", "2X"], "2X");
    usage_error(
        &["send", "--to", "127.0.0.1:1", "--streams", "0"],
        "--streams",
    );
    usage_error(
        &["send", "--to", "127.0.0.1:1", "--streams", "1025"],
        "1025",
    );
    usage_error(&["send", "--to", "127.0.0.1:1", "--rate", "fast"], "--rate");
    usage_error(
        &["send", "--to", "127.0.0.1:1", "--cc", "nosuchcc"],
        "tcp_available_congestion_control",
    );
    usage_error(&["send", "--streams", "4"], "--to");
    usage_error(&["serve", "--bogus"], "--bogus");
    usage_error(&["launch"], "unknown subcommand");
    usage_error(
        &["send", "--to", "127.0.0.1:1", "--time", "1", "/x"],
        "do not apply when PATHs are given",
    );
}

#[test]
fn unreachable_host_exits_1_refused() {
    // Bind and drop a listener to find a closed loopback port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = run(&[
        "send",
        "--to",
        &format!("127.0.0.1:{port}"),
        "--bytes",
        "1M",
    ]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("refused"), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
}

#[test]
fn help_exits_0() {
    for args in [&["--help"][..], &["send", "--help"], &["serve", "-h"]] {
        let out = run(args);
        assert_eq!(out.code, Some(0), "{args:?}");
        assert!(out.stdout.contains("longhaul send --to"), "{}", out.stdout);
    }
}

#[test]
fn congestion_control_the_server_may_not_use_is_refused_by_name() {
    // An unprivileged server may only use net.ipv4.tcp_allowed_congestion_control;
    // the client must hear which algorithm and which sysctl, not a broken stream.
    let list = |path: &str| -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let allowed = list("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
    let Some(alg) = list("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .into_iter()
        .find(|a| !allowed.contains(a))
    else {
        eprintln!("skipped: every available congestion control is allowed here");
        return;
    };
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to start the server as nobody");
        return;
    }
    let server = Server::start_under(
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
        &["--allow-unauthenticated"],
    );
    let out = run(&[
        "send",
        "--to",
        &server.addr(),
        "--streams",
        "2",
        "--time",
        "1",
        "--cc",
        &alg,
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("congestion control '{alg}' is not allowed"))
            && out
                .stderr
                .contains("net.ipv4.tcp_allowed_congestion_control"),
        "{}",
        out.stderr
    );
}
