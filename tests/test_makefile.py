"""`make help` lists every target the Makefile defines, each once."""

import re
import subprocess

from helpers import REPO


def makefile_targets():
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([a-z][a-z0-9-]*):(?!=)", text, re.M)}


def test_make_help_lists_every_target():
    out = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listed = [line.split()[1] for line in out.splitlines() if line.startswith("make ")]
    targets = makefile_targets()
    assert len(targets) >= 10, targets
    assert sorted(listed) == sorted(set(listed)), "listed twice: %s" % listed
    assert set(listed) == targets, "missing from help: %s; not a target: %s" % (
        sorted(targets - set(listed)),
        sorted(set(listed) - targets),
    )
    for line in out.splitlines():
        assert len(line.split(None, 2)) == 3, "no description: %r" % line


def test_every_target_is_phony():
    text = (REPO / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split())
    assert makefile_targets() == phony
