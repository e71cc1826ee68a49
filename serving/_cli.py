"""``spanrl serve``: run the policy server in the foreground; ``spanrl export model``: a checkpoint as GGUF."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from spanrl import env
from spanrl.errors import USAGE_EXIT_CODE, SpanRLError, cli_error
from spanrl.trust import add_token_option, env_token, token_from_args
from spanrl.extras import needs_extra

_GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")  # spanrl.serving.gguf_export.GGUF_TYPES, not imported at startup


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("serve", help="OpenAI-compatible policy server that records exact token ids")
    p.add_argument("--model", required=True, help="HF model folder, a .gguf file, or 'smollm2'")
    p.add_argument("--served-model-name", default=None, help="model id clients send (default: folder name)")
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                   help="LoRA adapters (PEFT folders) served beside the base; a request's model picks one by NAME")
    p.add_argument("--max-loras", type=int, default=None, metavar="N",
                   help="vLLM backend: LoRA slots for adapters loaded later over the reload route (a Trainer's "
                        "per-agent policies); default one per --lora-modules entry")
    p.add_argument("--max-lora-rank", type=int, default=None, metavar="R",
                   help="vLLM backend: largest rank those slots hold (1, 8, 16, 32, 64, 128, 256, 320 or 512)")
    p.add_argument("--host", default=env.DEFAULT_HOST)
    p.add_argument("--port", type=int, default=env.DEFAULT_POLICY_PORT)
    p.add_argument("--backend", default="transformers", choices=("transformers", "vllm"))
    p.add_argument("--device", default="cpu", help="torch device of the transformers backend (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"))
    p.add_argument("--max-batch-size", type=int, default=32, help="sequences generated together (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler for requests that give none (default 0)")
    p.add_argument("--max-batch-delay-ms", type=float, default=2.0, help="wait for more requests (default 2 ms)")
    p.add_argument("--default-max-tokens", type=int, default=256)
    p.add_argument("--max-context-tokens", type=int, default=None)
    p.add_argument(
        "--otlp-endpoint",
        default=f"{env.DEFAULT_HOST}:{env.DEFAULT_GRPC_PORT}",
        help="OTLP/gRPC endpoint for the server's spans; 'none' to export nothing",
    )
    p.add_argument("--max-body-bytes", type=int, default=None,
                   help="largest request body; larger gets 413 unread "
                        "(env SPANRL_POLICY_MAX_BODY_BYTES, default 4 MiB)")
    p.add_argument("--max-weights-bytes", type=int, default=None,
                   help="largest body of POST /v1/weights/load (whole weights, safetensors; default 8 GiB)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                   help="vLLM backend: share of the GPU's memory vLLM takes (default 0.85; lower beside a trainer)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="transformers backend: prefill only what a prompt adds to cached prompt blocks (default off)")
    p.add_argument("--disable-uvicorn-access-log", action="store_true",
                   help="no access-log line per request (as vLLM's flag)")
    p.add_argument("--prefix-cache-bytes", type=int, default=None,
                   help="memory the prefix cache may hold (default 512 MiB)")
    add_token_option(p, "--admin-token", "token POST /v1/weights/reload needs; the route is off without it "
                     "(env SPANRL_POLICY_ADMIN_TOKEN)")
    p.add_argument("--checkpoint-root", default=None,
                   help="the folder reloads may load weights from "
                        "(local files only; env SPANRL_POLICY_CHECKPOINT_ROOT)")

    p.add_argument("--api-key", default=None,
                   help="the one API key clients must send (Authorization: Bearer, OPENAI_API_KEY), tenant 'default'; "
                        "prefer --api-key-file (a command line is visible to every user)")
    p.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="API keys, one 'KEY TENANT' line each (or one bare key); a tenant cannot name another's "
                        "rollout. Without keys the server binds loopback only")
    add_token_option(p, "--collector-token", "bearer token sent with the server's spans: the collector's policy token "
                     "(env SPANRL_COLLECTOR_POLICY_TOKEN, else SPANRL_COLLECTOR_TOKEN)")
    p.add_argument("--no-content", action="store_true", help="do not record message contents on spans")
    p.set_defaults(func=_serve)
    needs_extra(p, "serve")
    _register_export_model(subparsers)


def _serve(args: argparse.Namespace) -> int:
    from spanrl.serving.config import ServerConfig
    from spanrl.serving.server import PolicyServer
    from spanrl.parent_watch import watch_parent
    from spanrl.serving.tenants import read_api_key_file

    try:
        admin_token = token_from_args(args, "--admin-token")
        api_keys = read_api_key_file(args.api_key_file) if args.api_key_file else {}
        if args.api_key is not None:
            api_keys[args.api_key] = "default"
        collector_token = (token_from_args(args, "--collector-token") or env_token(env.SPANRL_COLLECTOR_POLICY_TOKEN)
                           or env_token(env.SPANRL_COLLECTOR_TOKEN))
    except SpanRLError as exc:
        return cli_error(exc)
    modules = dict(m.partition("=")[::2] for m in args.lora_modules)
    if any("=" not in m for m in args.lora_modules):
        return cli_error("--lora-modules takes NAME=PATH pairs")
    config = ServerConfig(
        model=args.model,
        lora_modules=modules,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        seed=args.seed,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_batch_delay_ms=args.max_batch_delay_ms,
        default_max_tokens=args.default_max_tokens,
        max_context_tokens=args.max_context_tokens,
        otlp_endpoint=None if args.otlp_endpoint.lower() == "none" else args.otlp_endpoint,
        record_content=not args.no_content,
        torch_threads=args.threads,
        enable_prefix_caching=args.enable_prefix_caching,
        disable_uvicorn_access_log=args.disable_uvicorn_access_log,
        otlp_headers={"authorization": f"Bearer {collector_token}"} if collector_token else {},
        api_keys=api_keys,
    )
    if admin_token is not None:
        config.admin_token = admin_token
    if args.checkpoint_root is not None:
        config.checkpoint_root = args.checkpoint_root
    if args.max_body_bytes is not None:
        config.max_body_bytes = args.max_body_bytes
    if args.max_weights_bytes is not None:
        config.max_weights_bytes = args.max_weights_bytes
    if args.prefix_cache_bytes is not None:
        config.prefix_cache_bytes = args.prefix_cache_bytes
    watch_parent()  # started by a Trainer (SPANRL_PARENT_PID): stop once it is gone, even killed outright
    try:
        PolicyServer(config).serve_forever()
    except SpanRLError as exc:  # a bad flag or model (its ServingError too) is bad input: say which, no traceback
        return cli_error(exc, USAGE_EXIT_CODE)
    return 0


def _register_export_model(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``spanrl export model``: a trained checkpoint as one GGUF file for llama.cpp and Ollama (``gguf_export.py``)."""
    from spanrl.cli_groups import command_group

    m = command_group(subparsers, "export").add_parser(
        "model", help="a checkpoint as a GGUF file (llama.cpp, Ollama), LoRA adapters merged")
    m.add_argument("checkpoint", help="HF model folder, PEFT adapter folder, or a run's output_dir (latest checkpoint)")
    m.add_argument("--format", "-f", default="gguf", choices=("gguf",), help="output format (default gguf)")
    m.add_argument("--outtype", "--type", default="f16", choices=_GGUF_TYPES,
                   help="tensor type (default f16; norms stay f32)")
    m.add_argument("--output", "-o", required=True, help="output file, ending in .gguf")
    m.add_argument("--ollama", action="store_true", help="also write an Ollama Modelfile beside the file")
    m.set_defaults(func=_export_model)
    needs_extra(m, "serve")


def _export_model(args: argparse.Namespace) -> int:
    from spanrl.errors import SpanRLError
    from spanrl.logs import silence_progress_bars

    silence_progress_bars()  # before transformers loads: its "Loading weights" bars are not for this terminal
    logging.getLogger("gguf").setLevel(logging.WARNING)  # the writer's INFO lines; the path is printed below
    checkpoint = _model_folder(args.checkpoint)  # a wrong path: UsageError, exit status 2
    from spanrl.serving.gguf_export import export_gguf

    try:
        out = export_gguf(checkpoint, args.output, kind=args.outtype, ollama=args.ollama)
    except SpanRLError as exc:
        return cli_error(exc)
    print(out)
    return 0


def _model_folder(given: str) -> Any:
    """The folder to export: a run folder's newest complete ``checkpoint-N`` (a run folder holds the
    Trainer's own ``config.json``, which is no model's), else a model or adapter folder."""
    import json
    from pathlib import Path

    from spanrl.errors import UsageError
    from spanrl.algorithms.checkpoint_folders import latest

    path = Path(given)
    newest = latest(path) if path.is_dir() else None
    if newest is not None:
        return newest
    config = path / "config.json"
    is_model = config.is_file() and "model_type" in json.loads(config.read_text())
    if is_model or (path / "adapter_config.json").is_file():
        return path
    if config.is_file() or list(path.glob("checkpoint-*")):
        raise UsageError(f"checkpoint: the run folder {given!r} has no complete checkpoint-N/ yet (saved every "
                         "save_every steps and at the end): export one after a step is saved, or name a model folder")
    raise UsageError(f"checkpoint: {given!r} is neither a run folder (output_dir with checkpoint-N/) nor a model "
                     "folder (config.json with model_type, or a PEFT adapter_config.json): give one of those")
