"""Python client of the pagoda decode-attention service (pagoda.v1).

Tensors in and out are numpy arrays; they travel as raw little-endian bytes of
float32, float16 or bfloat16. Errors raise PagodaError with the gRPC code and
the server's message. Installed (`pip install ./client/python`), the pagoda.v1
stubs come with the package, generated from proto/ when it is built; from a
source tree, client/python/generate_stubs.sh writes them to a folder to put on
PYTHONPATH (or to pass as stubs_dir to import_stubs).

    client = PagodaClient("127.0.0.1:50051")
    cfg = client.config()
    seq = client.create_sequence("chat-1")
    client.append_kv(seq, layer=0, k=k, v=v)          # [n, kv_heads, head_dim]
    res = client.decode(layer=0, sequence_ids=[seq], q=q, return_lse=True)
    res.output                                        # [batch, q_heads, head_dim]
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import os
import pkgutil
import sys
import time
from typing import Iterable, Iterator, Optional, Sequence

import grpc
import numpy as np

from pagoda import tensors as _tensors

_pb = None
_pbg = None


# The generated pagoda.v1 modules live inside this package once it is
# installed (the build generates them from proto/); from a source tree they
# live in another folder's pagoda/ (generate_stubs.sh OUT_DIR), found on
# sys.path or through stubs_dir / $PAGODA_PY_STUBS.
__path__ = pkgutil.extend_path(__path__, __name__)


def import_stubs(stubs_dir: Optional[str] = None):
    """Imports the generated pagoda.v1 modules (installed, from stubs_dir, or from PYTHONPATH)."""
    global _pb, _pbg
    if _pb is None:
        stubs_dir = stubs_dir or os.environ.get("PAGODA_PY_STUBS")
        if stubs_dir:
            portion = os.path.join(stubs_dir, "pagoda")
            if portion not in __path__:
                __path__.append(portion)
        from pagoda.v1 import decode_attention_pb2 as pb  # noqa: E402
        from pagoda.v1 import decode_attention_pb2_grpc as pbg  # noqa: E402
        _pb, _pbg = pb, pbg
    return _pb, _pbg


# Wire dtype numbers (pagoda.v1.DType).
FLOAT32, FLOAT16, BFLOAT16 = 1, 2, 3
_DTYPE_NAMES = {"fp32": FLOAT32, "float32": FLOAT32, "fp16": FLOAT16, "float16": FLOAT16,
                "bf16": BFLOAT16, "bfloat16": BFLOAT16}


def wire_dtype(dtype) -> int:
    """A wire dtype number from 1/2/3 or a name (fp32, fp16, bf16)."""
    if isinstance(dtype, str):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype: expected fp32, fp16 or bf16, received {dtype!r}")
        return _DTYPE_NAMES[dtype]
    if dtype not in (FLOAT32, FLOAT16, BFLOAT16):
        raise ValueError(f"dtype: expected 1, 2 or 3, received {dtype!r}")
    return int(dtype)


def encode(values, dtype) -> bytes:
    """float values (numpy, or a torch CPU tensor) -> little-endian bytes of the wire dtype
    (round to nearest even)."""
    dtype = wire_dtype(dtype)
    if _tensors.is_torch(values):
        return _tensors.torch_bytes(values, dtype, FLOAT32, FLOAT16)
    x = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == FLOAT32:
        return x.astype("<f4").tobytes()
    if dtype == FLOAT16:
        return x.astype("<f2").tobytes()
    # bfloat16: the upper half of the float32 bits, rounded to nearest even; NaN stays NaN.
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(x)
    out = np.where(nan, (bits >> 16) | 0x40, rounded).astype("<u2")
    return out.tobytes()


def decode_tensor(data: bytes, dtype, shape: Sequence[int], field: str = "tensor") -> np.ndarray:
    """Little-endian wire bytes -> float32 array of `shape`; checks the byte count."""
    dtype = wire_dtype(dtype)
    count = int(np.prod(shape)) if len(shape) else 1
    size = 4 if dtype == FLOAT32 else 2
    if len(data) != count * size:
        raise PagodaError(grpc.StatusCode.INTERNAL,
                          f"{field}.data: expected {count * size} bytes, received {len(data)}")
    if dtype == FLOAT32:
        arr = np.frombuffer(data, dtype="<f4")
    elif dtype == FLOAT16:
        arr = np.frombuffer(data, dtype="<f2").astype(np.float32)
    else:
        arr = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    return arr.reshape(shape).astype(np.float32, copy=False)


class PagodaError(Exception):
    """A failed call: the gRPC status code and the server's message."""

    def __init__(self, code: grpc.StatusCode, message: str, method: str = ""):
        self.code = code
        self.message = message
        self.method = method
        super().__init__(f"{method + ': ' if method else ''}{code.name} ({code.value[0]}): {message}")


def _call(method: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as e:  # a Call with code() and details()
        raise PagodaError(e.code(), e.details() or "(no message)", method) from None


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                           "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor,
                   grpc.UnaryStreamClientInterceptor, grpc.StreamUnaryClientInterceptor):
    """Adds `authorization: Bearer TOKEN` to every call (plaintext or TLS alike)."""

    def __init__(self, token: str):
        self._header = ("authorization", "Bearer " + token)

    def _details(self, d):
        metadata = list(d.metadata or []) + [self._header]
        return _CallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready, d.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """GetConfig as plain Python values; the field names are pagoda.v1.GetConfigResponse's."""
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    cache_dtype: int              # pagoda.v1.DType: 1 fp32, 2 fp16, 3 bf16, 4 fp8_e4m3, 5 fp8_e5m2
    total_blocks: int
    free_blocks: int
    split_tokens: int
    deterministic: bool
    backend: str
    device_name: str
    version: str
    max_message_bytes: int
    max_batch: int
    max_batch_wait_us: int
    k_scales: tuple               # [num_layers] the cache stores x / scale
    v_scales: tuple
    max_label_bytes: int
    max_request_tokens: int
    max_request_blocks: int
    max_stream_in_flight: int
    idle_ttl_seconds: float
    tenant: str                   # the calling tenant ("default" without --auth-tokens)
    tenant_max_blocks: int        # its quotas (0: none) and what it holds
    tenant_max_sequences: int
    tenant_blocks: int
    tenant_sequences: int
    tls: bool
    auth: bool
    max_sequences: int
    max_sequence_tokens: int
    v_head_dim: int               # of V and output rows; < head_dim: latent attention (V is K's prefix)

    @property
    def latent(self) -> bool:
        """Latent attention (MLA, docs/design.md §16): appends and decodes carry k alone,
        whose rows' first v_head_dim elements are V."""
        return 0 < self.v_head_dim < self.head_dim

    @classmethod
    def from_proto(cls, m) -> "ServerConfig":
        values = {}
        for f in dataclasses.fields(cls):
            v = getattr(m, f.name)
            values[f.name] = tuple(v) if f.type == "tuple" else v
        values["v_head_dim"] = values["v_head_dim"] or values["head_dim"]  # 0: a server older than the field
        return cls(**values)


@dataclasses.dataclass
class DecodeResult:
    request_id: int
    output: np.ndarray            # [rows, q_heads, v_head_dim] float32 (rows: sum(q_lengths) or batch)
    lse: Optional[np.ndarray]     # [rows, q_heads] natural log, or None
    lengths: list                 # [batch] tokens attended per sequence
    splits: list                  # [batch] split-KV chunks per sequence
    split_tokens: int
    deterministic: bool
    timing_us: dict               # queue_us, compute_us, total_us
    attempts: int = 1             # decode_step: calls made
    replayed: bool = False        # decode_step: an earlier attempt had appended; this is a re-read


class PagodaClient:
    """One channel to a pagoda server; `timeout` (seconds) applies to each unary call."""

    def __init__(self, address: str = None, timeout: Optional[float] = 10.0,
                 stubs_dir: Optional[str] = None, max_message_bytes: int = 256 << 20,
                 token: Optional[str] = None, tls: bool = False, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None):
        """token: bearer token (default $PAGODA_TOKEN), sent as `authorization: Bearer TOKEN`.
        tls (implied by tls_ca, tls_cert): TLS, the server verified against the PEM file tls_ca
        (default: the system's roots); tls_cert + tls_key: this client's certificate (mTLS)."""
        self.pb, pbg = import_stubs(stubs_dir)
        self.address = address or os.environ.get("PAGODA_SERVER", "127.0.0.1:50051")
        self.timeout = timeout
        options = [("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.max_receive_message_length", max_message_bytes)]
        if tls or tls_ca or tls_cert:
            def read(path):
                if path is None:
                    return None
                with open(path, "rb") as f:
                    return f.read()
            creds = grpc.ssl_channel_credentials(read(tls_ca), read(tls_key), read(tls_cert))
            self.channel = grpc.secure_channel(self.address, creds, options=options)
        else:
            self.channel = grpc.insecure_channel(self.address, options=options)
        token = token if token is not None else os.environ.get("PAGODA_TOKEN")
        if token:
            self.channel = grpc.intercept_channel(self.channel, _BearerToken(token))
        self.stub = pbg.DecodeAttentionStub(self.channel)
        self._config = None
        self._ids = itertools.count(1)
        self._regions = {}  # registered name -> (SharedMemoryRegion, offset in it)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- RPCs ---------------------------------------------------------------
    def config(self, refresh: bool = False) -> ServerConfig:
        """GetConfig (cached: the geometry does not change while a server runs; refresh for
        free_blocks and the tenant's usage)."""
        if self._config is None or refresh:
            self._config = ServerConfig.from_proto(
                _call("GetConfig", self.stub.GetConfig, self.pb.GetConfigRequest(), timeout=self.timeout))
        return self._config

    def with_timeout(self, timeout: Optional[float]) -> "PagodaClient":
        """The same client (channel, stubs, cached config) with another per-call deadline, e.g.
        `client.with_timeout(0.05).decode(...)`; None: no deadline."""
        clone = copy.copy(self)
        clone.timeout = timeout
        return clone

    def create_sequence(self, label: str = "") -> int:
        resp = _call("CreateSequence", self.stub.CreateSequence,
                     self.pb.CreateSequenceRequest(label=label), timeout=self.timeout)
        return resp.sequence_id

    def append_kv(self, sequence_id: int, layer: int, k, v=None,
                  dtype=None, expected_length: Optional[int] = None) -> int:
        """Appends k, v [n, kv_heads, head_dim] (numpy or torch) to one layer; returns its
        new length. On a latent-attention server (config().latent) k alone: V is the first
        v_head_dim elements of its rows. The wire dtype follows k unless `dtype` says. With
        expected_length the layer must hold exactly that many tokens first
        (FAILED_PRECONDITION otherwise, nothing appended): a retry is then safe. k, v may be
        ShmTensors of a registered region (read where they lie)."""
        cfg = self.config()
        _check_kv(cfg, k, v)
        if not isinstance(k, ShmTensor):
            dtype = _tensors.follow_dtype(k, dtype)
            k = _tensors.shaped(k, (-1, cfg.num_kv_heads, cfg.head_dim))
            if v is not None:
                v = _tensors.shaped(v, (-1, cfg.num_kv_heads, cfg.head_dim))
        req = self.pb.AppendKVRequest(sequence_id=sequence_id, layer=layer, k=self._tensor(k, dtype))
        if v is not None:
            req.v.CopyFrom(self._tensor(v, dtype))
        if expected_length is not None:
            req.expected_length = expected_length
        return _call("AppendKV", self.stub.AppendKV, req, timeout=self.timeout).layer_length

    def decode(self, layer: int, sequence_ids: Sequence[int], q: np.ndarray,
               k: Optional[np.ndarray] = None, v: Optional[np.ndarray] = None, scale: float = 0.0,
               return_lse: bool = False, dtype=None, request_id: int = 0,
               q_lengths: Optional[Sequence[int]] = None, sliding_window: int = 0,
               logits_soft_cap: float = 0.0, sinks: Optional[np.ndarray] = None,
               expected_lengths: Optional[Sequence[int]] = None, out: Optional["ShmTensor"] = None,
               lse_out: Optional["ShmTensor"] = None) -> DecodeResult:
        """One decode step: q [rows, q_heads, head_dim]; k, v [rows, kv_heads, head_dim]
        (optional; k alone on a latent-attention server) are appended to `layer` before
        attending; the output is [rows, q_heads, v_head_dim]. rows = sum(q_lengths), or
        one per sequence. On a latent-attention server send the model's scale (0 means 1/sqrt(head_dim) there too). The variants (docs/design.md §9): q_lengths (query rows per sequence,
        its last tokens), sliding_window, logits_soft_cap, sinks [q_heads] (natural
        log), expected_lengths (lengths before the append: a safe retry).
        q, k, v are numpy arrays or torch CPU tensors (fp32, fp16, bf16); the wire dtype
        follows q unless `dtype` says; a torch q gets a torch output (and LSE) back.
        Shared memory (a server with --allow-shared-memory): q, k, v may be ShmTensors of a
        registered region, and out / lse_out name where the results go; the result's
        output and lse are then views of those ranges (no copy)."""
        req = self._decode_request(layer, sequence_ids, q, k, v, scale, return_lse, dtype, request_id,
                                   q_lengths, sliding_window, logits_soft_cap, sinks, expected_lengths, out, lse_out)
        resp = _call("Decode", self.stub.Decode, req, timeout=self.timeout)
        return self._result(resp, _rows(sequence_ids, q_lengths), like=q)

    def decode_step(self, layer: int, sequence_ids: Sequence[int], q: np.ndarray, k: np.ndarray, v=None,
                    expected_lengths: Optional[Sequence[int]] = None, attempts: int = 4, backoff: float = 0.005,
                    max_backoff: float = 1.0, **decode_kwargs) -> DecodeResult:
        """One decode step that is safe to retry (docs/design.md §11): appends k, v (k alone on a
        latent-attention server) and attends,
        sending expected_lengths (read with GetSequence first when not given). Calls that
        end DEADLINE_EXCEEDED or UNAVAILABLE are sent again, up to `attempts` calls in all,
        `backoff` seconds apart, doubled each time up to `max_backoff`;
        a FAILED_PRECONDITION whose sequences hold exactly expected + rows tokens means an
        earlier attempt was applied, and the step is re-read (a Decode without k/v, the same
        output) instead of appended twice. The result's `replayed` says so."""
        calls = [0]
        wait = [backoff]

        def with_retries(fn):
            while True:
                try:
                    calls[0] += 1
                    return fn()
                except PagodaError as e:
                    if e.code not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE) \
                            or calls[0] >= attempts:
                        raise
                    time.sleep(wait[0])
                    wait[0] = min(2 * wait[0], max(max_backoff, backoff))

        def lengths_now():
            return [list(with_retries(lambda i=i: self.get_sequence(i)).layer_lengths)[layer] for i in sequence_ids]

        expected = list(expected_lengths) if expected_lengths is not None else lengths_now()
        try:
            result = with_retries(lambda: self.decode(layer, sequence_ids, q, k, v,
                                                      expected_lengths=expected, **decode_kwargs))
            result.attempts = calls[0]
            return result
        except PagodaError as e:
            if e.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            rows = decode_kwargs.get("q_lengths") or [1] * len(sequence_ids)
            after = [n + r for n, r in zip(expected, rows)]
            if lengths_now() != after:
                raise
        result = with_retries(lambda: self.decode(layer, sequence_ids, q, expected_lengths=after, **decode_kwargs))
        result.attempts = calls[0]
        result.replayed = True
        return result

    def decode_stream(self, requests: Iterable[dict], timeout: Optional[float] = None) -> Iterator[DecodeResult]:
        """DecodeStream: each item of `requests` holds decode()'s keyword arguments;
        yields one DecodeResult per request, in order, checking request ids. A request
        the server rejected raises PagodaError (the code and message it sent)."""
        pending = []

        def messages():
            for kwargs in requests:
                kwargs = dict(kwargs)
                kwargs.setdefault("request_id", next(self._ids))
                pending.append((kwargs["request_id"], _rows(kwargs["sequence_ids"], kwargs.get("q_lengths")),
                                kwargs["q"]))
                yield self._decode_request(**kwargs)

        responses = self.stub.DecodeStream(messages(), timeout=timeout)
        try:
            for resp in responses:
                want, batch, q = pending.pop(0)
                if resp.request_id != want:
                    raise PagodaError(grpc.StatusCode.INTERNAL,
                                      f"request_id: expected {want}, received {resp.request_id}",
                                      "DecodeStream")
                if resp.HasField("error") and resp.error.code != 0:
                    raise PagodaError(_status_code(resp.error.code), resp.error.message, "DecodeStream")
                yield self._result(resp, batch, like=q)
        except grpc.RpcError as e:
            raise PagodaError(e.code(), e.details() or "(no message)", "DecodeStream") from None
        finally:
            responses.cancel()  # no-op once the stream has ended; stops it when abandoned

    def fork_sequence(self, source_id: int) -> int:
        return self.fork_sequences(source_id, 1)[0]

    def fork_sequences(self, source_id: int, count: int) -> list:
        """`count` copy-on-write forks in one call, all or none (parallel
        sampling, beam search); forks decoded in one batch read their shared
        chunks once."""
        r = _call("ForkSequence", self.stub.ForkSequence,
                  self.pb.ForkSequenceRequest(source_id=source_id, count=count), timeout=self.timeout)
        return list(r.sequence_ids) or [r.sequence_id]

    def free_sequence(self, sequence_id: int) -> None:
        _call("FreeSequence", self.stub.FreeSequence,
              self.pb.FreeSequenceRequest(sequence_id=sequence_id), timeout=self.timeout)

    def truncate_sequence(self, sequence_id: int, length: int) -> list:
        """Cuts every layer longer than `length` to it (rejected drafts); returns the
        layers' lengths after the cut."""
        resp = _call("TruncateSequence", self.stub.TruncateSequence,
                     self.pb.TruncateSequenceRequest(sequence_id=sequence_id, length=length),
                     timeout=self.timeout)
        return list(resp.layer_lengths)

    def get_sequence(self, sequence_id: int):
        return _call("GetSequence", self.stub.GetSequence,
                     self.pb.GetSequenceRequest(sequence_id=sequence_id), timeout=self.timeout)

    def export_sequence(self, sequence_id: int, from_lengths: Sequence[int] = ()) -> Iterator:
        """ExportSequence: the SequenceChunk messages of one sequence (a header, then each
        layer's K/V bytes in token order); from_lengths: only tokens at or past these."""
        chunks = self.stub.ExportSequence(
            self.pb.ExportSequenceRequest(sequence_id=sequence_id, from_lengths=list(from_lengths)))
        try:
            yield from chunks
        except grpc.RpcError as e:
            raise PagodaError(e.code(), e.details() or "(no message)", "ExportSequence") from None

    def import_sequence(self, chunks: Iterable, into_sequence_id: int = 0):
        """ImportSequence of an export's chunks (all or nothing); into_sequence_id: append
        this later stage to that sequence. Returns (sequence_id, layer_lengths)."""
        source_error = []

        def with_target():
            try:
                for c in chunks:
                    if c.HasField("header") and into_sequence_id:
                        copy_ = self.pb.SequenceChunk()
                        copy_.CopyFrom(c)
                        copy_.header.into_sequence_id = into_sequence_id
                        c = copy_
                    yield c
            except PagodaError as e:  # the export failed: the import ends early and is refused
                source_error.append(e)
        try:
            resp = _call("ImportSequence", self.stub.ImportSequence, with_target())
        except PagodaError:
            if source_error:
                raise source_error[0] from None
            raise
        if source_error:
            raise source_error[0]
        return resp.sequence_id, list(resp.layer_lengths)

    def migrate(self, sequence_id: int, target: "PagodaClient", hold=None, max_catch_up_stages: int = 3,
                last_stage_tokens: int = 256, free_source: bool = True) -> int:
        """Moves a sequence to `target` and returns its id there (docs/design.md §13): a bulk stage
        while it keeps serving, catch-up stages of what was appended meanwhile, then
        `hold()` (return once nothing appends to it any more) and a last stage; the source
        is freed after it. Raises PagodaError, leaving the source as it was, on failure.
        `target` is a PagodaClient, or an address (connected with this client's timeout and
        $PAGODA_TOKEN)."""
        if isinstance(target, str):
            with PagodaClient(target, timeout=self.timeout) as other:
                return self.migrate(sequence_id, other, hold, max_catch_up_stages, last_stage_tokens, free_source)
        new_id, at = target.import_sequence(self.export_sequence(sequence_id))

        def stage():
            return target.import_sequence(self.export_sequence(sequence_id, at), into_sequence_id=new_id)[1]
        try:
            for _ in range(max_catch_up_stages):
                now = list(self.get_sequence(sequence_id).layer_lengths)
                if sum(n - a for n, a in zip(now, at)) <= last_stage_tokens:
                    break
                at = stage()
            if hold is not None:
                hold()
            at = stage()
            if free_source:
                now = list(self.get_sequence(sequence_id).layer_lengths)
                if now != at:
                    raise PagodaError(grpc.StatusCode.FAILED_PRECONDITION,
                                      f"sequence {sequence_id}: expected no appends after the last stage (hold), "
                                      f"its lengths went from {at} to {now}; the source is kept", "migrate")
                self.free_sequence(sequence_id)
        except Exception:
            try:
                target.free_sequence(new_id)
            except PagodaError:
                pass
            raise
        return new_id

    def health(self, service: str = "") -> str:
        """grpc.health.v1 Check: 'SERVING', 'NOT_SERVING', ... (messages encoded by hand:
        HealthCheckRequest{string service = 1}, HealthCheckResponse{enum status = 1})."""
        check = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda s: (b"\x0a" + _varint(len(s.encode())) + s.encode()) if s else b"",
            response_deserializer=_health_status)
        status = _call("Health/Check", check, service, timeout=self.timeout)
        return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, str(status))

    # --- helpers ------------------------------------------------------------
    def _tensor(self, values, dtype):
        if isinstance(values, ShmTensor):  # the bytes stay where they lie, in its dtype
            return self.pb.Tensor(dtype=values.dtype, shape=list(values.shape), shm=self._shm_ref(values))
        return self.pb.Tensor(dtype=wire_dtype(dtype), shape=list(values.shape), data=encode(values, dtype))

    def _shm_ref(self, t: "ShmTensor"):
        return self.pb.SharedMemoryRef(region=t.region, offset=t.offset, byte_size=t.byte_size)

    # --- shared memory (docs/design.md §15) ------------------------------------
    def register_shared_memory(self, name: str, region: "SharedMemoryRegion", offset: int = 0,
                               byte_size: Optional[int] = None) -> None:
        """Registers `region` (or its [offset, offset + byte_size)) under `name`:
        its tensor() ranges may then stand in for arrays in decode/append_kv/LayerStreams."""
        size = region.byte_size - offset if byte_size is None else byte_size
        _call("RegisterSharedMemory", self.stub.RegisterSharedMemory,
              self.pb.RegisterSharedMemoryRequest(name=name, key=region.key, offset=offset, byte_size=size),
              timeout=self.timeout)
        region.name = name
        region.base = offset
        self._regions[name] = (region, offset)

    def unregister_shared_memory(self, name: str = "") -> None:
        """Unregisters `name`, or every region of the caller's when empty."""
        _call("UnregisterSharedMemory", self.stub.UnregisterSharedMemory,
              self.pb.UnregisterSharedMemoryRequest(name=name), timeout=self.timeout)
        if name:
            self._regions.pop(name, None)
        else:
            self._regions.clear()

    def shared_memory_status(self, name: str = "") -> list:
        """The caller's regions as dicts (name, key, offset, byte_size)."""
        r = _call("GetSharedMemoryStatus", self.stub.GetSharedMemoryStatus,
                  self.pb.GetSharedMemoryStatusRequest(name=name), timeout=self.timeout)
        return [{"name": x.name, "key": x.key, "offset": x.offset, "byte_size": x.byte_size} for x in r.regions]

    def _shm_view(self, t):
        """A result the server wrote into a region this client registered: its view (no copy)."""
        region, base = self._regions[t.shm.region]
        return region.view(base + t.shm.offset, list(t.shape), t.dtype)

    def _decode_request(self, layer, sequence_ids, q, k=None, v=None, scale=0.0, return_lse=False,
                        dtype=None, request_id=0, q_lengths=None, sliding_window=0, logits_soft_cap=0.0,
                        sinks=None, expected_lengths=None, out=None, lse_out=None):
        cfg = self.config()
        if q_lengths is not None and len(q_lengths) != len(sequence_ids):
            raise ValueError(f"q_lengths: expected {len(sequence_ids)} entries (one per sequence), "
                             f"received {len(q_lengths)}")
        if k is not None or v is not None:
            _check_kv(cfg, k, v)
        rows = _rows(sequence_ids, q_lengths)
        shm = isinstance(q, ShmTensor)  # then q, k, v lie in a region, already in their wire dtype and shape
        if not shm:
            dtype = _tensors.follow_dtype(q, dtype)
            q = _tensors.shaped(q, (rows, cfg.num_q_heads, cfg.head_dim))
        req = self.pb.DecodeRequest(layer=layer, sequence_ids=list(sequence_ids), q=self._tensor(q, dtype),
                                    scale=scale, return_lse=return_lse, request_id=request_id,
                                    q_lengths=list(q_lengths or []), sliding_window=sliding_window,
                                    logits_soft_cap=logits_soft_cap,
                                    expected_lengths=list(expected_lengths or []))
        if sinks is not None:
            req.sinks.CopyFrom(self._tensor(_tensors.shaped(sinks, (cfg.num_q_heads,)), "fp32"))
        if k is not None:
            shape = (rows, cfg.num_kv_heads, cfg.head_dim)
            req.k.CopyFrom(self._tensor(k if shm else _tensors.shaped(k, shape), dtype))
            if v is not None:
                req.v.CopyFrom(self._tensor(v if shm else _tensors.shaped(v, shape), dtype))
        if out is not None:
            req.output_shm.CopyFrom(self._shm_ref(out))
        if lse_out is not None:
            req.lse_shm.CopyFrom(self._shm_ref(lse_out))
        return req

    def _result(self, resp, rows: int, like=None) -> DecodeResult:
        cfg = self.config()
        lse = None
        shm_out = resp.output.HasField("shm")  # written into our region: views, no copy
        if shm_out:
            out = self._shm_view(resp.output)
        else:
            out = decode_tensor(resp.output.data, resp.output.dtype, (rows, cfg.num_q_heads, cfg.v_head_dim), "output")
        if resp.HasField("lse") and resp.lse.HasField("shm"):
            lse = self._shm_view(resp.lse)
        elif resp.HasField("lse") and resp.lse.data:
            lse = decode_tensor(resp.lse.data, FLOAT32, (rows, cfg.num_q_heads), "lse")
        if shm_out:
            like = None  # the region's view is the result, in the dtype it was asked in
        if isinstance(like, np.ndarray) and like.dtype == np.float16:
            out = out.astype(np.float16)  # numpy in fp16, out fp16 (the wire carried fp16)
        if _tensors.is_torch(like):
            import torch
            out = _tensors.torch_from_wire(resp.output.data, resp.output.dtype, out.shape, like, FLOAT32, FLOAT16)
            if lse is not None:
                lse = torch.from_numpy(lse.copy())
        return DecodeResult(resp.request_id, out, lse, list(resp.lengths), list(resp.splits),
                            resp.split_tokens, resp.deterministic,
                            {"queue_us": resp.timing.queue_us, "compute_us": resp.timing.compute_us,
                             "total_us": resp.timing.total_us})


def _check_kv(cfg: ServerConfig, k, v) -> None:
    """k with v, or k alone on a latent-attention server (V is the prefix of k's rows)."""
    if cfg.latent:
        if v is not None:
            raise ValueError(f"v: expected none on a latent-attention server (v_head_dim {cfg.v_head_dim} < "
                             f"head_dim {cfg.head_dim}: V is the first {cfg.v_head_dim} elements of k's rows), "
                             f"received a v")
        if k is None:
            raise ValueError("k: expected k (V is its prefix on this server), received none")
    elif (k is None) != (v is None):
        raise ValueError("k, v: expected both or neither")


def _rows(sequence_ids, q_lengths) -> int:
    """Query rows of a request: sum(q_lengths), or one per sequence."""
    return int(sum(q_lengths)) if q_lengths else len(sequence_ids)


def merge_by_lse(outputs: Sequence[np.ndarray], lses: Sequence[np.ndarray]):
    """Merges shards' results over disjoint keys of the same sequences (the
    online-softmax merge): outputs [..., head_dim], lses [...] natural log (-inf for
    a shard without keys). Returns (output, lse) as if one server held every key."""
    lse = np.stack([np.asarray(x, dtype=np.float64) for x in lses])            # [shards, ...]
    out = np.stack([np.asarray(x, dtype=np.float64) for x in outputs])         # [shards, ..., d]
    m = lse.max(axis=0)
    safe_m = np.where(np.isneginf(m), 0.0, m)
    w = np.where(np.isneginf(lse), 0.0, np.exp(lse - safe_m))                  # [shards, ...]
    total = w.sum(axis=0)
    merged = np.einsum("s...,s...d->...d", w, np.where(np.isneginf(lse)[..., None], 0.0, out))
    with np.errstate(divide="ignore", invalid="ignore"):
        merged = np.where(total[..., None] > 0, merged / total[..., None], 0.0)
        merged_lse = np.where(total > 0, safe_m + np.log(total), -np.inf)
    return merged.astype(np.float32), merged_lse.astype(np.float32)


def _status_code(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _health_status(data: bytes) -> int:
    # Only field 1 (varint) is expected; anything else is skipped by wire type.
    pos, status = 0, 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wtype = key >> 3, key & 7
        if wtype == 0:
            value, pos = _read_varint(data, pos)
            if field == 1:
                status = value
        elif wtype == 2:
            length, pos = _read_varint(data, pos)
            pos += length
        elif wtype == 1:
            pos += 8
        elif wtype == 5:
            pos += 4
        else:
            raise ValueError("malformed HealthCheckResponse")
    return status


def _read_varint(data: bytes, pos: int):
    value, shift = 0, 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


# Past one pod (docs/design.md §12) and the per-layer streams of a model's decode loop;
# imported last: they build on the client above.
from pagoda.sharded import HashRing, SequenceRef, ShardedClient, ShardedSequence, endpoints_from_dns  # noqa: E402,F401
from pagoda.layer_streams import LayerStreams  # noqa: E402,F401
from pagoda.shared_memory import SharedMemoryRegion, ShmTensor  # noqa: E402,F401
from pagoda.micro_batches import pipelined_layers  # noqa: E402,F401
from pagoda.heap import retain_freed_heap  # noqa: E402,F401
