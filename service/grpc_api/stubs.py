"""The generated bert.v1 modules, imported by name so that type checkers see their `.pyi` stubs; generated first
(`proto.stubs.ensure_generated`, the same protoc call as `make proto`) when a development checkout lacks them or
they are older than the .proto."""

from __future__ import annotations

from proto.stubs import ensure_generated

ensure_generated()

from proto.gen.bert.v1 import bert_pb2, bert_pb2_grpc  # noqa: E402  (generated just above when needed)

__all__ = ["bert_pb2", "bert_pb2_grpc"]
