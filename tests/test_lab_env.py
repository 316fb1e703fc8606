"""lab/lab.env's pairs of transfer hosts (LAB_PAIRS), as lab/up, lab/check-path
and scripts/demo read them: names, sites and addresses of every pair, overrides
kept, and a bad value refused with a message that names it. Sourced by bash
here; the lab tests (tests/lab) bring the lab up with two pairs."""

import os
import subprocess
from pathlib import Path

import pytest

LAB_ENV = Path(__file__).resolve().parent.parent / "lab" / "lab.env"

# What the tests print from a sourced lab.env: one line per transfer host
# (name, site, address), then every host.
SHOW = r"""
. "$1"
for host in "${LAB_TRANSFER_HOSTS[@]}"; do echo "$host $(lab_site "$host") $(lab_ip "$host")"; done
echo "hosts: ${LAB_HOSTS[*]}"
"""


def source(**env):
    """bash sources lab.env with `env` over a clean LAB_* environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAB_")}
    clean.update(env)
    return subprocess.run(
        ["bash", "-c", SHOW, "show", str(LAB_ENV)], capture_output=True, text=True, env=clean
    )


def test_one_pair_by_default():
    done = source()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "xfer-a a 10.77.1.10",
        "xfer-b b 10.77.2.10",
        "hosts: xfer-a xfer-b router monitor central",
    ]


def test_each_further_pair_gets_a_host_on_each_site():
    done = source(LAB_PAIRS="3", LAB_ID="2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "xfer-a a 10.79.1.10",
        "xfer-b b 10.79.2.10",
        "xfer-a2 a 10.79.1.11",
        "xfer-b2 b 10.79.2.11",
        "xfer-a3 a 10.79.1.12",
        "xfer-b3 b 10.79.2.12",
        "hosts: xfer-a xfer-b xfer-a2 xfer-b2 xfer-a3 xfer-b3 router monitor central",
    ]


def test_addresses_follow_pair_one_and_their_own_overrides():
    done = source(LAB_PAIRS="2", LAB_IP_XFER_A="10.77.1.20", LAB_IP_XFER_B2="10.77.2.50")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:4] == [
        "xfer-a a 10.77.1.20",
        "xfer-b b 10.77.2.10",
        "xfer-a2 a 10.77.1.21",
        "xfer-b2 b 10.77.2.50",
    ]


@pytest.mark.parametrize("value", ["0", "10", "two", "-1", "2 "])
def test_a_bad_number_of_pairs_is_refused_by_name(value):
    done = source(LAB_PAIRS=value)
    assert done.returncode != 0
    assert "hosts:" not in done.stdout
    assert "LAB_PAIRS=%s: expected a number of transfer host pairs, 1..9" % value in done.stderr
