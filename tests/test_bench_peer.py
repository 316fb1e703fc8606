"""`make bench` names its peers: bench-memory prints the iperf3 it compares
with, by `iperf3 --version`'s first line and how that version runs its
streams (one thread for all before 3.16, a thread per stream since), and
puts both into its JSON; the README's rows quote the same."""

import importlib.machinery
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, cannot_run


def bench_memory():
    loader = importlib.machinery.SourceFileLoader("bench_memory", str(REPO / "scripts" / "bench-memory"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_bench_memory_names_the_iperf3_it_runs_and_its_threading():
    iperf3 = shutil.which("iperf3")
    if not iperf3:
        cannot_run("iperf3 is not installed (Debian package iperf3)")
    peer = bench_memory().iperf3_identity(iperf3)
    print(peer)
    found = re.match(r"iperf (\d+)\.(\d+)", peer["version"])
    assert found, peer
    threaded = (int(found.group(1)), int(found.group(2))) >= (3, 16)
    assert peer["threading"] == ("a thread per stream" if threaded else "every stream in one thread"), peer


def test_every_iperf3_client_takes_the_arguments_iperf3_args_names(monkeypatch, tmp_path):
    """IPERF3_ARGS (e.g. "-Z --skip-rx-copy", issue 47) goes on the command line of
    every iperf3 client the bench runs, against iperf3's server and longhaul's, after
    the bench's own; split as a shell splits it."""
    monkeypatch.setenv("IPERF3_ARGS", "-Z --skip-rx-copy -l '1M'")
    module = bench_memory()
    settings = module.read_settings()
    assert settings.iperf3_args == ["-Z", "--skip-rx-copy", "-l", "1M"]
    for tool in (module.Iperf3(tmp_path, "iperf3"), module.Iperf3OnLonghaul(tmp_path, "iperf3", Path("longhaul"))):
        tool.port = 5201
        command = tool.client_command(35, settings)
        assert command[:3] == ["iperf3", "-c", "127.0.0.1"], command
        assert command[-5:] == ["-J", "-Z", "--skip-rx-copy", "-l", "1M"], command
    monkeypatch.delenv("IPERF3_ARGS")
    command = module.Iperf3(tmp_path, "iperf3").client_command(35, module.read_settings())
    assert command[-1] == "-J", command


def test_iperf3_args_a_shell_could_not_split_is_refused_by_name():
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench-memory")],
        env={"PATH": "/usr/bin:/bin", "IPERF3_ARGS": '-Z "--skip-rx-copy'},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "IPERF3_ARGS=" in done.stderr and "quotation" in done.stderr, done.stderr


def test_iperf3_args_that_set_what_the_bench_sets_are_refused(monkeypatch):
    """-P, -t, -w (the rows' stream count, time and buffer) and the rest the bench
    sets itself: given again in IPERF3_ARGS, the last would win and a row would
    say what it did not run with."""
    module = bench_memory()
    for words in ("-P 8", "-Z -P8", "--time=10", "-w 4M", "--parallel 2", "-J", "-c 127.0.0.2"):
        monkeypatch.setenv("IPERF3_ARGS", words)
        with pytest.raises(SystemExit) as ended:
            module.read_settings()
        assert ended.value.code == 2, words
    monkeypatch.setenv("IPERF3_ARGS", "-Z --skip-rx-copy -C cubic -l 1M")
    assert module.read_settings().iperf3_args == ["-Z", "--skip-rx-copy", "-C", "cubic", "-l", "1M"]


def test_the_readme_names_the_peer_of_every_benchmark_row():
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| benchmark | longhaul |"):]
    lines = table.splitlines()[2:]
    rows = lines[: next(i for i, line in enumerate(lines + [""]) if not line.startswith("|"))]
    assert len(rows) >= 5, rows
    for row in rows:
        peer = row.split("|")[3]
        # A tool and its version (iperf3 3.12, fio 3.33, Prometheus 2.42), an engine
        # or exporter of ours at a commit, the WAN's bottleneck or the targets.
        assert re.search(
            r"(iperf3|fio) 3\.\d+|Prometheus \d+\.\d+|longhaul(-exporter)? [0-9a-f]{7}|bottleneck|target", peer
        ), row
        # Every iperf3 and every engine named, with how it runs its streams.
        for name in re.findall(r"iperf3 3\.\d+|longhaul [0-9a-f]{7}", peer):
            said = peer[peer.index(name):].split(":")[0]
            assert "thread" in said, (name, row)
