"""What the Python client tests that drive real servers share: the pagoda
package (the source tree's, unless PAGODA_INSTALLED says an installed one is
under test), its generated stubs, and pagoda-server processes on loopback
ports, each waited for until its health check answers."""
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if not os.environ.get("PAGODA_INSTALLED"):
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import pagoda  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate_stubs(directory: str) -> None:
    """The pagoda.v1 stubs into `directory` (an installed package has its own)."""
    if os.environ.get("PAGODA_INSTALLED"):
        return
    subprocess.run(["sh", os.path.join(ROOT, "client", "python", "generate_stubs.sh"),
                    os.path.join(directory, "stubs")], check=True, capture_output=True)
    os.environ["PAGODA_PY_STUBS"] = os.path.join(directory, "stubs")


def start_server(server: str, extra=(), cache_bytes: int = 32 << 20):
    """A pagoda-server with `extra` flags on a free loopback port, serving: (process, endpoint)."""
    endpoint = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([server, "--listen", endpoint, "--metrics-address", "", "--log-level", "warn",
                             "--cache-bytes", str(cache_bytes)] + list(extra),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while True:
        try:
            pagoda.PagodaClient(endpoint, timeout=1).health()
            return proc, endpoint
        except pagoda.PagodaError:
            if time.time() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)


def stop_servers(procs) -> None:
    for p in procs:
        p.terminate()
        p.wait(10)
