"""scripts/build-grafana, the setup step that builds Grafana's server from the
Go module proxy: what it says when it cannot build, on an empty cache.

The build itself runs in `make setup` (and its artifact is tested by the
grafana role's Molecule scenario and the lab); these tests need no network:
GOPROXY=off stands for a proxy that no longer serves the pinned version.
"""

import os
import subprocess

import helpers

SCRIPT = helpers.REPO / "scripts" / "build-grafana"


def run(cache, *args, **env):
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, LONGHAUL_CACHE=str(cache), **env),
        check=False,
    )


def test_artifact_path_is_in_the_cache_and_unbuilt_there(tmp_path):
    path = run(tmp_path, "--path")
    assert path.returncode == 0, path.stderr
    artifact = path.stdout.strip()
    assert artifact.startswith(str(tmp_path / "grafana")) and artifact.endswith(".tar.gz"), artifact
    assert run(tmp_path, "--check").returncode == 1


def test_a_version_the_proxy_does_not_serve_fails_by_name(tmp_path):
    done = run(tmp_path, GOPROXY="off", GOFLAGS="")
    assert done.returncode != 0
    assert "does not serve github.com/grafana/grafana@v" in done.stderr, done.stderr
    assert "pin another version in scripts/build-grafana" in done.stderr, done.stderr
    assert run(tmp_path, "--check").returncode == 1, "a failed build left a stamp"


def test_unknown_argument_is_refused(tmp_path):
    done = run(tmp_path, "--bogus")
    assert done.returncode != 0
    assert "unknown argument --bogus" in done.stderr, done.stderr
