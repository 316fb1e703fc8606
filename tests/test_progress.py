"""Progress of long steps: scripts/stage (every make target's stage) prints a
line when a stage starts and one while its command is silent, at least every
STAGE_HEARTBEAT seconds (default 20, under the 30 s a user waits before
wondering whether it hangs); pytest stages print each test's start, outcome
and duration (tests/conftest.py)."""

import os
import re
import subprocess

from helpers import REPO

STAGE = REPO / "scripts" / "stage"
SILENCE_BOUND_S = 30


def stage(*command, beat=None):
    """scripts/stage demo-step COMMAND... with STAGE_HEARTBEAT=beat (default: unset)."""
    env = dict(os.environ)
    env.pop("STAGE_HEARTBEAT", None)
    if beat is not None:
        env["STAGE_HEARTBEAT"] = str(beat)
    return subprocess.run(
        [str(STAGE), "demo-step", *command], capture_output=True, text=True, timeout=60, env=env
    )


def test_default_heartbeat_is_under_the_silence_bound():
    out = stage("true")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("== stage demo-step: start"), out.stdout
    beat = int(re.search(r"a line at least every (\d+)s", first).group(1))
    assert 0 < beat < SILENCE_BOUND_S, first


def test_a_silent_command_gets_heartbeats_and_its_exit_status():
    out = stage("bash", "-c", "sleep 9; echo done-now; exit 7", beat=2)
    lines = out.stdout.splitlines()
    beats = [i for i, l in enumerate(lines) if "still running" in l]
    # 9 s of silence at one line per 2 s: four lines expected, at least two
    # even when a loaded machine delays the watcher.
    assert len(beats) >= 2, out.stdout
    assert beats[-1] < lines.index("done-now"), out.stdout
    # The watcher looks once a second: a loaded machine may first look after
    # 3 s or more of silence, never before the 2 s asked for.
    first = re.match(r"== stage demo-step: still running, (\d+)s \(no output for (\d+)s\)", lines[beats[0]])
    assert first, lines[beats[0]]
    assert 2 <= int(first.group(2)) <= int(first.group(1)) < 9, lines[beats[0]]
    assert lines[-1].startswith("== stage demo-step: FAILED (exit 7) in "), out.stdout
    assert out.returncode == 7


def test_a_talking_command_gets_no_heartbeat_and_partial_lines_count():
    # A dot every 0.5 s without a newline (pytest -q's way) is output too.
    out = stage("bash", "-c", "for i in $(seq 8); do printf .; sleep 0.5; done; echo", beat=2)
    assert "still running" not in out.stdout, out.stdout
    assert "........" in out.stdout
    assert out.stdout.splitlines()[-1].startswith("== stage demo-step: ok in ")


def test_stderr_is_shown_and_a_bad_heartbeat_is_refused():
    out = stage("bash", "-c", "echo oops >&2", beat=2)
    assert "oops" in out.stdout and out.returncode == 0
    out = stage("true", beat="soon")
    assert out.returncode == 2 and "STAGE_HEARTBEAT" in out.stderr


def test_pytest_prints_each_test_with_outcome_and_duration():
    test = "tests/test_makefile.py::test_every_target_is_phony"
    out = subprocess.run(
        [str(REPO / "scripts" / "pytest-run"), test],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    start = lines.index("  %s ..." % test)
    end = next(i for i, l in enumerate(lines) if re.fullmatch(r"  %s PASSED in \d+\.\ds" % re.escape(test), l))
    assert start < end, out.stdout
