"""CI fails when a test skips itself: scripts/check-test-skips finds Rust
and Python tests that skip themselves or print a skip and pass, and
longhaul-testkit's cannot_run (its own unit test) and helpers.cannot_run fail
a test unless LONGHAUL_ALLOW_SKIP is set."""

import pathlib
import subprocess

import pytest

import helpers

REPO = pathlib.Path(__file__).resolve().parent.parent
CHECK = REPO / "scripts" / "check-test-skips"


def check(tree):
    return subprocess.run([str(CHECK), str(tree)], capture_output=True, text=True)


def test_the_repository_has_no_self_skipping_test():
    out = check(REPO)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_test_that_prints_a_skip_and_passes_is_found(tmp_path):
    src = tmp_path / "crate" / "tests"
    src.mkdir(parents=True)
    (src / "ok.rs").write_text(
        '#[test]\nfn a() {\n    longhaul_testkit::cannot_run("no root");\n    return;\n}\n'
        '#[test]\n#[ignore = "needs a RAID controller"]\nfn b() {}\n'
    )
    assert check(tmp_path).returncode == 0
    (src / "bad.rs").write_text(
        '#[test]\nfn c() {\n    if !root() {\n        eprintln!("skipped: not root");\n        return;\n    }\n}\n'
    )
    out = check(tmp_path)
    assert out.returncode == 1
    assert "bad.rs:4" in out.stdout, out.stdout
    (src / "bad.rs").write_text("#[test]\n#[ignore]\nfn d() {}\n")
    out = check(tmp_path)
    assert out.returncode == 1 and "bad.rs:2" in out.stdout, out.stdout


def test_a_python_test_that_skips_itself_is_found(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_ok.py").write_text(
        "import pytest\nfrom helpers import cannot_run\n\n"
        '@pytest.mark.skip(reason="runs as its own stage")\ndef test_a():\n    pass\n\n'
        "def test_b():\n    if True:\n        cannot_run('no docker')\n"
    )
    assert check(tmp_path).returncode == 0
    for bad, line in [
        ("import pytest\n\ndef test_c():\n    pytest.skip('no docker')\n", 4),
        ("import pytest\n\n@pytest.mark.skipif(True, reason='x')\ndef test_d():\n    pass\n", 3),
        ("import pytest\n\n@pytest.mark.skip\ndef test_e():\n    pass\n", 3),
        ("import pytest\nyaml = pytest.importorskip('yaml')\n", 2),
        ("def test_f():\n    print('skipped: no docker')\n    return\n", 2),
    ]:
        (tests / "test_bad.py").write_text(bad)
        out = check(tmp_path)
        assert out.returncode == 1, bad
        assert "test_bad.py:%d" % line in out.stdout, (bad, out.stdout)


def test_cannot_run_fails_unless_skipping_is_allowed(monkeypatch):
    monkeypatch.delenv(helpers.ALLOW_SKIP, raising=False)
    with pytest.raises(pytest.fail.Exception, match="no docker.*LONGHAUL_ALLOW_SKIP"):
        helpers.cannot_run("no docker")
    monkeypatch.setenv(helpers.ALLOW_SKIP, "0")
    with pytest.raises(pytest.fail.Exception):
        helpers.cannot_run("no docker")
    monkeypatch.setenv(helpers.ALLOW_SKIP, "1")
    with pytest.raises(pytest.skip.Exception, match="no docker"):
        helpers.cannot_run("no docker")
