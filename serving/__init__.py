"""spanrl.serving: the OpenAI-compatible policy server that records exact token ids on its spans.

    from spanrl.serving import PolicyServer, ServerConfig
    srv = PolicyServer(ServerConfig(model=PATH, port=0)).start()
    srv.base_url; srv.rollout_base_url("r1"); srv.reload(model_or_state_dict_or_path); srv.shutdown()
    PolicyClient(url).version(); PolicyClient(url).reload(folder)   # a server another process started

Heavy modules (torch, transformers, fastapi) load on first use of a name that needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spanrl._lazy import lazy_getattr
from spanrl.serving.config import ServerConfig, default_config

__all__ = [
    "Completion",
    "GenerationResult",
    "PolicyClient",
    "PolicyServer",
    "SamplingParams",
    "ServerConfig",
    "decode_float32",
    "decode_int32",
    "default_config",
    "encode_float32",
    "encode_int32",
    "export_gguf",
    "resolve_model",
]

_LAZY = {
    "PolicyClient": "spanrl.serving.client",
    "PolicyServer": "spanrl.serving.server",
    "SamplingParams": "spanrl.serving.backend",
    "Completion": "spanrl.serving.backend",
    "GenerationResult": "spanrl.serving.backend",
    "decode_float32": "spanrl.codec",
    "decode_int32": "spanrl.codec",
    "encode_float32": "spanrl.codec",
    "encode_int32": "spanrl.codec",
    "resolve_model": "spanrl.serving.models",
    "export_gguf": "spanrl.serving.gguf_export",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


if TYPE_CHECKING:  # pragma: no cover
    from spanrl.serving.backend import Completion, GenerationResult, SamplingParams
    from spanrl.serving.gguf_export import export_gguf
    from spanrl.serving.models import resolve_model
    from spanrl.serving.client import PolicyClient
    from spanrl.serving.server import PolicyServer
    from spanrl.codec import decode_float32, decode_int32, encode_float32, encode_int32
