"""ansible/campaign.yml's checks of a campaign's runs refuse what cannot run,
before any host is touched: here runs with `protocol: iperf3` (issue 22)
that are not memory-to-memory sends, or whose receiver has no iperf3 port,
and disk runs whose `dest` (which the campaign removes on the receiver
afterwards) is not a plain path under the receiver's root.
The playbook runs for real on this machine against an inventory of two
transfer hosts it never has to reach (the checks run on the controller).
"""

import os
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CAMPAIGN = REPO / "ansible" / "campaign.yml"
# The play runs with connection local; hosts it delegates to must say ssh,
# or the delegated task would run on this machine.
SSH = {"ansible_connection": "ssh"}
VENV_BIN = Path(os.environ.get("LONGHAUL_CACHE", "/var/cache/longhaul")) / "venv" / "bin"


def run_campaign(tmp_path, runs, receiver_vars=None, name="bad"):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "transfer_hosts": {
                            "hosts": {
                                # Nothing listens on port 1: a task that
                                # reaches a host fails at once, unreachable.
                                "xfer-a": {"ansible_host": "127.0.0.1", "ansible_port": 1, **SSH},
                                "xfer-b": {
                                    "ansible_host": "127.0.0.1",
                                    "ansible_port": 1,
                                    **SSH,
                                    **(receiver_vars or {}),
                                },
                            }
                        }
                    }
                }
            }
        )
    )
    campaign = tmp_path / "bad.yml"
    campaign.write_text(
        yaml.safe_dump({"campaign_name": name, "campaign_description": "x", "campaign_runs": runs})
    )
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (VENV_BIN, env.get("PATH", ""))
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible" / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    return subprocess.run(
        [
            "ansible-playbook",
            "-i",
            str(inventory),
            str(CAMPAIGN),
            "-e",
            "campaign=bad",
            "-e",
            "campaign_file=%s" % campaign,
            "-e",
            "campaign_results_dir=%s" % (tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )


IPERF3_RUN = {"name": "r", "sender": "xfer-a", "receiver": "xfer-b", "protocol": "iperf3"}


@pytest.mark.parametrize(
    "run, receiver_vars, why",
    [
        pytest.param(
            {**IPERF3_RUN, "mode": "disk", "paths": ["/srv/x"]},
            None,
            "memory to memory only",
            id="disk",
        ),
        pytest.param(
            {**IPERF3_RUN, "kind": "sweep", "sweep_streams": "1", "sweep_buffers": "2M"},
            None,
            "memory to memory only",
            id="sweep",
        ),
        pytest.param({**IPERF3_RUN, "streams": 129}, None, "up to 128 streams", id="streams-129"),
        pytest.param(
            IPERF3_RUN,
            {"longhaul_engine_iperf3_listen": ""},
            'longhaul_engine_iperf3_listen of xfer-b: ""',
            id="receiver-without-iperf3",
        ),
        pytest.param(
            {**IPERF3_RUN, "protocol": "iperf2"}, None, "protocol is longhaul", id="iperf2"
        ),
        pytest.param(
            {**IPERF3_RUN, "bidir": True, "reverse": True},
            None,
            "bidir and reverse",
            id="bidir-and-reverse",
        ),
        pytest.param(
            {**IPERF3_RUN, "udp": True},
            None,
            "needs protocol iperf3 and a rate",
            id="udp-without-rate",
        ),
        pytest.param(
            {"name": "r", "sender": "xfer-a", "receiver": "xfer-b", "udp": True, "rate": "1M"},
            None,
            "needs protocol iperf3 and a rate",
            id="udp-without-iperf3",
        ),
    ],
)
def test_campaign_refuses_runs_iperf3_cannot_make(tmp_path, run, receiver_vars, why):
    done = run_campaign(tmp_path, [run], receiver_vars)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "Check the runs with protocol iperf3" in out and why in out, out[-3000:]
    # Refused before anything ran: no results directory.
    assert not (tmp_path / "results").exists(), out[-3000:]


def test_campaign_passes_a_valid_iperf3_run_on_to_the_hosts(tmp_path):
    # The control: the same checks let a memory iperf3 run through, and the
    # playbook goes on to the receivers (unreachable here).
    done = run_campaign(
        tmp_path,
        [
            {**IPERF3_RUN, "streams": 128, "reverse": True},
            {**IPERF3_RUN, "name": "u", "udp": True, "rate": "100M"},
        ],
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "Start the receivers' engine" in out and "UNREACHABLE" in out, out[-3000:]
    assert (tmp_path / "results" / "bad").is_dir(), out[-3000:]


DISK_RUN = {"name": "d", "sender": "xfer-a", "receiver": "xfer-b", "mode": "disk", "paths": ["/srv/x"]}


# The cleanup after a disk run removes <longhaul_engine_root>/<dest> on the
# receiver, whatever the run did: "" was the whole root, ".." its parent,
# "x/../../../etc" /etc.
@pytest.mark.parametrize(
    "dest, name",
    [
        pytest.param("", "bad", id="empty"),
        pytest.param(".", "bad", id="dot"),
        pytest.param("..", "bad", id="dot-dot"),
        pytest.param("../..", "bad", id="up-twice"),
        pytest.param("x/../../../etc", "bad", id="through-a-name"),
        pytest.param("/etc", "bad", id="absolute"),
        pytest.param("a//b", "bad", id="empty-name"),
        pytest.param("a/", "bad", id="trailing-slash"),
        pytest.param(7, "bad", id="not-a-string"),
        pytest.param(None, "..", id="campaign-name-as-default"),
    ],
)
def test_campaign_refuses_a_disk_dest_outside_the_root(tmp_path, dest, name):
    run = dict(DISK_RUN) if dest is None else {**DISK_RUN, "dest": dest}
    done = run_campaign(tmp_path, [run], name=name)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    task = "Check the campaign's name" if dest is None else "Check the disk runs' destinations"
    assert task in out and "failed" in out.lower(), out[-3000:]
    assert "letters, digits" in out, out[-3000:]
    assert not (tmp_path / "results").exists(), out[-3000:]


def test_campaign_passes_plain_disk_dests_on_to_the_hosts(tmp_path):
    # The control: nested names with dots, and the campaign name as the
    # default, pass; the playbook goes on to the receivers (unreachable).
    done = run_campaign(
        tmp_path,
        [{**DISK_RUN, "dest": "runs/2026-11.27_a"}, {**DISK_RUN, "name": "e"}],
        name="disk-ok_1",
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "Start the receivers' engine" in out and "UNREACHABLE" in out, out[-3000:]
    assert (tmp_path / "results" / "disk-ok_1").is_dir(), out[-3000:]


@pytest.mark.parametrize(
    "run_name, name, task",
    [
        pytest.param("r" * 65, "bad", "Check the campaign's runs", id="run-65"),
        pytest.param("r", "c" * 65, "Check the campaign's name", id="campaign-65"),
    ],
)
def test_campaign_refuses_names_its_series_cannot_carry(tmp_path, run_name, name, task):
    """The campaign's and each run's names become --campaign and --run, which
    the engine takes up to 64 characters long: longer is refused before any
    host is touched, not by every sender at its start."""
    run = {"name": run_name, "sender": "xfer-a", "receiver": "xfer-b"}
    done = run_campaign(tmp_path, [run], name=name)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert task in out and "at most 64" in out, out[-3000:]
    assert not (tmp_path / "results").exists(), out[-3000:]
