"""The live view in Debian's Chromium for the tests: web/test/drive.mjs (headless,
playwright-core with /usr/bin/chromium) keeps one page open; this class sends
it one command at a time and reads its answer, with a time limit on each."""

import http.server
import json
import queue
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import helpers

DRIVER = helpers.REPO / "web" / "test" / "drive.mjs"
# Panels whose query has no series unless something is wrong: no firing alert.
MAY_BE_EMPTY = {"Longhaul alerts"}


class LiveView:
    def __init__(self, base, user=None, password=None, height=None):
        config = {"base": base, "user": user, "password": password}
        if height:
            config["height"] = height
        # Node's own messages to a file: a pipe nobody reads could fill and stop it.
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            ["node", str(DRIVER), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )
        self.answers = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def send(self, timeout=120, **command):
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        try:
            line = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("the browser did not answer %s in %d s" % (command, timeout)) from None
        if line is None:
            self.errors.seek(0)
            raise AssertionError("the browser driver ended: %s" % self.errors.read()[-3000:])
        answer = json.loads(line)
        assert answer.get("ok"), "the browser driver failed %s: %s" % (command, answer)
        return answer

    def open(self, path):
        return self.send(cmd="open", path=path)

    def settle(self, want="drawn", timeout_s=60, stable_s=3, allow_nodata=()):
        return self.send(
            timeout=timeout_s + stable_s + 60,
            cmd="settle",
            want=want,
            timeoutMs=int(timeout_s * 1000),
            stableMs=int(stable_s * 1000),
            allowNoData=sorted(allow_nodata),
        )

    def settle_with_data(self, timeout_s=90, may_be_empty=MAY_BE_EMPTY):
        """Every panel with data (one titled in `may_be_empty` may say "No data"),
        the states unchanged for 3 s: a panel's first answer may come before its
        variables' (Perses asks with the variables' previous values, then again),
        so a panel is given until `timeout_s` to draw its data."""
        return self.settle("data", timeout_s, allow_nodata=may_be_empty)

    def settle_recovered(self, before, timeout_s=90):
        """After Prometheus's return: every panel of `before` out of its error, with
        data or "No data" (an instant table's sessions may have ended meanwhile),
        the states unchanged for 3 s; `not_recovered` then says what is wrong."""
        return self.settle("data", timeout_s, allow_nodata={p["title"] for p in before["panels"]})

    def panel_until(self, title, holds, timeout_s=60):
        """The panel `title` read again until `holds(panel)`, at most `timeout_s`;
        returns the last reading. A legend is a virtual list that draws its first
        row, measures it, then the rest, and does so again after a refresh: one
        reading can catch it with one row (lab CI W: 1 of 8 streams listed, the
        screenshot taken next showed them)."""
        deadline = time.monotonic() + timeout_s
        while True:
            settled = self.settle("drawn", 30, stable_s=0)
            panel = next((p for p in settled["panels"] if p["title"] == title), None)
            if panel is not None and holds(panel):
                return panel
            if time.monotonic() > deadline:
                assert panel is not None, "no panel %r:\n%s" % (title, describe(settled))
                return panel
            time.sleep(0.5)

    def click(self, selector):
        """Click the first element `selector` finds; the page's path and search after."""
        return self.send(cmd="click", selector=selector)

    def text(self, selector):
        """The text of the first element `selector` finds, once it is there."""
        return self.send(cmd="text", selector=selector)["text"]

    def viewport(self, width, height):
        return self.send(cmd="viewport", width=width, height=height)

    def screenshot(self, path, full_page=True):
        return self.send(cmd="screenshot", path=str(path), fullPage=full_page)

    def queries(self):
        return self.send(cmd="queries")["queries"]

    def heap(self):
        return self.send(cmd="heap")["bytes"]

    def close(self):
        if self.process.poll() is None:
            try:
                self.send(timeout=30, cmd="quit")
            except (AssertionError, BrokenPipeError, ValueError):
                pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.errors.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def perses_board(name):
    """The Perses dashboard `name` (dashboards/perses/NAME.json)."""
    return json.loads((helpers.REPO / "dashboards" / "perses" / ("%s.json" % name)).read_text())


def panel_count(name):
    """How many panels the Perses dashboard `name` has."""
    return len(perses_board(name)["spec"]["panels"])


def refresh_requests(name):
    """What one refresh of the Perses dashboard `name` asks the store: its panel
    queries (annotations' too) and its variables (one label request each)."""
    spec = perses_board(name)["spec"]
    return sum(len(panel["spec"].get("queries", [])) for panel in spec["panels"].values()), len(spec["variables"])


def not_all_data(name, settled, may_be_empty=MAY_BE_EMPTY):
    """None when every panel of the settled page of dashboard `name` is there (a
    panel out of view is not drawn at all: the count is checked) and drew data
    (a MAY_BE_EMPTY panel may say "No data"), and the page logged no error;
    else what is wrong, by panel."""
    if len(settled["panels"]) != panel_count(name):
        return "%s: %d panels on the page, %d in the dashboard (some out of view?):\n%s" % (
            name,
            len(settled["panels"]),
            panel_count(name),
            describe(settled),
        )
    bad = [
        p
        for p in settled["panels"]
        if p["state"] != "data" and not (p["title"] in may_be_empty and p["state"] == "nodata")
    ]
    if settled["held"] and not bad and not settled["consoleErrors"]:
        return None
    return "%s (console %s; requests without an answer %s):\n%s" % (
        name,
        settled["consoleErrors"],
        settled.get("requestFailures") or "none",
        describe(settled),
    )


def not_recovered(before, back):
    """What is wrong with the panels once Prometheus is back, compared with
    `before` it went away: none may still show an error (or nothing), and each
    chart that drew series before draws series again. (An instant table's
    sessions may have ended meanwhile: it may say "No data".)"""
    problems = [p for p in back["panels"] if p["state"] not in ("data", "nodata")]
    charts = {p["title"] for p in before["panels"] if p["state"] == "data" and p.get("legendCount", 0) > 0}
    drawn = {p["title"] for p in back["panels"] if p["state"] == "data"}
    problems += [p for p in back["panels"] if p["title"] in charts - drawn]
    if back["held"] and not problems:
        return None
    return "after Prometheus came back:\n" + describe(back)


def away_and_back(view, before, stop, start, says, timeout_s=90):
    """With the page open (`before`: its panels settled with data): `stop()` the
    store it reads; every panel must say `says`, the page staying up; `start()`
    it again (also when that check fails); every panel must draw again without a
    reload. Returns the panels while it was away, and what `start()` returned."""
    stop()
    try:
        down = view.settle("error", timeout_s)
    finally:
        started = start()
    assert down["held"], "not every panel says %r:\n%s" % (says, describe(down))
    unreadable = [p["title"] for p in down["panels"] if says not in p["text"]]
    assert not unreadable, describe(down)
    back = view.settle_recovered(before, timeout_s)
    problem = not_recovered(before, back)
    assert problem is None, problem
    return down, started


def each_dashboard(view, index, failures, shots, pages="", timeout_s=90):
    """Each dashboard of `index` opened at `pages`/d/NAME (refreshed every 5 s) and
    settled with data, its screenshot in `shots` (NAME.png, or central-NAME.png
    for /central); what is not drawn goes to `failures`. Yields (entry, settled)
    for the caller's own checks of that dashboard."""
    for entry in index:
        view.open("%s/d/%s?refresh=5s" % (pages, entry["name"]))
        settled = view.settle_with_data(timeout_s)
        view.screenshot(Path(shots) / ("%s%s.png" % (pages.strip("/") + "-" if pages else "", entry["name"])))
        failure = not_all_data(entry["name"], settled)
        if failure:
            failures.append("%s%s" % (pages.strip("/") + " " if pages else "", failure))
        yield entry, settled


def describe(settled):
    """A settle's answer for a failed check: whether the panels held still, one
    line per panel (state, title, first legend entries or text), those not drawn
    with data first (a long message is cut in CI's summary), then the panels whose
    state changed once drawn (their last states in order)."""
    panels = sorted(settled["panels"], key=lambda p: p["state"] == "data")
    if settled["held"]:
        held = "held, first after %d ms" % settled["ms"]
    elif settled.get("everHeld"):
        held = "held at %d ms but not still to the end" % settled["ms"]
    else:
        held = "never held in %d ms" % settled["ms"]
    return "%s\n%s\n  states changed: %s" % (
        held,
        "\n".join(
            "  %-7s %s: %s" % (p["state"], p["title"], (p["legend"][:4] or [p["text"][:120]])) for p in panels
        ),
        settled.get("changes") or "none",
    )


class SlowStore:
    """A store that answers late: an HTTP server on loopback that passes every
    request to `upstream` (a real Prometheus) and its answer back `delay_s`
    later, as a Prometheus busy with other work would. Its `url` goes where the
    store's would; `arrived` lists the paths of the requests that reached it."""

    def __init__(self, upstream, delay_s):
        self.upstream = upstream.rstrip("/")
        self.delay_s = delay_s
        self.arrived = []
        self.lock = threading.Lock()
        store = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.pass_on(None)

            def do_POST(self):
                self.pass_on(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def pass_on(self, body):
                with store.lock:
                    store.arrived.append(self.path.split("?")[0])
                time.sleep(store.delay_s)
                headers = {"Content-Type": self.headers.get("Content-Type", "application/x-www-form-urlencoded")}
                request = urllib.request.Request(store.upstream + self.path, data=body, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        status, kind, data = answer.status, answer.headers.get("Content-Type"), answer.read()
                except urllib.error.HTTPError as error:
                    status, kind, data = error.code, error.headers.get("Content-Type"), error.read()
                except OSError as error:  # no answer upstream: said as Prometheus's own errors are
                    status, kind = 503, "application/json"
                    data = json.dumps({"status": "error", "error": "slow store: %s" % error}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind or "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the page (through nginx) gave up on it: its business

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def start_live_view(processes, workdir, prometheus_url, tmp_path, **overrides):
    """nginx on a free loopback port with the live_view role's own site (rendered
    from its template and defaults by Ansible, as the role writes it), serving
    $LONGHAUL_DIST/web and passing `prometheus_url`'s read API; returns its URL."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = helpers.free_port()
    role = helpers.REPO / "roles" / "live_view"
    site = workdir / "live-view.conf"
    settings = {
        "live_view_listen_address": "127.0.0.1:%d" % port,
        "live_view_prometheus_url": prometheus_url,
        "live_view_root": str(Path(helpers.dist_dir()) / "web"),
        **overrides,
    }
    tasks = [
        {"ansible.builtin.include_vars": {"file": str(role / "defaults" / "main.yml")}},
        {"ansible.builtin.include_vars": {"file": str(role / "vars" / "main.yml")}},
        {"ansible.builtin.set_fact": settings},
        {"ansible.builtin.template": {"src": str(role / "templates" / "live-view.conf.j2"), "dest": str(site)}},
    ]
    done = helpers.run_local_playbook(tmp_path, tasks, {"role_path": str(role)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    conf = workdir / "nginx.conf"
    conf.write_text(
        "worker_processes 1;\n"
        "pid %(w)s/nginx.pid;\n"
        "error_log %(w)s/error.log;\n"
        "events { worker_connections 256; }\n"
        "http {\n"
        "  include /etc/nginx/mime.types;\n"
        "  access_log %(w)s/access.log;\n"
        "  client_body_temp_path %(w)s/body; proxy_temp_path %(w)s/proxy;\n"
        "  fastcgi_temp_path %(w)s/fastcgi; uwsgi_temp_path %(w)s/uwsgi; scgi_temp_path %(w)s/scgi;\n"
        "  include %(site)s;\n"
        "}\n" % {"w": workdir, "site": site}
    )
    process = processes.start("nginx", ["/usr/sbin/nginx", "-c", conf, "-g", "daemon off;"])
    processes.wait_port(process, port)
    return "http://127.0.0.1:%d" % port
