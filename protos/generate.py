"""Regenerates the Python protobuf/gRPC modules next to the .proto files.

The generated modules are committed so that an install needs no protoc;
tests/unit/test_packaging.py fails when they are out of date with the .proto.
Run: python protos/generate.py [OUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

PROTOS = Path(__file__).resolve().parent
SOURCES = ["streamtx/v1/streamtx.proto"]


def generate(out_dir: Path = PROTOS) -> None:
    for source in SOURCES:
        args = [
            "protoc",
            f"-I{PROTOS}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(PROTOS / source),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {source}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTOS)
