"""``gspo eval``: the composition root of an evaluation (model, engine, problems from the
config) and its command-line summary; the scoring itself is :mod:`gspo.orchestration.evaluation`."""

from __future__ import annotations

from typing import Any

from .orchestration.evaluation import eval_examples, evaluate


def run_eval(cfg: Any) -> dict[str, Any]:
    """``gspo eval``: load the model, score the problems, write the JSON report, return it."""
    import dataclasses
    import json
    import time
    from pathlib import Path

    from gspo.build import build_policy, build_prompt_format, resolve_device, set_threads
    from gspo.core.seeding import step_generator
    from gspo.engine_config import build_engine, check_engine_available, close_engine

    check_engine_available(cfg)  # e.g. vLLM missing: say so before loading anything
    set_threads(cfg.threads)
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    examples, reward, where = eval_examples(cfg)
    if not examples:
        raise ValueError(f"nothing to evaluate: {where} has no problems")
    model, tokenizer = build_policy(cfg, device)
    model.eval()
    fmt = build_prompt_format(cfg, tokenizer, model)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else fmt.stop_token_ids[0]
    engine = build_engine(cfg, model, tokenizer, pad_id=tokenizer.pad_token_id, eos_id=eos)
    t_load = time.perf_counter() - t0
    details: list[dict[str, Any]] = []
    try:
        metrics = evaluate(
            engine,
            tokenizer,
            examples,
            reward,
            max_new_tokens=cfg.max_new_tokens,
            samples=cfg.samples,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            generator=step_generator(cfg.seed, 0, stream=3, device=engine.device),
            batch_size=cfg.batch_size,
            greedy=cfg.greedy,
            prompt_format=fmt,
            details=details,
            progress=cfg.progress,
        )
    finally:
        close_engine(engine)  # vLLM: shut it down (the torch engine has nothing to close)
    report = {
        "model": cfg.model,
        "data": where,
        "chat_template": fmt.chat,
        "stop_token_ids": list(fmt.stop_token_ids),
        "metrics": metrics,
        "seconds": {"load": t_load, "total": time.perf_counter() - t0},
        "config": dataclasses.asdict(cfg),
        "examples": details[: cfg.show] if cfg.show > 0 else details,
    }
    if cfg.output:
        path = Path(cfg.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
    return report


def run_eval_cli(args: Any, overrides: Any) -> int:
    """``gspo eval``: build the config from the flags, run, print a summary."""
    from gspo.config import EvalConfig, build

    cfg = build(
        EvalConfig, preset=args.preset, file=args.config, overrides=overrides(args, EvalConfig)
    )
    report = run_eval(cfg)
    m = report["metrics"]
    print(f"{report['data']}: {int(m['problems'])} problems, model {cfg.model}")
    rows = [("greedy accuracy", "greedy_accuracy")]
    if cfg.samples > 0:
        rows += [
            (f"avg@{cfg.samples}", f"avg@{cfg.samples}"),
            (f"pass@{cfg.samples}", f"pass@{cfg.samples}"),
        ]
    for label, key in rows:
        if key in m:
            print(f"  {label:16s} {m[key]:.3f} ± {m[key + '_se']:.3f}")
    for label, key in (
        ("greedy length", "greedy_response_length"),
        ("sampled length", "response_length"),
        ("greedy truncated", "greedy_truncated_fraction"),
        ("sampled truncated", "truncated_fraction"),
    ):
        if key in m:
            print(f"  {label:16s} {m[key]:.3g}")
    print(
        f"  time {report['seconds']['total']:.0f} s"
        + (f"; report: {cfg.output}" if cfg.output else "")
    )
    return 0
