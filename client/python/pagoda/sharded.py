"""Past one pod (docs/design.md §12): a client over several pagoda servers.

Sequence placement: each new sequence gets a placement key (its label, or a
random one), and a consistent-hash ring of the endpoints (64 virtual nodes
each; FNV-1a + splitmix64, as the C++ ShardedClient) picks its pod, so adding a pod moves about 1/(pods+1) of the keys and
nothing else. The server assigns the id, so a sequence is named by a
`SequenceRef` (endpoint, id). A batch is split per pod, the parts issued
concurrently, and the results put back in request order.

Context sharding: a `ShardedSequence` spreads one long sequence's tokens over
several pods (each pod holds a disjoint part); a decode asks every part for its
output and LSE and merges them with the one online-softmax merge
(`merge_by_lse`), which equals attention over all the tokens up to rounding.

A pod that does not answer is a PagodaError UNAVAILABLE naming its endpoint,
within the client's timeout, never a hang."""
from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import os
import socket
from typing import Dict, List, Optional, Sequence

import numpy as np

from pagoda import PagodaClient, PagodaError, merge_by_lse


_MASK = (1 << 64) - 1


def _hash(text: str) -> int:
    """FNV-1a over the UTF-8 bytes, then the splitmix64 finaliser (so that
    similar keys spread): the C++ ShardedClient hashes the same way, so both
    clients place a key on the same pod."""
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & _MASK
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK
    return h ^ (h >> 31)


@dataclasses.dataclass(frozen=True)
class SequenceRef:
    endpoint: str
    sequence_id: int


class HashRing:
    """Consistent hashing of keys onto endpoints, `vnodes` points each."""

    def __init__(self, endpoints: Sequence[str], vnodes: int = 64):
        if not endpoints:
            raise ValueError("endpoints: expected at least one, received none")
        self._points = sorted((_hash(f"{e}#{i}"), e) for e in endpoints for i in range(vnodes))
        self._keys = [p for p, _ in self._points]

    def owners(self, key: str, n: int = 1) -> List[str]:
        """The first n distinct endpoints clockwise from the key's hash."""
        start = bisect.bisect(self._keys, _hash(key))
        found: List[str] = []
        for i in range(len(self._points)):
            endpoint = self._points[(start + i) % len(self._points)][1]
            if endpoint not in found:
                found.append(endpoint)
                if len(found) == n:
                    break
        return found


def endpoints_from_dns(name: str, port: int) -> List[str]:
    """Every address a name resolves to (a headless Service's pods), as host:port."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({f"{i[4][0]}:{port}" if i[0] == socket.AF_INET else f"[{i[4][0]}]:{port}" for i in infos})


class ShardedClient:
    def __init__(self, endpoints: Sequence[str], vnodes: int = 64, **client_kwargs):
        """endpoints: host:port of every pod (or endpoints_from_dns(...)); client_kwargs go to
        each PagodaClient (timeout, token, tls_ca, ...)."""
        self.endpoints = list(endpoints)
        self.ring = HashRing(self.endpoints, vnodes)
        self._clients: Dict[str, PagodaClient] = {e: PagodaClient(e, **client_kwargs) for e in self.endpoints}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(self.endpoints)))
        self._client_kwargs = client_kwargs
        self._vnodes = vnodes
        # Every sequence this client placed, with its placement key (rebalance moves them).
        self.placed: Dict[SequenceRef, str] = {}

    def close(self):
        self._pool.shutdown(wait=True)
        for c in self._clients.values():
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def client(self, endpoint: str) -> PagodaClient:
        return self._clients[endpoint]

    def _on(self, endpoint: str, method, *args, **kwargs):
        """Calls method on endpoint's client; errors name the endpoint."""
        try:
            return method(self._clients[endpoint], *args, **kwargs)
        except PagodaError as e:
            raise PagodaError(e.code, f"{endpoint}: {e.message}", e.method) from None

    def config(self):
        """GetConfig of the first pod (pods of one deployment share the geometry)."""
        return self._on(self.endpoints[0], PagodaClient.config)

    # --- sequences placed whole on one pod --------------------------------
    def create_sequence(self, label: str = "", placement_key: Optional[str] = None) -> SequenceRef:
        key = placement_key or label or os.urandom(8).hex()
        endpoint = self.ring.owners(key)[0]
        ref = SequenceRef(endpoint, self._on(endpoint, PagodaClient.create_sequence, label))
        self.placed[ref] = key
        return ref

    def append_kv(self, ref: SequenceRef, layer: int, k, v=None, **kwargs) -> int:
        return self._on(ref.endpoint, PagodaClient.append_kv, ref.sequence_id, layer, k, v, **kwargs)

    def free_sequence(self, ref: SequenceRef) -> None:
        self._on(ref.endpoint, PagodaClient.free_sequence, ref.sequence_id)
        self.placed.pop(ref, None)

    def rebalance(self, endpoints: Sequence[str], hold=None) -> Dict[SequenceRef, SequenceRef]:
        """After a scale event: the ring over `endpoints`, and every placed sequence whose owner
        changed migrated to its new owner (PagodaClient.migrate: bulk and catch-up stages while
        it keeps serving, then hold(ref) if given, the last stage, the source freed). Sequences
        whose owner stayed are not touched. Returns {old ref: new ref} of the moved ones; pods
        no longer listed are closed once emptied of this client's sequences."""
        if not endpoints:
            raise ValueError("endpoints: expected at least one, received none")
        ring = HashRing(list(endpoints), self._vnodes)
        for e in endpoints:
            if e not in self._clients:
                self._clients[e] = PagodaClient(e, **self._client_kwargs)
        moved: Dict[SequenceRef, SequenceRef] = {}
        for ref, key in list(self.placed.items()):
            owner = ring.owners(key)[0]
            if owner == ref.endpoint:
                continue
            wait = (lambda r=ref: hold(r)) if hold is not None else None
            try:
                new_id = self._clients[ref.endpoint].migrate(ref.sequence_id, self._clients[owner], hold=wait)
            except PagodaError as e:
                raise PagodaError(e.code, f"{ref.endpoint} -> {owner}: {e.message}", e.method) from None
            new_ref = SequenceRef(owner, new_id)
            del self.placed[ref]
            self.placed[new_ref] = key
            moved[ref] = new_ref
        for e in [e for e in self._clients if e not in endpoints]:
            self._clients.pop(e).close()
        self.endpoints = list(endpoints)
        self.ring = ring
        self._pool.shutdown(wait=True)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(self.endpoints)))
        return moved

    def decode(self, layer: int, refs: Sequence[SequenceRef], q, k=None, v=None, return_lse: bool = False,
               **kwargs):
        """One decode step for a batch spread over pods (one query row per sequence): one Decode
        per pod, concurrently; returns (output [batch, q_heads, v_head_dim], lse or None, lengths)
        in the order of `refs`. A latent-attention server takes k alone."""
        cfg = self.config()
        q = np.asarray(q, dtype=np.float32).reshape(len(refs), cfg.num_q_heads, cfg.head_dim)
        kv_shape = (len(refs), cfg.num_kv_heads, cfg.head_dim)
        k = None if k is None else np.asarray(k, dtype=np.float32).reshape(kv_shape)
        v = None if v is None else np.asarray(v, dtype=np.float32).reshape(kv_shape)
        rows: Dict[str, List[int]] = {}
        for i, ref in enumerate(refs):
            rows.setdefault(ref.endpoint, []).append(i)

        def part(endpoint, idx):
            return self._on(endpoint, PagodaClient.decode, layer, [refs[i].sequence_id for i in idx], q[idx],
                            None if k is None else k[idx], None if v is None else v[idx],
                            return_lse=return_lse, **kwargs)

        futures = {e: self._pool.submit(part, e, idx) for e, idx in rows.items()}
        out = np.zeros((len(refs), cfg.num_q_heads, cfg.v_head_dim), dtype=np.float32)
        lse = np.zeros((len(refs), cfg.num_q_heads), dtype=np.float32) if return_lse else None
        lengths = [0] * len(refs)
        for endpoint, idx in rows.items():
            r = futures[endpoint].result()
            out[idx] = r.output
            if return_lse:
                lse[idx] = r.lse
            for j, i in enumerate(idx):
                lengths[i] = r.lengths[j]
        return out, lse, lengths

    # --- one sequence's context spread over pods ----------------------------
    def create_sharded_sequence(self, label: str = "", shards: int = 2) -> "ShardedSequence":
        key = label or os.urandom(8).hex()
        pods = self.ring.owners(key, shards)
        if len(pods) < shards:
            raise ValueError(f"shards: expected at most the {len(self.endpoints)} pods, received {shards}")
        parts = [SequenceRef(e, self._on(e, PagodaClient.create_sequence, f"{label}#{i}")) for i, e in enumerate(pods)]
        return ShardedSequence(self, parts)


class ShardedSequence:
    """One sequence whose tokens are spread over pods: appends go to the part
    holding the fewest tokens of that layer; decodes merge every part by LSE."""

    def __init__(self, client: ShardedClient, parts: List[SequenceRef]):
        self._client = client
        self.parts = parts
        cfg = client.config()
        self._lengths = [[0] * cfg.num_layers for _ in parts]

    def append_kv(self, layer: int, k, v=None, chunk: int = 256) -> int:
        """Appends k, v [n, kv_heads, head_dim] (k alone on a latent-attention server) in chunks
        of `chunk` tokens, each to the least filled part; returns the layer's total length."""
        k = np.asarray(k, dtype=np.float32)
        v = None if v is None else np.asarray(v, dtype=np.float32)
        for start in range(0, k.shape[0], chunk):
            p = min(range(len(self.parts)), key=lambda i: self._lengths[i][layer])
            ref = self.parts[p]
            self._lengths[p][layer] = self._client.append_kv(ref, layer, k[start:start + chunk],
                                                             None if v is None else v[start:start + chunk])
        return self.length(layer)

    def length(self, layer: int) -> int:
        return sum(lengths[layer] for lengths in self._lengths)

    def decode(self, layer: int, q, k=None, v=None):
        """One query row over the whole context: the new token's k/v (if any) appended to the
        least filled part, every part decoded with its LSE, merged. Returns (output, lse)."""
        cfg = self._client.config()
        q = np.asarray(q, dtype=np.float32).reshape(1, cfg.num_q_heads, cfg.head_dim)
        target = min(range(len(self.parts)), key=lambda i: self._lengths[i][layer]) if k is not None else -1

        def part(i):
            ref = self.parts[i]
            appends = i == target
            return self._client._on(ref.endpoint, PagodaClient.decode, layer, [ref.sequence_id], q,
                                    k if appends else None, v if appends else None, return_lse=True)

        results = list(self._client._pool.map(part, range(len(self.parts))))
        if target >= 0:
            self._lengths[target][layer] = results[target].lengths[0]
        return merge_by_lse([r.output for r in results], [r.lse for r in results])

    def free(self):
        for ref in self.parts:
            self._client.free_sequence(ref)
