"""One DecodeStream per layer, kept open for a model's whole decode loop.

A model calls pagoda once per layer per step; layer l + 1 needs layer l's
output, so one batch cannot pipeline through the layers. Several micro-batches
can: send micro-batch A's layer-0 step, then B's, and receive A's while B is
computed. LayerStreams keeps a stream per layer open (no per-call set-up, the
server's pipelined path), sends requests as they come and hands back each
layer's responses in order, checking their request ids.

    streams = LayerStreams(client)
    streams.send(0, ids_a, q_a, k_a, v_a)
    streams.send(0, ids_b, q_b, k_b, v_b)
    out_a = streams.receive(0).output
    ...
    streams.close()
"""
from __future__ import annotations

import collections
import queue
from typing import Optional

import grpc

from pagoda import DecodeResult, PagodaError, _rows, _status_code

_END = object()


class _LayerStream:
    def __init__(self, client, timeout: Optional[float]):
        self._client = client
        self._requests: "queue.Queue" = queue.Queue()
        self.pending = collections.deque()  # (request_id, rows, q) in send order

        def messages():
            while True:
                item = self._requests.get()
                if item is _END:
                    return
                yield item

        self._responses = client.stub.DecodeStream(messages(), timeout=timeout)

    def send(self, request, rows: int, q) -> None:
        self.pending.append((request.request_id, rows, q))
        self._requests.put(request)

    def receive(self) -> DecodeResult:
        if not self.pending:
            raise ValueError("receive: expected a request sent and not yet received, found none")
        want, rows, q = self.pending.popleft()
        try:
            resp = next(self._responses)
        except grpc.RpcError as e:
            raise PagodaError(e.code(), e.details() or "(no message)", "DecodeStream") from None
        except StopIteration:
            raise PagodaError(grpc.StatusCode.INTERNAL, "the stream ended with requests outstanding",
                              "DecodeStream") from None
        if resp.request_id != want:
            raise PagodaError(grpc.StatusCode.INTERNAL, f"request_id: expected {want}, received {resp.request_id}",
                              "DecodeStream")
        if resp.HasField("error") and resp.error.code != 0:
            raise PagodaError(_status_code(resp.error.code), resp.error.message, "DecodeStream")
        return self._client._result(resp, rows, like=q)

    def close(self) -> None:
        self._requests.put(_END)
        try:
            for _ in self._responses:  # drains; the stream ends when the server has answered everything
                pass
        except grpc.RpcError:  # already failed: its error reached receive(), or nobody waits for it
            pass


class LayerStreams:
    def __init__(self, client, timeout: Optional[float] = None):
        """client: a PagodaClient; timeout: the deadline of each layer's whole stream (None: none)."""
        self._client = client
        self._timeout = timeout
        self._streams = {}

    def _stream(self, layer: int) -> _LayerStream:
        if layer not in self._streams:
            self._streams[layer] = _LayerStream(self._client, self._timeout)
        return self._streams[layer]

    def send(self, layer: int, sequence_ids, q, k=None, v=None, **decode_kwargs) -> int:
        """Sends one decode step of `layer` (decode()'s arguments); returns its request_id."""
        decode_kwargs.setdefault("request_id", next(self._client._ids))
        request = self._client._decode_request(layer, sequence_ids, q, k, v, **decode_kwargs)
        self._stream(layer).send(request, _rows(sequence_ids, decode_kwargs.get("q_lengths")), q)
        return request.request_id

    def receive(self, layer: int) -> DecodeResult:
        """The response to the oldest request sent on `layer` and not yet received."""
        return self._stream(layer).receive()

    def step(self, layer: int, sequence_ids, q, k=None, v=None, **decode_kwargs) -> DecodeResult:
        """send() then receive(): one synchronous step when nothing else is outstanding on the layer."""
        self.send(layer, sequence_ids, q, k, v, **decode_kwargs)
        return self.receive(layer)

    def outstanding(self, layer: int) -> int:
        return len(self._streams[layer].pending) if layer in self._streams else 0

    def close(self) -> None:
        """Half-closes every stream and waits for them to end."""
        for s in self._streams.values():
            s.close()
        self._streams.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
