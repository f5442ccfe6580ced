#!/usr/bin/python3
"""The Python client's token and TLS options against a real pagoda-server with
--auth-tokens and TLS (certificates made with openssl in a temporary folder).

Usage: python_security_test.py PAGODA_SERVER"""
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# PAGODA_INSTALLED: test the installed package (python_package_test.sh), else the source tree's.
INSTALLED = bool(os.environ.get("PAGODA_INSTALLED"))
if not INSTALLED:
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import pagoda as pc  # noqa: E402

SERVER = None  # set in main


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TokensAndTls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        d = cls.dir.name
        if not INSTALLED:
            subprocess.run(["sh", os.path.join(ROOT, "client", "python", "generate_stubs.sh"),
                            os.path.join(d, "stubs")], check=True, capture_output=True)
            os.environ["PAGODA_PY_STUBS"] = os.path.join(d, "stubs")
        script = (
            "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca && "
            "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost && "
            "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext && "
            "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
            "-extfile server.ext")
        subprocess.run(script, shell=True, cwd=d, check=True, capture_output=True)
        with open(os.path.join(d, "tokens"), "w") as f:
            f.write("a secret-of-a max_sequences=4\n")
        cls.address = f"127.0.0.1:{free_port()}"
        cls.server = subprocess.Popen(
            [SERVER, "--listen", cls.address, "--metrics-address", "", "--log-level", "warn",
             "--auth-tokens", os.path.join(d, "tokens"), "--tls-cert", os.path.join(d, "server.pem"),
             "--tls-key", os.path.join(d, "server.key")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cls.ca = os.path.join(d, "ca.pem")
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with pc.PagodaClient(cls.address, token="secret-of-a", tls_ca=cls.ca, timeout=1) as c:
                    c.config()
                return
            except pc.PagodaError:
                time.sleep(0.1)
        raise RuntimeError("the server did not answer within 20 s")

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        cls.server.wait(10)
        cls.dir.cleanup()

    def test_token_over_tls_names_the_tenant(self):
        with pc.PagodaClient(self.address, token="secret-of-a", tls_ca=self.ca) as c:
            config = c.config(refresh=True)
            self.assertEqual(config.tenant, "a")
            self.assertTrue(config.tls)
            self.assertEqual(config.tenant_max_sequences, 4)
            sid = c.create_sequence("py")
            self.assertNotEqual(sid, 0)
            c.free_sequence(sid)

    def test_missing_or_unknown_token_is_unauthenticated(self):
        for token in ("", "secret-of-b"):
            with pc.PagodaClient(self.address, token=token, tls_ca=self.ca) as c:
                with self.assertRaises(pc.PagodaError) as err:
                    c.create_sequence()
                self.assertEqual(err.exception.code, grpc.StatusCode.UNAUTHENTICATED)

    def test_plaintext_against_tls_fails(self):
        with pc.PagodaClient(self.address, token="secret-of-a", timeout=2) as c:
            with self.assertRaises(pc.PagodaError) as err:
                c.config()
            self.assertEqual(err.exception.code, grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    SERVER = sys.argv.pop(1)
    unittest.main()
