"""The gRPC server bounds a connection's age: a long-lived channel is sent GOAWAY and reconnects.

HTTP/2 carries every call of a channel on one connection, and a connection-level balancer (a Kubernetes
ClusterIP Service) picks a replica per connection; so a client that keeps its channel would stay on one replica
forever. With `grpc.max_connection_age_ms` the server ends each connection after the age (GOAWAY, then a grace
for the calls in flight); the channel goes IDLE and its next call opens a new connection, which the balancer
may send to another replica. Reference: https://github.com/grpc/proposal/blob/master/A9-server-side-conn-mgt.md
"""

from __future__ import annotations

import threading
import time

import grpc

from service.grpc_api.server import connection_age_options
from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from service.settings import ServiceSettings
from tests.deploy.conftest import CONNECTION_AGE_S
from tests.service.server import ServerProcess


def _classify(channel: grpc.Channel) -> None:
    request = pb.ClassifyRequest(inputs=[pb.TextInput(text="a fine film")])
    response = pb_grpc.ClassifierStub(channel).Classify(request, timeout=10)
    assert len(response.results) == 1


def test_a_long_lived_channel_is_told_to_reconnect_after_the_connection_age(deploy_server: ServerProcess) -> None:
    states: list[grpc.ChannelConnectivity] = []
    changed = threading.Condition()

    def record(state: grpc.ChannelConnectivity) -> None:
        with changed:
            states.append(state)
            changed.notify_all()

    with grpc.insecure_channel(deploy_server.grpc_target) as channel:
        channel.subscribe(record, try_to_connect=False)
        _classify(channel)
        connected_at = time.monotonic()
        with changed:
            assert changed.wait_for(lambda: grpc.ChannelConnectivity.READY in states, timeout=5), states
            # nothing is sent after the first call: only the server's GOAWAY can take the channel out of READY
            left_ready = changed.wait_for(
                lambda: states[-1] != grpc.ChannelConnectivity.READY, timeout=CONNECTION_AGE_S * 1.1 + 4
            )
        assert left_ready, f"the channel is still connected {time.monotonic() - connected_at:.1f} s later: {states}"
        assert time.monotonic() - connected_at >= CONNECTION_AGE_S * 0.9 - 0.1  # not before the age (minus jitter)
        ready_count = states.count(grpc.ChannelConnectivity.READY)
        _classify(channel)  # the same channel serves on, over a new connection
        with changed:
            assert changed.wait_for(lambda: states.count(grpc.ChannelConnectivity.READY) > ready_count, timeout=5)
        channel.unsubscribe(record)


def test_an_age_of_zero_gives_grpc_no_connection_age_so_connections_never_age_out() -> None:
    assert connection_age_options(ServiceSettings(grpc_max_connection_age_s=0)) == []
    settings = ServiceSettings(grpc_max_connection_age_s=2.5, grpc_max_connection_age_grace_s=1)
    aged = dict(connection_age_options(settings))
    assert aged == {"grpc.max_connection_age_ms": 2500, "grpc.max_connection_age_grace_ms": 1000}
