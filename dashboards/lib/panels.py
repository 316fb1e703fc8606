"""The panel builders (time series, stat, table, state timeline, row), their
targets, the annotations from Prometheus, and `dashboard()`, which puts a
dashboard together and returns its JSON."""

import json

import perses

from lib.sdk import (
    INFLUX,
    PROM,
    Built,
    InfluxQLQuery,
    JSONEncoder,
    PrometheusAnnotationQuery,
    common,
    common_builder,
    dashboard_builder,
    model,
    prometheus_builder,
    prometheus_model,
    stat_builder,
    statetimeline_builder,
    table_builder,
    timeseries_builder,
)
from lib.promql import ALERT_NAMES, CAMPAIGN, PROTOCOL, SESSION, TAG, TWINS, UIDS


def prom_target(expr, legend="", ref="A", instant=False, table=False):
    target = (
        prometheus_builder.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(PROM)
    )
    if instant:
        target.instant()
    if table:
        target.format(prometheus_model.PromQueryFormat.TABLE)
    return target


def influx_target(queries, alias, ref="A"):
    """An InfluxQL target from `queries`, (InfluxQL, its PromQL twin): the
    twin, with the alias's tags as legend labels, is what the Perses
    rendering (perses.py) draws, from the counters Telegraf also publishes to
    Prometheus."""
    query, twin = queries
    TWINS[(query, alias)] = {"expr": twin, "legend": perses.legend_of_alias(alias)}
    return Built(InfluxQLQuery(query=query, alias=alias, ref_id=ref, datasource=INFLUX))


def _common(panel, title, description, unit, targets, width, height):
    """What every panel has: title, description, unit, the first target's data
    source for the panel, the targets, its size."""
    panel.title(title).description(description).unit(unit).datasource(
        targets[0].build().datasource
    ).span(width).height(height)
    for target in targets:
        panel.with_target(target)
    return panel


def legend_table():
    return (
        common_builder.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["mean", "max"])
    )


def tooltip_all():
    return (
        common_builder.VizTooltipOptions()
        .mode(common.TooltipDisplayMode.MULTI)
        .sort(common.SortOrder.DESCENDING)
    )


def timeseries(
    title,
    description,
    unit,
    targets,
    stack=False,
    repeat=None,
    threshold_refs=(),
    full_width=False,
):
    panel = _common(
        timeseries_builder.Panel(), title, description, unit, targets, 24 if full_width else 12, 8
    )
    panel.min(0).fill_opacity(30 if stack else 10).line_width(1).show_points(
        common.VisibilityMode.NEVER
    ).legend(legend_table()).tooltip(tooltip_all())
    if stack:
        panel.stacking(common_builder.StackingConfig().mode(common.StackingMode.NORMAL).group("A"))
    for ref in threshold_refs:
        # The alert threshold's own series, drawn as a dashed red line.
        panel.override_by_query(
            ref,
            [
                model.DynamicConfigValue(
                    id_val="color", value={"mode": "fixed", "fixedColor": "red"}
                ),
                model.DynamicConfigValue(
                    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                ),
                model.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
            ],
        )
    if repeat:
        panel.repeat(repeat).repeat_direction("h")
    return panel


def stat(title, description, unit, targets):
    return (
        _common(stat_builder.Panel(), title, description, unit, targets, 6, 4)
        .reduce_options(
            common_builder.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)
        )
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.AREA)
        .text_mode(common.BigValueTextMode.AUTO)
    )


def table(title, description, unit, targets):
    return (
        _common(table_builder.Panel(), title, description, unit, targets, 12, 8)
        .show_header(True)
        .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            model.DataTransformerConfig(
                id_val="organize", options={"excludeByName": {"Time": True}}
            )
        )
    )


def state_timeline(title, description, targets, states):
    """A state timeline whose values are named and coloured by `states`
    ({value: (text, colour)})."""
    mapping = model.ValueMap(
        options={
            str(value): model.ValueMappingResult(text=text, color=color, index=index)
            for index, (value, (text, color)) in enumerate(sorted(states.items()))
        }
    )
    return (
        _common(statetimeline_builder.Panel(), title, description, "none", targets, 12, 8)
        .mappings([mapping])
        .fill_opacity(70)
        .line_width(0)
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .legend(
            common_builder.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(tooltip_all())
    )


def row(title):
    return dashboard_builder.Row(title)


def prometheus_annotations(variable_names):
    """Annotations from Prometheus: each run of the selected campaigns, firing
    longhaul alerts, and every session, each run and session a region from its
    start to its end (the engine lists a session while it runs and for a
    minute after), sessions tagged with their protocol (longhaul or iperf3).
    Sessions are filtered by the dashboard's instance, session, protocol and
    campaign variables where it has them; a campaign's runs by the campaign
    variable only (a run's session is listed by its receiving engine, which
    need not be a selected host)."""
    where = ['job=~"$job"'] if "job" in variable_names else []
    where += ['instance=~"$instance"'] if "instance" in variable_names else []
    where += [SESSION] if "session" in variable_names else []
    where += [PROTOCOL] if "protocol" in variable_names else []
    where += [CAMPAIGN] if "campaign" in variable_names else []
    alert_where = ['alertstate="firing"', 'alertname=~"%s"' % ALERT_NAMES]
    return [
        Built(
            PrometheusAnnotationQuery(
                name="Campaign runs",
                expr='max by (campaign, run) (longhaul_session_info{%s, campaign!=""})' % CAMPAIGN,
                icon_color="purple",
                step="30s",
                title_format="{{campaign}}: run {{run}}",
                text_format="campaign {{campaign}}, run {{run}}",
                tag_keys="campaign,run",
            )
        ),
        Built(
            PrometheusAnnotationQuery(
                name="Longhaul alerts",
                expr="max by (alertname, severity, scope, instance, session, direction, peer_host, "
                "protocol) "
                "(ALERTS{%s})" % ", ".join(alert_where),
                icon_color="red",
                step="30s",
                title_format="{{alertname}} ({{severity}})",
                text_format="{{instance}} {{peer_host}} session {{session}} {{direction}}",
                tag_keys="scope,severity,protocol",
            )
        ),
        Built(
            PrometheusAnnotationQuery(
                name="Sessions",
                expr="max by (instance, session, protocol, peer_host, mode, direction) "
                "(longhaul_session_info{%s})" % ", ".join(where),
                icon_color="blue",
                step="30s",
                title_format="session {{session}}",
                text_format="{{peer_host}} and {{instance}}, {{mode}}, {{direction}} on {{instance}}",
                tag_keys="protocol,mode,direction",
            )
        ),
    ]


def dashboard(key, title, description, variables, panels):
    """A dashboard: the shared settings, links, annotations, the variables and
    the panels laid out in order (the SDK's grid layout) with ids 1, 2, ..."""
    board = (
        dashboard_builder.Dashboard(title)
        .uid(UIDS[key])
        .description(description)
        .tags([TAG])
        .readonly()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("10s")
        .time("now-30m", "now")
        .timezone("utc")
        .link(
            dashboard_builder.DashboardLink("longhaul")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(False)
            .include_vars(False)
            .keep_time(True)
            .target_blank(False)
        )
    )
    names = [variable.build().name for variable in variables]
    if "prometheus_datasource" in names:
        for annotation in prometheus_annotations(names):
            board.annotation(annotation)
    for variable in variables:
        board.with_variable(variable)
    for number, panel in enumerate(panels, start=1):
        panel.id(number)
        if isinstance(panel, dashboard_builder.Row):
            board.with_row(panel)
        else:
            board.with_panel(panel)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))
