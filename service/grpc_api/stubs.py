"""The generated bert.v1 modules, imported by name so that type checkers see their `.pyi` stubs; generated first
(`proto.stubs.generate`, the same protoc call as `make proto`) when a development checkout lacks them."""

from __future__ import annotations

import importlib

try:
    from proto.gen.bert.v1 import bert_pb2, bert_pb2_grpc
except ImportError:  # not generated yet: do what `make proto` does
    from proto.stubs import generate

    generate()
    importlib.invalidate_caches()
    from proto.gen.bert.v1 import bert_pb2, bert_pb2_grpc

__all__ = ["bert_pb2", "bert_pb2_grpc"]
