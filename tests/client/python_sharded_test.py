#!/usr/bin/python3
"""ShardedClient against real pagoda servers on loopback: a batch split over
three pods equals, bit for bit, the same batch on one server; one sequence's
context spread over three pods and merged by LSE equals it held whole (to
rounding); the hash ring moves few keys when a pod is added; a pod that is
down is UNAVAILABLE naming its endpoint, not a hang; decode_step's waits stop
doubling at max_backoff.

Usage: python_sharded_test.py PAGODA_SERVER"""
import sys
import tempfile
import time
import unittest

import grpc
import numpy as np

from local_servers import free_port, generate_stubs, pagoda, start_server, stop_servers

SERVER = None


class Sharded(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        generate_stubs(cls.dir.name)
        cls.servers, cls.endpoints = [], []
        for _ in range(4):  # three pods and one reference server
            proc, endpoint = start_server(SERVER)
            cls.servers.append(proc)
            cls.endpoints.append(endpoint)
        cls.pods, cls.reference = cls.endpoints[:3], pagoda.PagodaClient(cls.endpoints[3])
        cls.cfg = cls.reference.config()

    @classmethod
    def tearDownClass(cls):
        stop_servers(cls.servers)
        cls.dir.cleanup()

    def kv(self, rng, n):
        return rng.standard_normal((n, self.cfg.num_kv_heads, self.cfg.head_dim)).astype(np.float32)

    def test_a_batch_split_over_pods_has_the_bits_of_one_server(self):
        rng = np.random.default_rng(1)
        # Six keys the ring places on at least two pods (the pods' ports are
        # free ones, so the ring differs from run to run).
        ring = pagoda.HashRing(self.pods)
        keys = [f"seq-{i}" for i in range(5)]
        keys.append(next(f"seq-{i}" for i in range(5, 1000)
                         if ring.owners(f"seq-{i}")[0] != ring.owners(keys[0])[0]))
        with pagoda.ShardedClient(self.pods) as sc:
            refs, alone = [], []
            for i, key in enumerate(keys):
                k, v = self.kv(rng, 20 + 7 * i), self.kv(rng, 20 + 7 * i)
                ref = sc.create_sequence(placement_key=key)
                sc.append_kv(ref, 0, k, v)
                refs.append(ref)
                one = self.reference.create_sequence()
                self.reference.append_kv(one, 0, k, v)
                alone.append(one)
            self.assertGreaterEqual(len({r.endpoint for r in refs}), 2, "every sequence on one pod")
            q = rng.standard_normal((6, self.cfg.num_q_heads, self.cfg.head_dim)).astype(np.float32)
            nk, nv = self.kv(rng, 6), self.kv(rng, 6)
            out, lse, lengths = sc.decode(0, refs, q, nk, nv, return_lse=True)
            want = self.reference.decode(0, alone, q, nk, nv, return_lse=True)
            self.assertEqual(lengths, want.lengths)
            self.assertTrue(np.array_equal(out, want.output), "the sharded batch differs from one server")
            self.assertTrue(np.array_equal(lse, want.lse))
            for ref in refs:
                sc.free_sequence(ref)
            for one in alone:
                self.reference.free_sequence(one)

    def test_decode_step_backoff_stops_doubling_at_its_cap(self):
        # Nothing listens on port 1: every call is UNAVAILABLE. Eleven doublings
        # from 1 ms would wait 2 s in all; capped at 2 ms, about 21 ms.
        client = pagoda.PagodaClient("127.0.0.1:1", timeout=0.2)
        row = np.zeros((1, self.cfg.num_kv_heads, self.cfg.head_dim), dtype=np.float32)
        start = time.monotonic()
        with self.assertRaises(pagoda.PagodaError) as raised:
            client.decode_step(0, [1], row, row, row, attempts=12, backoff=0.001, max_backoff=0.002)
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertLess(time.monotonic() - start, 1.0, "the waits kept doubling past max_backoff")

    def test_context_spread_over_pods_merges_to_the_whole(self):
        rng = np.random.default_rng(2)
        k, v = self.kv(rng, 700), self.kv(rng, 700)
        with pagoda.ShardedClient(self.pods) as sc:
            seq = sc.create_sharded_sequence("long", shards=3)
            self.assertEqual(len({p.endpoint for p in seq.parts}), 3)
            self.assertEqual(seq.append_kv(0, k, v), 700)
            whole = self.reference.create_sequence()
            self.reference.append_kv(whole, 0, k, v)
            q = rng.standard_normal((1, self.cfg.num_q_heads, self.cfg.head_dim)).astype(np.float32)
            nk, nv = self.kv(rng, 1), self.kv(rng, 1)
            out, lse = seq.decode(0, q, nk, nv)
            want = self.reference.decode(0, [whole], q, nk, nv, return_lse=True)
            self.assertEqual(seq.length(0), 701)
            np.testing.assert_allclose(out, want.output, rtol=0, atol=2e-5)
            np.testing.assert_allclose(lse, want.lse, rtol=0, atol=2e-5)
            seq.free()
            self.reference.free_sequence(whole)

    def test_layer_streams_pipeline_micro_batches_with_the_bits_of_unary_calls(self):
        rng = np.random.default_rng(3)
        c = self.reference
        layers = self.cfg.num_layers
        batches = [[c.create_sequence() for _ in range(2)] for _ in range(2)]  # micro-batches A, B
        twins = [[c.create_sequence() for _ in range(2)] for _ in range(2)]
        with pagoda.LayerStreams(c) as streams:
            for step in range(5):
                inputs = [[(rng.standard_normal((2, self.cfg.num_q_heads, self.cfg.head_dim)).astype(np.float32),
                            self.kv(rng, 2), self.kv(rng, 2)) for _ in range(2)] for _ in range(layers)]
                for layer in range(layers):
                    for b in range(2):  # both micro-batches in flight on the layer's stream
                        q, k, v = inputs[layer][b]
                        streams.send(layer, batches[b], q, k, v)
                    self.assertEqual(streams.outstanding(layer), 2)
                    for b in range(2):
                        q, k, v = inputs[layer][b]
                        got = streams.receive(layer)
                        want = c.decode(layer, twins[b], q, k, v)
                        self.assertEqual(got.lengths, [step + 1, step + 1])
                        self.assertTrue(np.array_equal(got.output, want.output), f"step {step} layer {layer}")
        for ids in batches + twins:
            for sid in ids:
                c.free_sequence(sid)

    def test_tensors_come_back_in_the_dtype_they_went(self):
        import torch
        c = self.reference
        sid = c.create_sequence()
        rng = np.random.default_rng(4)
        c.append_kv(sid, 0, self.kv(rng, 9), self.kv(rng, 9))
        q = rng.standard_normal((1, self.cfg.num_q_heads, self.cfg.head_dim)).astype(np.float32)
        exact = c.decode(0, [sid], q).output
        half = c.decode(0, [sid], q.astype(np.float16)).output
        self.assertEqual(half.dtype, np.float16)
        np.testing.assert_allclose(half.astype(np.float32), exact, atol=2e-3)
        for dtype, tol in ((torch.float32, 0), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
            out = c.decode(0, [sid], torch.from_numpy(q).to(dtype)).output
            self.assertIsInstance(out, torch.Tensor)
            self.assertEqual(out.dtype, dtype)
            np.testing.assert_allclose(out.float().numpy(), exact, atol=tol + 1e-6)
        c.free_sequence(sid)

    def test_adding_a_pod_moves_few_keys_and_only_to_it(self):
        keys = [f"k{i}" for i in range(2000)]
        three = pagoda.HashRing(["a:1", "b:1", "c:1"])
        four = pagoda.HashRing(["a:1", "b:1", "c:1", "d:1"])
        moved = [key for key in keys if three.owners(key)[0] != four.owners(key)[0]]
        self.assertLess(len(moved) / len(keys), 0.4)
        self.assertTrue(all(four.owners(key)[0] == "d:1" for key in moved))

    def test_a_pod_that_is_down_is_unavailable_naming_it(self):
        dead = f"127.0.0.1:{free_port()}"
        with pagoda.ShardedClient([dead, self.pods[0]], timeout=3) as sc:
            key = next(f"x{i}" for i in range(1000) if sc.ring.owners(f"x{i}")[0] == dead)
            t0 = time.time()
            with self.assertRaises(pagoda.PagodaError) as err:
                sc.create_sequence(placement_key=key)
            self.assertLess(time.time() - t0, 5)
            self.assertEqual(err.exception.code.name, "UNAVAILABLE")
            self.assertIn(dead, str(err.exception))


if __name__ == "__main__":
    SERVER = sys.argv.pop(1)
    unittest.main()
