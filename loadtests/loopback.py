"""Where this project's clients send requests: only to this machine (127.0.0.0/8, `localhost`, ::1), checked before
anything is sent. The load tests (`loadtests`) and the retrieval evaluation (`bertserve.retrieval_eval`)
take their targets through these checks.

Host names other than `localhost` are refused rather than resolved, so that no name (or DNS answer) can
point load at another machine. In docker compose the `locust` service shares the `api` container's network
namespace, so there too the service is reached on 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost",)


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name or an IP literal, brackets allowed) is an address of this machine's loopback."""
    bare = host.strip().strip("[]").lower()
    if bare in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def _refuse(what: str, given: str) -> ValueError:
    return ValueError(
        f"{what} {given!r} is not on this machine: load tests only send load to 127.0.0.0/8, localhost or ::1"
    )


def check_http_url(url: str) -> str:
    """`url` normalised without a trailing slash; ValueError unless it is http(s) on a loopback address."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--host {url!r} is not an http(s) URL such as http://127.0.0.1:8000")
    if not is_loopback_host(parts.hostname):
        raise _refuse("--host", url)
    try:
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ValueError(f"--host {url!r} has an invalid port") from None
    return url.strip().rstrip("/")


def check_grpc_target(target: str) -> str:
    """`host:port` (IPv6 in brackets); ValueError unless the host is a loopback address and the port valid."""
    text = target.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--grpc-host {target!r} is not host:port such as 127.0.0.1:50051")
    if not is_loopback_host(host):
        raise _refuse("--grpc-host", target)
    return text
