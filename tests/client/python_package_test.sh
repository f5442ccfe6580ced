#!/usr/bin/env bash
# The Python package as a user installs it: a venv over Debian's python3-grpcio,
# python3-protobuf and python3-numpy (--system-site-packages), `pip install
# --no-build-isolation --no-deps ./client/python` (stubs generated from proto/
# by the build), then the client's tests run against the installed package,
# from outside the source tree and with no PYTHONPATH.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
server_bin="$(realpath "${1:?usage: python_package_test.sh PAGODA_SERVER}")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
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
