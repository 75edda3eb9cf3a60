"""graphdecode: a C++20/CUDA decode engine for LLM serving, built on CUDA graphs.

    import graphdecode as gd
    engine = gd.Engine.from_checkpoint("/models/Llama-3.2-1B", max_batch=32)
    request = engine.submit(token_ids, max_new_tokens=64, temperature=0.8, seed=7)
    for token in request:     # steps the engine while it waits
        ...
    print(engine.stats().tokens_per_s)

Every refusal (bad request, option, config, checkpoint; CUDA failure) raises ``gd.Error``, a
ValueError carrying ``field`` and ``value``.
"""

from ._errors import Error  # first: the extension raises this class
from . import _graphdecode as _core
from ._engine import (
    EagleHead,
    Engine,
    ModelConfig,
    Request,
    Sampling,
    Speculative,
    Stats,
    TokenEvent,
    Weights,
    check_engine_options,
    check_request,
)

__version__ = _core.version()


def cuda_device_available() -> bool:
    """True when a usable CUDA device is present (the library's own check; never raises)."""
    return _core.cuda_device_available()


__all__ = [
    "EagleHead",
    "Engine",
    "Error",
    "ModelConfig",
    "Request",
    "Sampling",
    "Speculative",
    "Stats",
    "TokenEvent",
    "Weights",
    "check_engine_options",
    "check_request",
    "cuda_device_available",
]
