"""``serve(cfg, host, port)``: the composition root of ``gspo serve`` (docs/endpoint.md): a
checkpoint's model, tokenizer, chat template and engine (torch, or vLLM with
``rollout_engine="vllm"``) behind the OpenAI-compatible endpoint, for agents to be tried
outside training."""

from __future__ import annotations

import threading
from collections.abc import Callable

from gspo.config.eval_config import EvalConfig
from gspo.config.options import EngineOptions, ModelOptions
from gspo.core.seeding import step_generator
from gspo.envs.trajectory import make_encoder
from gspo.models.policy import build_prompt_format, resolve_device, set_threads
from gspo.rollout.base import SamplingParams
from gspo.rollout.engines import build_engine, check_engine_available, close_engine
from gspo.rollout.openai_request import Caps
from gspo.rollout.openai_server import OpenAIEndpoint, ServerThread
from gspo.rollout.openai_top import locked, top_logprobs_for
from gspo.rollout.openai_vllm import protocol_for
from gspo.rollout.request_batcher import RequestBatcher

from .parts import build_policy_for


def serve(
    cfg: EvalConfig,
    host: str,
    port: int,
    model_name: str,
    *,
    ready: Callable[[ServerThread], None] = lambda server: None,
    stop: threading.Event | None = None,
    max_n: int = Caps.max_n,
    max_tokens: int = Caps.max_tokens,
) -> None:
    """Serve ``cfg.model`` on ``host:port`` until ``stop`` is set (default: forever). Requests
    default to ``cfg.max_new_tokens``, ``cfg.temperature`` and ``cfg.top_p``; each may set
    its own, up to ``max_n`` completions of ``max_tokens`` tokens, within the model's context
    (its ``max_position_embeddings``). ``ready(server)`` is called once it listens."""
    check_engine_available(EngineOptions.of(cfg))  # e.g. vLLM missing: before loading anything
    set_threads(cfg.threads)
    model, tokenizer = build_policy_for(cfg, resolve_device(cfg.device))
    model.eval()
    fmt = build_prompt_format(ModelOptions.of(cfg), tokenizer, model)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else fmt.stop_token_ids[0]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    engine = build_engine(
        EngineOptions.of(cfg),
        model,
        tokenizer,
        seed=cfg.seed,
        logprobs=True,  # every response carries its tokens' log-probs
        pad_id=pad,
        eos_id=eos,
    )
    defaults = SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        stop_token_ids=tuple(fmt.stop_token_ids),
    )
    generator = step_generator(cfg.seed, 0, stream=3, device=engine.device)
    lock = threading.Lock()  # the rounds and the top_logprobs passes take turns on the model
    batcher = RequestBatcher(locked(engine.generate, lock), generator=generator)
    context = model.config.to_dict().get("max_position_embeddings")  # None: unchecked
    caps = Caps(max_n=max_n, max_tokens=max_tokens, context=context)
    encoder = make_encoder(tokenizer, fmt)
    endpoint = OpenAIEndpoint(
        batcher, encoder, model_name, defaults, protocol=protocol_for(engine), caps=caps,
        top_logprobs=top_logprobs_for(engine, lock),
    )  # fmt: skip
    server = ServerThread(endpoint, host, port).start()
    try:
        ready(server)
        (stop or threading.Event()).wait()
    finally:
        server.stop()
        close_engine(engine)
