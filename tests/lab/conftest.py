"""The lab for the end-to-end tests: one lab for the whole session.

The `lab` fixture brings the lab down (whatever was left), up from scratch
(lab/up, with two pairs of transfer hosts unless LAB_PAIRS says otherwise:
test_phases.py gives each run of a phase a pair of its own), provisions it
twice with the real ansible/site.yml (the second run must change nothing),
and removes it at the end of the session (lab/down).
For debugging: LONGHAUL_LAB_KEEP=1 keeps the lab afterwards, and
LONGHAUL_LAB_REUSE=1 reuses a running, provisioned lab as it is (no site.yml
run: the provisioning tests fail, or skip with LONGHAUL_ALLOW_SKIP=1). The
tests talk only to the lab's containers (docker exec) and their addresses on
the lab networks.

These tests run as their own stage (`scripts/pytest-run tests/lab`): a run of
the whole tests/ directory skips them, so nothing outside tests/lab needs the
lab.
"""

import os
import time
from pathlib import Path

import pytest

from labkit import REPO, SITE, Lab, wait_until

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Run the lab tests only when tests/lab (or a file in it) was named."""
    selected = any(
        Path(arg.split("::")[0]).resolve().is_relative_to(HERE) for arg in config.args if arg
    )
    if selected:
        return
    skip = pytest.mark.skip(reason="lab tests run as their own stage: scripts/pytest-run tests/lab")
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def lab():
    """The lab, provisioned from scratch twice; removed after the session."""
    for binary in ("longhaul", "longhaul-exporter"):
        dist = Path(os.environ.get("LONGHAUL_DIST", REPO / "dist"))
        if not (dist / binary).is_file():
            pytest.fail("%s/%s is missing: run `make build` first" % (dist, binary))
    os.environ.setdefault("LAB_PAIRS", "2")
    handle = Lab()
    BRING_UP.append(handle)
    handle.reused = os.environ.get("LONGHAUL_LAB_REUSE") == "1"

    def timed(what, step):
        t0 = time.time()
        result = step()
        handle.bring_up.append((what, time.time() - t0))
        return result

    if not handle.reused:
        timed("lab/down", lambda: handle.script("down"))
    try:
        timed("lab/up", lambda: handle.script("up"))
        timed("lab/check-path", lambda: handle.script("check-path"))
        if not handle.reused:
            handle.provision.append(timed("site.yml (fresh)", lambda: handle.playbook(SITE)))
            if handle.provision[0].rc == 0:
                handle.provision.append(timed("site.yml (again)", lambda: handle.playbook(SITE)))
        yield handle
    finally:
        if os.environ.get("LONGHAUL_LAB_KEEP") != "1":
            handle.script("down")


# The session's lab, for the summary below.
BRING_UP = []


def pytest_terminal_summary(terminalreporter):
    """Where the lab's bring-up spent its time: each step, and the slowest
    tasks of each site.yml run (Ansible's profile_tasks, ansible.cfg), so a
    slow CI stage shows which role to look at."""
    for handle in BRING_UP:
        terminalreporter.section("lab bring-up")
        for what, seconds in handle.bring_up:
            terminalreporter.write_line("%7.1fs  %s" % (seconds, what))
        for name, run in zip(("fresh", "again"), handle.provision):
            slowest = run.slowest_tasks(12)
            if slowest:
                terminalreporter.write_line("slowest tasks of site.yml (%s):" % name)
                for line in slowest:
                    terminalreporter.write_line("  " + line)


@pytest.fixture(scope="session")
def provisioned(lab):
    """The lab after a successful provisioning, with its monitoring answering."""
    first = lab.provision[0] if lab.provision else None
    if first is not None and first.rc != 0:
        pytest.fail("site.yml failed on the fresh lab; its end:\n%s" % first.tail())
    wait_until(lambda: lab.ready(lab.prometheus_url + "/-/ready"), 60, "Prometheus on the monitor")
    wait_until(
        lambda: lab.ready(lab.alertmanager_url + "/-/ready"), 60, "Alertmanager on the monitor"
    )
    return lab
