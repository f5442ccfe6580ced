#!/usr/bin/env python3
"""A small DeepSeek-V2-style model with multi-head latent attention (MLA; seeded random
weights) sized to a latent-attention server (--kv-heads 1 --head-dim 576 --v-head-dim 512),
generating greedily for a batch of prompts of different lengths two ways:

  local:  its own attention, the plain (non-absorbed) form: each head's keys and values
          up-projected from the cached latent rows (rounded to the server's cache dtype,
          as the server stores them) and attended in float64;
  pagoda: the absorbed form of DeepSeek-V2's paper (section 2.1.2): W_UK folded into the
          query, so every head attends the one latent row [c_kv; k_rope] (576 elements)
          with V = c_kv (its first 512), and W_UV applied to pagoda's 512-wide output.
          The prompts' latent rows go in with AppendKV (k alone), then one Decode per
          layer per step appends the step's row and attends in one call.

It asserts that both produce the same tokens and close logits, and prints the tokens per
second of each.

    make run ARGS="--kv-heads 1 --head-dim 576 --v-head-dim 512 --q-heads 16 --cache-dtype bf16"
    .venv/bin/python client/python/examples/mla_decode.py --server 127.0.0.1:50051
"""
import argparse
import math
import sys
import time

import torch

import pagoda

CACHE_DTYPES = {1: torch.float32, 2: torch.float16, 3: torch.bfloat16}  # pagoda.v1.DType of the cache


class TinyMla:
    """Per layer: RMSNorm; q = x W_Q split per head into q_nope [d_nope] and q_rope [d_rope];
    the latent c_kv = RMSNorm(x W_DKV) [d_c] and the shared RoPE key k_rope = RoPE(x W_KR)
    [d_rope]; per-head up-projections W_UK [d_c -> d_nope] and W_UV [d_c -> d_v]; W_O; a
    SwiGLU MLP. The softmax scale is 1/sqrt(d_nope + d_rope) (DeepSeek's, without YaRN)."""

    def __init__(self, layers, heads, d_c, d_rope, d_nope, d_v, hidden, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.layers, self.h, self.dc, self.dr, self.dn, self.dv = layers, heads, d_c, d_rope, d_nope, d_v
        inner = 2 * hidden

        def w(*shape):
            return torch.randn(*shape, generator=g) / math.sqrt(shape[-2] if len(shape) > 2 else shape[0])

        self.embed = torch.randn(vocab, hidden, generator=g)
        self.blocks = [dict(wq=w(hidden, heads * (d_nope + d_rope)), wdkv=w(hidden, d_c), wkr=w(hidden, d_rope),
                            wuk=w(heads, d_c, d_nope), wuv=w(heads, d_c, d_v), wo=w(heads * d_v, hidden),
                            gate=w(hidden, inner), up=w(hidden, inner), down=w(inner, hidden),
                            norm1=1 + 0.1 * torch.randn(hidden, generator=g),
                            kv_norm=1 + 0.1 * torch.randn(d_c, generator=g),
                            norm2=1 + 0.1 * torch.randn(hidden, generator=g)) for _ in range(layers)]
        self.norm = torch.ones(hidden)
        self.head = w(hidden, vocab)
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, d_rope, 2, dtype=torch.float32) / d_rope))
        self.scale = 1 / math.sqrt(d_nope + d_rope)

    @staticmethod
    def rmsnorm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def rope(self, x, positions):  # x [n, heads, d_rope], positions [n]
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def project(self, block, x, positions):
        """q_nope [n, h, d_nope], q_rope [n, h, d_rope] and the latent row [n, d_c + d_rope]."""
        h = self.rmsnorm(x, block["norm1"])
        q = (h @ block["wq"]).view(-1, self.h, self.dn + self.dr)
        q_nope, q_rope = q[..., : self.dn], self.rope(q[..., self.dn:], positions)
        c_kv = self.rmsnorm(h @ block["wdkv"], block["kv_norm"])
        k_rope = self.rope((h @ block["wkr"])[:, None, :], positions)[:, 0]
        return q_nope, q_rope, torch.cat([c_kv, k_rope], dim=-1)

    def absorbed_q(self, block, q_nope, q_rope):
        """The query against latent rows: [W_UK_h^T q_nope_h ; q_rope_h], [n, h, d_c + d_rope]."""
        return torch.cat([torch.einsum("nhd,hcd->nhc", q_nope, block["wuk"]), q_rope], dim=-1)

    def finish_block(self, block, x, attn):  # attn [n, h, d_v]
        x = x + attn.reshape(x.shape[0], -1) @ block["wo"]
        h = self.rmsnorm(x, block["norm2"])
        return x + (torch.nn.functional.silu(h @ block["gate"]) * (h @ block["up"])) @ block["down"]

    def logits(self, x):
        return self.rmsnorm(x, self.norm) @ self.head


def attend_plain(model, block, q_nope, q_rope, latent):
    """One position's heads (q_nope [h, d_nope], q_rope [h, d_rope]) over cached latent rows
    [n, d_c + d_rope], the plain way: per-head keys [W_UK c; k_rope] and values W_UV c, in
    float64. Returns [h, d_v]."""
    c, k_rope = latent[:, : model.dc].double(), latent[:, model.dc:].double()
    k_nope = torch.einsum("nc,hcd->nhd", c, block["wuk"].double())
    v = torch.einsum("nc,hcv->nhv", c, block["wuv"].double())
    s = (torch.einsum("hd,nhd->hn", q_nope.double(), k_nope) + q_rope.double() @ k_rope.T) * model.scale
    return torch.einsum("hn,nhv->hv", torch.softmax(s, dim=-1), v).float()


def prefill(model, prompt, rounded):
    """Causal attention over one prompt; returns the last hidden state and each layer's latent
    rows [n, d_c + d_rope] as the cache holds them (rounded)."""
    positions = torch.arange(len(prompt))
    x = model.embed[torch.tensor(prompt)]
    rows = []
    for block in model.blocks:
        q_nope, q_rope, latent = model.project(block, x, positions)
        latent = rounded(latent)
        attn = torch.stack([attend_plain(model, block, q_nope[i], q_rope[i], latent[: i + 1])
                            for i in range(len(prompt))])
        rows.append(latent)
        x = model.finish_block(block, x, attn)
    return x[-1], rows


def generate(model, last_hidden, lengths, steps, attention_step):
    """Greedy decoding; attention_step(layer, q_nope, q_rope, latent) -> [batch, h, d_v]."""
    x_last = torch.stack(last_hidden)
    tokens, all_logits = [], []
    positions = torch.tensor(lengths)
    logits = model.logits(x_last)
    for _ in range(steps):
        nxt = logits.argmax(-1)
        tokens.append(nxt)
        all_logits.append(logits)
        x = model.embed[nxt]
        for layer, block in enumerate(model.blocks):
            q_nope, q_rope, latent = model.project(block, x, positions)
            x = model.finish_block(block, x, attention_step(layer, q_nope, q_rope, latent))
        positions = positions + 1
        logits = model.logits(x)
    return torch.stack(tokens, 1), torch.stack(all_logits, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=None, help="host:port (default $PAGODA_SERVER or 127.0.0.1:50051)")
    ap.add_argument("--token", default=None, help="bearer token (default $PAGODA_TOKEN)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per prompt")
    ap.add_argument("--prompts", default="5,12,29", help="prompt lengths, comma-separated")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256, help="the model's hidden size")
    ap.add_argument("--nope-dim", type=int, default=128, help="per-head query/key dims without RoPE (d_nope)")
    ap.add_argument("--v-dim", type=int, default=128, help="per-head value dims after W_UV (d_v)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    client = pagoda.PagodaClient(args.server, token=args.token, timeout=60)
    cfg = client.config()
    if not cfg.latent or cfg.num_kv_heads != 1:
        sys.exit(f"this example needs a latent-attention server (--kv-heads 1 --head-dim 576 --v-head-dim 512); "
                 f"this one has {cfg.num_kv_heads} KV heads, head_dim {cfg.head_dim}, v_head_dim {cfg.v_head_dim}")
    if cfg.cache_dtype not in CACHE_DTYPES:
        sys.exit(f"cache dtype {cfg.cache_dtype}: this example rounds to fp32, fp16 or bf16 caches only")
    if any(s != 1.0 for s in list(cfg.k_scales) + list(cfg.v_scales)):
        sys.exit("the server's K/V scales: this example expects 1 (the default)")
    cache_dtype = CACHE_DTYPES[cfg.cache_dtype]

    def rounded(t):
        return t.to(cache_dtype).to(torch.float32)

    # The latent row is c_kv (v_head_dim of the server: d_c) then the RoPE key (the rest).
    d_c, d_rope = cfg.v_head_dim, cfg.head_dim - cfg.v_head_dim
    model = TinyMla(cfg.num_layers, cfg.num_q_heads, d_c, d_rope, args.nope_dim, args.v_dim, args.hidden,
                    args.vocab, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    lengths = [int(n) for n in args.prompts.split(",")]
    prompts = [torch.randint(0, args.vocab, (n,), generator=g).tolist() for n in lengths]
    prefilled = [prefill(model, p, rounded) for p in prompts]
    last = [h for h, _ in prefilled]

    # Local: the rounded latent rows per sequence and layer, attended the plain way.
    local = [list(rows) for _, rows in prefilled]

    def local_step(layer, q_nope, q_rope, latent):
        out = []
        for b in range(q_nope.shape[0]):
            local[b][layer] = torch.cat([local[b][layer], rounded(latent[b : b + 1])])
            out.append(attend_plain(model, model.blocks[layer], q_nope[b], q_rope[b], local[b][layer]))
        return torch.stack(out)

    # pagoda: the prompts' latent rows appended (k alone: V is their first d_c elements),
    # then one Decode per layer per step with the absorbed query and the model's scale.
    ids = [client.create_sequence(f"mla-{i}") for i in range(len(prompts))]
    try:
        for sid, (_, rows) in zip(ids, prefilled):
            for layer, latent in enumerate(rows):
                client.append_kv(sid, layer, latent[:, None, :], dtype="fp32", expected_length=0)

        def pagoda_step(layer, q_nope, q_rope, latent):
            block = model.blocks[layer]
            q = model.absorbed_q(block, q_nope, q_rope)
            out = client.decode(layer, ids, q, k=latent[:, None, :], scale=model.scale, dtype="fp32").output
            return torch.einsum("nhc,hcv->nhv", out, block["wuv"])  # [batch, h, d_c] -> [batch, h, d_v]

        t0 = time.perf_counter()
        local_tokens, local_logits = generate(model, last, lengths, args.tokens, local_step)
        t1 = time.perf_counter()
        pagoda_tokens, pagoda_logits = generate(model, last, lengths, args.tokens, pagoda_step)
        t2 = time.perf_counter()
    finally:
        for sid in ids:
            client.free_sequence(sid)

    n = args.tokens * len(prompts)
    diff = (local_logits - pagoda_logits).abs().max().item()
    print(f"prompts {lengths}, {args.tokens} tokens each; {cfg.num_layers} layers, {cfg.num_q_heads} query heads "
          f"over one latent head of {cfg.head_dim} (V: its first {cfg.v_head_dim}), cache dtype {cache_dtype}")
    print(f"local plain attention:   {n / (t1 - t0):8.1f} tokens/s")
    print(f"pagoda absorbed Decode:  {n / (t2 - t1):8.1f} tokens/s")
    print(f"tokens identical: {torch.equal(local_tokens, pagoda_tokens)}; max |logit difference| {diff:.3g}")
    for b in range(len(prompts)):
        print(f"  sequence {b}: {pagoda_tokens[b, :12].tolist()} ...")
    if not torch.equal(local_tokens, pagoda_tokens):
        sys.exit("FAIL: the token sequences differ")
    # fp32 attention leaves the logits within 1e-3 of the local model's. A CPU
    # server on a bf16 matrix unit (a bf16 cache; its device name says
    # "AMX-BF16" or "AVX512-BF16") rounds q and each softmax weight to bf16,
    # 2^-9 relative apiece, a few 2^-9 of every attention output over the
    # layers: 1e-2 then.
    bf16_unit = any(u in cfg.device_name for u in ("AMX-BF16", "AVX512-BF16"))
    allowed = 1e-2 if bf16_unit else 1e-3
    if diff > allowed * max(1.0, local_logits.abs().max().item()):
        sys.exit(f"FAIL: logits differ by {diff}")


if __name__ == "__main__":
    main()
