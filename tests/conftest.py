"""Shared pytest fixtures: free ports, temporary directories, binaries and
processes that are always cleaned up. Topic-specific set-ups (a monitoring
stack, a lab) live in their own modules and build on these."""

import pytest

import helpers

# tests/fixtures holds data trees (the fake disk server's sysfs, whose
# symlinks loop like the kernel's): nothing to collect there.
collect_ignore = ["fixtures"]


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
