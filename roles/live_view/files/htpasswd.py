# The htpasswd lines of a {user: password} map, made on the host with openssl
# (SHA-512 crypt, which nginx checks): a stored hash that still matches its password
# is kept (idempotent), others get a new random salt. Reads
# {"users": {...}, "rounds": N, "stored": "<the file's lines>"} on stdin.
# Used by the roles live_view and victoriametrics (python3 -c, the JSON on stdin:
# no password on a command line).
import json, re, secrets, string, subprocess, sys
d = json.load(sys.stdin)
stored = dict(line.split(":", 1) for line in d["stored"].splitlines() if ":" in line)
chars = string.ascii_letters + string.digits + "./"
def crypt(pw, salt):
    return subprocess.run(["openssl", "passwd", "-6", "-salt", salt, "-stdin"],
                          input=pw + "\n", capture_output=True, text=True, check=True).stdout.strip()
rounds = "rounds=%d$" % d["rounds"] if d["rounds"] != 5000 else ""
def kept(u):
    return re.fullmatch(r"[$]6[$]" + re.escape(rounds) + r"([./A-Za-z0-9]{16})[$][./A-Za-z0-9]{86}", stored.get(u, ""))
def same(u):
    return kept(u) and crypt(d["users"][u], rounds + kept(u).group(1)) == stored[u]
def fresh(u):
    return crypt(d["users"][u], rounds + "".join(secrets.choice(chars) for _ in range(16)))
print("".join("%s:%s\n" % (u, stored[u] if same(u) else fresh(u)) for u in sorted(d["users"])), end="")
