"""lab/lab.env's pairs of transfer hosts (LAB_PAIRS), as lab/up, lab/check-path
and scripts/demo read them: names, sites and addresses of every pair, overrides
kept, and a bad value refused with a message that names it. Sourced by bash
here; the lab tests (tests/lab) bring the lab up with two pairs. Also what
each LAB_ID's lab generates (inventory, secrets), and that lab/down removes
its own and not another lab's."""

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from helpers import cannot_run

LAB_DIR = Path(__file__).resolve().parent.parent / "lab"
LAB_ENV = LAB_DIR / "lab.env"

# What the tests print from a sourced lab.env: one line per transfer host
# (name, site, address), then every host.
SHOW = r"""
. "$1"
for host in "${LAB_TRANSFER_HOSTS[@]}"; do echo "$host $(lab_site "$host") $(lab_ip "$host")"; done
echo "hosts: ${LAB_HOSTS[*]}"
"""


def clean_env(**env):
    """This environment without LAB_* variables, plus `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAB_")}
    clean.update(env)
    return clean


def source(show=SHOW, **env):
    """bash sources lab.env with `env` over a clean LAB_* environment."""
    return subprocess.run(
        ["bash", "-c", show, "show", str(LAB_ENV)],
        capture_output=True,
        text=True,
        env=clean_env(**env),
    )


def test_one_pair_by_default():
    done = source()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "xfer-a a 10.77.1.10",
        "xfer-b b 10.77.2.10",
        "hosts: xfer-a xfer-b router monitor central central2",
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
        "hosts: xfer-a xfer-b xfer-a2 xfer-b2 xfer-a3 xfer-b3 router monitor central central2",
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


GENERATED = '. "$1"; echo "$LAB_INVENTORY $LAB_STATE"'


@pytest.mark.parametrize(
    "lab_id, paths",
    [("", "ansible/inventories/lab lab/.state"), ("2", "ansible/inventories/lab2 lab/.state2")],
    ids=["default", "LAB_ID=2"],
)
def test_each_lab_generates_its_own_inventory_and_secrets(lab_id, paths):
    # Set from LAB_ID alone: lab/up writes and lab/down removes "$repo/$LAB_INVENTORY".
    done = source(GENERATED, LAB_ID=lab_id, LAB_INVENTORY="/etc", LAB_STATE="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == paths.split()


def test_lab_down_removes_its_own_generated_files_and_not_another_labs(tmp_path):
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        cannot_run("lab/down needs a Docker engine that answers (make setup starts dockerd)")
    # lab/down in a copy of the repository's lab/ (it works on the repository
    # it sits in), under a prefix no lab has, so it finds no container.
    shutil.copytree(LAB_DIR, tmp_path / "lab", ignore=shutil.ignore_patterns(".state*"))
    kept, removed = [], []
    for lab_id, into in (("", kept), ("2", removed)):
        for path in ("ansible/inventories/lab%s/hosts.yml", "lab/.state%s/engine-token"):
            path = tmp_path / (path % lab_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x\n")
            into.append(path)
    done = subprocess.run(
        [str(tmp_path / "lab" / "down")],
        capture_output=True,
        text=True,
        env=clean_env(LAB_ID="2", LAB_PREFIX="lhtest-%s" % uuid.uuid4().hex[:8]),
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p for p in removed if p.exists()] == [], done.stdout
    assert [p for p in kept if not p.exists()] == [], done.stdout
    assert (tmp_path / "lab" / "lab.env").exists()
