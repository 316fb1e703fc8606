"""docs/architecture.md names every source module of the workspace: a module
added without its line there fails here (issue 42).

The rule: each workspace member (Cargo.toml's `members`) has a section of
docs/architecture.md, the first `## ` heading that names the member's
directory in backticks (`transfer-engine/src`, `exporters/longhaul-exporter`)
or its parent's (`crates/`). In it every `.rs` file under the member's `src/`
is named in backticks by its path below `src/` (`planes/disk/writer.rs`);
where one section holds several members, by the member's directory name
first (`admission/lobby.rs`). `{a,b}` in a name stands for each of a and b.
Test modules (`*tests.rs`) are left out."""

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
    """Every name in backticks in `body`, with `{a,b}` expanded."""
    names = set()
    for token in re.findall(r"`([^`\n]+)`", body):
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
    for heading, body in sections(text):
        if "`%s`" % member in heading or "`%s/src`" % member in heading:
            return body, False
        if parent and "`%s`" % parent in heading:
            return body, True
    return None, False


def missing(text):
    """Every module the document does not name where it should."""
    found = []
    for member in members():
        src = helpers.REPO / member / "src"
        body, shared = section_of(member, text)
        if body is None:
            found.append("%s: no section of docs/architecture.md names it in its heading" % member)
            continue
        names = named(body)
        prefix = member.rsplit("/", 1)[-1] + "/" if shared else ""
        for path in sorted(src.rglob("*.rs")):
            module = path.relative_to(src).as_posix()
            if module.endswith("tests.rs"):
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
    assert problems == ["transfer-engine/src/cpus.rs: not named (as `cpus.rs`) in its section"], problems


def test_brace_lists_and_shared_sections_are_read_as_written():
    assert named("`collectors/{engine,tcp}.rs` and `a{b,c}d{e,f}`") == {
        "collectors/engine.rs",
        "collectors/tcp.rs",
        "abde",
        "abdf",
        "acde",
        "acdf",
    }
    text = "## Shared (`crates/`)\n`units/lib.rs`\n## Other\n`lib.rs`\n"
    assert section_of("crates/units", text) == ("`units/lib.rs`\n", True)
