"""The generated bert.v1 modules (`make proto` writes them to proto/gen/, git-ignored).

On a development checkout where they are missing but grpcio-tools is installed, they are generated on first
import (same command as `make proto`), so `bertserve serve` and the tests never depend on a forgotten step.
"""

from __future__ import annotations

import importlib
from pathlib import Path

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


try:
    from proto.gen.bert.v1 import bert_pb2, bert_pb2_grpc
except ImportError:  # not generated yet: do what `make proto` does
    generate()
    importlib.invalidate_caches()
    from proto.gen.bert.v1 import bert_pb2, bert_pb2_grpc

__all__ = ["bert_pb2", "bert_pb2_grpc", "generate"]
