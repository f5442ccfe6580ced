#!/usr/bin/env python3
"""A worked example of the Python client: one sequence, 200 tokens of K/V in
layer 0, a decode step with the new token's K/V appended, checked against numpy,
then the same keys split over two sequences ("shards") merged by LSE.

    .venv/bin/python client/python/example.py --server 127.0.0.1:50051      # the installed package (README)
    client/python/generate_stubs.sh build/python                               # or from the source tree:
    PYTHONPATH=build/python:client/python /usr/bin/python3 client/python/example.py --server 127.0.0.1:50051
"""
import argparse

import numpy as np

from pagoda import PagodaClient, decode_tensor, encode, merge_by_lse


def attention(q, k, v, scale):
    """q [qh, d], k/v [n, kvh, d] -> output [qh, d], lse [qh] (GQA: head h reads h // group)."""
    group = q.shape[0] // k.shape[1]
    kh = np.repeat(k.astype(np.float64), group, axis=1)          # [n, qh, d]
    vh = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("hd,nhd->hn", q.astype(np.float64), kh) * scale
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    return np.einsum("hn,nhd->hd", p / p.sum(axis=1, keepdims=True), vh), (m[:, 0] + np.log(p.sum(axis=1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=None, help="host:port (default $PAGODA_SERVER or 127.0.0.1:50051)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with PagodaClient(args.server) as client:
        cfg = client.config()
        print(f"{client.address}: {cfg.backend}, {cfg.num_q_heads} q / {cfg.num_kv_heads} kv heads, "
              f"head_dim {cfg.head_dim}, cache dtype {cfg.cache_dtype} (1 fp32, 2 fp16, 3 bf16)")
        kv_shape = (cfg.num_kv_heads, cfg.head_dim)
        # K/V as the cache stores them (rounded to its dtype), for the numpy check.
        stored = lambda x: decode_tensor(encode(x, cfg.cache_dtype), cfg.cache_dtype, x.shape)
        k = stored(rng.standard_normal((200, *kv_shape)))
        v = stored(rng.standard_normal((200, *kv_shape)))

        seq = client.create_sequence("python-example")
        print("layer 0 length:", client.append_kv(seq, 0, k, v))
        q = rng.standard_normal((1, cfg.num_q_heads, cfg.head_dim)).astype(np.float32)
        res = client.decode(layer=0, sequence_ids=[seq], q=q, return_lse=True)
        want, want_lse = attention(q[0], k, v, 1 / np.sqrt(cfg.head_dim))
        print(f"decode: lengths {res.lengths}, max error {np.abs(res.output[0] - want).max():.2e}, "
              f"lse error {np.abs(res.lse[0] - want_lse).max():.2e}")

        # Two shards holding the first 96 and the last 104 tokens, merged by LSE.
        a, b = client.create_sequence("shard-a"), client.create_sequence("shard-b")
        client.append_kv(a, 0, k[:96], v[:96])
        client.append_kv(b, 0, k[96:], v[96:])
        ra = client.decode(layer=0, sequence_ids=[a], q=q, return_lse=True)
        rb = client.decode(layer=0, sequence_ids=[b], q=q, return_lse=True)
        merged, merged_lse = merge_by_lse([ra.output, rb.output], [ra.lse, rb.lse])
        print(f"shards merged by LSE: max error vs whole {np.abs(merged - res.output).max():.2e}")

        # Three pipelined steps on one stream, each appending a new token.
        steps = [dict(layer=0, sequence_ids=[seq], q=q, k=rng.standard_normal((1, *kv_shape)),
                      v=rng.standard_normal((1, *kv_shape))) for _ in range(3)]
        for r in client.decode_stream(steps):
            print(f"stream: request {r.request_id} attended {r.lengths[0]} tokens in {r.timing_us['total_us']:.0f} us")
        for s in (seq, a, b):
            client.free_sequence(s)
        print("health:", client.health())


if __name__ == "__main__":
    main()
