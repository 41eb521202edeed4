"""What the load scripts (soak.py, conn_stress.py) share: they talk to loopback servers only,
and their usage errors exit with 2 and a message that names the script."""
import ipaddress
import os
import socket
import sys
from urllib.parse import urlparse


def die(msg):
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr)
    sys.exit(2)


def check_loopback(url):
    """(host, port) of an http:// URL whose every address is a loopback one; else die()."""
    u = urlparse(url)
    if u.scheme != "http" or not u.hostname:
        die(f"--url must be http://HOST:PORT, got {url!r}")
    try:
        infos = socket.getaddrinfo(u.hostname, u.port or 80, proto=socket.IPPROTO_TCP)
    except OSError as e:
        die(f"cannot resolve {u.hostname}: {e}")
    for info in infos:
        if not ipaddress.ip_address(info[4][0]).is_loopback:
            die(f"{url} resolves to {info[4][0]}: this script only talks to loopback")
    return u.hostname, u.port or 80
