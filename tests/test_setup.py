"""scripts/setup on a bare Debian bookworm (the image lab/images/build-base
makes with debootstrap, which scripts/setup builds): without Rust and Go
there, setup stops at its preflight, names each missing prerequisite with
the command that gets it, and installs nothing."""

import re
import subprocess

from helpers import REPO

IMAGE = "debian:bookworm"


def in_bare_debian(script):
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", "%s:/repo:ro" % REPO, IMAGE,
         "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_preflight_names_each_missing_prerequisite_and_how_to_get_it():
    probe = in_bare_debian("for c in cargo rustc go python3 curl node npm apt-get; do command -v $c >/dev/null && echo $c; done; true")
    assert probe.returncode == 0, "no %s image (scripts/setup builds it): %s" % (IMAGE, probe.stderr)
    present = set(probe.stdout.split())
    assert not present & {"cargo", "rustc", "go"}, "the image is not bare: %s" % present
    assert "apt-get" in present

    run = in_bare_debian("/repo/scripts/setup; echo \"exit=$?\"; dpkg -l docker.io iperf3 2>&1 | grep -c '^ii' || true")
    out = run.stdout + run.stderr
    assert "exit=1" in run.stdout, out
    msrv = re.search(r'^rust-version *= *"(.*)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)
    expected = {
        # prerequisite named -> the command that gets it
        "Rust >= %s with rustfmt and clippy" % msrv: "https://sh.rustup.rs | sh -s -- -y --default-toolchain stable --component rustfmt,clippy",
        "Go >= 1.23": "https://go.dev/dl/go1.23",
    }
    if "python3" not in present:
        expected["Python >= 3.10"] = "apt-get install -y python3 python3-venv"
    if not {"node", "npm"} <= present:
        node_min = re.search(r"^node_min=(\S+)", (REPO / "scripts" / "setup").read_text(), re.M).group(1)
        expected["Node.js >= %s with npm" % node_min] = "apt-get install -y nodejs npm"
    if "curl" not in present:
        expected["curl, for the commands above"] = "apt-get install -y curl ca-certificates"
    items = [l[4:] for l in run.stderr.splitlines() if l.startswith("  - ")]
    assert "setup: missing prerequisites" in run.stderr, out
    for what, command in expected.items():
        line = next((i for i in items if i.startswith(what)), None)
        assert line is not None, "%r not named:\n%s" % (what, out)
        assert command in line, "no command for %r:\n%s" % (what, line)
    assert len(items) == len(expected), out
    # It stopped before installing anything.
    assert "debian-packages" not in out
    assert run.stdout.strip().splitlines()[-1] == "0", out
