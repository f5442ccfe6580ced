#!/usr/bin/python3
"""Shared-memory tensors from Python against a real server started with
--allow-shared-memory: q, k, v written into a SharedMemoryRegion's views and
results written back into it give the bits of the same calls over the socket,
on unary Decode, AppendKV and LayerStreams; bad ranges and unregistered
regions are refused naming them; a server without the flag says which flag.

Usage: python_shm_test.py PAGODA_SERVER"""
import os
import sys
import tempfile
import unittest

import numpy as np

from local_servers import generate_stubs, pagoda, start_server, stop_servers

SERVER = None


class SharedMemory(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        generate_stubs(cls.dir.name)
        cls.proc, cls.endpoint = start_server(SERVER, ["--allow-shared-memory"])
        cls.off_proc, cls.off_endpoint = start_server(SERVER)
        cls.c = pagoda.PagodaClient(cls.endpoint)
        cls.cfg = cls.c.config()
        cls.region = pagoda.SharedMemoryRegion(f"/pagoda-py-{os.getpid()}", 4 << 20)
        cls.c.register_shared_memory("orch", cls.region)

    @classmethod
    def tearDownClass(cls):
        cls.region.close()
        cls.region.unlink()
        stop_servers([cls.proc, cls.off_proc])
        cls.dir.cleanup()

    def kv(self, rng, n):
        return rng.standard_normal((n, self.cfg.num_kv_heads, self.cfg.head_dim)).astype(np.float16)

    def pair(self, rng, n):
        """Two sequences holding the same n tokens of K/V on every layer."""
        ids = [self.c.create_sequence("shm"), self.c.create_sequence("socket")]
        for layer in range(self.cfg.num_layers):
            k, v = self.kv(rng, n), self.kv(rng, n)
            for s in ids:
                self.c.append_kv(s, layer, k, v)
        return ids

    def test_decode_append_and_streams_through_shared_memory_have_the_socket_bits(self):
        rng = np.random.default_rng(3)
        h, d, kvh = self.cfg.num_q_heads, self.cfg.head_dim, self.cfg.num_kv_heads
        a, a_twin = self.pair(rng, 40)
        b, b_twin = self.pair(rng, 17)
        self.region.reset()
        q = self.region.tensor((2, h, d), "fp16")
        k = self.region.tensor((2, kvh, d), "fp16")
        v = self.region.tensor((2, kvh, d), "fp16")
        out = self.region.tensor((2, h, d), "fp16")
        lse = self.region.tensor((2, h), "fp32")
        q.array[...] = rng.standard_normal(q.shape)
        k.array[...] = rng.standard_normal(k.shape)
        v.array[...] = rng.standard_normal(v.shape)
        got = self.c.decode(1, [a, b], q, k, v, return_lse=True, out=out, lse_out=lse)
        want = self.c.decode(1, [a_twin, b_twin], q.array.copy(), k.array.copy(), v.array.copy(), return_lse=True)
        self.assertTrue(np.shares_memory(got.output, out.array), "the output is a view of the region")
        self.assertEqual(got.output.tobytes(), want.output.tobytes())
        self.assertEqual(got.lse.tobytes(), want.lse.tobytes())
        self.assertEqual(got.lengths, [41, 18])

        # AppendKV from the region, then a plain decode of both.
        k3, v3 = self.region.tensor((3, kvh, d), "fp16"), self.region.tensor((3, kvh, d), "fp16")
        k3.array[...] = rng.standard_normal(k3.shape)
        v3.array[...] = rng.standard_normal(v3.shape)
        self.assertEqual(self.c.append_kv(a, 0, k3, v3), 43)
        self.c.append_kv(a_twin, 0, k3.array.copy(), v3.array.copy())
        q1 = rng.standard_normal((1, h, d)).astype(np.float16)
        self.assertEqual(self.c.decode(0, [a], q1).output.tobytes(), self.c.decode(0, [a_twin], q1).output.tobytes())

        # LayerStreams: two requests in flight, results written into their own ranges.
        outs = [self.region.tensor((1, h, d), "fp16") for _ in range(2)]
        streams = pagoda.LayerStreams(self.c)
        for i, s in enumerate((a, b)):
            streams.send(0, [s], q1, out=outs[i])
        results = [streams.receive(0) for _ in range(2)]
        for i, twin in enumerate((a_twin, b_twin)):
            self.assertEqual(results[i].output.tobytes(), self.c.decode(0, [twin], q1).output.tobytes())
        streams.close()

    def test_bad_ranges_and_unknown_regions_are_refused_naming_them(self):
        rng = np.random.default_rng(4)
        a, _ = self.pair(rng, 5)
        h, d = self.cfg.num_q_heads, self.cfg.head_dim
        self.region.reset()
        q = self.region.tensor((1, h, d), "fp16")
        bad = pagoda.ShmTensor("orch", (4 << 20) - 64, 2, q.array)
        with self.assertRaises(pagoda.PagodaError) as err:
            self.c.decode(0, [a], bad)
        self.assertIn("q.shm: expected offset + byte_size within region 'orch' (4194304 bytes), received offset "
                      f"{(4 << 20) - 64} and byte_size {q.byte_size}", str(err.exception))
        unknown = pagoda.ShmTensor("nope", 0, 2, q.array)
        with self.assertRaises(pagoda.PagodaError) as err:
            self.c.decode(0, [a], unknown)
        self.assertIn("q.shm.region: expected a registered region, received 'nope'", str(err.exception))
        self.assertEqual([r["name"] for r in self.c.shared_memory_status()], ["orch"])

        off = pagoda.PagodaClient(self.off_endpoint)
        with self.assertRaises(pagoda.PagodaError) as err:
            off.register_shared_memory("orch", self.region)
        self.assertEqual(err.exception.code.name, "FAILED_PRECONDITION")
        self.assertIn("--allow-shared-memory", str(err.exception))


if __name__ == "__main__":
    SERVER = sys.argv.pop(1)
    unittest.main()
