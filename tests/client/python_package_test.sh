#!/usr/bin/env bash
# The Python package as a user installs it: a venv over Debian's python3-grpcio,
# python3-protobuf and python3-numpy (--system-site-packages), `pip install
# --no-build-isolation --no-deps ./client/python` (stubs generated from proto/
# by the build), then the client's tests run against the installed package,
# from outside the source tree and with no PYTHONPATH, the Llama example
# decodes through a real server with the same tokens as its own attention, and
# the MLA example does so through a latent-attention server (k-only appends).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
server_bin="$(realpath "${1:?usage: python_package_test.sh PAGODA_SERVER}")"
tmp="$(mktemp -d)"
server_pid=""
mla_pid=""
cleanup() {
  for pid in $server_pid $mla_pid; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-build-isolation --no-deps "$root/client/python"
cd "$tmp"
unset PYTHONPATH PAGODA_PY_STUBS
"$tmp/venv/bin/python" - <<'PY'
import pagoda
import pagoda_client  # the module name of earlier releases still imports
from pagoda.v1 import decode_attention_pb2, decode_attention_pb2_grpc  # generated at install
assert pagoda.__file__.startswith("/") and "site-packages" in pagoda.__file__, pagoda.__file__
assert hasattr(decode_attention_pb2_grpc, "DecodeAttentionStub")
print("installed:", pagoda.__file__)
PY
"$tmp/venv/bin/python" "$root/tests/client/python_client_test.py"
PAGODA_INSTALLED=1 "$tmp/venv/bin/python" "$root/tests/client/python_security_test.py" "$server_bin"
PAGODA_INSTALLED=1 "$tmp/venv/bin/python" "$root/tests/client/python_sharded_test.py" "$server_bin"
PAGODA_INSTALLED=1 "$tmp/venv/bin/python" "$root/tests/client/python_shm_test.py" "$server_bin"

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_for() {
  "$tmp/venv/bin/python" - "$1" <<'PY'
import sys, time
import pagoda
deadline = time.time() + 20
while True:
    try:
        pagoda.PagodaClient(sys.argv[1], timeout=1).health()
        break
    except pagoda.PagodaError:
        if time.time() > deadline:
            sys.exit("the server did not answer within 20 s")
        time.sleep(0.1)
PY
}
port="$(free_port)"
"$server_bin" --listen "127.0.0.1:$port" --metrics-address "" --log-level warn >"$tmp/server.log" 2>&1 &
server_pid=$!
wait_for "127.0.0.1:$port"
"$tmp/venv/bin/python" "$root/client/python/examples/llama_decode.py" --server "127.0.0.1:$port" --tokens 24 \
  --vocab 2048 --micro-batches 2

# The shape README.md tells a newcomer to start: one latent KV head of 576, V its first 512.
mla_port="$(free_port)"
"$server_bin" --listen "127.0.0.1:$mla_port" --metrics-address "" --log-level warn --kv-heads 1 --head-dim 576 \
  --v-head-dim 512 --q-heads 16 --cache-dtype bf16 --num-blocks 64 >"$tmp/mla-server.log" 2>&1 &
mla_pid=$!
wait_for "127.0.0.1:$mla_port"
"$tmp/venv/bin/python" "$root/client/python/examples/mla_decode.py" --server "127.0.0.1:$mla_port" --tokens 12 \
  --vocab 2048
