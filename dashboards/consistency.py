#!/usr/bin/env python3
"""Check that the two renderings of each dashboard agree, as committed: the
Grafana JSON (dashboards/*.json) and the Perses dashboard of the live view
(dashboards/perses/*.json), both written by generate.py.

    python3 dashboards/consistency.py [DIR]      (default: this directory)

For each dashboard, fails (exit 1) naming the dashboard and the panel when
- one rendering is missing;
- a panel is in one rendering only (Grafana's annotations count as the
  panels perses.py makes of them; a repeated panel by perses.perses_title);
- a panel's queries differ: their number, or a Prometheus query's text or
  legend (an InfluxQL target's PromQL twin is the library's to keep, in
  lib/promql.py's TWINS; its count is checked);
- a panel's unit differs (through perses.UNITS);
- the variables differ (data source variables aside): names, label_values
  query (a Prometheus one), multiple values, the "All" value.

Runs in `make lint` (scripts/check-dashboards). Needs no SDK: it reads files.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perses  # noqa: E402

PERSES_DIR = "perses"


def grafana_panels(board):
    """title -> (queries, unit) of a Grafana dashboard, its annotations included.
    A query is the PromQL text, or None for an InfluxQL target."""
    panels = {}
    for panel in board.get("panels", []):
        if panel.get("type") == "row":
            continue
        queries = []
        for target in panel.get("targets", []):
            kind = (target.get("datasource") or {}).get("type")
            if kind == "prometheus":
                queries.append((target.get("expr"), target.get("legendFormat", "")))
            elif kind == "influxdb":
                # its PromQL twin is lib/promql.py's TWINS; its legend is the alias's tags
                queries.append((None, perses.legend_of_alias(target.get("alias", ""))))
            else:
                queries.append(("(a target of data source %r)" % kind, ""))
        unit = perses.UNITS.get(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "none"))
        unit = unit[0] if unit else "(no Perses unit)"
        # A state timeline names its values (mappings): no unit in either.
        panels[perses.perses_title(panel)] = (queries, None if panel["type"] == "state-timeline" else unit)
    for annotation in board.get("annotations", {}).get("list", []):
        if (annotation.get("datasource") or {}).get("type") == "prometheus":
            panels[annotation["name"]] = ([(annotation["expr"], annotation.get("titleFormat", ""))], None)
    return panels


def perses_unit(plugin):
    spec = plugin.get("spec", {})
    unit = (spec.get("yAxis") or {}).get("format", {}).get("unit") or (spec.get("format") or {}).get("unit")
    if unit is None:
        units = {c["format"]["unit"] for c in spec.get("columnSettings", []) if "format" in c}
        unit = units.pop() if len(units) == 1 else None
    return unit


def perses_panels(board):
    panels = {}
    for panel in board.get("spec", {}).get("panels", {}).values():
        spec = panel["spec"]
        queries = [
            (q["spec"]["plugin"]["spec"]["query"], q["spec"]["plugin"]["spec"].get("seriesNameFormat", ""))
            for q in spec.get("queries", [])
        ]
        panels[spec["display"]["name"]] = (queries, perses_unit(spec["plugin"]))
    return panels


def variables(grafana, persesboard):
    """Each variable as (name, label_values query or None for InfluxQL, multi, all
    value) in both renderings."""
    ours = []
    for v in grafana.get("templating", {}).get("list", []):
        if v["type"] == "datasource":
            continue
        kind = (v.get("datasource") or {}).get("type")
        # an InfluxQL variable's PromQL twin is the library's (lib/variables.py, influx_var);
        # any other kind is compared as it is
        query = None if kind == "influxdb" else v.get("query")
        ours.append(
            (v["name"], query, bool(v.get("multi")), bool(v.get("includeAll")), v.get("allValue") or None)
        )
    theirs = []
    for v in persesboard.get("spec", {}).get("variables", []):
        spec = v["spec"]
        plugin = spec.get("plugin", {}).get("spec", {})
        matchers = plugin.get("matchers") or []
        query = "label_values(%s)" % ", ".join(matchers + [plugin.get("labelName", "(no labelName)")])
        theirs.append(
            (
                spec["name"],
                query,
                bool(spec.get("allowMultiple")),
                bool(spec.get("allowAllValue")),
                spec.get("customAllValue"),
            )
        )
    # An InfluxQL variable's PromQL twin is the library's: its name and options are compared.
    theirs = [t if o[1] is not None else (t[0], None) + t[2:] for o, t in zip(ours, theirs)] + theirs[len(ours):]
    return ours, theirs


def compare(name, grafana, persesboard):
    found = []
    left, right = grafana_panels(grafana), perses_panels(persesboard)
    for title in sorted(set(left) - set(right)):
        found.append("%s: panel %r is in Grafana's dashboard only" % (name, title))
    for title in sorted(set(right) - set(left)):
        found.append("%s: panel %r is in the Perses dashboard only" % (name, title))
    for title in sorted(set(left) & set(right)):
        (ours, unit), (theirs, their_unit) = left[title], right[title]
        if len(ours) != len(theirs):
            found.append(
                "%s: panel %r has %d queries in Grafana, %d in Perses" % (name, title, len(ours), len(theirs))
            )
            continue
        for number, (one, other) in enumerate(zip(ours, theirs), start=1):
            if one[0] is not None and one[0] != other[0]:
                found.append(
                    "%s: panel %r query %d differs: Grafana %r, Perses %r" % (name, title, number, one[0], other[0])
                )
            elif one[1] != other[1]:
                found.append(
                    "%s: panel %r query %d's legend differs: Grafana %r, Perses %r"
                    % (name, title, number, one[1], other[1])
                )
        if unit is not None and unit != their_unit:
            found.append(
                "%s: panel %r unit differs: Grafana's is %r in Perses, Perses has %r"
                % (name, title, unit, their_unit)
            )
    ours, theirs = variables(grafana, persesboard)
    if ours != theirs:
        found.append("%s: variables differ: Grafana %s, Perses %s" % (name, ours, theirs))
    return found


def check(directory):
    found = []
    boards = sorted(directory.glob("*.json"))
    names = {path.name for path in boards}
    for path in sorted((directory / PERSES_DIR).glob("*.json")):
        if path.name not in names:
            found.append("%s: a Perses dashboard without a Grafana one" % path.name)
    for path in boards:
        other = directory / PERSES_DIR / path.name
        if not other.exists():
            found.append("%s: no Perses rendering (%s)" % (path.name, other))
            continue
        try:
            grafana = json.loads(path.read_text(encoding="utf-8"))
            persesboard = json.loads(other.read_text(encoding="utf-8"))
        except ValueError as error:
            found.append("%s: not JSON: %s" % (path.name, error))
            continue
        found += compare(path.name, grafana, persesboard)
    return found, len(boards)


def main(argv):
    directory = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    found, count = check(directory)
    for problem in found:
        print("consistency.py: " + problem, file=sys.stderr)
    if not found:
        print("consistency.py: %d dashboards agree in Grafana and Perses" % count)
    return 1 if found or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
