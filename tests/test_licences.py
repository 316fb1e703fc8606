"""scripts/check-licences: no AGPL package in the Go module cache, in any
lockfile of the tree or in the venv. On this machine's real caches and tree
it passes; on a scratch copy of each kind it passes as made, and fails,
naming the package, once one AGPL entry is added."""

import json
import shutil
import subprocess
import textwrap

import pytest

import helpers

SCRIPT = helpers.REPO / "scripts" / "check-licences"
AGPL_LICENSE = "                    GNU AFFERO GENERAL PUBLIC LICENSE\n                       Version 3, 19 November 2007\n"
# MPL-2.0 names the AGPL in its own text: not the AGPL.
MPL_LICENSE = (
    'Mozilla Public License Version 2.0\n\n1.12. "Secondary License"\n    means either the GNU '
    "General Public License, Version 2.0, the GNU\n    Lesser General Public License, Version "
    "2.1, the GNU Affero General\n    Public License, Version 3.0\n"
)


def check(tree, go_cache, venv):
    return subprocess.run(
        [str(SCRIPT), "--tree", str(tree), "--go-cache", str(go_cache), "--venv", str(venv)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def scratch(tmp_path):
    """An empty tree, Go module cache and venv; returns their paths."""
    paths = [tmp_path / "tree", tmp_path / "go" / "pkg" / "mod", tmp_path / "venv"]
    for path in paths:
        path.mkdir(parents=True)
    return paths


def passes_then_fails(scratch, add, names):
    """The scratch copy passes as made; after add() it fails naming `names`."""
    before = check(*scratch)
    assert before.returncode == 0, before.stderr
    add()
    after = check(*scratch)
    assert after.returncode == 1, (after.stdout, after.stderr)
    for name in names:
        assert name in after.stderr, after.stderr
    return after.stderr


def test_this_machine_and_tree_are_clean():
    """The real Go module cache, Cargo.lock, every package-lock.json of the
    tree and the venv that scripts/setup made: nothing we may not use."""
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "no AGPL module in" in done.stdout, done.stdout


def test_a_grafana_or_loki_module_in_the_go_cache_fails(scratch):
    _, mod, _ = scratch
    (mod / "github.com" / "grafana" / "grafana-plugin-sdk-go@v0.250.0").mkdir(parents=True)
    (mod / "github.com" / "prometheus" / "common@v0.60.0").mkdir(parents=True)
    (mod / "github.com" / "hashicorp" / "errwrap@v1.1.0").mkdir(parents=True)
    (mod / "github.com" / "hashicorp" / "errwrap@v1.1.0" / "LICENSE").write_text(MPL_LICENSE)

    def add():
        (mod / "github.com" / "grafana" / "loki" / "v3@v3.4.2").mkdir(parents=True)
        download = mod / "cache" / "download" / "github.com" / "grafana" / "grafana" / "@v"
        download.mkdir(parents=True)
        (download / "v0.0.0-20230609.zip").write_bytes(b"PK")
        lookup = mod / "cache" / "download" / "sumdb" / "sum.golang.org" / "lookup"
        (lookup / "github.com" / "grafana").mkdir(parents=True)
        (lookup / "github.com" / "grafana" / "tempo@v2.6.0+incompatible").write_text("")

    stderr = passes_then_fails(
        scratch,
        add,
        ["github.com/grafana/loki", "github.com/grafana/grafana", "github.com/grafana/tempo"],
    )
    assert "grafana-plugin-sdk-go" not in stderr and "errwrap" not in stderr, stderr


def test_a_module_under_the_agpl_by_its_licence_file_fails(scratch):
    _, mod, _ = scratch
    module = mod / "example.org" / "someone" / "tool@v1.2.0"

    def add():
        module.mkdir(parents=True)
        (module / "LICENSE").write_text(AGPL_LICENSE)

    passes_then_fails(scratch, add, ["example.org/someone/tool@v1.2.0"])


def test_a_go_mod_requiring_grafana_fails(scratch):
    tree = scratch[0]
    (tree / "tools").mkdir()
    go_mod = tree / "tools" / "go.mod"
    go_mod.write_text(
        "module example.org/tools\n\ngo 1.23\n\nrequire github.com/prometheus/common v0.60.0\n"
    )

    def add():
        go_mod.write_text(
            go_mod.read_text()
            + "require github.com/grafana/grafana/apps/dashboard v0.0.0-20250101\n"
        )
        (tree / "tools" / "go.sum").write_text("github.com/grafana/loki/v3 v3.4.2 h1:AAAA=\n")

    passes_then_fails(
        scratch,
        add,
        [
            "go.mod:6: github.com/grafana/grafana/apps/dashboard",
            "go.sum:1: github.com/grafana/loki/v3",
        ],
    )


def test_an_agpl_crate_in_a_cargo_lock_fails(scratch):
    """A scratch workspace whose Cargo.lock locks a crate licensed AGPL-3.0
    (a path crate: cargo metadata reads its license field as any crate's)."""
    tree = scratch[0]
    (tree / "app" / "src").mkdir(parents=True)
    (tree / "app" / "src" / "lib.rs").write_text("")
    (tree / "agpl-thing" / "src").mkdir(parents=True)
    (tree / "agpl-thing" / "src" / "lib.rs").write_text("")
    (tree / "agpl-thing" / "Cargo.toml").write_text(
        '[package]\nname = "agpl-thing"\nversion = "0.1.0"\nedition = "2021"\n'
        'license = "AGPL-3.0-or-later"\n'
    )
    manifest = tree / "app" / "Cargo.toml"
    manifest.write_text(
        '[package]\nname = "app"\nversion = "0.1.0"\nedition = "2021"\n'
        'license = "MIT OR AGPL-3.0-only"\n\n[workspace]\n\n[dependencies]\n'
    )

    def lock():
        done = subprocess.run(
            ["cargo", "generate-lockfile", "--offline", "--manifest-path", str(manifest)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr

    lock()

    def add():
        manifest.write_text(manifest.read_text() + 'agpl-thing = { path = "../agpl-thing" }\n')
        lock()

    stderr = passes_then_fails(scratch, add, ["crate agpl-thing 0.1.0 is AGPL-3.0-or-later"])
    # "MIT OR AGPL" leaves the MIT: not a finding.
    assert "crate app " not in stderr, stderr


def test_an_agpl_npm_package_in_any_package_lock_fails(scratch):
    tree = scratch[0]
    lock = tree / "web" / "package-lock.json"
    lock.parent.mkdir()
    data = {
        "name": "web",
        "lockfileVersion": 3,
        "requires": True,
        "packages": {
            "": {"name": "web", "dependencies": {"@perses-dev/core": "0.50.0"}},
            "node_modules/@perses-dev/core": {"version": "0.50.0", "license": "Apache-2.0"},
            "node_modules/dual": {"version": "1.0.0", "license": "(MIT OR AGPL-3.0)"},
        },
    }
    lock.write_text(json.dumps(data))

    def add():
        data["packages"]["node_modules/@perses-dev/core/node_modules/k6-thing"] = {
            "version": "2.0.0",
            "license": "AGPL-3.0-only",
        }
        lock.write_text(json.dumps(data))

    stderr = passes_then_fails(scratch, add, ["npm package k6-thing 2.0.0 is AGPL-3.0-only"])
    assert "dual" not in stderr, stderr


def test_an_unlicensed_npm_package_fails(scratch):
    tree = scratch[0]
    lock = tree / "package-lock.json"
    data = {"lockfileVersion": 3, "packages": {"": {}, "node_modules/a": {"license": "ISC"}}}
    lock.write_text(json.dumps(data))

    def add():
        data["packages"]["node_modules/b"] = {"version": "1.0.0", "license": "UNLICENSED"}
        data["packages"]["node_modules/c"] = {"version": "1.0.0"}
        lock.write_text(json.dumps(data))

    passes_then_fails(
        scratch,
        add,
        ["npm package b 1.0.0 is not open source", "npm package c 1.0.0 has no licence"],
    )


def test_an_npm_package_without_a_licence_field_needs_a_review_of_its_licence_file(scratch):
    """Perses's plugins name no licence in package.json; their LICENSE is
    Apache-2.0's. Such a package passes only as licences-reviewed.json (beside
    the lockfile) lists it: the same version, the installed licence file with
    the reviewed sha256. A text that merely contains a licence's words, another
    version, a changed file, an AGPL file, an unlisted or uninstalled package fail."""
    import hashlib

    tree = scratch[0]
    web = tree / "web"
    lock = web / "package-lock.json"
    modules = web / "node_modules"
    apache = "                                 Apache License\n                           Version 2.0, January 2004\n"

    def package(name, text):
        (modules / name).mkdir(parents=True)
        if text is not None:
            (modules / name / "LICENSE").write_text(text)

    package("@perses-dev/prometheus-plugin", apache)
    reviewed = {
        "@perses-dev/prometheus-plugin": {
            "version": "0.53.4",
            "licence": "Apache-2.0",
            "file": "LICENSE",
            "sha256": hashlib.sha256(apache.encode()).hexdigest(),
        }
    }
    (web / "licences-reviewed.json").write_text(json.dumps({"packages": reviewed}))
    data = {
        "lockfileVersion": 3,
        "packages": {"": {}, "node_modules/@perses-dev/prometheus-plugin": {"version": "0.53.4"}},
    }
    lock.write_text(json.dumps(data))

    def add():
        # Apache's words and a restriction after them: not what was reviewed
        package("clause", apache + "Commons Clause: you may not sell the software.\n")
        package("agpl", AGPL_LICENSE)
        package("newer", apache)
        for name in ("clause", "agpl", "newer", "unlisted", "absent"):
            data["packages"]["node_modules/" + name] = {"version": "1.0.0"}
        for name in ("clause", "agpl", "absent"):
            reviewed[name] = dict(reviewed["@perses-dev/prometheus-plugin"], version="1.0.0")
        reviewed["newer"] = dict(reviewed["@perses-dev/prometheus-plugin"], version="0.9.0")
        (web / "licences-reviewed.json").write_text(json.dumps({"packages": reviewed}))
        lock.write_text(json.dumps(data))

    stderr = passes_then_fails(
        scratch,
        add,
        [
            "npm package clause 1.0.0 has no licence (its LICENSE is not the one reviewed in "
            "licences-reviewed.json (sha256 differs))",
            "npm package agpl 1.0.0 is AGPL-3.0",
            "npm package newer 1.0.0 has no licence (licences-reviewed.json reviewed version 0.9.0, "
            "the lockfile locks 1.0.0: review its licence again)",
            "npm package unlisted 1.0.0 has no licence (none in the lockfile, and licences-reviewed.json does "
            "not list it)",
            "npm package absent 1.0.0 has no licence (",
            "is not installed to check its reviewed licence file: run npm ci)",
        ],
    )
    assert "prometheus-plugin" not in stderr, stderr


def test_an_agpl_python_package_in_the_venv_fails(scratch):
    """A distribution installed in the venv (its dist-info METADATA, as pip
    writes it) that declares the AGPL."""
    venv = scratch[2]
    site = venv / "lib" / "python3.11" / "site-packages"

    def dist(name, *headers):
        info = site / ("%s-1.0.dist-info" % name)
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            "Metadata-Version: 2.4\nName: %s\nVersion: 1.0\n%s\n" % (name, "\n".join(headers))
        )

    dist("fine", "License-Expression: Apache-2.0")
    dist("also-fine", "License: MPL 2.0", "Classifier: License :: OSI Approved :: MIT License")

    def add():
        dist("server-kit", "License-Expression: AGPL-3.0-or-later")
        dist(
            "old-style",
            "License: UNKNOWN",
            "Classifier: License :: OSI Approved :: GNU Affero General Public License v3",
        )

    stderr = passes_then_fails(
        scratch, add, ["server-kit 1.0 is AGPL-3.0-or-later", "old-style 1.0"]
    )
    assert "fine" not in stderr, stderr


def test_a_requirement_missing_from_the_venv_fails(scratch):
    """A requirement whose licence cannot be read (not installed) is not let through."""
    tree, _, venv = scratch
    (tree / "scripts").mkdir()
    (tree / "scripts" / "requirements.txt").write_text("# tools\n")
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)

    def add():
        (tree / "scripts" / "requirements.txt").write_text("# tools\nsome-linter==1.0  # new\n")

    passes_then_fails(scratch, add, ["some-linter is not installed"])


def test_usage_errors_exit_2(tmp_path):
    done = subprocess.run(
        [str(SCRIPT), "--tree", str(tmp_path / "missing")], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--tree" in done.stderr, done.stderr
    done = subprocess.run([str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert done.returncode == 2 and "--bogus" in done.stderr, done.stderr
    assert shutil.which("cargo"), "cargo is needed for the Cargo.lock check"
