"""The telegraf role's configuration polls a router at an IPv6 address: the
agent address is bracketed (udp://[::1]:PORT), in the deploy-time walk that
resolves snmp_interfaces to ifIndex values as in the polling config.

snmpd listens on [::1] only, with an SNMPv3 authPriv user; the configuration is
rendered from the role (tests/stack.py, lab/compose/render.yml) and run once
with `telegraf --test`. Needs IPv6 on the loopback interface (Linux has it
unless disabled).
"""

import subprocess

from stack import SNMP_INTERFACES, Stack, TELEGRAF, require


def test_telegraf_polls_an_ipv6_agent(processes, tmp_path):
    assert (
        "00000000000000000000000000000001" in open("/proc/net/if_inet6").read()
    ), "this test needs IPv6 on the loopback interface ([::1])"
    stack = Stack(processes, tmp_path)
    stack.start_snmpd(address="::1")
    binary = require(TELEGRAF, "telegraf")
    conf = stack.render_telegraf_config(binary)
    text = conf.read_text()
    assert 'agents = ["udp://[::1]:%d"]' % stack.snmp_port in text, text
    done = subprocess.run(
        [binary, "--config", str(conf), "--test", "--test-wait", "0", "--input-filter", "snmp"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("> interface,")]
    names = {
        tag.split("=", 1)[1]
        for line in lines
        for tag in line.split(" ")[1].split(",")
        if tag.startswith("ifName=")
    }
    assert names == set(SNMP_INTERFACES), "telegraf --test: %s %s" % (done.stdout, done.stderr)
    assert all("ifHCInOctets=" in line and "ifOperStatus=" in line for line in lines), lines
