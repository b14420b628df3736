"""``gspo serve``: the OpenAI-compatible rollout endpoint over a checkpoint (docs/endpoint.md).

The parser and the config checks import nothing heavy: help and bad flags answer before torch
loads."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from gspo.config import EvalConfig, build
from gspo.config.machine import machine_problems
from gspo.config.validation import config_error

from .cli_parsers import add_log_level

MODEL_HELP = (
    "'tiny' (random init: a smoke test), 'smollm2-135m-instruct' or a local Hugging Face "
    "checkpoint directory (e.g. a run's final/)"
)


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model as an OpenAI-compatible endpoint (chat/completions, token ids and "
        "log-probs in every response)",
    )
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one [8000]")
    p.add_argument("--model-name", default=None, help="the name clients ask for [--model]")
    p.add_argument(
        "--engine", "--rollout-engine", dest="rollout_engine", default="torch",
        help="rollout engine: torch or vllm [torch]",
    )  # fmt: skip
    p.add_argument("--device", default="auto", help="'cpu', 'cuda' or 'auto' [auto]")
    p.add_argument("--dtype", default="float32", help="model dtype [float32]")
    p.add_argument("--chat-template", default="auto", help="'auto', 'none' or 'always' [auto]")
    p.add_argument(
        "--max-new-tokens", type=int, default=256, help="tokens per completion unless a "
        "request sets max_tokens [256]",
    )  # fmt: skip
    p.add_argument("--temperature", type=float, default=1.0, help="default temperature [1.0]")
    p.add_argument("--top-p", type=float, default=1.0, help="default top-p [1.0]")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of requests that set "
                   "none [0]")  # fmt: skip
    p.add_argument("--max-n", type=int, default=64, help="most completions one request may ask "
                   "(n); above: HTTP 400 [64]")  # fmt: skip
    p.add_argument("--max-tokens-cap", type=int, default=4096, help="most tokens one request "
                   "may ask (max_tokens); above: HTTP 400 [4096]")  # fmt: skip
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    add_log_level(p)


BUILT_IN_MODELS = ("tiny", "smollm2-135m-instruct", "tiny-moe")
"""Models ``--model`` names without a folder (gspo.models.pretrained.NAMED_MODELS + tiny)."""

SERVE_FIELDS = (
    "model", "rollout_engine", "device", "dtype", "chat_template", "max_new_tokens",
    "temperature", "top_p", "seed", "threads",
)  # fmt: skip


def serve_config(args: argparse.Namespace) -> EvalConfig:
    """The model, engine and sampling defaults of ``gspo serve`` (checked, torch-free)."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.max_n < 1 or args.max_tokens_cap < 1:
        raise ValueError(f"--max-n and --max-tokens-cap must be >= 1, got {args.max_n} and "
                         f"{args.max_tokens_cap}")  # fmt: skip
    if args.model not in BUILT_IN_MODELS and not Path(args.model).expanduser().exists():
        raise FileNotFoundError(  # the loader's message, before torch loads
            f"--model {args.model!r}: no such checkpoint directory, and not a named model "
            f"({', '.join(name for name in BUILT_IN_MODELS if name != 'tiny-moe')})"
        )
    cfg = build(EvalConfig, overrides={k: getattr(args, k) for k in SERVE_FIELDS})
    problems = machine_problems(cfg)
    if problems:
        raise config_error(problems, header="cannot start")
    return cfg


def run_serve(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM; prints the base URL once listening."""
    cfg = serve_config(args)
    from gspo.compose.serve import serve  # loads torch

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    name = args.model_name or args.model

    def ready(server) -> None:
        print(f"gspo serve: {server.url()} (model {name!r}); Ctrl-C stops", flush=True)

    serve(cfg, args.host, args.port, name, ready=ready, stop=stop,
          max_n=args.max_n, max_tokens=args.max_tokens_cap)  # fmt: skip
    print("gspo serve: stopped", file=sys.stderr)
    return 0
