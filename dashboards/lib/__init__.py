"""The library every dashboard is built from, in the spirit of the Prometheus
mixins' lib/: Grafana's SDK and the query kinds it lacks (sdk), the selectors
(promql), the template variables (variables), the panel builders (panels) and
the panels more than one dashboard draws (shared_panels).


One place defines the selectors, units and thresholds that every dashboard
shares, in the spirit of the Prometheus mixins: Prometheus panels filter by
`job` and `instance` (the host) and use `$__rate_interval`; router panels
read Telegraf's SNMP data from InfluxDB with InfluxQL. Threshold lines are
the alerts' own threshold series (longhaul:threshold:*, rules/), so they
follow whatever the prometheus role deployed. Every dashboard has a campaign
variable and annotates from Prometheus: each run of the selected campaigns
(`longhaul send --campaign NAME --run NAME`, which ansible/campaign.yml
passes; the engine keeps both with the session and the exporter puts them on
longhaul_session_info), firing longhaul alerts (ALERTS) and sessions (from
start to end, longhaul_session_info). Nothing is kept in Grafana itself.
"""
