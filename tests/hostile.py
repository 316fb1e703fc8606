"""Hostile and unlucky peers for hardening tests: a crowd of connections held
open on one loopback port, silent or trickling a byte every few seconds, each
reopened as soon as the server closes it, so the pressure lasts as long as the
test wants (longer than any of the server's deadlines).

Only ever aims at 127.0.0.1 ports the test itself started servers on.
"""

import errno
import json
import os
import resource
import selectors
import socket
import struct
import threading
import time

LOOPBACK = "127.0.0.1"


def raise_open_files_limit():
    """Hundreds of sockets in one test process: lift the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Crowd:
    """`silent` connections that never send, and `trickling` ones that send
    the next byte of `trickle` every `interval` seconds (starting over when
    it is used up). Closed connections are reopened. Counts reopenings, so a
    test can show the server really cut them."""

    def __init__(self, port, silent=0, trickling=0, trickle=b"", interval=2.0):
        self.port = port
        self.want_silent = silent
        self.want_trickling = trickling
        self.trickle = trickle
        self.interval = interval
        self.reopened = 0
        self.selector = selectors.DefaultSelector()
        self.conns = {}
        self.stopping = threading.Event()
        self.thread = None

    def _open(self, kind):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect((LOOPBACK, self.port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            return False
        # Stagger the first byte so the crowd does not trickle in lockstep.
        first = time.monotonic() + self.interval * (len(self.conns) % 7) / 7.0
        self.conns[s] = {"kind": kind, "next": first, "sent": 0}
        self.selector.register(s, selectors.EVENT_READ)
        return True

    def _close(self, s):
        self.selector.unregister(s)
        kind = self.conns.pop(s)["kind"]
        s.close()
        return kind

    def _fill(self):
        silent = sum(1 for c in self.conns.values() if c["kind"] == "silent")
        trickling = len(self.conns) - silent
        for _ in range(self.want_silent - silent):
            self._open("silent")
        for _ in range(self.want_trickling - trickling):
            self._open("trickling")

    def start(self):
        raise_open_files_limit()
        self._fill()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stopping.is_set():
            for key, _ in self.selector.select(timeout=0.1):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._close(s)
                    self.reopened += 1
            now = time.monotonic()
            for s, c in list(self.conns.items()):
                if c["kind"] != "trickling" or now < c["next"] or not self.trickle:
                    continue
                byte = self.trickle[c["sent"] % len(self.trickle)]
                try:
                    s.send(bytes([byte]))
                    c["sent"] += 1
                except BlockingIOError:
                    pass
                except OSError as error:
                    if error.errno not in (errno.EAGAIN, errno.ENOTCONN):
                        self._close(s)
                        self.reopened += 1
                        continue
                c["next"] = now + self.interval
            self._fill()

    def stop(self):
        self.stopping.set()
        if self.thread:
            self.thread.join(timeout=10)
        for s in list(self.conns):
            self._close(s)
        self.selector.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class StalledIperf3Tests:
    """`count` iperf3 tests from 127.0.0.1 that stop after their parameter
    exchange: each connection sends a cookie and a test's parameters,
    reads the server's answer and then says nothing (it never opens its
    streams), and is reopened as soon as the server closes it. One thread
    per connection. Counts the answers: `slots` for CREATE_STREAMS (the
    test took a slot), `denied` for ACCESS_DENIED, and `cut` for every
    close by the server."""

    PARAM_EXCHANGE, CREATE_STREAMS, ACCESS_DENIED = 9, 10, 0xFF

    def __init__(self, port, count, params):
        body = json.dumps(params).encode()
        self.port = port
        self.count = count
        self.block = struct.pack(">I", len(body)) + body
        self.slots = self.denied = self.cut = 0
        self.errors = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = []

    def _one(self):
        s = socket.create_connection((LOOPBACK, self.port), timeout=15)
        try:
            s.sendall(os.urandom(18).hex().encode() + b"\0")
            if s.recv(1) != bytes([self.PARAM_EXCHANGE]):
                return
            s.sendall(self.block)
            answer = s.recv(1)
            with self.lock:
                if answer == bytes([self.CREATE_STREAMS]):
                    self.slots += 1
                elif answer == bytes([self.ACCESS_DENIED]):
                    self.denied += 1
            # Silent from here on, until the server cuts it.
            s.settimeout(None)
            while not self.stopping.is_set() and s.recv(4096):
                pass
        finally:
            s.close()
            with self.lock:
                self.cut += 1

    def _run(self):
        while not self.stopping.is_set():
            try:
                self._one()
            except OSError as error:
                with self.lock:
                    self.errors.append(error)
                time.sleep(0.05)

    def __enter__(self):
        raise_open_files_limit()
        for _ in range(self.count):
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        # Threads blocked in recv end when the server cuts them (within its
        # attach timeout) or when the process ends: they are daemons.
        for t in self.threads:
            t.join(timeout=0.1)


def proc_status(pid):
    """/proc/PID/status as a dict of str -> str."""
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def rss_kib(pid):
    return int(proc_status(pid)["VmRSS"].split()[0])


def hwm_kib(pid):
    return int(proc_status(pid)["VmHWM"].split()[0])


def threads(pid):
    return int(proc_status(pid)["Threads"])
