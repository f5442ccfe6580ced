#!/bin/sh
# Generates the Python stubs of pagoda.v1 into OUT_DIR (default build/python):
#   OUT_DIR/pagoda/v1/decode_attention_pb2.py, decode_attention_pb2_grpc.py
# Uses Debian's interpreter (/usr/bin/python3 with python3-grpc-tools): a pyenv
# python3 on PATH does not see Debian's modules. -I is the proto root, so the
# generated modules are named pagoda.v1.* and do not shadow the grpc package.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/build/python}
python=${PYTHON:-/usr/bin/python3}
mkdir -p "$out"
"$python" -m grpc_tools.protoc -I "$root/proto" \
  --python_out="$out" --grpc_python_out="$out" \
  "$root/proto/pagoda/v1/decode_attention.proto"
echo "$out"
