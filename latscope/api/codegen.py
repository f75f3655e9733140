"""Regenerate the Python code of latscope's own protobuf services.

Run from a source checkout::

    python -m latscope.api.codegen

It compiles ``proto/latscope/v1/*.proto`` with grpcio-tools into ``*_pb2.py``, ``*_pb2.pyi`` and
``*_pb2_grpc.py`` beside each file (importable as ``latscope.v1``). The generated files are
committed; ``tests/test_api_grpc.py`` fails when they no longer match the ``.proto`` files.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"


def proto_files(proto_dir: Path = PROTO_DIR) -> list[Path]:
    return sorted((proto_dir / "latscope" / "v1").glob("*.proto"))


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Compile every ``.proto`` under ``proto_dir`` into ``out_dir``; returns the files written."""
    from grpc_tools import protoc

    include = str(resources.files("grpc_tools") / "_proto")
    files = [str(p.relative_to(proto_dir)) for p in proto_files(proto_dir)]
    if not files:
        raise SystemExit(f"no .proto files under {proto_dir}/latscope/v1")
    out_dir.mkdir(parents=True, exist_ok=True)
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *files,
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    return sorted(p for p in (out_dir / "latscope" / "v1").glob("*_pb2*.py*"))


def main() -> int:
    for path in generate(PROTO_DIR):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
