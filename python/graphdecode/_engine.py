"""The Python face of graphdecode's Engine: requests, token streams, stats.

The decode loop runs in C++ (graph replay, device sampling); this layer only submits requests,
hands out each request's tokens after a step, and runs user callbacks. ``Engine.step()`` releases
the GIL for the whole step; callbacks run after it, on the calling thread, with the GIL held.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Optional, Union

from . import _graphdecode as _core
from ._errors import Error

ModelConfig = _core.ModelConfig
Weights = _core.Weights
EagleHead = _core.EagleHead


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How a request picks its tokens. The defaults are greedy decoding.

    temperature: 0 = greedy (argmax); > 0 samples from softmax(logits / temperature).
    top_k: keep the k most likely tokens (0 = off). top_p: nucleus mass in (0, 1] (1 = off).
    seed: the request's Philox stream; equal seeds give equal samples.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Speculative:
    """Speculative decoding settings of an engine (off while max_draft_tokens is 0).

    max_draft_tokens: most draft tokens per request per step (1..8). k_by_batch: (max_batch, k)
    rules, the first whose max_batch >= the step's batch gives k (empty: the library's
    defaults). proposer: "draft" (a draft model passed to the Engine), "ngram" (prompt lookup
    in the request's own tokens, no draft model) or "eagle" (an EAGLE-1/2 head passed to the
    Engine as ``eagle``). ngram_max / ngram_min: suffix lengths looked up.
    """

    max_draft_tokens: int = 0
    k_by_batch: Sequence[tuple[int, int]] = ()
    proposer: str = "draft"
    ngram_max: int = 4
    ngram_min: int = 1


class TokenEvent(NamedTuple):
    """One generated token of one request; ``finished`` on the request's last event. A
    cancelled request's last event has ``cancelled`` set and no token (``token`` is -1)."""

    request_id: int
    token: int
    finished: bool
    cancelled: bool = False


@dataclasses.dataclass(frozen=True)
class Stats:
    """Engine counters since construction (see engine/engine.h EngineStats)."""

    steps: int
    prefill_steps: int
    decode_steps: int
    graph_steps: int
    eager_steps: int
    prompt_tokens: int
    generated_tokens: int
    finished: int  # including cancelled
    cancelled: int
    busy_s: float  # wall time inside step(), host + device
    tokens_per_s: float  # generated_tokens / busy_s
    decode_p50_us: float  # decode step wall time percentiles over the last 4096 decode steps
    decode_p90_us: float
    decode_p99_us: float
    spec_rows: int  # request-steps of speculative steps
    drafted_tokens: int
    accepted_tokens: int
    tokens_per_spec_row: float
    drafted_at: list[int]  # per draft position
    accepted_at: list[int]
    spec_steps: int  # speculative steps
    spec_phase_us: list[float]  # device us summed over them: prep, propose, verify, accept
    prefix_lookup_tokens: int = 0  # prefix cache: prompt tokens looked up at admission
    prefix_hit_tokens: int = 0  # of those, found cached (not prefilled)
    prefix_cached_pages: int = 0  # pages cached now, held or not
    prefix_unreferenced_pages: int = 0  # cached pages no request holds (evictable)
    prefix_evictions: int = 0  # cached pages evicted for room
    pipelined_steps: int = 0  # pipeline=True: decode steps launched before the last one's tokens
    sync_steps: int = 0  # steps run synchronously (prefill chunks, speculative, fallbacks)
    discarded_rows: int = 0  # pipelined rows of requests that ended a step before (not delivered)
    device_p50_us: float = 0.0  # decode step device time (timing events), plain decoding
    device_p90_us: float = 0.0
    device_p99_us: float = 0.0
    prefill_wall_us: float = 0.0  # prefill steps: wall time inside step(), summed
    prefill_device_us: float = 0.0  # and their device time (timing events), summed


TokenCallback = Callable[[TokenEvent], Any]


class Request:
    """A submitted request: its id, the tokens generated so far, and a token stream.

    Iterating yields each generated token once, in order; while none is waiting it runs
    ``engine.step()``, which advances every request of the engine (their tokens are buffered
    for their own iterators and callbacks). ``result()`` runs the engine until this request
    finishes and returns all its tokens.
    """

    __slots__ = ("id", "prompt_len", "tokens", "finished", "cancelled", "_engine", "_on_token",
                 "_read", "_encoder_states")

    def __init__(self, engine: Engine, request_id: int, prompt_len: int,
                 on_token: Optional[TokenCallback]) -> None:
        self.id = request_id
        self.prompt_len = prompt_len
        self.tokens: list[int] = []
        self.finished = False
        self.cancelled = False
        self._engine = engine
        self._on_token = on_token
        self._read = 0  # tokens handed out by iteration
        self._encoder_states: Any = None  # a device array the engine reads at admission

    def __iter__(self) -> Iterator[int]:
        while True:
            while self._read < len(self.tokens):
                self._read += 1
                yield self.tokens[self._read - 1]
            if self.finished:
                return
            self._engine._step_for(self)

    def cancel(self) -> None:
        """Stops this request now (see ``Engine.cancel``); its stream ends."""
        self._engine.cancel(self)

    def result(self) -> list[int]:
        """Runs the engine until this request finished; returns every token it generated."""
        while not self.finished:
            self._engine._step_for(self)
        return list(self.tokens)

    def __repr__(self) -> str:
        state = "finished" if self.finished else "running"
        return f"Request(id={self.id}, prompt_len={self.prompt_len}, tokens={len(self.tokens)}, {state})"


def _model_config(model: Union[str, os.PathLike, Mapping, ModelConfig]) -> ModelConfig:
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, Mapping):
        return ModelConfig.from_json(json.dumps(dict(model)), "dict")
    name = os.fspath(model)
    if name == "small":
        return ModelConfig.small_test()
    if name == "small-cross":
        return ModelConfig.small_cross_test()
    if name in ("1b", "llama-1b"):
        return ModelConfig.llama_1b()
    if os.path.isdir(name):
        name = os.path.join(name, "config.json")
    if os.path.isfile(name):
        return ModelConfig.from_file(name)
    raise Error("must be \"small\", \"small-cross\", \"1b\", a ModelConfig, a config dict, or a "
                "config.json path",
                field="model", value=repr(model))


def _weights(source: Union[Weights, str, os.PathLike, None], field: str) -> Optional[Weights]:
    if source is None or isinstance(source, Weights):
        return source
    if isinstance(source, (str, os.PathLike)):
        return Weights.load(os.fspath(source))
    raise Error("must be Weights or a checkpoint directory", field=field, value=repr(source))


def _eagle(source: Union[EagleHead, str, os.PathLike, None]) -> Optional[EagleHead]:
    if source is None or isinstance(source, EagleHead):
        return source
    if isinstance(source, (str, os.PathLike)):
        return EagleHead.load(os.fspath(source))
    raise Error("must be EagleHead or an EAGLE head directory", field="eagle", value=repr(source))


def _sampling_dict(sampling: Optional[Sampling], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dataclasses.asdict(Sampling())
    if isinstance(sampling, Sampling):
        out = dataclasses.asdict(sampling)
    elif isinstance(sampling, Mapping):
        out.update(sampling)  # unknown keys are refused by the extension, naming them
    elif sampling is not None:
        raise Error("must be a graphdecode.Sampling or a dict", field="sampling",
                    value=repr(sampling))
    out.update({k: v for k, v in overrides.items() if v is not None})
    return out


def _engine_options(options: dict[str, Any], speculative: Union[Speculative, Mapping, None]
                    ) -> dict[str, Any]:
    out = dict(options)
    if isinstance(speculative, Speculative):
        speculative = dataclasses.asdict(speculative)
    elif speculative is not None and not isinstance(speculative, Mapping):
        raise Error("must be a graphdecode.Speculative or a dict", field="speculative",
                    value=repr(speculative))
    for k, v in (speculative or {}).items():  # unknown keys are refused by the extension
        out["speculative." + k] = v
    return out


def check_request(model: Union[ModelConfig, Weights, str, Mapping], prompt: Iterable[int], *,
                  max_context: int = 4096, max_new_tokens: int = 16,
                  stop_tokens: Iterable[int] = (), sampling: Optional[Sampling] = None,
                  temperature: Optional[float] = None, top_k: Optional[int] = None,
                  top_p: Optional[float] = None, seed: Optional[int] = None,
                  speculate: bool = True, encoder_states: Any = None,
                  max_encoder_len: int = 0, encoder_first_position: int = 0) -> None:
    """Checks a request as ``Engine.submit`` would, on the host, without a device or an engine.

    Applies the same argument conversions and the scheduler's rules (non-empty prompt, ids in the
    vocabulary, max_new_tokens >= 1, prompt + max_new_tokens <= max_context, sampling ranges).
    Whether the KV pool of a real engine can hold it is checked by ``Engine.submit``. Encoder
    states (cross-attention models, with the engine's max_encoder_len): type, shape and length as
    ``Engine.submit`` checks them. Raises ``graphdecode.Error`` naming the field.
    """
    config = model.config if isinstance(model, Weights) else _model_config(model)
    _core.check_request(config.vocab_size, int(max_context), prompt, max_new_tokens, stop_tokens,
                        _sampling_dict(sampling, dict(temperature=temperature, top_k=top_k,
                                                      top_p=top_p, seed=seed)), speculate,
                        encoder_states, int(max_encoder_len) if config.num_cross_layers else 0,
                        config.hidden_size, config.extra_input_tokens, encoder_first_position)


def check_engine_options(speculative: Union[Speculative, Mapping, None] = None,
                         **options: Any) -> None:
    """Converts engine options as ``Engine()`` does (names and types); raises Error naming one."""
    _core.engine_config_check(_engine_options(options, speculative))


class Engine:
    """graphdecode's decode engine on the current CUDA device.

    Build it from weights (``Weights.load(dir)``, ``Weights.synthetic(config, seed)``), or with
    ``Engine.from_checkpoint(dir)`` / ``Engine.synthetic("small" | "1b" | config)``. Options (all
    keyword, defaults from the C++ EngineConfig): max_batch (32), max_step_tokens (2048, the
    prefill chunk budget), max_context (4096, prompt + generated tokens of one request),
    kv_pages / sliding_pages (0 = sized for max_batch requests of max_context), page_size (16),
    use_graphs (True: decode steps by CUDA-graph replay), pipeline (False: when True, step()
    launches decode step t + 1 before it waits for step t's tokens; a stop is then seen one step
    late and the extra token discarded, never delivered; docs/serving_loop.md; the logits view
    refuses such an engine), deterministic (False: batch-invariant
    attention when True), prefix_cache (True: share cached prompt-prefix pages across requests,
    docs/prefix_cache.md), speculative (a ``Speculative``; with proposer "draft" pass ``draft``,
    with proposer "eagle" pass ``eagle``: an ``EagleHead`` or its directory),
    max_encoder_len (cross-attention models: the longest encoder_states a request may carry,
    required for them) and cross_pages (0 = max_batch requests at max_encoder_len).

    Construction uploads the weights, allocates every buffer and captures the decode graphs.
    Bad options raise ``graphdecode.Error`` naming the field; so does ``submit`` for a bad
    request, and nothing already submitted is affected. Not for concurrent use from several
    threads beyond what the GIL and an internal lock serialize: one step runs at a time.
    """

    def __init__(self, weights: Weights, *, draft: Union[Weights, str, os.PathLike, None] = None,
                 eagle: Union[EagleHead, str, os.PathLike, None] = None,
                 speculative: Union[Speculative, Mapping, None] = None, **options: Any) -> None:
        if not isinstance(weights, Weights):
            raise Error("must be graphdecode.Weights (see Engine.from_checkpoint / synthetic)",
                        field="weights", value=repr(weights))
        self._core = _core.Engine(weights, _engine_options(options, speculative),
                                  _weights(draft, "draft"), _eagle(eagle))
        self._requests: dict[int, Request] = {}
        self._vocab_size = weights.config.vocab_size
        self._delivering = False

    @classmethod
    def from_checkpoint(cls, path: Union[str, os.PathLike], **kwargs: Any) -> Engine:
        """An engine over a Hugging Face checkpoint directory (config.json + safetensors)."""
        return cls(Weights.load(os.fspath(path)), **kwargs)

    @classmethod
    def synthetic(cls, model: Union[str, Mapping, ModelConfig] = "small", *, seed: int = 1,
                  **kwargs: Any) -> Engine:
        """An engine on seeded random weights: model "small", "1b", a ModelConfig, a config
        dict (Hugging Face config.json keys) or a config.json path."""
        return cls(Weights.synthetic(_model_config(model), seed), **kwargs)

    # ---- requests --------------------------------------------------------------------------
    def submit(self, prompt: Iterable[int], *, max_new_tokens: int = 16,
               stop_tokens: Iterable[int] = (), sampling: Optional[Sampling] = None,
               temperature: Optional[float] = None, top_k: Optional[int] = None,
               top_p: Optional[float] = None, seed: Optional[int] = None,
               speculate: bool = True, encoder_states: Any = None,
               encoder_id: Optional[int] = None, encoder_first_position: int = 0,
               on_token: Optional[TokenCallback] = None) -> Request:
        """Queues a request and returns its handle (iterate it for its tokens).

        prompt: token ids (a list, or a 1-D integer array on the host: numpy, a CPU torch
        tensor). Generation ends after max_new_tokens or after emitting one of stop_tokens.
        Sampling: a ``Sampling`` and/or temperature / top_k / top_p / seed (these override it).
        speculate: in a speculative engine, draft for this request. on_token(TokenEvent) is
        called after each step that produced one of its tokens (the last with finished=True).
        encoder_states (cross-attention models, e.g. Llama-3.2-Vision's text decoder): the
        request's image or audio encoder output, a bfloat16 [encoder_len, hidden] tensor on the
        engine's CUDA device or in host memory, taken by DLPack without a copy. Host states are
        copied at submit; device states are read when the request is admitted, so the request
        keeps a reference until it finishes (do not write to them meanwhile). A torch CUDA
        tensor's current stream is synchronized first, so pending writes to it are complete.
        encoder_id (prefix cache): names the encoder states, e.g. an image hash; requests with the
        same nonzero id must carry identical states and then share their text prefix's KV pages
        (requests with states and no id share nothing). encoder_first_position: the prompt
        position of the first <|image|> token; rows before it see no image (as transformers'
        cross_attention_mask makes them: their cross layers' MLP term is dropped).
        Raises ``graphdecode.Error`` naming the field of a bad request.
        """
        params = _sampling_dict(sampling, dict(temperature=temperature, top_k=top_k,
                                               top_p=top_p, seed=seed))
        if on_token is not None and not callable(on_token):
            raise Error("must be callable", field="on_token", value=repr(on_token))
        if not hasattr(prompt, "__len__") and hasattr(prompt, "__iter__"):
            prompt = list(prompt)  # a generator: read it once
        on_device = encoder_states is not None and bool(getattr(encoder_states, "is_cuda", False))
        if on_device:  # torch: the engine's stream must see the tensor's pending writes done
            import torch

            torch.cuda.current_stream(encoder_states.device).synchronize()
        request_id = self._core.submit(prompt, max_new_tokens, stop_tokens, params, speculate,
                                       encoder_states, encoder_id, encoder_first_position)
        request = Request(self, request_id, len(prompt), on_token)
        if on_device or hasattr(encoder_states, "__cuda_array_interface__"):
            request._encoder_states = encoder_states
        self._requests[request_id] = request
        return request

    def cancel(self, request: Union[Request, int]) -> None:
        """Cancels a waiting or running request: it leaves the queue or the batch at once (its
        KV pages go back), gets no more tokens, and its callback sees a final TokenEvent with
        cancelled=True. Error ("request") for an unknown or finished one. Callable from a
        callback: the request then stops after the step's other callbacks."""
        request_id = request.id if isinstance(request, Request) else request
        self._core.cancel(request_id)
        if not self._delivering:
            self._deliver()

    def generate(self, prompts: Iterable[Iterable[int]], **kwargs: Any) -> list[list[int]]:
        """Submits every prompt with the same options, runs to completion, returns the tokens."""
        requests = [self.submit(p, **kwargs) for p in prompts]
        self.run_until_idle()
        return [r.tokens for r in requests]

    # ---- the loop --------------------------------------------------------------------------
    def step(self) -> bool:
        """Runs one engine step (GIL released), then delivers its tokens. False when idle.

        A callback that raises does not stop the others of the step; the first exception is
        raised after every token of the step was delivered.
        """
        progressed = self._core.step()
        self._deliver()
        return progressed

    def run_until_idle(self) -> None:
        """Steps until every submitted request finished."""
        while self.step():
            pass

    def _step_for(self, request: Request) -> None:
        if not self.step() and not request.finished:
            raise Error("the engine went idle before this request finished (was it closed?)",
                        field="request", value=str(request.id))

    def _deliver(self) -> None:
        first_error: Optional[BaseException] = None
        self._delivering = True
        try:
            # A callback may cancel a request: its final event is taken in the next round.
            while events := self._core.take_events():
                for request_id, token, finished, cancelled in events:
                    request = self._requests.get(request_id)
                    if request is None:
                        continue
                    if not cancelled:
                        request.tokens.append(token)
                    if finished:
                        request.finished = True
                        request._encoder_states = None
                        request.cancelled = cancelled
                        del self._requests[request_id]
                    if request._on_token is not None:
                        try:
                            request._on_token(TokenEvent(request_id, token, finished, cancelled))
                        except BaseException as e:  # noqa: BLE001 - re-raised below
                            if first_error is None:
                                first_error = e
        finally:
            self._delivering = False
        if first_error is not None:
            raise first_error

    # ---- state -----------------------------------------------------------------------------
    def stats(self) -> Stats:
        """Counters, throughput and decode-step latency percentiles."""
        return Stats(**self._core.stats())

    @property
    def idle(self) -> bool:
        return self._core.idle

    @property
    def waiting(self) -> int:
        """Requests queued, not yet admitted (their KV extent did not fit yet)."""
        return self._core.waiting

    @property
    def running(self) -> int:
        return self._core.running

    @property
    def model_config(self) -> ModelConfig:
        return self._core.model_config

    @property
    def device(self) -> int:
        """The CUDA device ordinal the engine runs on."""
        return self._core.device

    def last_logits(self) -> Any:
        """The last step's logits as a DLPack array on the device, no copy: [rows, vocab]
        float32, row i = request ``last_step_request_ids()[i]`` (the logits at the last position
        the step computed for it). A view of the engine's buffer, valid until the next step:
        ``torch.from_dlpack(engine.last_logits()).clone()`` to keep it. Plain decoding only."""
        return self._core.last_logits()

    def last_step_request_ids(self) -> list[int]:
        """The request ids of the last step, in logits-row order."""
        return self._core.last_step_ids()

    def last_step_kind(self) -> str:
        """"prefill", "decode", "speculative", or "none" before the first step."""
        return self._core.last_step_kind()

    def close(self) -> None:
        """Frees the engine's device memory now (otherwise when the Engine is collected)."""
        self._core.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
