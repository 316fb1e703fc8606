//! The command line: help per subcommand, suggestions for typos, exit code
//! 2 with a message naming the problem; unreachable peers: exit code 1
//! naming the cause.

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
    usage_error(&["launch"], "unrecognized subcommand 'launch'");
    usage_error(
        &["send", "--to", "127.0.0.1:1", "--time", "1", "/x"],
        "do not apply when PATHs are given",
    );
}

/// `--campaign` and `--run` take plain names: a space, a slash, 200
/// characters are refused before any connection, naming the flag (send,
/// send --protocol iperf3, get and sweep).
#[test]
fn campaign_and_run_names_that_are_not_plain_exit_2_naming_the_flag() {
    let long = "x".repeat(200);
    for (flag, name, why) in [
        ("--campaign", "fig 5", "contains ' '"),
        ("--campaign", "fig/5", "contains '/'"),
        (
            "--campaign",
            long.as_str(),
            "200 characters long, at most 64",
        ),
        ("--run", "a to b", "contains ' '"),
        ("--run", "../b", "contains '/'"),
        ("--run", long.as_str(), "200 characters long, at most 64"),
        ("--run", "", "empty"),
    ] {
        let arg = format!("{flag}={name}");
        for args in [
            vec!["send", "--to", "127.0.0.1:1", arg.as_str()],
            vec![
                "send",
                "--protocol",
                "iperf3",
                "--to",
                "127.0.0.1:1",
                arg.as_str(),
            ],
            vec!["get", "--from", "127.0.0.1:1", "x", arg.as_str()],
            vec!["sweep", "--to", "127.0.0.1:1", arg.as_str()],
        ] {
            let out = run(&args);
            assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
            assert!(
                out.stderr.contains(flag) && out.stderr.contains(why),
                "{args:?}: {}",
                out.stderr
            );
            assert!(
                !out.stderr.contains("refused"),
                "{args:?} connected: {}",
                out.stderr
            );
        }
    }
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

/// Flags only one subcommand has (shared names such as --to, --streams or
/// --out are left out): its help lists them, no other's does.
const OWN_FLAGS: &[(&str, &[&str])] = &[
    (
        "serve",
        &["--listen", "--root", "--max-sessions", "--stats-listen"],
    ),
    (
        "send",
        &["--bidir", "--reverse", "--dest", "--checksum", "--strict"],
    ),
    ("sweep", &["--messages", "--load"]),
    ("advise", &["--pings"]),
    ("report", &["--prometheus", "--title", "--step"]),
];

#[test]
fn help_of_each_subcommand_lists_only_its_own_flags() {
    for (sub, own) in OWN_FLAGS {
        for help in ["--help", "-h"] {
            let out = run(&[sub, help]);
            assert_eq!(out.code, Some(0), "{sub} {help}: {}", out.stderr);
            assert!(
                out.stdout.contains(&format!("Usage: longhaul {sub}")),
                "{}",
                out.stdout
            );
            for flag in *own {
                assert!(out.stdout.contains(flag), "{sub}: {flag}\n{}", out.stdout);
            }
            for (other, flags) in OWN_FLAGS.iter().filter(|(o, _)| o != sub) {
                for flag in *flags {
                    assert!(
                        !out.stdout.contains(&format!("{flag} ")),
                        "{sub} --help shows {other}'s {flag}:\n{}",
                        out.stdout
                    );
                }
            }
        }
    }
    let out = run(&["--help"]);
    assert_eq!(out.code, Some(0));
    for (sub, _) in OWN_FLAGS {
        assert!(out.stdout.contains(sub), "{}", out.stdout);
    }
    let out = run(&["--version"]);
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.starts_with("longhaul "), "{}", out.stdout);
}

#[test]
fn typos_get_a_suggestion_and_exit_2() {
    usage_error(&["send", "--to", "h:1", "--stream", "4"], "'--streams'");
    usage_error(&["send", "--to", "h:1", "--bidi"], "'--bidir'");
    usage_error(&["sweep", "--to", "h:1", "--mesages", "64"], "'--messages'");
    usage_error(&["serv"], "'serve'");
    usage_error(&["reprot", "d"], "'report'");
}

#[test]
fn no_subcommand_is_a_usage_error_with_the_list() {
    let out = run(&[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("send"), "{}", out.stderr);
}

/// The words of a /proc file (empty when it cannot be read).
fn proc_words(path: &str) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn congestion_control_the_server_may_not_use_is_refused_by_name() {
    // An unprivileged server may only use net.ipv4.tcp_allowed_congestion_control;
    // the client must hear which algorithm and which sysctl, not a broken stream.
    let allowed = proc_words("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
    let Some(alg) = proc_words("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .into_iter()
        .find(|a| !allowed.contains(a))
    else {
        longhaul_testkit::cannot_run(
            "every available congestion control is allowed here (load a second one, e.g. modprobe tcp_bbr)",
        );
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        longhaul_testkit::cannot_run("needs root to start the server as nobody");
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

/// The congestion control of every established socket whose local port is
/// `port`, as `ss -ti` shows the kernel's view of them.
fn server_side_ccs(port: u16, available: &[String]) -> Vec<String> {
    let out = std::process::Command::new("ss")
        .args([
            "-Htin",
            "state",
            "established",
            "sport",
            "=",
            &format!(":{port}"),
        ])
        .output()
        .expect("run ss (iproute2)");
    assert!(out.status.success(), "{out:?}");
    let mut ccs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| available.iter().any(|a| a == w))
        .map(str::to_string)
        .collect();
    ccs.sort();
    ccs
}

#[test]
fn the_server_s_control_connections_run_the_default_and_its_data_sockets_the_session_s() {
    // Both servers' listeners start accepted sockets as reno; the data
    // sockets get the session's --cc (-C for iperf3), and the control
    // connection the machine's default, as the client's end of it has.
    let default = proc_words("/proc/sys/net/ipv4/tcp_congestion_control").join(" ");
    let available = proc_words("/proc/sys/net/ipv4/tcp_available_congestion_control");
    // Neither the default nor the listeners' reno, so that neither could
    // pass for the other; a root server may use any available one.
    let Some(other) = available
        .iter()
        .find(|a| **a != default && *a != "reno")
        .cloned()
    else {
        longhaul_testkit::cannot_run(
            "needs a third congestion control beside the default and reno (modprobe tcp_bbr or tcp_cubic)",
        );
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        longhaul_testkit::cannot_run("needs root to use a congestion control that is not allowed");
        return;
    }
    let iperf3_port = free_port();
    let iperf3_addr = format!("127.0.0.1:{iperf3_port}");
    let server = Server::start(&["--iperf3-listen", &iperf3_addr]);
    for (protocol, to, port) in [
        ("longhaul", server.addr(), server.port),
        ("iperf3", iperf3_addr.clone(), iperf3_port),
    ] {
        let sender = spawn(&[
            "send",
            "--protocol",
            protocol,
            "--to",
            &to,
            "--streams",
            "2",
            "--time",
            "30",
            "--interval",
            "0.2",
            "--cc",
            &other,
        ]);
        sender.wait_until_flowing();
        let mut want = vec![default.clone(), other.clone(), other.clone()];
        want.sort();
        assert_eq!(server_side_ccs(port, &available), want, "{protocol}");
    }
}
