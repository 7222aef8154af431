"""Fail the start at once when a port the server will listen on is taken.

The gRPC front door binds its port only once the models are ready (service/http_api/app.py says why), seconds or
minutes after the start; checking the ports first makes a taken one a one-line error before anything loads.
"""

from __future__ import annotations

import socket


def ensure_port_free(host: str, port: int, option: str) -> None:
    """Raise ValueError, naming `option`, if `host:port` cannot be bound now (0: any free port, nothing to check)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as the servers bind: a port left in TIME_WAIT by a server that just stopped is no conflict
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as error:
            raise ValueError(f"cannot listen on {host}:{port} ({error.strerror}): choose another {option}") from None
