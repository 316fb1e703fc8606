#!/usr/bin/env python3
"""Lint Grafana dashboard JSON files: our own checks of the practices the
Grafana dashboard linter documents (its rule pages: templated data sources,
job and instance variables and matchers, `$__rate_interval`, units, titles
and descriptions), for dashboards that mix Prometheus and InfluxDB, plus
what we add (fixed, unique uids; defined variables; InfluxQL time filters).
No Grafana code is run or needed.

    python3 dashboards/lint.py [DIR | FILE...]     (default: this directory)

Rules (the name is what `.lint` exclusions use):

- datasource-variables: each data source type the dashboard queries has
  exactly one data source variable, named `<type>_datasource`, and every
  panel, target, query variable and annotation query names it.
- job-instance-variables: a dashboard with Prometheus targets has `job` and
  `instance` query variables on the Prometheus data source variable:
  multi-value, with "All" as `.+`.
- job-instance-selectors: every series selector of a Prometheus target
  matches `job=~"$job"` and `instance=~"$instance"`; a recorded series (a
  name with `:`, whose rule aggregated `job` away) needs the instance only.
- rate-interval: every range in PromQL (targets and annotation queries) is
  `[$__rate_interval]`.
- units: every panel sets a unit Grafana knows.
- uids: every dashboard has a fixed uid (letters, digits, `-`, `_`; at most
  40, Grafana's limit; no variable), unique among the files checked; panel
  ids are unique within a dashboard.
- titles: every dashboard has a title, unique among the files checked; every
  panel a title and a description; every variable a label.
- variables-defined: every `$name` in a query, a variable's query or an
  annotation is a variable of the dashboard or one of Grafana's own.
- variable-refresh: query variables refresh when the time range changes.
- influxql: InfluxQL targets filter by `$timeFilter` and group by
  `time($__interval)`.

Exclusions: a `.lint` file (YAML) beside the dashboards, in the dashboard
linter's documented format: `exclusions: {RULE: {reason: ..., entries:
[{dashboard: TITLE, panel: TITLE}, ...]}}`; an entry without `panel`
excludes the whole dashboard, a rule without entries every dashboard. A
reason is required. Exit 1 with one line per finding; 2 on a usage error.
"""

import json
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent

# Grafana's own variables and macros (dashboards may use them without defining them).
GRAFANA_VARIABLES = {
    "__rate_interval",
    "__interval",
    "__interval_ms",
    "__range",
    "__range_s",
    "__range_ms",
    "__from",
    "__to",
    "__dashboard",
    "__user",
    "__org",
    "timeFilter",
    "__timeFilter",
}
# Unit ids of Grafana's value formats (its "Standard options > Unit" list) that
# dashboards of this kind use: counts, percentages, data, data rates, time,
# throughput.
UNITS = set("""
    none short percent percentunit sci locale hex hex0x dB
    bits bytes decbits decbytes kbytes mbytes gbytes tbytes pbytes
    deckbytes decmbytes decgbytes dectbytes decpbytes
    bps Bps binbps binBps Kbits KBs Mbits MBs Gbits GBs Tbits TBs Pbits PBs
    Kibits KiBs Mibits MiBs Gibits GiBs Tibits TiBs Pibits PiBs pps
    hertz ns µs ms s m h d dtdurationms dtdurations dthms dtdhms timeticks clockms clocks
    cps ops reqps rps wps iops eps mps cpm opm rpm wpm
    bool bool_yes_no bool_on_off
    """.split())
UID = re.compile(r"[A-Za-z0-9_-]{1,40}")
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")
RULES = (
    "datasource-variables",
    "job-instance-variables",
    "job-instance-selectors",
    "rate-interval",
    "units",
    "uids",
    "titles",
    "variables-defined",
    "variable-refresh",
    "influxql",
)


# --- PromQL, as far as the rules need it --------------------------------------------------

AGGREGATIONS = set("""
    sum min max avg group stddev stdvar count count_values bottomk topk quantile
    limitk limit_ratio
    """.split())
# Keywords after which a parenthesised label list follows.
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = LABEL_LISTS | {"bool", "and", "or", "unless", "offset", "atan2", "inf", "nan"}
TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)"""
    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"|(?P<braces>\{)"
    r"|(?P<range>\[)"
    r"|(?P<open>\()"
    r"|(?P<other>.)",
    re.DOTALL,
)
MATCHER = re.compile(
    r"""\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*,?"""
)


def _closing(text, start, opening, closing):
    """Index just past the bracket that closes text[start] (strings skipped)."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c in "\"'`":
            end = text.find(c, i + 1)
            while end != -1 and c != "`" and text[end - 1] == "\\":
                end = text.find(c, end + 1)
            i = len(text) if end == -1 else end + 1
            continue
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def promql_parts(expr):
    """(selectors, ranges) of a PromQL expression: each series selector as
    (metric name or "", {label: [(op, value)]}), each range's text (what is
    inside [...])."""
    selectors, ranges = [], []
    i = 0
    while i < len(expr):
        match = TOKEN.match(expr, i)
        kind = match.lastgroup
        if kind == "name":
            name = match.group("name")
            j = match.end()
            while j < len(expr) and expr[j].isspace():
                j += 1
            follows = expr[j] if j < len(expr) else ""
            if name in LABEL_LISTS and follows == "(":
                i = _closing(expr, j, "(", ")")
                continue
            if follows == "(" or name in AGGREGATIONS or name in KEYWORDS:
                i = match.end()
                continue
            labels = {}
            if follows == "{":
                end = _closing(expr, j, "{", "}")
                labels = matchers(expr[j + 1 : end - 1])
                i = end
            else:
                i = match.end()
            selectors.append((name, labels))
            continue
        if kind == "braces":
            end = _closing(expr, i, "{", "}")
            selectors.append(("", matchers(expr[i + 1 : end - 1])))
            i = end
            continue
        if kind == "range":
            end = _closing(expr, i, "[", "]")
            ranges.append(expr[i + 1 : end - 1].strip())
            i = end
            continue
        i = match.end()
    return selectors, ranges


def matchers(text):
    found, position = {}, 0
    while position < len(text):
        match = MATCHER.match(text, position)
        if not match:
            break
        label, op, quoted = match.groups()
        found.setdefault(label, []).append((op, quoted[1:-1]))
        position = match.end()
    return found


def matches_variable(labels, label, variable):
    return any(
        op in ("=", "=~") and value in ("$" + variable, "${%s}" % variable)
        for op, value in labels.get(label, [])
    )


# --- reading dashboards ------------------------------------------------------------------


def panels_of(board):
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def datasource_of(reference):
    """(type, uid) of a data source reference (a dict, an old-style name, None)."""
    if isinstance(reference, dict):
        return reference.get("type"), reference.get("uid", "")
    return None, reference or ""


def variable_name(uid):
    match = re.fullmatch(r"\$\{(\w+)\}|\$(\w+)", uid or "")
    return (match.group(1) or match.group(2)) if match else None


def query_text(target):
    for field in ("expr", "query"):
        if isinstance(target.get(field), str):
            return field, target[field]
    return None, ""


def queries(board):
    """(where, kind, datasource reference, text) of every query of a dashboard:
    panel targets (kind prometheus or influxdb by the target's data source),
    query variables and annotation queries."""
    for panel in panels_of(board):
        if panel.get("type") == "row":
            continue
        for target in panel.get("targets", []):
            reference = target.get("datasource") or panel.get("datasource")
            _, text = query_text(target)
            yield (panel.get("title", "?"), "target", reference, text, target)
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable.get("query")
            text = query.get("query", "") if isinstance(query, dict) else (query or "")
            yield (
                "variable $%s" % variable.get("name"),
                "variable",
                variable.get("datasource"),
                text,
                variable,
            )
    for annotation in board.get("annotations", {}).get("list", []):
        reference = annotation.get("datasource")
        if datasource_of(reference)[0] == "grafana":
            continue  # Grafana's built-in annotations: no query
        yield (
            "annotation %r" % annotation.get("name"),
            "annotation",
            reference,
            annotation.get("expr") or annotation.get("query") or "",
            annotation,
        )


# --- the rules ------------------------------------------------------------------------------


def lint_board(board):
    """[(rule, panel title or None, message)] of one dashboard."""
    found = []

    def finding(rule, panel, message):
        found.append((rule, panel, message))

    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}
    datasource_vars = {
        name: v.get("query") for name, v in variables.items() if v.get("type") == "datasource"
    }
    used_types = set()
    prometheus_targets = False

    # datasource-variables, variables-defined, rate-interval, selectors, influxql
    for where, kind, reference, text, item in queries(board):
        panel = where if kind == "target" else None
        source_type, uid = datasource_of(reference)
        name = variable_name(uid)
        if source_type:
            used_types.add(source_type)
        if name is None or name not in datasource_vars:
            finding(
                "datasource-variables",
                panel,
                "%s: data source %r is not a data source variable of the dashboard"
                % (where, uid or None),
            )
        elif source_type and datasource_vars[name] != source_type:
            finding(
                "datasource-variables",
                panel,
                "%s: data source $%s is %s, the query is %s"
                % (where, name, datasource_vars[name], source_type),
            )
        for match in VARIABLE.finditer(text):
            used = next(g for g in match.groups() if g)
            if used not in variables and used not in GRAFANA_VARIABLES:
                finding(
                    "variables-defined", panel, "%s: uses undefined variable $%s" % (where, used)
                )
        if source_type == "prometheus" and kind in ("target", "annotation"):
            selectors, ranges = promql_parts(text)
            for window in ranges:
                if window not in ("$__rate_interval", "${__rate_interval}"):
                    finding(
                        "rate-interval",
                        panel,
                        "%s: range [%s] instead of [$__rate_interval]: %s" % (where, window, text),
                    )
            if kind == "target":
                prometheus_targets = True
                for metric, labels in selectors:
                    shown = metric or "{%s}" % ",".join(labels)
                    if ":" not in metric and not matches_variable(labels, "job", "job"):
                        finding(
                            "job-instance-selectors",
                            panel,
                            '%s: %s has no job=~"$job" matcher: %s' % (where, shown, text),
                        )
                    if not matches_variable(labels, "instance", "instance"):
                        finding(
                            "job-instance-selectors",
                            panel,
                            '%s: %s has no instance=~"$instance" matcher: %s'
                            % (where, shown, text),
                        )
        if source_type == "influxdb" and kind == "target":
            if "$timeFilter" not in text:
                finding(
                    "influxql", panel, "%s: InfluxQL query without $timeFilter: %s" % (where, text)
                )
            if not re.search(r"GROUP BY time\(\$__interval\)", text, re.IGNORECASE):
                finding(
                    "influxql",
                    panel,
                    "%s: InfluxQL query not grouped by time($__interval): %s" % (where, text),
                )
    for source_type in sorted(used_types):
        having = [n for n, t in datasource_vars.items() if t == source_type]
        if having != ["%s_datasource" % source_type]:
            finding(
                "datasource-variables",
                None,
                "queries %s but has %s instead of one data source variable %s_datasource"
                % (source_type, having or "no data source variable", source_type),
            )

    # job-instance-variables
    if prometheus_targets:
        for name in ("job", "instance"):
            variable = variables.get(name)
            if variable is None:
                finding(
                    "job-instance-variables",
                    None,
                    "has Prometheus targets but no $%s variable" % name,
                )
                continue
            problems = []
            if variable.get("type") != "query":
                problems.append("not a query variable")
            if (
                variable_name(datasource_of(variable.get("datasource"))[1])
                != "prometheus_datasource"
            ):
                problems.append("not on $prometheus_datasource")
            if not variable.get("multi") or not variable.get("includeAll"):
                problems.append("not multi-value with All")
            if variable.get("allValue") != ".+":
                problems.append("All is %r, not .+" % variable.get("allValue"))
            if problems:
                finding("job-instance-variables", None, "$%s: %s" % (name, ", ".join(problems)))

    # variable-refresh, titles (variables)
    for name, variable in variables.items():
        if variable.get("type") == "query" and variable.get("refresh") != 2:
            finding(
                "variable-refresh",
                None,
                "variable $%s does not refresh on time range change (refresh 2)" % name,
            )
        if not variable.get("label"):
            finding("titles", None, "variable $%s has no label" % name)

    # units, titles (panels), uids (panel ids)
    ids = {}
    for panel in panels_of(board):
        title = panel.get("title")
        ids.setdefault(panel.get("id"), []).append(title)
        if panel.get("type") == "row":
            continue
        if not title:
            finding("titles", None, "a %s panel has no title" % panel.get("type"))
        if not panel.get("description"):
            finding("titles", title, "panel %r has no description" % title)
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if not unit:
            finding("units", title, "panel %r has no unit" % title)
        elif unit not in UNITS:
            finding(
                "units", title, "panel %r has unit %r, which Grafana does not know" % (title, unit)
            )
    for number, titles in ids.items():
        if number is None or len(titles) > 1:
            finding("uids", None, "panel id %s is not unique: %s" % (number, titles))
    if not board.get("title"):
        finding("titles", None, "the dashboard has no title")
    uid = board.get("uid")
    if not isinstance(uid, str) or not UID.fullmatch(uid):
        finding("uids", None, "uid %r is not a fixed uid (1-40 letters, digits, - or _)" % (uid,))
    return found


# --- exclusions and the command line -------------------------------------------------------------


def load_exclusions(path):
    """{rule: [(dashboard title or None, panel title or None)]} from a .lint file."""
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    exclusions = {}
    for rule, spec in (data.get("exclusions") or {}).items():
        if rule not in RULES:
            raise ValueError("%s: unknown rule %r (rules: %s)" % (path, rule, ", ".join(RULES)))
        if not isinstance(spec, dict) or not str(spec.get("reason") or "").strip():
            raise ValueError("%s: the exclusion of %s gives no reason" % (path, rule))
        entries = spec.get("entries") or [{}]
        exclusions[rule] = [(e.get("dashboard"), e.get("panel")) for e in entries]
    return exclusions


def excluded(exclusions, rule, dashboard, panel):
    return any(
        (d is None or d == dashboard) and (p is None or p == panel)
        for d, p in exclusions.get(rule, [])
    )


def lint(paths):
    """Findings ("file: [rule] message") of the dashboard files, exclusions applied."""
    found, boards = [], {}
    for path in paths:
        try:
            boards[path] = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            found.append("%s: not a dashboard: %s" % (path, error))
    exclusions_by_dir = {}
    for path, board in boards.items():
        if path.parent not in exclusions_by_dir:
            exclusions_by_dir[path.parent] = load_exclusions(path.parent / ".lint")
        exclusions = exclusions_by_dir[path.parent]
        for rule, panel, message in lint_board(board):
            if not excluded(exclusions, rule, board.get("title"), panel):
                found.append("%s: [%s] %s" % (path, rule, message))
    for key, rule in (("uid", "uids"), ("title", "titles")):
        seen = {}
        for path, board in boards.items():
            seen.setdefault(board.get(key), []).append(path.name)
        for value, names in seen.items():
            if len(names) > 1:
                found.append(
                    "[%s] %s %r is used by %s" % (rule, key, value, ", ".join(sorted(names)))
                )
    return found


def main(argv):
    args = argv[1:] or [str(HERE)]
    paths = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            paths += sorted(path.glob("*.json"))
        elif path.is_file():
            paths.append(path)
        else:
            print("lint.py: %s: no such file or directory" % arg, file=sys.stderr)
            return 2
    if not paths:
        print("lint.py: no dashboards in %s" % " ".join(args), file=sys.stderr)
        return 2
    try:
        found = lint(paths)
    except ValueError as error:
        print("lint.py: %s" % error, file=sys.stderr)
        return 2
    for line in found:
        print("lint.py: " + line, file=sys.stderr)
    if not found:
        print("lint.py: %d dashboards pass every rule" % len(paths))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
