#!/usr/bin/python3
"""The Python client's own logic, without a server: wire encodings (bit patterns
shared with the C++ client's tests) and the shard merge by LSE against a direct
numpy computation over all keys."""
import math
import os
import unittest

import numpy as np

import pagoda as pc


def attention(q, k, v, scale):
    """q [h, d], k/v [n, h, d] in float64 -> output [h, d], lse [h]."""
    s = np.einsum("hd,nhd->hn", q, k) * scale
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    return np.einsum("hn,nhd->hd", p / p.sum(axis=1, keepdims=True), v), m[:, 0] + np.log(p.sum(axis=1))


class Encoding(unittest.TestCase):
    def words(self, data):
        return list(np.frombuffer(data, dtype="<u2"))

    def test_fp16_bits(self):
        self.assertEqual(self.words(pc.encode(np.array([1.0, -2.0, 65504.0]), "fp16")), [0x3C00, 0xC000, 0x7BFF])

    def test_bf16_bits_round_to_nearest_even(self):
        x = np.array([1.0, -2.0, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8], dtype=np.float32)
        self.assertEqual(self.words(pc.encode(x, "bf16")), [0x3F80, 0xC000, 0x3F80, 0x3F82])

    def test_bf16_nan_stays_nan(self):
        back = pc.decode_tensor(pc.encode(np.array([np.nan], dtype=np.float32), "bf16"), "bf16", (1,))
        self.assertTrue(np.isnan(back[0]))

    def test_round_trip_and_byte_count(self):
        x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
        for dtype in ("fp32", "fp16", "bf16"):
            back = pc.decode_tensor(pc.encode(x, dtype), dtype, x.shape)
            self.assertEqual(back.shape, x.shape)
            self.assertLessEqual(np.abs(back - x).max(), 3 * 2.0 ** -8)
        with self.assertRaises(pc.PagodaError) as err:
            pc.decode_tensor(b"\0" * 10, "fp32", (3,), "output")
        self.assertIn("output.data: expected 12 bytes, received 10", str(err.exception))
        with self.assertRaises(ValueError):
            pc.wire_dtype("fp8")


try:
    import torch
except ImportError:  # the install script installs python3-torch; without it these skip
    torch = None


@unittest.skipIf(torch is None, "python3-torch is not installed")
class TorchTensors(unittest.TestCase):
    def test_bf16_bits_travel_unchanged(self):
        t = torch.tensor([1.0, -2.0, 1 + 2.0 ** -7, 3.140625], dtype=torch.bfloat16)
        self.assertEqual(pc.encode(t, "bf16"), t.view(torch.int16).numpy().tobytes())

    def test_conversions_match_the_numpy_path(self):
        x = torch.linspace(-3, 3, 50, dtype=torch.float32)
        for dtype in ("fp32", "fp16", "bf16"):
            self.assertEqual(pc.encode(x, dtype), pc.encode(x.numpy(), dtype), dtype)

    def test_the_wire_dtype_follows_the_input(self):
        self.assertEqual(pc.tensors.follow_dtype(torch.zeros(2, dtype=torch.bfloat16), None), "bf16")
        self.assertEqual(pc.tensors.follow_dtype(torch.zeros(2, dtype=torch.float16), None), "fp16")
        self.assertEqual(pc.tensors.follow_dtype(torch.zeros(2), None), "fp32")
        self.assertEqual(pc.tensors.follow_dtype(np.zeros(2, dtype=np.float16), None), "fp16")
        self.assertEqual(pc.tensors.follow_dtype(torch.zeros(2, dtype=torch.bfloat16), "fp32"), "fp32")

    def test_back_from_the_wire_in_the_dtype_of_q(self):
        like = torch.zeros(1, dtype=torch.bfloat16)
        x = torch.tensor([[1.5, -0.25]], dtype=torch.float32)
        back = pc.tensors.torch_from_wire(pc.encode(x, "bf16"), pc.BFLOAT16, (1, 2), like, pc.FLOAT32, pc.FLOAT16)
        self.assertEqual(back.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(back.float(), x))


class HeapRetention(unittest.TestCase):
    @unittest.skipUnless(hasattr(os, "confstr") and "glibc" in (os.confstr("CS_GNU_LIBC_VERSION") or ""), "not glibc")
    def test_sets_the_thresholds_on_glibc(self):
        self.assertTrue(pc.retain_freed_heap(""))

    def test_an_operators_malloc_tunable_stands(self):
        self.assertFalse(pc.retain_freed_heap("glibc.malloc.trim_threshold=1048576"))


class MergeByLse(unittest.TestCase):
    def setUp(self):
        rng = np.random.default_rng(3)
        self.q = rng.standard_normal((4, 16))
        self.k = rng.standard_normal((90, 4, 16))
        self.v = rng.standard_normal((90, 4, 16))
        self.k[85] = 0.5 * self.q  # the row max in the last shard
        self.scale = 1 / math.sqrt(16)

    def test_shards_equal_the_whole(self):
        want, want_lse = attention(self.q, self.k, self.v, self.scale)
        parts = [attention(self.q, self.k[a:b], self.v[a:b], self.scale) for a, b in ((0, 30), (30, 31), (31, 90))]
        out, lse = pc.merge_by_lse([p[0] for p in parts], [p[1] for p in parts])
        self.assertLess(np.abs(out - want).max(), 1e-6)
        self.assertLess(np.abs(lse - want_lse).max(), 1e-5)
        self.assertGreater(np.abs(parts[0][0] - want).max(), 1e-2)  # merging did something

    def test_empty_shards(self):
        out, lse = attention(self.q, self.k, self.v, self.scale)
        empty_out, empty_lse = np.full_like(out, 7.0), np.full_like(lse, -np.inf)
        merged, merged_lse = pc.merge_by_lse([empty_out, out], [empty_lse, lse])
        self.assertLess(np.abs(merged - out).max(), 1e-6)
        nothing, nothing_lse = pc.merge_by_lse([empty_out, empty_out], [empty_lse, empty_lse])
        self.assertTrue((nothing == 0).all())
        self.assertTrue(np.isneginf(nothing_lse).all())


if __name__ == "__main__":
    unittest.main()
