"""A socket guard: any connection attempt outside the loopback fails and is recorded.

Imported at start-up by every Python process whose `PYTHONPATH` holds this directory
(as `sitecustomize`), and installed in the test process by `conftest.py`. An attempt is
appended to the file named by `METADIST_NETGUARD_LOG` (when set) and refused with
`OSError`, so a test sees it even where the caller swallows the error.
"""

import ipaddress
import os
import socket
import sys

_LOOKUPS = ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr")
_LOCAL_NAMES = {"", "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def _is_local(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).strip("[]").lower()
    if host in _LOCAL_NAMES or host == socket.gethostname().lower():
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _refuse(what: str) -> None:
    path = os.environ.get("METADIST_NETGUARD_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()} {what}\n")
    raise OSError(f"network access refused by the test guard: {what}")


def _hook(event: str, args: tuple) -> None:
    if event == "socket.connect":
        sock, address = args
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
            _refuse(f"connect {address!r}")
    elif event in _LOOKUPS and not _is_local(args[0]):
        _refuse(f"{event} {args[0]!r}")


def install() -> None:
    """Adds the guard to this process (once)."""
    if not getattr(sys, "_metadist_netguard", False):
        sys._metadist_netguard = True
        sys.addaudithook(_hook)


install()
