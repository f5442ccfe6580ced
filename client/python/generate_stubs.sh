#!/bin/sh
# Generates the Python stubs of pagoda.v1 into OUT_DIR (default build/python):
#   OUT_DIR/pagoda/v1/decode_attention_pb2.py, decode_attention_pb2_grpc.py
# With the distribution's protoc and grpc_python_plugin (the ones the C++ build
# uses): they match Debian's python3-protobuf runtime and know proto3
# `optional`, which python3-grpc-tools' bundled protoc (3.5) refuses. -I is the
# proto root, so the generated modules are named pagoda.v1.* and do not shadow
# the grpc package.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/build/python}
protoc=${PROTOC:-protoc}
plugin=${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || echo /usr/bin/grpc_python_plugin)}
mkdir -p "$out"
"$protoc" -I "$root/proto" \
  --python_out="$out" --grpc_out="$out" --plugin=protoc-gen-grpc="$plugin" \
  "$root/proto/pagoda/v1/decode_attention.proto"
echo "$out"
