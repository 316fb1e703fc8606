"""Shared pytest fixtures: free ports, temporary directories, binaries and
processes that are always cleaned up. Topic-specific set-ups (a monitoring
stack, a lab) live in their own modules and build on these."""

import time

import pytest

import helpers

# tests/fixtures holds data trees (the fake disk server's sysfs, whose
# symlinks loop like the kernel's): nothing to collect there.
collect_ignore = ["fixtures"]


# Progress: a line when each test starts and one with its outcome and
# duration (set-up and teardown included) when it ends, so a long stage
# (the lab's is about 15 minutes) shows which test runs and for how long,
# where `-q` alone prints a dot per test.
_started = {}


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = time.monotonic()
    _progress_line("%s ..." % nodeid)


def pytest_runtest_logfinish(nodeid, location):
    took = time.monotonic() - _started.pop(nodeid, time.monotonic())
    _progress_line("%s %s in %.1fs" % (nodeid, _outcomes.pop(nodeid, "done"), took))


_outcomes = {}


# Lines of a failure's report printed the moment it fails: a stage that is
# killed later (its time limit, a CI run stopped by hand) still shows why.
FAILURE_TAIL_LINES = 40


def pytest_runtest_logreport(report):
    # The first failure or skip decides; "passed" only when every phase passed.
    if report.outcome != "passed" or report.when == "call":
        _outcomes.setdefault(report.nodeid, report.outcome.upper())
    if report.failed:
        lines = report.longreprtext.splitlines()[-FAILURE_TAIL_LINES:]
        _progress_line("%s failed in %s; its report ends:" % (report.nodeid, report.when))
        for line in lines:
            _progress_line("  | " + line)
        printed = report.capstdout.splitlines()[-FAILURE_TAIL_LINES // 2 :]
        if printed:
            _progress_line("%s printed before it failed:" % report.nodeid)
            for line in printed:
                _progress_line("  | " + line)


def pytest_report_teststatus(report, config):
    # A passing test has its line: no dot for it (letters of other outcomes stay).
    if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
        return "passed", "", "PASSED"
    return None


_reporter = None


def pytest_sessionstart(session):
    global _reporter
    _reporter = session.config.pluginmanager.get_plugin("terminalreporter")


def _progress_line(text):
    if _reporter is None:
        return
    if _reporter._tw.width_of_current_line:  # after -q's dots
        _reporter.write("\n")
    _reporter.write_line("  " + text)


@pytest.fixture
def free_port():
    """Factory: free_port() -> a free TCP port on 127.0.0.1."""
    return helpers.free_port


@pytest.fixture
def free_udp_port():
    """Factory: free_udp_port() -> a free UDP port on 127.0.0.1."""
    return helpers.free_udp_port


@pytest.fixture(scope="session")
def dist_dir():
    """Directory with the built longhaul binaries (env LONGHAUL_DIST)."""
    return helpers.dist_dir()


@pytest.fixture
def processes(tmp_path):
    """Start processes with logs under tmp_path/logs; all stopped at teardown."""
    group = helpers.Processes(tmp_path / "logs")
    yield group
    group.stop()


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory):
    """Like `processes`, shared by the tests of one module."""
    group = helpers.Processes(tmp_path_factory.mktemp("logs"))
    yield group
    group.stop()
