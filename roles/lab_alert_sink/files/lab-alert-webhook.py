#!/usr/bin/env python3
"""The lab's webhook receiver: keeps every JSON body POSTed to it.

    lab-alert-webhook.py HOST PORT DIRECTORY

Each POST whose body is JSON (at most MAX_BODY bytes) is written to
DIRECTORY/<unix time in ns>-<sequence>.json (via a temporary file and a
rename, so a reader never sees half a file) and answered 200; anything else
gets 400 or 413 and is not kept. For tests: Alertmanager's webhook_configs
deliver here, the tests read the files.
"""

import http.server
import itertools
import json
import os
import sys
import time

MAX_BODY = 1 << 20
SEQUENCE = itertools.count()


class Handler(http.server.BaseHTTPRequestHandler):
    directory = "."

    def do_POST(self):  # noqa: N802 (the stdlib's name)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.send_error(413, "body larger than %d bytes" % MAX_BODY)
            return
        body = self.rfile.read(length)
        try:
            json.loads(body)
        except ValueError as error:
            self.send_error(400, "not JSON: %s" % error)
            return
        name = "%d-%06d.json" % (time.time_ns(), next(SEQUENCE))
        partial = os.path.join(self.directory, "." + name)
        with open(partial, "wb") as out:
            out.write(body)
        os.rename(partial, os.path.join(self.directory, name))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


def main(argv):
    if len(argv) != 4:
        sys.stderr.write("usage: %s HOST PORT DIRECTORY\n" % argv[0])
        return 2
    host, port, directory = argv[1], int(argv[2]), argv[3]
    if not os.path.isdir(directory):
        sys.stderr.write("%s: %s is not a directory\n" % (argv[0], directory))
        return 2
    Handler.directory = directory
    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
