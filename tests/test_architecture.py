"""docs/architecture.md names every source module of the workspace: a module
added without its line there fails here (issue 42).

The rule: each workspace member (Cargo.toml's `members`) has a section of
docs/architecture.md, the first `## ` heading that names the member's
directory in backticks (`transfer-engine/src`, `crates/core`, `exporters/longhaul-exporter`)
or its parent's (`crates/`), its own first. In a row of a table of that
section (a line that starts with `|`: prose does not count, so a module gets
its line) every `.rs` file under the member's `src/` is named in backticks by
its path below `src/` (`planes/messages.rs`); where one section holds
several members, by the member's directory name first (`admission/lobby.rs`).
`{a,b}` in a name stands for each of a and b. Test modules (`tests.rs`,
`*_tests.rs`) are left out; a member without `src/` fails."""

import re
import tomllib

import helpers

DOC = helpers.REPO / "docs" / "architecture.md"


def members():
    workspace = tomllib.loads((helpers.REPO / "Cargo.toml").read_text(encoding="utf-8"))
    return workspace["workspace"]["members"]


def sections(text):
    """(heading, body) of each `## ` section."""
    found = []
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        found.append((heading, body))
    return found


def named(body):
    """Every name in backticks in the table rows of `body`, with `{a,b}` expanded."""
    names = set()
    rows = "\n".join(line for line in body.splitlines() if line.lstrip().startswith("|"))
    for token in re.findall(r"`([^`\n]+)`", rows):
        expanded = [token]
        while any("{" in name for name in expanded):
            next_round = []
            for name in expanded:
                match = re.search(r"\{([^{}]*)\}", name)
                if not match:
                    next_round.append(name)
                    continue
                for choice in match.group(1).split(","):
                    next_round.append(name[: match.start()] + choice.strip() + name[match.end() :])
            expanded = next_round
        names.update(expanded)
    return names


def section_of(member, text):
    """The member's section and whether it is shared with other members."""
    parent = member.rsplit("/", 1)[0] + "/" if "/" in member else None
    found = sections(text)
    for heading, body in found:
        if "`%s`" % member in heading or "`%s/src`" % member in heading:
            return body, False
    for heading, body in found:
        if parent and "`%s`" % parent in heading:
            return body, True
    return None, False


def missing(text):
    """Every module the document does not name where it should."""
    found = []
    for member in members():
        src = helpers.REPO / member / "src"
        if not src.is_dir():
            found.append("%s: no src/ directory (a member the test cannot read)" % member)
            continue
        body, shared = section_of(member, text)
        if body is None:
            found.append("%s: no section of docs/architecture.md names it in its heading" % member)
            continue
        names = named(body)
        prefix = member.rsplit("/", 1)[-1] + "/" if shared else ""
        for path in sorted(src.rglob("*.rs")):
            module = path.relative_to(src).as_posix()
            if path.name == "tests.rs" or path.name.endswith("_tests.rs"):
                continue
            if prefix + module not in names:
                found.append("%s/src/%s: not named (as `%s%s`) in its section" % (member, module, prefix, module))
    return found


def test_every_source_module_has_its_line_in_the_architecture_document():
    problems = missing(DOC.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_a_module_left_out_of_the_document_fails():
    text = DOC.read_text(encoding="utf-8")
    assert "`cpus.rs`" in text
    problems = missing(text.replace("`cpus.rs`", "`cpus`"))
    assert problems == ["crates/core/src/cpus.rs: not named (as `cpus.rs`) in its section"], problems


def test_brace_lists_and_shared_sections_are_read_as_written():
    assert named("| `collectors/{engine,tcp}.rs` and `a{b,c}d{e,f}` |") == {
        "collectors/engine.rs",
        "collectors/tcp.rs",
        "abde",
        "abdf",
        "acde",
        "acdf",
    }
    text = "## Shared (`crates/`)\n| `units/lib.rs` |\n## Other\n| `lib.rs` |\n"
    assert section_of("crates/units", text) == ("| `units/lib.rs` |\n", True)
    # a member's own section before its parent's, wherever it stands
    text += "## Units (`crates/units`)\n| `lib.rs` |\n"
    assert section_of("crates/units", text) == ("| `lib.rs` |\n", False)
    # prose names nothing: a module needs its row
    assert named("`client.rs` in a sentence\n| | `server.rs` | a row |") == {"server.rs"}
