"""Load goes only to this machine: loopback addresses are accepted, everything else refused by name."""

from __future__ import annotations

import pytest

from loadtests.loopback import check_grpc_target, check_http_url, is_loopback_host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "localhost", "LOCALHOST", "::1", "[::1]"])
def test_loopback_hosts_are_accepted(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "192.168.1.2", "example.com", "api", "::", "128.0.0.1", ""])
def test_other_hosts_are_refused(host: str) -> None:
    assert not is_loopback_host(host)


def test_http_url_is_normalised_and_checked() -> None:
    assert check_http_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_http_url("http://[::1]:8000") == "http://[::1]:8000"
    with pytest.raises(ValueError, match="not on this machine"):
        check_http_url("http://example.com:8000")
    with pytest.raises(ValueError, match="not on this machine"):
        check_http_url("https://10.1.2.3")
    with pytest.raises(ValueError, match="not an http"):
        check_http_url("127.0.0.1:8000")
    with pytest.raises(ValueError, match="invalid port"):
        check_http_url("http://127.0.0.1:99999")


def test_grpc_target_is_checked() -> None:
    assert check_grpc_target("127.0.0.1:50051") == "127.0.0.1:50051"
    assert check_grpc_target("[::1]:50051") == "[::1]:50051"
    assert check_grpc_target("localhost:1") == "localhost:1"
    with pytest.raises(ValueError, match="not on this machine"):
        check_grpc_target("api:50051")
    for bad in ("127.0.0.1", "127.0.0.1:0", "127.0.0.1:x", ":50051"):
        with pytest.raises(ValueError, match="host:port"):
            check_grpc_target(bad)
