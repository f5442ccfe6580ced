#!/usr/bin/python3
"""PagodaClient.migrate and ShardedClient.rebalance against real pagoda servers
on loopback: a migrated sequence decodes bit for bit as it did at the source
(block sizes differ between the servers), keeps its label, and the source is
freed; a client appending all along loses no token (the last stage runs under
hold); rebalance moves exactly the sequences whose ring owner changed.

Usage: python_migrate_test.py PAGODA_SERVER"""
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from local_servers import generate_stubs, pagoda, start_server, stop_servers
from pagoda.sharded import HashRing, SequenceRef  # noqa: E402

SERVER = None


class Migrate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        generate_stubs(cls.dir.name)
        cls.servers, cls.endpoints = [], []
        for block_size in (16, 32, 16, 8):
            proc, endpoint = start_server(SERVER, ["--block-size", str(block_size), "--split-tokens", "64",
                                                   "--cache-dtype", "fp32"])
            cls.servers.append(proc)
            cls.endpoints.append(endpoint)
        cls.clients = [pagoda.PagodaClient(e) for e in cls.endpoints]
        cls.cfg = cls.clients[0].config()

    @classmethod
    def tearDownClass(cls):
        for c in cls.clients:
            c.close()
        stop_servers(cls.servers)
        cls.dir.cleanup()

    def kv(self, rng, n):
        return rng.standard_normal((n, self.cfg.num_kv_heads, self.cfg.head_dim)).astype(np.float32)

    def q(self, rng):
        return rng.standard_normal((1, self.cfg.num_q_heads, self.cfg.head_dim)).astype(np.float32)

    def fill(self, client, rng, lengths, label=""):
        seq = client.create_sequence(label)
        for layer, n in enumerate(lengths):
            if n:
                client.append_kv(seq, layer, self.kv(rng, n), self.kv(rng, n))
        return seq

    def bits(self, client, seq, q):
        out = []
        for layer in range(self.cfg.num_layers):
            r = client.decode(layer, [seq], q, return_lse=True)
            out.append((r.output.tobytes(), r.lse.tobytes()))
        return out

    def test_migrate_keeps_bits_and_label_and_frees_the_source(self):
        rng = np.random.default_rng(3)
        a, b = self.clients[0], self.clients[1]
        seq = self.fill(a, rng, [70, 45], "chat-9")
        q = self.q(rng)
        want = self.bits(a, seq, q)
        moved = a.migrate(seq, b)
        self.assertEqual(self.bits(b, moved, q), want)
        back = b.migrate(moved, self.endpoints[2])  # by address; block size 16 -> 32 -> 16
        self.assertEqual(self.bits(self.clients[2], back, q), want)
        moved_back = self.clients[2].migrate(back, b)
        self.assertEqual(self.bits(b, moved_back, q), want)
        moved = moved_back
        info = b.get_sequence(moved)
        self.assertEqual(list(info.layer_lengths), [70, 45])
        self.assertEqual(info.label, "chat-9")
        with self.assertRaises(pagoda.PagodaError) as err:
            a.get_sequence(seq)
        self.assertEqual(err.exception.code.name, "NOT_FOUND")

    def test_an_appending_client_loses_nothing(self):
        rng = np.random.default_rng(4)
        a, b = self.clients[0], self.clients[1]
        seq = self.fill(a, rng, [300, 300])
        appended = {"n": 0}
        lock = threading.Lock()  # held by the appender while it appends; hold() takes it
        stop = threading.Event()
        held = threading.Event()

        def appender():
            local = np.random.default_rng(5)
            while not stop.is_set():
                with lock:
                    if held.is_set():
                        return
                    for layer in range(self.cfg.num_layers):
                        a.append_kv(seq, layer, self.kv(local, 1), self.kv(local, 1))
                    appended["n"] += 1
                time.sleep(0.002)

        t = threading.Thread(target=appender)
        t.start()
        time.sleep(0.05)

        def hold():
            with lock:
                held.set()
        try:
            moved = a.migrate(seq, b, hold=hold, last_stage_tokens=2)
        finally:
            stop.set()
            t.join()
        self.assertGreater(appended["n"], 0)
        self.assertEqual(list(b.get_sequence(moved).layer_lengths), [300 + appended["n"]] * 2)

    def test_a_copy_keeps_the_source_and_an_unknown_id_is_not_found(self):
        rng = np.random.default_rng(6)
        a = self.clients[0]
        seq = self.fill(a, rng, [10, 10])
        moved = a.migrate(seq, a, free_source=False)  # a copy on the same server
        self.assertNotEqual(moved, seq)
        self.assertEqual(list(a.get_sequence(seq).layer_lengths), [10, 10])
        with self.assertRaises(pagoda.PagodaError) as err:
            a.migrate(seq ^ 1, self.clients[1])
        self.assertEqual(err.exception.code.name, "NOT_FOUND")

    def test_rebalance_moves_exactly_the_sequences_whose_owner_changed(self):
        rng = np.random.default_rng(7)
        old, new = self.endpoints[:2], self.endpoints[:3]
        with pagoda.ShardedClient(old) as sc:
            refs = []
            for i in range(16):
                ref = sc.create_sequence(placement_key=f"user-{i}")
                sc.append_kv(ref, 0, self.kv(rng, 5 + i), self.kv(rng, 5 + i))
                refs.append(ref)
            q = self.q(rng)
            before = {ref: sc.client(ref.endpoint).decode(0, [ref.sequence_id], q).output.tobytes() for ref in refs}
            ring = HashRing(new)
            expect_moved = {ref for i, ref in enumerate(refs) if ring.owners(f"user-{i}")[0] != ref.endpoint}
            self.assertTrue(expect_moved, "the test's keys should move some sequences")
            moved = sc.rebalance(new)
            self.assertEqual(set(moved), expect_moved)
            for i, ref in enumerate(refs):
                now = moved.get(ref, ref)
                self.assertEqual(now.endpoint, ring.owners(f"user-{i}")[0])
                self.assertEqual(sc.client(now.endpoint).decode(0, [now.sequence_id], q).output.tobytes(),
                                 before[ref])
                if ref in moved:
                    self.assertEqual(now.endpoint, new[2])
                    with self.assertRaises(pagoda.PagodaError):
                        sc.client(ref.endpoint).get_sequence(ref.sequence_id)
                else:
                    self.assertEqual(now, ref)
            self.assertEqual(set(sc.placed), {moved.get(r, r) for r in refs})


if __name__ == "__main__":
    SERVER = sys.argv.pop(1)
    unittest.main()
