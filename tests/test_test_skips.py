"""CI's Rust stage fails when a test skips itself: scripts/check-test-skips
finds tests that print a skip and pass, and longhaul-testkit's cannot_run
fails a test unless LONGHAUL_ALLOW_SKIP is set (its own unit test)."""

import pathlib
import subprocess

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
