"""The generated bert.v1 modules, for the service (server) and the load tests (client).

`make proto` writes them into the git-ignored `proto/gen/`; the images generate them at build. On a development
checkout where they are missing, or older than the .proto (a pull changed the contract), and grpcio-tools is
installed, `load_stubs()` generates them with the same protoc call, so `bertserve serve`, the load tests and the
tests never run on a forgotten or stale step. Without grpcio-tools (the serving image) the modules are used as
they are.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
PROTO_FILE = "proto/bert/v1/bert.proto"


def generate(repo_root: Path = REPO) -> None:
    """Run protoc (grpcio-tools) exactly as `make proto` does: modules + .pyi into proto/gen/bert/v1/."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as error:
        raise RuntimeError(
            "the gRPC stubs are not generated (proto/gen/) and grpcio-tools is not installed: run `make proto`"
        ) from error
    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = ["protoc", f"-I{include}", "-Iproto/gen=proto", "--python_out=.", "--pyi_out=.", "--grpc_python_out=."]
    cwd = os.getcwd()
    try:
        os.chdir(repo_root)
        code = protoc.main([*args, PROTO_FILE])
    finally:
        os.chdir(cwd)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code} on {PROTO_FILE}: run `make proto` to see why")


GENERATED = ("proto/gen/bert/v1/bert_pb2.py", "proto/gen/bert/v1/bert_pb2_grpc.py")


def stale(repo_root: Path = REPO) -> bool:
    """Whether a generated module is missing or older than the .proto it was generated from."""
    source = (repo_root / PROTO_FILE).stat().st_mtime
    paths = [repo_root / name for name in GENERATED]
    return any(not path.is_file() or path.stat().st_mtime < source for path in paths)


def ensure_generated(repo_root: Path = REPO) -> None:
    """Generate the modules when they are missing (grpcio-tools required: else a RuntimeError says to run
    `make proto`) or older than the .proto (when grpcio-tools is installed; else they are used as they are)."""
    if not (repo_root / PROTO_FILE).is_file() or not stale(repo_root):
        return  # an image that carries only the generated modules, or modules newer than the contract
    missing = not all((repo_root / name).is_file() for name in GENERATED)
    if missing or importlib.util.find_spec("grpc_tools") is not None:
        generate(repo_root)
        importlib.invalidate_caches()


def load_stubs() -> tuple[ModuleType, ModuleType]:
    """(bert_pb2, bert_pb2_grpc) of package bert.v1, generated first when they are missing or stale."""
    ensure_generated()
    from proto.gen.bert.v1 import bert_pb2, bert_pb2_grpc

    return bert_pb2, bert_pb2_grpc
