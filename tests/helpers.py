"""Generic helpers for tests that start real binaries on loopback.

Free ports, finding binaries, starting processes with their output in a log
file, waiting for a port or an HTTP answer, and stopping everything that was
started. Nothing here knows about longhaul; tests/conftest.py turns these
into fixtures.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"

# How long a freshly started daemon may take to open its port. Generous:
# CI shares two cores among everything it runs.
START_TIMEOUT_S = 30.0
POLL_S = 0.1


# The variable that lets a test that cannot run here skip instead of fail, as
# longhaul-testkit's cannot_run does for the Rust tests.
ALLOW_SKIP = "LONGHAUL_ALLOW_SKIP"


def cannot_run(why):
    """The calling test cannot run here because `why`: it fails, unless
    LONGHAUL_ALLOW_SKIP is set (not 0), then it is skipped. CI runs as root
    with everything installed, so there a test that cannot run is broken. The
    only way a Python test may skip (scripts/check-test-skips)."""
    import pytest

    if os.environ.get(ALLOW_SKIP, "") not in ("", "0"):
        pytest.skip(why)
    pytest.fail(
        "this test cannot run here: %s (set %s=1 to skip such tests on a machine without it)"
        % (why, ALLOW_SKIP),
        pytrace=False,
    )


def dist_dir():
    """Where `make build` puts longhaul and longhaul-exporter."""
    return Path(os.environ.get("LONGHAUL_DIST", REPO / "dist"))


def find_binary(*candidates):
    """First candidate that is an executable file or on PATH, else None."""
    for candidate in candidates:
        candidate = str(candidate)
        if os.sep in candidate:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        else:
            found = shutil.which(candidate)
            if found:
                return found
    return None


def free_port(kind=socket.SOCK_STREAM):
    """A port on loopback that nobody listens on right now (TCP by default)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def free_udp_port():
    return free_port(socket.SOCK_DGRAM)


def port_open(port, host=LOOPBACK):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def http_get(url, params=None, timeout=10.0):
    """GET url (with query params) and return the body as text."""
    if params:
        url = url + "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read().decode("utf-8")


def http_post(url, params=None, timeout=10.0):
    data = urllib.parse.urlencode(params or {}).encode()
    with urllib.request.urlopen(url, data=data, timeout=timeout) as answer:
        return answer.read().decode("utf-8")


def get_json(url, params=None, timeout=10.0):
    return json.loads(http_get(url, params, timeout))


# One sample line of Prometheus's text format: name, {labels}, value, and a
# timestamp that may follow.
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?[0-9]+)?$")
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """[(name, {label: value as written}, value)] of a /metrics answer in
    Prometheus's text format; a line that is neither a comment nor a sample
    is an error naming it."""
    samples = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = SAMPLE_LINE.match(line)
        if not m:
            raise ValueError("not a sample line of the text format: %r" % line)
        samples.append((m.group(1), dict(LABEL_PAIR.findall(m.group(2) or "")), float(m.group(3))))
    return samples


class Processes:
    """Processes started by one test, each with a log file; stop() ends them
    all (SIGTERM, then SIGKILL) and is safe to call twice."""

    def __init__(self, log_dir):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.started = []

    def start(self, name, argv, env=None, cwd=None):
        log = open(self.log_dir / ("%s.log" % name), "wb")
        process = subprocess.Popen(
            [str(arg) for arg in argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        process.name = name
        process.log_path = log.name
        log.close()
        self.started.append(process)
        return process

    def log(self, name):
        path = self.log_dir / ("%s.log" % name)
        return path.read_text(errors="replace") if path.exists() else ""

    def check_running(self, process):
        if process.poll() is not None:
            raise AssertionError(
                "%s exited with %s:\n%s"
                % (process.name, process.returncode, self.log(process.name))
            )

    def wait_port(self, process, port, timeout=START_TIMEOUT_S):
        """Wait until process listens on TCP port; fail with its log if it dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_running(process)
            if port_open(port):
                return
            time.sleep(POLL_S)
        raise AssertionError(
            "%s did not open port %d in %.0f s:\n%s"
            % (process.name, port, timeout, self.log(process.name))
        )

    def stop(self):
        for process in reversed(self.started):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for process in reversed(self.started):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        self.started.clear()


def start_engine(processes, *extra, name="serve"):
    """`longhaul serve` of $LONGHAUL_DIST on free loopback ports (control and
    stats API, plus `extra` flags), once both answer: (Popen, port, stats port)."""
    longhaul = dist_dir() / "longhaul"
    assert longhaul.is_file(), f"{longhaul} missing: run `make build` or set LONGHAUL_DIST"
    port, stats = free_port(), free_port()
    proc = processes.start(
        name,
        [
            str(longhaul),
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--stats-listen",
            f"127.0.0.1:{stats}",
            *extra,
        ],
    )
    processes.wait_port(proc, port)
    processes.wait_port(proc, stats)
    return proc, port, stats


def wait_until(predicate, timeout, what, interval=0.5):
    """Call predicate until it returns a truthy value; return that value."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, urllib.error.URLError, ValueError, KeyError) as error:
            last_error = error
        time.sleep(interval)
    raise AssertionError(
        "timed out after %.0f s waiting for %s (last error: %s)" % (timeout, what, last_error)
    )


def run_local_playbook(tmp_path, tasks, overrides, gather_facts=False, env=None, inventory=None):
    """`tasks` as a playbook on localhost with `overrides` as extra vars, as
    the role's users run it: the finished ansible-playbook. `inventory` (an
    inventory as a dict, YAML's shape) gives the play the groups and host
    variables of other hosts; localhost stays implicit."""
    play = {"hosts": "localhost", "connection": "local", "gather_facts": gather_facts, "tasks": tasks}
    if gather_facts:
        play["gather_subset"] = ["min"]
    playbook = tmp_path / "playbook.yml"
    playbook.write_text(yaml.safe_dump([play]))
    inventory_args = []
    if inventory is not None:
        path = tmp_path / "inventory.yml"
        path.write_text(yaml.safe_dump(inventory))
        inventory_args = ["--inventory", str(path)]
    return subprocess.run(
        [shutil.which("ansible-playbook") or "ansible-playbook", *inventory_args,
         "--extra-vars", json.dumps(overrides), str(playbook)],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
            **(env or {}),
        },
    )
