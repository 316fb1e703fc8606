"""Campaign phases for ansible/campaign.yml: which runs start together, and
the phase summary (aggregate throughput per direction and per link) written
next to the runs' own JSON.

A run's `phase` names its phase; runs without one are phases of their own.
Phases run in the order their first run appears in the campaign file.

Directions and links come from the inventory: a transfer host's `site`
variable (default: the host's own name) places it; the direction of a
transfer is "<from site>-><to site>" and its link the sending host's `link`
variable (the same one Prometheus labels its metrics with), else what the
inventory's `campaign_links` maps the pair ("siteA--siteB") to, else the
two sites in name order joined by "--".
"""


def campaign_phases(runs):
    """The runs grouped into phases, in order: [{"name", "runs"}]."""
    phases = []
    by_name = {}
    for run in runs:
        name = run.get("phase") or run["name"]
        if name not in by_name:
            by_name[name] = {"name": name, "runs": []}
            phases.append(by_name[name])
        by_name[name]["runs"].append(run)
    return phases


def _site(hosts, host):
    return (hosts.get(host) or {}).get("site") or host


def _link(hosts, sender, a, b, links):
    pair = "--".join(sorted([a, b]))
    return (hosts.get(sender) or {}).get("link") or (links or {}).get(pair, pair)


def _flows(run, result):
    """(from host, to host, payload bytes) of each direction the run moved."""
    sender, receiver = run["sender"], run["receiver"]
    direction = result.get("direction", "send")
    if direction == "bidir":
        return [
            (sender, receiver, result.get("bytes_sent", 0)),
            (receiver, sender, result.get("bytes_received", 0)),
        ]
    if direction == "receive":
        return [(receiver, sender, result.get("bytes", 0))]
    return [(sender, receiver, result.get("bytes", 0))]


def campaign_phase_summary(phase, results, hosts, links=None, start_at=None):
    """Summary of one phase.

    `results` is [{"run": <run>, "result": <the engine's final JSON>}] of the
    runs that succeeded; `hosts` maps inventory host -> its variables
    (hostvars). The phase's window runs from its first data phase start to
    its last end (`started_unix` + `seconds`); each direction's and link's
    aggregate rate is its bytes over that window, so runs that overlap add
    up and runs that do not are not counted as simultaneous.
    """
    starts, ends = [], []
    directions, by_link = {}, {}
    runs = []
    for item in results:
        run, result = item["run"], item["result"]
        begin = float(result.get("started_unix", 0.0))
        end = begin + float(result.get("seconds", 0.0))
        starts.append(begin)
        ends.append(end)
        runs.append({
            "name": run["name"],
            "sender": run["sender"],
            "receiver": run["receiver"],
            "started_unix": begin,
            "seconds": result.get("seconds", 0.0),
            "throughput_bps": result.get("throughput_bps", 0.0),
        })
        for src, dst, moved in _flows(run, result):
            a, b = _site(hosts, src), _site(hosts, dst)
            key = "%s->%s" % (a, b)
            d = directions.setdefault(key, {"from": a, "to": b, "link": _link(hosts, src, a, b, links),
                                            "bytes": 0, "runs": [], "run_bytes": {}})
            d["bytes"] += moved
            if run["name"] not in d["runs"]:
                d["runs"].append(run["name"])
            # What each run moved this way (`longhaul report` splits a bidir
            # run's interval lines by it).
            d["run_bytes"][run["name"]] = d["run_bytes"].get(run["name"], 0) + moved
    window = (max(ends) - min(starts)) if starts else 0.0
    for d in directions.values():
        d["throughput_bps"] = round(d["bytes"] * 8 / window) if window > 0 else 0
        per_link = by_link.setdefault(d["link"], {"bytes": 0, "directions": {}})
        per_link["bytes"] += d["bytes"]
        per_link["directions"]["%s->%s" % (d["from"], d["to"])] = d["throughput_bps"]
    for link in by_link.values():
        link["throughput_bps"] = round(link["bytes"] * 8 / window) if window > 0 else 0
    return {
        "type": "phase",
        "phase": phase,
        "start_at": start_at,
        "started_unix": min(starts) if starts else None,
        "ended_unix": max(ends) if ends else None,
        "start_spread_seconds": round(max(starts) - min(starts), 3) if starts else None,
        "seconds": round(window, 3),
        "runs": runs,
        "directions": directions,
        "links": by_link,
        "bytes": sum(d["bytes"] for d in directions.values()),
        "throughput_bps": round(sum(d["bytes"] for d in directions.values()) * 8 / window) if window > 0 else 0,
    }


class FilterModule:
    """The filters campaign.yml uses."""

    def filters(self):
        return {
            "campaign_phases": campaign_phases,
            "campaign_phase_summary": campaign_phase_summary,
        }
