"""The transfer hosts' roles refuse listen addresses their services cannot
take before they touch a host: before, longhaul_engine took "0.0.0.0:99999"
(it only asked for ADDR:DIGITS), `longhaul serve` then exited at start, and
systemd, and so Ansible, called the service started. The preflights run
here for real, on localhost, as the roles run them.
"""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import run_local_playbook

REPO = Path(__file__).resolve().parent.parent
ROLES = REPO / "roles"


def preflight(tmp_path, role, **overrides):
    tasks = [{"ansible.builtin.include_role": {"name": role, "tasks_from": "preflight.yml"}}]
    done = run_local_playbook(
        tmp_path, tasks, overrides, gather_facts=True, env={"ANSIBLE_ROLES_PATH": str(ROLES)}
    )
    return done.returncode == 0, done.stdout + done.stderr


# What the engine's preflight needs besides the addresses (the binary is
# this tree's dist/longhaul, which `make build` wrote).
ENGINE = {"longhaul_engine_token": "t0ken"}


@pytest.mark.parametrize(
    "overrides, says",
    [
        ({"longhaul_engine_listen": "0.0.0.0:99999"}, "port 1-65535"),
        ({"longhaul_engine_listen": "0.0.0.0:0"}, "port 1-65535"),
        ({"longhaul_engine_stats_listen": "127.0.0.1"}, "port 1-65535"),
        ({"longhaul_engine_stats_listen": ":7401"}, "port 1-65535"),
        ({"longhaul_engine_listen": "[::1:7400"}, "port 1-65535"),
        ({"longhaul_engine_iperf3_listen": "0.0.0.0:70000"}, "must be ADDR:PORT (port 1-65535)"),
    ],
    ids=["port-too-big", "port-0", "no-port", "no-address", "broken-brackets", "iperf3-port"],
)
def test_the_engine_role_refuses_an_address_serve_cannot_take(tmp_path, overrides, says):
    passed, output = preflight(tmp_path, "longhaul_engine", **ENGINE, **overrides)
    assert not passed, output[-3000:]
    assert says in output, output[-3000:]


def test_the_engine_role_takes_the_addresses_serve_takes(tmp_path):
    passed, output = preflight(
        tmp_path,
        "longhaul_engine",
        **ENGINE,
        longhaul_engine_listen="[::]:7400",
        longhaul_engine_stats_listen="127.0.0.1:65535",
        longhaul_engine_iperf3_listen="",
    )
    assert passed, output[-3000:]


@pytest.mark.parametrize(
    "overrides",
    [
        {"longhaul_exporter_web_listen_address": ":97430"},
        {"longhaul_exporter_web_listen_address": "9743"},
        {"longhaul_exporter_engine_url": "127.0.0.1:7401"},
        {"longhaul_exporter_engine_url": "http://127.0.0.1:7401/v1 x"},
    ],
    ids=["port-too-big", "no-colon", "no-scheme", "garbage"],
)
def test_the_exporter_role_refuses_what_the_exporter_cannot_take(tmp_path, overrides):
    passed, output = preflight(tmp_path, "longhaul_exporter", **overrides)
    assert not passed, output[-3000:]
    assert "longhaul_exporter_web_listen_address must be [ADDR]:PORT" in output, output[-3000:]


def test_the_exporter_reads_the_engine_where_the_inventory_put_it(tmp_path):
    # The engine's stats API moved (longhaul_engine_stats_listen): the
    # exporter follows it, a wildcard address reached on loopback; before,
    # it kept reading 127.0.0.1:7401 and saw no engine.
    out = tmp_path / "url"
    tasks = [
        {
            "ansible.builtin.include_role": {
                "name": "longhaul_exporter",
                "tasks_from": "preflight.yml",
                "public": True,
            }
        },
        {
            "ansible.builtin.copy": {
                "content": "{{ longhaul_exporter_engine_url }}",
                "dest": str(out),
                "mode": "0644",
            }
        },
    ]
    for stats, url in [
        ("0.0.0.0:7411", "http://127.0.0.1:7411"),
        ("192.0.2.7:7401", "http://192.0.2.7:7401"),
        ("[::]:7401", "http://[::1]:7401"),
    ]:
        done = run_local_playbook(
            tmp_path,
            tasks,
            {"longhaul_engine_stats_listen": stats, "role_path": str(ROLES / "longhaul_exporter")},
            gather_facts=True,
            env={"ANSIBLE_ROLES_PATH": str(ROLES)},
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert out.read_text() == url, (stats, out.read_text())


# The grafana role: what it needs besides the install settings.
GRAFANA = {"grafana_admin_password": "not-the-default"}


@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            {
                "grafana_install": True,
                "grafana_install_method": "deb",
                "grafana_deb_src": "/nonexistent.deb",
            },
            "grafana_install_method=deb needs grafana_deb_src",
        ),
        (
            {"grafana_install": True, "grafana_install_method": "artifact"},
            "grafana_install_method=artifact needs grafana_artifact_src",
        ),
        ({"grafana_install_method": "snap"}, "must be repo, deb or artifact"),
        ({"grafana_version": "9.5.2"}, "is not a Grafana release of 10.4 or newer"),
    ],
    ids=["deb-missing", "artifact-missing", "method", "too-old"],
)
def test_the_grafana_role_refuses_what_it_cannot_install(tmp_path, overrides, says):
    passed, output = preflight(tmp_path, "grafana", **{**GRAFANA, **overrides})
    assert not passed, output[-3000:]
    assert says in output, output[-3000:]


@pytest.mark.parametrize(
    "overrides",
    [
        {"grafana_install": True, "grafana_version": "10.4.15"},
        {
            "grafana_install": "auto",
            "grafana_install_method": "deb",
            "grafana_deb_src": "/nonexistent.deb",
        },
        {"grafana_install": "auto"},
    ],
    ids=["pinned", "auto-deb-missing", "auto-repo"],
)
def test_the_grafana_role_takes_what_it_can_install_or_provisions_only(tmp_path, overrides):
    passed, output = preflight(tmp_path, "grafana", **{**GRAFANA, **overrides})
    assert passed, output[-3000:]
    skipped = "Grafana is NOT installed" in output
    assert skipped == (overrides["grafana_install"] is not True), output[-3000:]


# --- TLS and basic auth of the exporters (issue 41) ------------------------------------

HASH = "$2b$12$" + "a" * 53
TLS = {"cert_file": "/etc/ssl/certs/longhaul-host.pem", "key_file": "/etc/ssl/private/k.key"}


# The roles that serve the web configuration format, and their variables' prefix.
WEB_ROLES = {
    "node_exporter": "node_exporter",
    "longhaul_exporter": "longhaul_exporter",
    "prometheus": "prometheus_web",
    "alertmanager": "alertmanager_web",
}


def exporter_tls(role, users, **tls):
    """The role's TLS and user variables, named as that role names them."""
    prefix = WEB_ROLES[role]
    found = {"%s_basic_auth_users" % prefix: users}
    for key, value in tls.items():
        found["%s_tls_%s" % (prefix, key)] = value
    return found


@pytest.mark.parametrize("role", sorted(WEB_ROLES))
@pytest.mark.parametrize(
    "users, tls",
    [
        ({"prometheus": HASH}, {}),
        ({"prometheus": "$2b$15$" + "a" * 53}, TLS),
        ({"prometheus": "$2b$12$" + "a" * 53 + "\n"}, TLS),
        ({"prometheus": "plain password"}, TLS),
        ({"pro:metheus": HASH}, TLS),
    ],
    ids=["users-without-tls", "cost-15", "trailing-newline", "not-a-hash", "colon-in-user"],
)
def test_the_exporter_roles_refuse_passwords_they_cannot_guard(tmp_path, role, users, tls):
    # Before: longhaul_exporter took users without TLS (passwords in clear), any
    # two-digit cost (15 and more let one guess cost seconds), a trailing newline,
    # and a user with a colon that basic auth cannot carry; node_exporter had no check.
    passed, output = preflight(tmp_path, role, **exporter_tls(role, users, **tls))
    assert not passed, output[-3000:]
    assert "needs TLS (passwords must not cross the network in clear)" in output, output[-3000:]


@pytest.mark.parametrize("role", sorted(WEB_ROLES))
def test_the_exporter_roles_take_tls_with_bcrypt_users(tmp_path, role):
    # a user name YAML reads as a number is a user name too
    users = {"prometheus": HASH, 1234: "$2y$04$" + "b" * 53}
    # Prometheus' self-scrape must get through its own door: the CA and a user of its own
    own = {
        "prometheus_scrape_tls_ca_file": "/usr/local/share/ca-certificates/longhaul-ca.crt",
        "prometheus_scrape_basic_auth": {"username": "prometheus", "password": "p" * 32},
    } if role == "prometheus" else {}
    passed, output = preflight(tmp_path, role, **exporter_tls(role, users, **TLS), **own)
    assert passed, output[-3000:]


@pytest.mark.parametrize(
    "overrides, says",
    [
        ({"longhaul_pki_renew_days": 400}, "must be above 0 and below longhaul_pki_cert_days"),
        ({"longhaul_pki_bcrypt_cost": 15}, "must be 10-14"),
        ({"longhaul_pki_credentials": {"scrape": "pro:metheus"}}, "basic auth cannot carry a colon"),
        ({"longhaul_pki_credentials": {"Scrape": "prometheus"}}, "credential names (lowercase"),
        ({"longhaul_pki_scrape_password": "short"}, "must be a string of 16 to 72 bytes"),
        ({"longhaul_pki_scrape_password": "x" * 73}, "must be a string of 16 to 72 bytes"),
        # 40 characters, 80 bytes: bcrypt would ignore the last 8
        ({"longhaul_pki_scrape_password": "é" * 40}, "must be a string of 16 to 72 bytes"),
    ],
    ids=["renew-after-end", "cost-15", "colon-in-user", "name-uppercase", "short", "too-long", "too-many-bytes"],
)
def test_the_pki_role_refuses_what_it_cannot_keep(tmp_path, overrides, says):
    passed, output = preflight(tmp_path, "longhaul_pki", **overrides)
    assert not passed, output[-3000:]
    assert says in output, output[-3000:]


def test_the_pki_role_takes_its_defaults_and_an_inventory_password(tmp_path):
    passed, output = preflight(tmp_path, "longhaul_pki", longhaul_pki_scrape_password="p" * 32)
    assert passed, output[-3000:]


def test_the_pki_role_keeps_its_secrets_out_of_the_inventory(tmp_path):
    # An inventory directory's every file is inventory to Ansible, hidden ones
    # aside: a password file there became a host, its name (the password) printed
    # in the run's recap (the lab's first run of site.yml with this role).
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    tasks = [{"ansible.builtin.include_role": {"name": "longhaul_pki", "tasks_from": "preflight.yml"}}]
    for name, refused in (
        ("longhaul-secrets", True),
        ("private/pki", True),
        ("secrets/", True),
        (".", True),
        (".longhaul-secrets", False),
        (".private/pki", False),
        ("../elsewhere", False),
    ):
        done = run_local_playbook(
            tmp_path,
            tasks,
            {"longhaul_pki_dir": str(inventory / name)},
            gather_facts=False,
            env={"ANSIBLE_ROLES_PATH": str(ROLES), "ANSIBLE_INVENTORY": str(inventory)},
        )
        output = done.stdout + done.stderr
        assert (done.returncode != 0) == refused, output[-3000:]
        if refused:
            assert "Ansible would read the CA and the passwords as inventory" in output, output[-3000:]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"prometheus_scrape_tls_ca_file": "/ca.crt", "prometheus_scrape_basic_auth": {"username": "x", "password": "p" * 32}},
    ],
    ids=["self-scrape-without-the-ca", "self-scrape-as-a-stranger"],
)
def test_the_prometheus_role_refuses_a_self_scrape_its_own_door_refuses(tmp_path, overrides):
    web = exporter_tls("prometheus", {"prometheus": HASH}, **TLS)
    passed, output = preflight(tmp_path, "prometheus", **web, **overrides)
    assert not passed, output[-3000:]
    assert "with prometheus_self_scrape, TLS" in output, output[-3000:]


# iperf3's RSA login from the inventory (roles/longhaul_engine): the preflight reads
# only the key's PEM head, so a head with any body stands for a key here.
IPERF3_KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----"
IPERF3_USER = {"name": "noc", "password": "eight-or-more"}


@pytest.mark.parametrize(
    "overrides",
    [
        {"longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY},
        {"longhaul_engine_iperf3_users": [IPERF3_USER]},
        {"longhaul_engine_iperf3_rsa_private_key": "ssh-rsa AAAA", "longhaul_engine_iperf3_users": [IPERF3_USER]},
        {
            "longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY,
            "longhaul_engine_iperf3_users": [{"name": "a,b", "password": "eight-or-more"}],
        },
        {
            "longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY,
            "longhaul_engine_iperf3_users": [{"name": "noc", "password": "short"}],
        },
        {
            "longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY,
            "longhaul_engine_iperf3_users": [{"name": "noc", "password": "two\nlines here"}],
        },
        {
            "longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY,
            "longhaul_engine_iperf3_users": [{"name": "noc", "password": "two words here"}],
        },
        {
            "longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY,
            "longhaul_engine_iperf3_users": [{"name": "noc", "password": "x" * 129}],
        },
        {
            "longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY,
            "longhaul_engine_iperf3_users": [{"name": "noc\n", "password": "eight-or-more"}],
        },
        {
            "longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY,
            "longhaul_engine_iperf3_users": [{"name": "n" * 64, "password": "x" * 121}],
        },
        {
            "longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY,
            "longhaul_engine_iperf3_users": [{"name": "noc", "password": "\u00e9" * 8}],
        },
        {"longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY, "longhaul_engine_iperf3_users": [IPERF3_USER] * 2},
        {
            "longhaul_engine_iperf3_rsa_private_key": IPERF3_KEY,
            "longhaul_engine_iperf3_users": [IPERF3_USER],
            "longhaul_engine_iperf3_rsa_private_key_path": "/etc/k.pem",
            "longhaul_engine_iperf3_authorized_users_path": "/etc/u",
        },
        {
            "longhaul_engine_iperf3_rsa_private_key_path": "/etc/longhaul/iperf3/mine.pem",
            "longhaul_engine_iperf3_authorized_users_path": "/etc/u",
        },
        {
            "longhaul_engine_iperf3_rsa_private_key_path": "/etc/k.pem",
            "longhaul_engine_iperf3_authorized_users_path": "/etc/longhaul//iperf3/users",
        },
        {
            "longhaul_engine_iperf3_rsa_private_key_path": "/etc/longhaul/./iperf3/mine.pem",
            "longhaul_engine_iperf3_authorized_users_path": "/etc/u",
        },
    ],
    ids=["key-alone", "users-alone", "not-pem", "comma-in-name", "short-password", "two-line-password",
         "space-in-password", "password-too-long", "name-with-newline", "login-over-one-block", "not-ascii",
         "user-twice", "key-and-paths", "own-files-in-the-roles-directory", "double-slash", "dot-segment"],
)
def test_the_engine_role_refuses_an_iperf3_login_it_cannot_write(tmp_path, overrides):
    passed, output = preflight(tmp_path, "longhaul_engine", **ENGINE, **overrides)
    assert not passed, output[-3000:]
    assert "iperf3 authentication" in output, output[-3000:]


def test_the_engine_role_takes_an_iperf3_login_from_the_inventory(tmp_path):
    passed, output = preflight(
        tmp_path,
        "longhaul_engine",
        **ENGINE,
        longhaul_engine_iperf3_rsa_private_key=IPERF3_KEY,
        longhaul_engine_iperf3_users=[
            IPERF3_USER,
            {"name": "perfsonar@site-b", "password": "x" * 128},
            {"name": "n" * 64, "password": "x" * 120},
        ],
    )
    assert passed, output[-3000:]


@pytest.mark.parametrize(
    "overrides",
    [
        {"influxdb_https_cert_file": TLS["cert_file"]},
        {"influxdb_https_key_file": TLS["key_file"]},
        {"influxdb_https_key_group": "ssl-cert"},
        {"influxdb_https_ca_file": "/etc/ca.pem"},
        {"influxdb_https_cert_file": TLS["cert_file"], "influxdb_https_key_file": TLS["key_file"],
         "influxdb_https_key_group": "ssl cert"},
    ],
    ids=["cert-alone", "key-alone", "group-without-tls", "ca-without-tls", "bad-group"],
)
def test_the_influxdb_role_refuses_https_without_its_files(tmp_path, overrides):
    passed, output = preflight(tmp_path, "influxdb", influxdb_admin_password="eight-or-more", **overrides)
    assert not passed, output[-3000:]
    assert "influxdb_https_cert_file and influxdb_https_key_file go together" in output, output[-3000:]


TELEGRAF_TLS = {
    "telegraf_binary_src": "/bin/true",
    "telegraf_prometheus_client_tls_cert": TLS["cert_file"],
    "telegraf_prometheus_client_tls_key": TLS["key_file"],
}


@pytest.mark.parametrize(
    "overrides",
    [
        {"telegraf_prometheus_client_basic_username": "prometheus", "telegraf_prometheus_client_basic_password": "p" * 32},
        {**TELEGRAF_TLS, "telegraf_prometheus_client_basic_username": "prometheus"},
        {**TELEGRAF_TLS, "telegraf_prometheus_client_basic_password": "p" * 32},
        {**TELEGRAF_TLS, "telegraf_prometheus_client_basic_username": "a:b",
         "telegraf_prometheus_client_basic_password": "p" * 32},
        {"telegraf_prometheus_client_tls_cert": TLS["cert_file"]},
    ],
    ids=["password-without-tls", "user-alone", "password-alone", "colon-in-user", "cert-alone"],
)
def test_the_telegraf_role_refuses_a_prometheus_login_it_cannot_guard(tmp_path, overrides):
    passed, output = preflight(tmp_path, "telegraf", **{"telegraf_binary_src": "/bin/true", **overrides})
    assert not passed, output[-3000:]
    assert "a password needs TLS" in output, output[-3000:]


def test_the_telegraf_role_takes_tls_with_its_user(tmp_path):
    passed, output = preflight(
        tmp_path,
        "telegraf",
        **TELEGRAF_TLS,
        telegraf_prometheus_client_tls_key_group="ssl-cert",
        telegraf_prometheus_client_basic_username="prometheus",
        telegraf_prometheus_client_basic_password="p" * 32,
    )
    assert passed, output[-3000:]


JOB_LOGIN = {"username": "telegraf", "password": "p" * 32}


@pytest.mark.parametrize(
    "overrides",
    [
        {"prometheus_scrape_job_basic_auth": {"telegraf": JOB_LOGIN}},
        {"prometheus_scrape_tls_ca_file": "/ca.crt", "prometheus_scrape_job_basic_auth": {"tele graf": JOB_LOGIN}},
        {"prometheus_scrape_tls_ca_file": "/ca.crt", "prometheus_scrape_job_basic_auth": {"telegraf": {"username": "t"}}},
        {
            "prometheus_scrape_tls_ca_file": "/ca.crt",
            "prometheus_scrape_job_basic_auth": {"telegraf": {"username": "", "password": "p" * 32}},
        },
        {"prometheus_scrape_tls_ca_file": "/ca.crt", "prometheus_scrape_job_basic_auth": {"telegraf": "secret"}},
        {"prometheus_scrape_tls_ca_file": "/ca.crt", "prometheus_scrape_job_basic_auth": ["telegraf"]},
        {"prometheus_scrape_tls_ca_file": "/ca.crt", "prometheus_scrape_job_basic_auth": {"telgraf": JOB_LOGIN}},
        {"prometheus_scrape_tls_ca_file": "/ca.crt", "prometheus_scrape_job_basic_auth": {"telegraf\n": JOB_LOGIN}},
    ],
    ids=["without-the-ca", "space-in-job", "no-password", "empty-user", "not-a-login", "not-a-mapping",
         "no-such-job", "newline-in-job"],
)
def test_the_prometheus_role_refuses_a_jobs_login_it_cannot_guard(tmp_path, overrides):
    passed, output = preflight(tmp_path, "prometheus", **overrides)
    assert not passed, output[-3000:]
    assert "prometheus_scrape_job_basic_auth must map jobs" in output, output[-3000:]


def test_the_prometheus_role_takes_a_jobs_login_over_tls(tmp_path):
    passed, output = preflight(
        tmp_path,
        "prometheus",
        prometheus_scrape_tls_ca_file="/ca.crt",
        prometheus_scrape_job_basic_auth={"telegraf": JOB_LOGIN, "node": JOB_LOGIN},
    )
    assert passed, output[-3000:]


# --- the live view (issue 44) -----------------------------------------------------------

LIVE_VIEW_TLS = {"live_view_tls_cert_file": TLS["cert_file"], "live_view_tls_key_file": TLS["key_file"]}


@pytest.mark.parametrize(
    "overrides, says",
    [
        ({"live_view_users": {"admin": "p" * 32}}, "only with TLS"),
        ({**LIVE_VIEW_TLS, "live_view_users": {"admin": "two words"}}, "is not one"),
        ({**LIVE_VIEW_TLS, "live_view_users": {"admin": "short"}}, "is not one"),
        ({**LIVE_VIEW_TLS, "live_view_users": {"ad:min": "p" * 32}}, "is not one"),
        ({"live_view_tls_cert_file": TLS["cert_file"]}, "together"),
        ({"live_view_prometheus_url": "https://127.0.0.1:9090/api"}, "scheme, host and port, nothing else"),
        ({"live_view_listen_address": "8443"}, 'must look like "0.0.0.0:8443"'),
        ({"live_view_listen_address": "0.0.0.0:99999"}, "port 1-65535"),
        ({"live_view_prometheus_url": "https://127.0.0.1"}, "scheme, host and port, nothing else"),
        ({"live_view_prometheus_url": "https://admin:secret@prometheus:9090"}, "scheme, host and port, nothing else"),
        ({"live_view_app_src": "/nonexistent"}, "run make build"),
        ({"live_view_prometheus_url": "https://127.0.0.1:9090"}, "checks a certificate against a DNS name only"),
        ({"live_view_prometheus_url": "https://[::1]:9090"}, "checks a certificate against a DNS name only"),
        ({"live_view_central_urls": "https://central:8427"}, "must be a list of at most 8 different URLs"),
        ({"live_view_central_urls": ["https://central:8427/api/v1"]}, "must be a list of at most 8 different URLs"),
        ({"live_view_central_urls": ["https://c%d:8427" % i for i in range(9)]}, "at most 10 internal redirects"),
        ({"live_view_central_urls": ["https://10.0.0.2:8427"], "live_view_central_server_names": ["10.0.0.2"]},
         "not IP addresses"),
        ({**LIVE_VIEW_TLS, "live_view_users": {"admin": "p" * 32}, "live_view_central_urls": ["http://central:8428"]},
         "must be https"),
        ({"live_view_central_urls": ["https://central:8427", "https://central:8427"]}, "different URLs"),
        ({"live_view_central_urls": ["https://central:8427"], "live_view_central_server_names": ["a", "b"]},
         "no longer than the URLs"),
        ({"live_view_central_urls": ["https://central:8427"], "live_view_central_server_names": ["a b"]},
         "a list of DNS"),
        ({"live_view_central_urls": ["https://central:99999"]}, "the port must be 1-65535"),
        ({"live_view_central_urls": ["https://central:8427", "https://10.0.0.2:8427"],
          "live_view_central_server_names": ["central"]}, "checks a certificate against a DNS name only"),
    ],
    ids=[
        "users-without-tls",
        "space",
        "short",
        "colon-in-user",
        "cert-without-key",
        "url-path",
        "no-port",
        "port-too-big",
        "url-without-port",
        "url-with-login",
        "not-built",
        "ip-without-name",
        "ipv6-without-name",
        "central-not-a-list",
        "central-url-path",
        "central-nine",
        "central-name-ip",
        "central-login-in-clear",
        "central-twice",
        "central-names-longer",
        "central-name-space",
        "central-port-too-big",
        "central-ip-without-name",
    ],
)
def test_the_live_view_role_refuses_what_nginx_cannot_serve_safely(tmp_path, overrides, says):
    passed, output = preflight(tmp_path, "live_view", **overrides)
    assert not passed, output[-3000:]
    assert says in output, output[-3000:]
    for password in overrides.get("live_view_users", {}).values():
        assert password not in output, "a password was printed"


def test_the_live_view_role_takes_what_site_yml_gives_it(tmp_path):
    passed, output = preflight(
        tmp_path,
        "live_view",
        **LIVE_VIEW_TLS,
        live_view_users={"admin": "p" * 32},
        live_view_prometheus_url="https://127.0.0.1:9090",
        live_view_prometheus_ca_file="/usr/local/share/ca-certificates/longhaul-ca.crt",
        live_view_prometheus_server_name="localhost",
        live_view_central_urls=["https://10.77.1.200:8427", "https://10.77.1.201:8427"],
        live_view_central_ca_file="/usr/local/share/ca-certificates/longhaul-ca.crt",
        live_view_central_server_names=["central", "central2"],
    )
    assert passed, output[-3000:]


SITE_CENTRAL_CHECK = "Check that every monitoring host writes to every replica of the central store"


def site_central_check(tmp_path, monitoring, central):
    """site.yml's preflight task that wants every site's Prometheus to write to
    every replica of the central store, run (on this machine) for each of those
    monitoring hosts (name -> host variables) of an inventory with those central
    hosts (name -> address), with site.yml's group_vars/all."""
    site = yaml.safe_load((REPO / "ansible" / "site.yml").read_text())
    [task] = [t for t in site[0]["tasks"] if t.get("name") == SITE_CENTRAL_CHECK]
    (tmp_path / "tasks").mkdir()
    shutil.copy(REPO / "ansible" / "tasks" / "central-urls.json.j2", tmp_path / "tasks")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": yaml.safe_load(
                        (REPO / "ansible" / "group_vars" / "all" / "monitoring_tls.yml").read_text()
                    ),
                    "children": {
                        "monitoring": {
                            "hosts": {name: {**vars_, "ansible_connection": "local"} for name, vars_ in monitoring.items()}
                        },
                        "central_monitoring": {
                            "hosts": {name: {"ansible_host": ip} for name, ip in central.items()}
                        },
                    },
                }
            }
        )
    )
    playbook = tmp_path / "playbook.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "monitoring", "gather_facts": False, "tasks": [task]}]))
    return subprocess.run(
        ["ansible-playbook", "--inventory", str(inventory), str(playbook)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_site_yml_has_every_site_write_to_every_replica(tmp_path):
    # site.yml's own list: each replica, one queue each.
    done = site_central_check(tmp_path, {"mon-a": {}, "mon-b": {}}, {"c1": "192.0.2.1", "c2": "192.0.2.2"})
    assert done.returncode == 0, done.stdout[-3000:]


def test_site_yml_refuses_a_site_that_writes_to_the_old_central_prometheus_only(tmp_path):
    # An inventory of before the replicated store: its own list, the central Prometheus.
    old = {"prometheus_remote_write": [{"url": "https://192.0.2.1:9090/api/v1/write"}]}
    done = site_central_check(tmp_path, {"mon-a": {}, "mon-b": old}, {"c1": "192.0.2.1", "c2": "192.0.2.2"})
    assert done.returncode != 0
    assert "Monitoring host mon-b remote-writes to ['https://192.0.2.1:9090/api/v1/write']" in done.stdout, done.stdout[-3000:]
    assert "https://192.0.2.2:8427/api/v1/write" in done.stdout
    # site.yml's own list passes for the other host
    assert "Monitoring host mon-a" not in done.stdout and "ok: [mon-a]" in done.stdout, done.stdout[-3000:]


def test_site_yml_without_central_hosts_wants_no_remote_write(tmp_path):
    done = site_central_check(tmp_path, {"mon-a": {}}, {})
    assert done.returncode == 0, done.stdout[-3000:]
