#!/usr/bin/env bash
# The Python package as a user installs it: a venv over Debian's python3-grpcio,
# python3-protobuf and python3-numpy (--system-site-packages), `pip install
# --no-build-isolation --no-deps ./client/python` (stubs generated from proto/
# by the build), then the client's tests run against the installed package,
# from outside the source tree and with no PYTHONPATH, and the Llama example
# decodes through a real server with the same tokens as its own attention.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
server_bin="$(realpath "${1:?usage: python_package_test.sh PAGODA_SERVER}")"
tmp="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" || true; fi
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

port="$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$server_bin" --listen "127.0.0.1:$port" --metrics-address "" --log-level warn >"$tmp/server.log" 2>&1 &
server_pid=$!
"$tmp/venv/bin/python" - "127.0.0.1:$port" <<'PY'
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
"$tmp/venv/bin/python" "$root/client/python/examples/llama_decode.py" --server "127.0.0.1:$port" --tokens 24 \
  --vocab 2048 --micro-batches 2
