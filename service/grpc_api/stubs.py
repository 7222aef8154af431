"""The generated bert.v1 modules (`make proto` writes them to proto/gen/, git-ignored).

On a development checkout where they are missing but grpcio-tools is installed, they are generated on first
import (same command as `make proto`), so `bertserve serve` and the tests never depend on a forgotten step.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"
PROTO_FILE = PROTO_ROOT / "bert" / "v1" / "bert.proto"


def generate(repo_root: Path = PROTO_ROOT.parent) -> None:
    """Run protoc (grpcio-tools) exactly as `make proto` does: modules + .pyi into proto/gen/bert/v1/."""
    try:
        from grpc_tools import protoc
    except ImportError as error:
        raise RuntimeError(
            "the gRPC stubs are not generated and grpcio-tools is not installed: run `make proto`"
        ) from error
    import grpc_tools

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{include}",
        "-Iproto/gen=proto",
        "--python_out=.",
        "--pyi_out=.",
        "--grpc_python_out=.",
        "proto/bert/v1/bert.proto",
    ]
    import os

    cwd = os.getcwd()
    try:
        os.chdir(repo_root)
        code = protoc.main(args)
    finally:
        os.chdir(cwd)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code} on {PROTO_FILE}")


def _load() -> tuple[ModuleType, ModuleType]:
    try:
        pb2 = importlib.import_module("proto.gen.bert.v1.bert_pb2")
        pb2_grpc = importlib.import_module("proto.gen.bert.v1.bert_pb2_grpc")
    except ImportError:
        generate()
        importlib.invalidate_caches()
        pb2 = importlib.import_module("proto.gen.bert.v1.bert_pb2")
        pb2_grpc = importlib.import_module("proto.gen.bert.v1.bert_pb2_grpc")
    return pb2, pb2_grpc


bert_pb2, bert_pb2_grpc = _load()
