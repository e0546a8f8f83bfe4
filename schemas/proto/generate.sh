#!/usr/bin/env bash
# Regenerate the Python code of the .proto files under schemas/proto (committed next to them).
#
#   schemas/proto/generate.sh [OUT_DIR]     # default OUT_DIR: schemas/proto
#
# Needs grpcio-tools and mypy-protobuf (the `dev` extra). PYTHON selects the interpreter
# (default: python on PATH, e.g. the activated .venv).
#
# Why the import rewrite: protoc derives the import of `*_pb2.py` in `*_pb2_grpc.py` from the
# proto package path (`ragstream.retrieval.v1`), which would resolve to our own top-level
# `ragstream` package. The descriptors keep their canonical file names and the wire names stay
# `ragstream.retrieval.v1.*` (what clients, reflection and buf see); only Python module names
# (imports, the classes' __module__) become `schemas.proto.ragstream...`, where the code lives.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here}"
python="${PYTHON:-python}"
# protoc finds the protoc-gen-mypy plugins on PATH: put the interpreter's bin dir first.
export PATH="$(dirname "$("$python" -c 'import sys; print(sys.executable)')"):$PATH"

mkdir -p "$out"
cd "$here"
mapfile -t protos < <(find ragstream -name '*.proto' | LC_ALL=C sort)

"$python" -m grpc_tools.protoc \
  -I . \
  --python_out="$out" \
  --grpc_python_out="$out" \
  --mypy_out="$out" \
  --mypy_grpc_out="$out" \
  "${protos[@]}"

mapfile -t generated < <(cd "$out" && find ragstream \( -name '*_pb2*.py' -o -name '*_pb2*.pyi' \) \
  | LC_ALL=C sort)
for file in "${generated[@]}"; do
  sed -i -E \
    -e 's/^from ragstream\.([A-Za-z0-9_.]+) import /from schemas.proto.ragstream.\1 import /' \
    -e 's/^import ragstream\.([A-Za-z0-9_.]+)/import schemas.proto.ragstream.\1/' \
    -e "s/^(_builder\.BuildTopDescriptorsAndMessages\(DESCRIPTOR, ')ragstream\./\1schemas.proto.ragstream./" \
    "$out/$file"
done

# Every generated package directory must be importable.
while IFS= read -r dir; do
  [[ -f "$out/$dir/__init__.py" ]] || printf '"""Generated protobuf code."""\n' >"$out/$dir/__init__.py"
done < <(cd "$out" && find ragstream -type d | LC_ALL=C sort)

# Fail loudly if protoc ever emits an import form the rewrite above does not cover.
if grep -nE '^(from|import) ragstream\.' "${generated[@]/#/$out/}"; then
  echo "generate.sh: unrewritten import of the top-level ragstream package (see above)" >&2
  exit 1
fi
