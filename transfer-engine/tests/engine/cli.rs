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
