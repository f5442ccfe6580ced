"""An orchestrator's layer loop with several micro-batches in flight.

Attention-disaggregated serving keeps 2-4 micro-batches moving so that the
server attends one while the caller computes another's projections and MLP.
`pipelined_layers` runs one forward pass that way over LayerStreams (one
DecodeStream per layer): a micro-batch's request for layer l+1 goes out as
soon as its layer-l MLP is done, while the others' requests are still being
answered. In deterministic mode every sequence's bits are those of one
micro-batch at a time (a sequence's output does not depend on its batch).
"""
from typing import Any, Callable, Sequence


def pipelined_layers(streams, num_layers: int, micro_batches: Sequence[Any],
                     attention_inputs: Callable[[int, Any], dict],
                     attention_done: Callable[[int, Any, Any], None]) -> None:
    """One forward pass of `num_layers` layers for every micro-batch.

    attention_inputs(layer, mb) -> decode() keyword arguments for micro-batch
    `mb` on `layer` (sequence_ids, q, k, v, ...): the caller's projections.
    attention_done(layer, mb, result) consumes the DecodeResult (the caller's
    output projection and MLP), before `mb`'s next layer is asked for.
    Requests of one layer are answered in the order they were sent, so the
    micro-batches advance round-robin, up to len(micro_batches) in flight."""
    if num_layers <= 0 or not micro_batches:
        return
    for mb in micro_batches:
        streams.send(0, **attention_inputs(0, mb))
    for layer in range(num_layers):
        for mb in micro_batches:
            attention_done(layer, mb, streams.receive(layer))
            if layer + 1 < num_layers:
                streams.send(layer + 1, **attention_inputs(layer + 1, mb))
