"""The second rendering of longhaul's dashboards: Perses dashboards for the
live view (web/), made from the Grafana dashboards generate.py builds.

One definition, two renderings: generate.py defines every dashboard once
(panels, queries, units, variables, thresholds) and writes it as Grafana JSON;
`to_perses` turns each built dashboard into a Perses dashboard (the format of
Perses 0.52's `Dashboard` resource, rendered by its npm components). Nothing
is added by hand here: what Grafana shows, Perses shows, with these
differences, each forced by what Perses 0.52 has:

- InfluxQL targets and variables (the routers' SNMP counters) become their
  PromQL twins, which the library defines beside each InfluxQL query
  (lib/shared_panels.py's router_query, lib/variables.py's influx_var; kept in TWINS):
  the live view reads Prometheus only, and Telegraf publishes the same
  counters to it (roles/telegraf, job telegraf).
- Grafana's annotations (campaign runs, firing alerts, sessions) become panels
  of a last group, "Campaign runs, alerts and sessions": Perses 0.52 draws no
  annotations.
- A panel Grafana repeats per value of a variable is drawn once for all
  values, unstacked, its title without the variable (`perses_title`).
- Units map to Perses's nearest (`UNITS`); a per-minute rate, which Perses has
  no unit for, is a plain number whose axis says "per minute".
- Data source variables are left out: the live view has one Prometheus.

dashboards/consistency.py compares the two renderings as committed.
"""

import re

PROJECT = "longhaul"

# Grafana unit -> Perses 0.52 format unit (core's UNIT_CONFIG), with an axis label
# where Perses has no unit of that meaning.
UNITS = {
    "bps": ("bits/sec", None),
    "Bps": ("bytes/sec", None),
    "pps": ("packets/sec", None),
    "cps": ("counts/sec", None),
    "iops": ("ops/sec", None),
    "opm": ("decimal", "per minute"),
    "s": ("seconds", None),
    "bytes": ("bytes", None),
    "percentunit": ("percent-decimal", None),
    "none": ("decimal", None),
}

# Grafana's annotation queries as Perses panels, in this group.
ANNOTATIONS_GROUP = "Campaign runs, alerts and sessions"

LABEL_VALUES = re.compile(r"^label_values\((?:(?P<expr>.+),\s*)?(?P<label>[A-Za-z_][A-Za-z0-9_]*)\)$")
BY_CLAUSE = re.compile(r"\bby \(([^)]*)\)")
LEGEND_TAG = re.compile(r"\$tag_([A-Za-z_][A-Za-z0-9_]*)")


class PersesError(ValueError):
    """A Grafana dashboard has something the Perses rendering cannot carry."""


def perses_title(panel):
    """The title of a Grafana panel in Perses: a repeated panel's title
    without its variable ("CPU by mode ($instance)" -> "CPU by mode")."""
    title = panel["title"]
    repeat = panel.get("repeat")
    if repeat:
        title = re.sub(r"\s*\(\$%s\)" % re.escape(repeat), "", title).strip()
    return title


def unit_of(grafana_unit, where):
    if grafana_unit not in UNITS:
        raise PersesError("%s: unit %r has no Perses unit in perses.UNITS" % (where, grafana_unit))
    return UNITS[grafana_unit]


def query(expr, legend=""):
    spec = {"query": expr}
    if legend:
        spec["seriesNameFormat"] = legend
    return {
        "kind": "TimeSeriesQuery",
        "spec": {"plugin": {"kind": "PrometheusTimeSeriesQuery", "spec": spec}},
    }


def target_query(target, twins, where):
    """A Grafana target as a Perses query: a Prometheus target as it is, an
    InfluxQL one as its PromQL twin."""
    kind = (target.get("datasource") or {}).get("type")
    if kind == "prometheus":
        return query(target["expr"], target.get("legendFormat", ""))
    if kind == "influxdb":
        twin = twins.get((target["query"], target.get("alias")))
        if twin is None:
            raise PersesError("%s: InfluxQL target %s has no PromQL twin" % (where, target["refId"]))
        return query(twin["expr"], twin["legend"])
    raise PersesError("%s: target of data source %r" % (where, kind))


def timeseries_spec(panel, where, unstacked):
    defaults = panel["fieldConfig"]["defaults"]
    custom = defaults.get("custom", {})
    unit, label = unit_of(defaults.get("unit", "none"), where)
    y_axis = {"format": {"unit": unit}, "min": defaults.get("min", 0)}
    if label:
        y_axis["label"] = label
    visual = {
        "display": "line",
        "lineWidth": custom.get("lineWidth", 1),
        "areaOpacity": custom.get("fillOpacity", 0) / 100,
        "connectNulls": False,
    }
    stacking = (custom.get("stacking") or {}).get("mode", "none")
    if stacking != "none" and not unstacked:
        visual["stack"] = "all"
    spec = {
        "legend": {"position": "bottom", "mode": "table", "size": "small", "values": ["mean", "max"]},
        "yAxis": y_axis,
        "visual": visual,
    }
    # Grafana's overrides by query (an alert threshold's own series): red and dashed.
    refs = [t["refId"] for t in panel["targets"]]
    settings = []
    for override in panel["fieldConfig"].get("overrides", []):
        matcher = override["matcher"]
        if matcher["id"] != "byFrameRefID":
            raise PersesError("%s: override by %s" % (where, matcher["id"]))
        settings.append(
            {
                "queryIndex": refs.index(matcher["options"]),
                "colorMode": "fixed-single",
                "colorValue": "#e02f44",
                "lineStyle": "dashed",
                "areaOpacity": 0,
            }
        )
    if settings:
        spec["querySettings"] = settings
    return {"kind": "TimeSeriesChart", "spec": spec}


def stat_spec(panel, where):
    unit, _ = unit_of(panel["fieldConfig"]["defaults"].get("unit", "none"), where)
    calcs = panel["options"]["reduceOptions"]["calcs"]
    if calcs != ["lastNotNull"]:
        raise PersesError("%s: stat reduces by %s" % (where, calcs))
    return {
        "kind": "StatChart",
        "spec": {"calculation": "last-number", "format": {"unit": unit}, "sparkline": {}},
    }


def join_labels(panel):
    """The labels every target of a table aggregates by (its `by (...)`): the
    columns its rows are joined on, as Grafana's merge joins them."""
    common = None
    for target in panel.get("targets", []):
        found = BY_CLAUSE.search(target.get("expr", ""))
        labels = [label.strip() for label in found.group(1).split(",")] if found else []
        common = labels if common is None else [label for label in common if label in labels]
    return common or []


def table_spec(panel, where):
    unit, _ = unit_of(panel["fieldConfig"]["defaults"].get("unit", "none"), where)
    columns = join_labels(panel)
    transform = (
        {"kind": "JoinByColumnValue", "spec": {"columns": columns}}
        if columns
        else {"kind": "MergeSeries", "spec": {}}
    )
    return {
        "kind": "Table",
        "spec": {
            "density": "compact",
            "pagination": False,
            # Every query's value column in the panel's unit; the rows of all
            # queries joined on the labels they share, as Grafana's merge does.
            "columnSettings": [
                {"name": "value #%d" % (n + 1), "format": {"unit": unit}}
                for n in range(len(panel["targets"]))
            ]
            + [{"name": "timestamp", "hide": True}],
            "transforms": [transform],
        },
    }


def status_spec(panel):
    mappings = []
    for mapping in panel["fieldConfig"]["defaults"].get("mappings", []):
        for value, result in sorted(mapping["options"].items(), key=lambda kv: kv[1]["index"]):
            mappings.append(
                {
                    "kind": "Value",
                    "spec": {
                        "value": value,
                        "result": {"value": result["text"], "color": result["color"]},
                    },
                }
            )
    return {
        "kind": "StatusHistoryChart",
        "spec": {"legend": {"position": "bottom"}, "mappings": mappings},
    }


def panel_plugin(panel, where):
    kind = panel["type"]
    if kind == "timeseries":
        return timeseries_spec(panel, where, unstacked=bool(panel.get("repeat")))
    if kind == "stat":
        return stat_spec(panel, where)
    if kind == "table":
        return table_spec(panel, where)
    if kind == "state-timeline":
        return status_spec(panel)
    raise PersesError("%s: panel type %r has no Perses panel" % (where, kind))


def annotation_panels(board):
    """Grafana's annotation queries as panels: each run and session a line
    while it lasts (named as Grafana titles its annotation), the firing
    alerts a table."""
    panels = []
    for annotation in board.get("annotations", {}).get("list", []):
        if (annotation.get("datasource") or {}).get("type") != "prometheus":
            continue
        legend = annotation.get("titleFormat", "")
        if annotation["name"] == "Longhaul alerts":
            plugin = {
                "kind": "Table",
                "spec": {
                    "density": "compact",
                    "columnSettings": [
                        {"name": "timestamp", "hide": True},
                        {"name": "value", "hide": True},
                    ],
                },
            }
        else:
            plugin = {
                "kind": "TimeSeriesChart",
                "spec": {
                    "legend": {"position": "right", "mode": "list", "size": "small"},
                    "yAxis": {"show": False},
                    "visual": {"display": "line", "lineWidth": 3, "areaOpacity": 0},
                },
            }
        panels.append(
            {
                "title": annotation["name"],
                "description": "In Grafana an annotation of every panel: %s."
                % annotation.get("textFormat", legend),
                "plugin": plugin,
                "queries": [query(annotation["expr"], legend)],
            }
        )
    return panels


def list_variable(variable, twins, where):
    """A Grafana query variable as a Perses list variable of label values."""
    text = variable["query"]
    kind = (variable.get("datasource") or {}).get("type")
    if kind == "influxdb":
        twin = twins.get((text, None))
        if twin is None:
            raise PersesError("%s: InfluxQL variable %s has no PromQL twin" % (where, variable["name"]))
        text = twin["expr"]
    match = LABEL_VALUES.match(text)
    if match is None:
        raise PersesError("%s: variable %s is not label_values(...)" % (where, variable["name"]))
    plugin_spec = {"labelName": match.group("label")}
    if match.group("expr"):
        plugin_spec["matchers"] = [match.group("expr")]
    spec = {
        "name": variable["name"],
        "display": {"name": variable.get("label") or variable["name"], "hidden": False},
        "allowAllValue": bool(variable.get("includeAll")),
        "allowMultiple": bool(variable.get("multi")),
        "sort": "alphabetical-asc",
        "plugin": {"kind": "PrometheusLabelValuesVariable", "spec": plugin_spec},
    }
    if variable.get("includeAll"):
        spec["defaultValue"] = "$__all"
        if variable.get("allValue"):
            spec["customAllValue"] = variable["allValue"]
    return {"kind": "ListVariable", "spec": spec}


def duration(grafana_from):
    match = re.fullmatch(r"now-(\d+[smhdw])", grafana_from)
    if match is None:
        raise PersesError("time range from %r is not now-<duration>" % grafana_from)
    return match.group(1)


def to_perses(board, twins):
    """The Perses dashboard of a built Grafana dashboard. `twins` maps each
    InfluxQL target's (query text, alias), and each InfluxQL variable's (query
    text, None), to its PromQL twin {"expr", "legend"}."""
    name = board["uid"]
    panels = {}
    layouts = []
    group = None

    def new_group(title):
        grid = {"kind": "Grid", "spec": {"items": []}}
        if title:
            grid["spec"]["display"] = {"title": title, "collapse": {"open": True}}
        layouts.append(grid)
        return grid

    def place(grid, key, box, title, description, plugin, queries):
        """A panel under `key`, and its place (x, y, width, height) in `grid`."""
        panels[key] = {
            "kind": "Panel",
            "spec": {
                "display": {"name": title, "description": description},
                "plugin": plugin,
                "queries": queries,
            },
        }
        x, y, width, height = box
        grid["spec"]["items"].append(
            {"x": x, "y": y, "width": width, "height": height, "content": {"$ref": "#/spec/panels/%s" % key}}
        )

    top = 0
    for panel in board["panels"]:
        where = "%s: %s" % (name, panel["title"])
        pos = panel["gridPos"]
        if panel["type"] == "row":
            group = new_group(panel["title"])
            top = pos["y"] + pos["h"]
            continue
        if group is None:
            group = new_group(None)
        place(
            group,
            "panel%d" % panel["id"],
            (pos["x"], pos["y"] - top, pos["w"], pos["h"]),
            perses_title(panel),
            panel.get("description", ""),
            panel_plugin(panel, where),
            [target_query(t, twins, where) for t in panel.get("targets", [])],
        )
    extra = annotation_panels(board)
    if extra:
        grid = new_group(ANNOTATIONS_GROUP)
        for number, panel in enumerate(extra):
            place(
                grid,
                "annotation%d" % (number + 1),
                (8 * (number % 3), 8 * (number // 3), 8, 8),
                panel["title"],
                panel["description"],
                panel["plugin"],
                panel["queries"],
            )
    variables = []
    for variable in board.get("templating", {}).get("list", []):
        if variable["type"] == "datasource":
            continue
        if variable["type"] != "query":
            raise PersesError("%s: variable %s of type %s" % (name, variable["name"], variable["type"]))
        variables.append(list_variable(variable, twins, name))
    return {
        "kind": "Dashboard",
        "metadata": {"name": name, "project": PROJECT},
        "spec": {
            "display": {"name": board["title"], "description": board.get("description", "")},
            "duration": duration(board["time"]["from"]),
            "refreshInterval": board.get("refresh", "0s"),
            "variables": variables,
            "panels": panels,
            "layouts": layouts,
        },
    }


def legend_of_alias(alias):
    """An InfluxQL alias's tags ($tag_router) as Prometheus legend labels ({{router}})."""
    return LEGEND_TAG.sub(lambda m: "{{%s}}" % m.group(1), alias)
