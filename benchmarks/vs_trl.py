"""Head-to-head: gspo's trainer against TRL's ``GRPOTrainer`` (GSPO mode), same model, task and
settings, both in one invocation, alternating, each run in its own subprocess.

    python benchmarks/vs_trl.py                                  # tiny models, 3 repetitions
    python benchmarks/vs_trl.py --workloads d64-add --reps 2 --steps 10
    python benchmarks/vs_trl.py --workloads smollm2 --reps 1 --steps 2   # slow: ~1 min per step
    python benchmarks/vs_trl.py --workloads d64-add --systems gspo,trl --baseline main
        # also gspo@<main's commit>, from its own temp worktree (benchmarks/baseline.py)
    python benchmarks/vs_trl.py --workloads d64-add --systems gspo,trl --compile --no-eval
        # also gspo-compile (the compile option), with its compile cost and break-even step

Needs the ``bench`` extra (``pip install -c constraints.txt -e ".[bench]"``: TRL). TRL is never
imported by the package itself.

What one "step" is, in both systems: one rollout of ``prompts x group`` completions, then 4
optimizer steps on 4 shuffled minibatches of it (gspo: ``num_minibatches=4``; TRL:
``per_device_train_batch_size = N / 4``, ``gradient_accumulation_steps=1``,
``steps_per_generation=4``, so TRL generates once every 4 optimizer steps and 1 gspo step = 4
TRL ``global_step`` s).

Settings made equal:

- model: the same checkpoint directory (a gspo SFT cold start of a tiny Qwen3 char model, or
  SmolLM2-135M-Instruct), float32 on CPU, SDPA attention, the same torch thread count;
- prompts: the same problems in the same order per step (TRL gets a dataset laid out in gspo's
  order with ``shuffle_dataset=False``), the same token ids (checked: the first generate call of
  TRL is compared with gspo's encoding);
- sampling: temperature 1, top-p 1, top-k off, ``max_completion_length = max_new_tokens``,
  stop at EOS (and, for chat models, the template's end-of-turn token);
- objective: GSPO (sequence-level ratio, TRL ``importance_sampling_level="sequence"``,
  ``loss_type="grpo"`` = mean over tokens then over sequences, gspo ``seq_mean_token_mean``),
  clip 3e-4 / 4e-4, no KL (``beta=0``), group advantages with the sample std (gspo
  ``advantage_scale=sample_std``, TRL ``scale_rewards="group"``);
- optimizer: AdamW, same lr, betas 0.9 / 0.999, no weight decay, 10 warm-up optimizer steps
  then constant, grad-norm clip 1.0; TRL is handed gspo's schedule (factor (i + 1) / W:
  transformers' i / W starts at lr 0), so both run one warm-up convention;
- reward: the task's own exact-match function, wrapped as a TRL reward function;
- bookkeeping: no checkpoints, no evaluation, no progress bar inside the timed steps.

Differences that remain (also in docs/performance.md):

1. Old log-probs: TRL (no vLLM, ``steps_per_generation > gradient_accumulation_steps``) runs a
   no-grad recompute pass over the whole batch; gspo by default takes the rollout engine's own
   log-probs (``old_logprobs=engine``, no pass). The ``gspo-recompute`` system runs gspo with
   ``old_logprobs=recompute``: the same passes as TRL.
2. Random streams: each system draws its own samples (gspo: per-step seeded generators; TRL:
   the global torch RNG through ``model.generate``) and shuffles minibatches its own way, so
   rewards differ by sampling noise; learning is compared over the same number of steps.
3. Advantage epsilon: TRL divides by std + 1e-4, gspo by std + 1e-6.
4. Log-ratio clamp: gspo clamps the sequence log-ratio before exp (no effect at these ratios).
5. Rollout: gspo's own KV-cache engine vs ``transformers`` ``generate`` (its logits
   processors, stopping criteria and cache) — this is the point of the comparison.
6. Training forward: TRL passes no position ids (left padding would shift positions; the tiny
   tasks' prompts all have the same length, so there is none) and uses the model's fused
   log-prob head; gspo passes explicit position ids.
7. Timing scope: each system's wall time between the ends of consecutive steps (gspo: its
   metrics logger's record per step; TRL: ``on_step_end`` every 4th optimizer step), so it
   includes rewards, advantages and metric bookkeeping in both; the first step is a warm-up and
   is not counted.
8. Minibatch composition (``gspo-groups`` only): whole groups per minibatch
   (``minibatch_grouping=groups``), where TRL shuffles rows across groups; ``gspo`` keeps
   TRL's shuffled layout.
9. Zero-advantage rows: gspo runs a row whose advantage is 0 (its group's rewards all agree)
   through a no-grad forward for its metrics only, since its loss term and gradient are exactly
   0 (when such rows are at least ``zero_advantage_split`` = 0.25 of the minibatch); TRL
   back-propagates through it. The saving scales with the share of such rows, which the
   task and the model's accuracy set (``zero-adv rows`` column; ``gspo-no-zero-advantage-skip``
   ablates it). ``gspo-lean`` also drops that forward (metrics then cover only rows with a
   gradient; TRL's cover every row).
10. ``gspo-compile`` (``--compile``): gspo with ``compile=True``, the training forward and
   backward under ``torch.compile`` (gspo.models.compiled_forward). Its inductor cache is a
   fresh folder per invocation, so repetition 0 compiles cold and later ones find the graphs
   (warm); a second table gives the compile seconds and the break-even step against ``gspo``
   (benchmarks/_compile_cost.py). Its first steps carry the compile; ``s/step`` is a median,
   so it shows the compiled pace.

Columns: ``s/step`` median wall seconds per step; ``CPU s/step`` median CPU seconds per step
of the run's process (all its threads: what the step cost, whatever share of a core the
machine's other jobs left it; on a shared machine the ratio that resolves a few percent);
``gen tok/s`` generated (completion) tokens per second of whole step; ``train tok/s``
prompt+completion tokens that went through the 4 training forward/backward passes per second
of step; ``rollout s`` median time inside the
generate call; ``peak RSS`` the subprocess's ``ru_maxrss`` (imports included; ``base RSS`` is
the RSS after imports and model load, before training); ``zero-adv rows`` mean share of rows
whose group's rewards all agree (gspo's ``advantage/zero_fraction``, TRL's
``frac_reward_zero_std``); ``reward`` mean train reward over the
last ``--reward-window`` steps; ``held-out`` greedy exact-match accuracy after training on the
task's test split (the same evaluation code for both). Speed figures are medians over
repetitions; reward and held-out are mean ± standard error over repetitions (use
``--vary-seed`` so that repetitions differ in data order and sampling; with the default
fixed seed, gspo's repetitions are identical). Ratios are gspo / TRL for throughput (higher is
better) and TRL / gspo for time.

Repetitions are paired rounds: a round runs every system once, back to back, the order
reversed every other round. Every ratio the table and the lines under it print (``speed vs
TRL``, ``speed vs baseline``, gen / train tok/s, rollout, peak RSS) is the geometric mean of
the per-round ratios with its 95% t-interval over rounds (``gspo.core.comparison.
ratio_interval``); a line says when an interval is wider than ±5%, too wide to show a 5%
change. The JSON keeps every round (its order, the load before and after, each system's
s/step) and every interval (``paired_ratios``; ``ratios`` holds the ratios of the medians).
``--cpus 1`` pins every run to CPU 1 (``os.sched_setaffinity``, as ``taskset -c 1`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import baseline as bl
from _compile_cost import COMPILED, compile_rows, compile_table
from _results import OUT_HELP, dated_result

if TYPE_CHECKING:  # not at run time: a --baseline run imports an older gspo in this script
    from gspo.core.comparison import RatioInterval

WORKLOADS: dict[str, dict[str, Any]] = {
    # The demo: 2-digit addition, 0.1 M-parameter char model, 6 new tokens.
    "d64-add": {
        "model": "tiny",
        "size": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
        "task": "addition",
        "difficulty": None,
        "max_new_tokens": 6,
        "prompts_per_step": 16,
        "group_size": 8,
        "lr": 1e-4,
        "sft_steps": 200,
        "sft_lr": 3e-3,
    },
    # Longer completions on a bigger model: reversal of 10 letters, up to 16 new tokens.
    "d128-rev": {
        "model": "tiny",
        "size": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2},
        "task": "reversal",
        "difficulty": 10,
        "max_new_tokens": 16,
        "prompts_per_step": 16,
        "group_size": 8,
        "lr": 5e-5,
        "sft_steps": 120,
        "sft_lr": 2e-3,
    },
    # A real pretrained model (SmolLM2-135M-Instruct, chat template), tiny batch: one-step word
    # problems after a 10-step SFT cold start on the task's demonstrations (held-out greedy
    # accuracy about 0.5, so rewards and advantages are not all 0). lr 1e-5, the SmolLM2
    # experiment's, so that 20 steps (80 optimizer steps) move the reward.
    "smollm2": {
        "model": "smollm2-135m-instruct",
        "size": {},
        "task": "word_problems",
        "difficulty": 1,
        "max_new_tokens": 32,
        "prompts_per_step": 4,
        "group_size": 4,
        "lr": 1e-5,
        "sft_steps": 10,
        "sft_batch_size": 8,
        "sft_lr": 1e-5,
        "sft_n_test": 32,
    },
}
SYSTEMS = ("gspo", "gspo-groups", "gspo-lean", "gspo-recompute", "gspo-before", "trl")
"""``gspo-groups`` is gspo with ``minibatch_grouping=groups`` (each minibatch holds whole groups,
so the training pass runs each of its prompts once; TRL shuffles rows across groups).
``gspo-lean`` is gspo (shuffled, like TRL) with ``zero_advantage_metrics=False``: rows whose
advantage is 0 get no forward at all, so entropy and clip metrics cover only rows with a
gradient (the update is the same)."""
OPTIMIZATIONS = (
    "fast-decoder",
    "shared-prefill",
    "shared-train-prompts",
    "fused-adam",
    "padding-trim",
    "zero-advantage-skip",
)
"""What this issue added to gspo's step; ``gspo-before`` turns all of them off (the step as it
was), ``gspo-no-<name>`` (``--ablate``) only that one."""
CLIP_LOW, CLIP_HIGH = 3e-4, 4e-4
NUM_MINIBATCHES = 4
WARMUP_OPT_STEPS = 10
SEED = 0


# ------------------------------------------------------------------------------------------
# Shared helpers (run inside the subprocesses)
# ------------------------------------------------------------------------------------------


def _rss_mb() -> float:
    """Current resident set size in MiB (from /proc; falls back to the high-water mark)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _train_config(
    spec: dict[str, Any],
    output_dir: str,
    *,
    recompute: bool = False,
    grouping: str = "shuffled",
    idle_metrics: bool = True,
    compile: bool = False,
):
    """The gspo TrainConfig of a workload (also used by the TRL runner for task and prompts)."""
    from gspo.config import TrainConfig, build

    # benchmarks/growth.py varies a workload's length, group and model size through these.
    w = {**WORKLOADS[spec["workload"]], **spec.get("workload_overrides", {})}
    overrides = {
        **w["size"],
        "model": spec["init"],
        "task": w["task"],
        "difficulty": w["difficulty"],
        "max_new_tokens": w["max_new_tokens"],
        "prompts_per_step": w["prompts_per_step"],
        "group_size": w["group_size"],
        "lr": w["lr"],
        "algo": "gspo",
        "clip_low": CLIP_LOW,
        "clip_high": CLIP_HIGH,
        "kl_coef": 0.0,
        "advantage_scale": "sample_std",
        "num_minibatches": NUM_MINIBATCHES,
        "minibatch_grouping": grouping,
        "zero_advantage_metrics": idle_metrics,
        "warmup_steps": WARMUP_OPT_STEPS,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "steps": spec["steps"],
        "old_logprobs": "recompute" if recompute else "engine",
        "eval_every": 0,
        "checkpoint_every": 0,
        "progress": False,
        "device": "cpu",
        "threads": spec["threads"],
        "output_dir": output_dir,
        "seed": spec.get("seed", SEED),
        "n_test": spec["n_test"],
        # Only when asked: a gspo@REF baseline from before the option has no such field.
        **({"compile": True} if compile else {}),
    }
    return build(TrainConfig, overrides=overrides)


def _step_prompts(cfg, n_train: int) -> list[list[int]]:
    """Training-problem indices of every step, in gspo's order (what TRL is fed too)."""
    from gspo.core.seeding import prompt_indices

    return [
        prompt_indices(n_train, s, cfg.rollout.prompts_per_step, cfg.run.seed)
        for s in range(cfg.run.steps)
    ]


def _held_out(model, tokenizer, cfg, task, fmt) -> float:
    """Greedy exact-match accuracy on the task's test split (the same code for both systems)."""
    from gspo.orchestration.evaluation import evaluate_model

    if not cfg.task.n_test or not task.test:
        return float("nan")
    metrics = evaluate_model(
        model,
        tokenizer,
        task.test,
        task.reward,
        max_new_tokens=cfg.rollout.max_new_tokens,
        samples=0,
        greedy=True,
        prompt_format=fmt,
    )
    return float(metrics.get("greedy_accuracy", float("nan")))


def _now() -> tuple[float, float]:
    """Wall time and this process's CPU time (all its threads): a step's CPU seconds are what
    it cost, whatever share of a core the machine's other jobs left it."""
    return time.perf_counter(), time.process_time()


def _summarize(
    spec: dict[str, Any],
    ends: list[tuple[float, float]],
    gen_tokens: list[int],
    train_tokens: list[int],
    rollout_s: list[float],
    rewards: list[float],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Per-step times from step-end (wall, CPU) stamps (ends[0] = start); drop the warm-up
    step."""
    step_s = [b[0] - a[0] for a, b in itertools.pairwise(ends)]
    cpu_s = [b[1] - a[1] for a, b in itertools.pairwise(ends)]
    if len(step_s) != len(gen_tokens):
        raise RuntimeError(f"{len(step_s)} step times but {len(gen_tokens)} token counts")
    skip = 1 if len(step_s) > 1 else 0
    s, g, t = step_s[skip:], gen_tokens[skip:], train_tokens[skip:]
    window = spec["reward_window"]
    return {
        **spec,
        "step_s": statistics.median(s),
        "step_s_all": step_s,
        "cpu_step_s": statistics.median(cpu_s[skip:]),
        "cpu_step_s_all": cpu_s,
        "gen_tokens_per_step": statistics.fmean(g),
        "gen_tokens_per_s": statistics.median(a / b for a, b in zip(g, s, strict=True)),
        "train_tokens_per_s": statistics.median(a / b for a, b in zip(t, s, strict=True)),
        "rollout_s": statistics.median(rollout_s[skip:]),
        "rewards": rewards,
        "reward_last": statistics.fmean(rewards[-window:]),
        "peak_rss_mb": _peak_rss_mb(),
        "load_avg_1min_at_end": os.getloadavg()[0],
        **extra,
    }


# ------------------------------------------------------------------------------------------
# gspo
# ------------------------------------------------------------------------------------------


def _ablate(names: list[str]) -> None:
    """Switch off the named optimizations in this process (see ``OPTIMIZATIONS``)."""
    import torch

    import gspo.models.fast_forward as ff
    import gspo.rollout.torch_engine as te

    unknown = set(names) - set(OPTIMIZATIONS)
    if unknown:
        raise ValueError(f"unknown optimizations {sorted(unknown)}")
    if "fast-decoder" in names:  # the engine decodes through the Hugging Face forward
        te.FastDecoder = type(
            "NoFastDecoder", (te.FastDecoder,), {"supports": staticmethod(lambda m: False)}
        )
    if "shared-prefill" in names:  # every row prefills its own copy of the prompt
        if "fast-decoder" not in names:
            raise ValueError("shared-prefill can only be ablated together with fast-decoder")
        te.has_forward_hooks = lambda model: True
    if "shared-train-prompts" in names:  # token_logprobs ignores prompt_index: plain HF pass
        ff.supports = lambda model: False
    if "padding-trim" in names:  # micro-batches keep the whole rollout's padded width
        import gspo.compose.train as tr

        rows = tr._rows
        tr._rows = lambda rollout, part, trim: rows(rollout, part, False)
    if "zero-advantage-skip" in names:  # zero-advantage rows keep their backward
        import gspo.compose.train as tr

        tr.zero_gradient_rows = lambda cfg, model, adv: torch.zeros(
            adv.shape[0], dtype=torch.bool, device=adv.device
        )
    if "fused-adam" in names:  # torch's default (foreach) AdamW
        base = torch.optim.AdamW

        class ForeachAdamW(base):  # type: ignore[misc, valid-type]
            def __init__(self, params, *args, fused=None, **kw):
                super().__init__(params, *args, **kw)

        torch.optim.AdamW = ForeachAdamW


def run_gspo(spec: dict[str, Any]) -> dict[str, Any]:
    """Train with ``gspo.compose.train.train``; step ends are the trainer's per-step metric records."""
    import torch

    torch.set_num_threads(spec["threads"])
    import gspo
    import gspo.compose.train as trainer_mod

    system, _ = bl.split(spec["system"])  # gspo@REF: the same system, another commit's package
    if system == "gspo-before":
        _ablate(list(OPTIMIZATIONS))
    elif system.startswith("gspo-no-"):
        name = system.removeprefix("gspo-no-")
        _ablate(["fast-decoder", name] if name == "shared-prefill" else [name])
    from gspo.compose.parts import build_task
    from gspo.models.policy import build_prompt_format

    ends: list[tuple[float, float]] = []
    base = trainer_mod.MetricsLogger

    class TimedLogger(base):  # type: ignore[misc, valid-type]
        """Stamps the wall time of every training-step record (those carrying time/train_s)."""

        def log(self, step: int, metrics: dict[str, Any]) -> None:
            if "time/train_s" in metrics:
                ends.append(_now())
            elif not ends and "data/train_problems" in metrics:
                ends.append(_now())  # set-up done: the first step starts now
            super().log(step, metrics)

    trainer_mod.MetricsLogger = TimedLogger
    with tempfile.TemporaryDirectory(prefix="vs-trl-gspo-") as tmp:
        cfg = _train_config(
            spec,
            tmp,
            recompute=system == "gspo-recompute",
            grouping="groups" if system == "gspo-groups" else "shuffled",
            idle_metrics=system != "gspo-lean",
            compile=system == COMPILED,
        )
        base_rss = _rss_mb()
        result = trainer_mod.train(cfg)
    steps = [r for r in result.history if "time/train_s" in r]
    # Prompt tokens per step: the prompts of that step, G times each (the same ids TRL sees).
    task = build_task(cfg)
    fmt = build_prompt_format(cfg.model, result.tokenizer, result.model)
    encoded = fmt.encode([e.prompt for e in task.train])
    order = _step_prompts(cfg, len(task.train))
    n = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    gen = [round(r["response_length/mean"] * n) for r in steps]
    prompt_tok = [cfg.rollout.group_size * sum(len(encoded[i]) for i in idx) for idx in order]
    held = _held_out(result.model, result.tokenizer, cfg, task, fmt) if spec["eval"] else None
    return _summarize(
        spec,
        ends,
        gen,
        [p + g for p, g in zip(prompt_tok, gen, strict=True)],
        [r["time/rollout_s"] for r in steps],
        [r["reward/mean"] for r in steps],
        {
            "recompute_s": statistics.median(r["time/recompute_s"] for r in steps[1:] or steps),
            "clip_fraction": statistics.fmean(r.get("clip/fraction", 0.0) for r in steps),
            "zero_adv_fraction": statistics.fmean(
                r.get("advantage/zero_fraction", 0.0) for r in steps
            ),
            "held_out_greedy": held,
            "base_rss_mb": base_rss,
            "params": sum(p.numel() for p in result.model.parameters()),
            "gspo_file": gspo.__file__,
            **(_compile_record() if system == COMPILED else {}),
        },
    )


def _compile_record() -> dict[str, Any]:
    """What the compiled forward did in this run: graphs compiled, seconds of their first calls."""
    from gspo.models.compiled_forward import RECORD

    return {"compile_graphs": len(RECORD.keys), "compile_first_call_s": RECORD.first_call_s}


def run_init_eval(spec: dict[str, Any]) -> dict[str, Any]:
    """Held-out greedy accuracy of the starting checkpoint, on the same test problems (same
    seed, same count) the trained models are scored on: the baseline both systems start from."""
    import torch

    torch.set_num_threads(spec["threads"])
    from gspo.compose.parts import build_task
    from gspo.models.policy import build_policy, build_prompt_format

    with tempfile.TemporaryDirectory(prefix="vs-trl-init-") as tmp:
        cfg = _train_config(spec, tmp)
        model, tokenizer = build_policy(cfg.model, torch.device("cpu"), seed=cfg.run.seed)
        model.eval()
        task = build_task(cfg)
        fmt = build_prompt_format(cfg.model, tokenizer, model)
        return {"held_out_greedy": _held_out(model, tokenizer, cfg, task, fmt)}


# ------------------------------------------------------------------------------------------
# TRL
# ------------------------------------------------------------------------------------------


def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    """Train with TRL's GRPOTrainer in GSPO mode on the same model, prompts and settings."""
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from gspo.backend.update import lr_lambda
    from gspo.compose.parts import build_task
    from gspo.models.policy import build_policy, build_prompt_format

    with tempfile.TemporaryDirectory(prefix="vs-trl-trl-") as tmp:
        cfg = _train_config(spec, tmp)
        model, tokenizer = build_policy(cfg.model, torch.device("cpu"), seed=cfg.run.seed)
        task = build_task(cfg)
        fmt = build_prompt_format(cfg.model, tokenizer, model)
        order = _step_prompts(cfg, len(task.train))
        rows = [task.train[i] for idx in order for i in idx]
        # Chat models get conversational prompts (TRL applies the chat template); raw otherwise.
        if fmt.chat:
            prompts: list[Any] = [[{"role": "user", "content": e.prompt}] for e in rows]
            if fmt.system_prompt is not None:
                system = {"role": "system", "content": fmt.system_prompt}
                prompts = [[system, *p] for p in prompts]
        else:
            prompts = [e.prompt for e in rows]
        dataset = Dataset.from_dict(
            {"prompt": prompts, "answer": [e.answer for e in rows], "row": list(range(len(rows)))}
        )
        encoded = fmt.encode([e.prompt for e in rows[: cfg.rollout.prompts_per_step]])
        reward_fn = task.reward
        gen_tokens: list[int] = []
        rewards: list[float] = []
        train_tokens: list[int] = []

        def exact_match(prompts, completions, completion_ids, row, **kw) -> list[float]:
            """The task's reward on each completion (TRL reward-function signature)."""
            texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
            out = [float(reward_fn(t, rows[r])) for t, r in zip(texts, row, strict=True)]
            n_gen = sum(len(c) for c in completion_ids)
            gen_tokens.append(n_gen)
            rewards.append(sum(out) / len(out))
            train_tokens.append(n_gen + last_prompt_tokens[0])
            return out

        exact_match.__name__ = "exact_match"
        rollout_s: list[float] = []
        last_prompt_tokens = [0]
        first_prompt_ids: list[list[int]] = []
        inner_generate = model.generate

        def timed_generate(*args, **kwargs):
            mask = kwargs["attention_mask"]  # [N, P]
            last_prompt_tokens[0] = int(mask.sum())
            if not first_prompt_ids:
                ids = kwargs["input_ids"]
                first_prompt_ids.extend(
                    ids[i][mask[i].bool()].tolist()
                    for i in range(0, ids.shape[0], cfg.rollout.group_size)
                )
            t0 = time.perf_counter()
            out = inner_generate(*args, **kwargs)
            rollout_s.append(time.perf_counter() - t0)
            return out

        model.generate = timed_generate
        n = cfg.rollout.prompts_per_step * cfg.rollout.group_size
        stop_ids = sorted({tokenizer.eos_token_id, *fmt.stop_token_ids})
        args = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            report_to="none",
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            per_device_train_batch_size=n // NUM_MINIBATCHES,
            gradient_accumulation_steps=1,
            steps_per_generation=NUM_MINIBATCHES,
            num_generations=cfg.rollout.group_size,
            max_completion_length=cfg.rollout.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            generation_kwargs={"eos_token_id": stop_ids},
            learning_rate=cfg.optim.lr,
            lr_scheduler_type="constant_with_warmup",
            warmup_steps=WARMUP_OPT_STEPS,
            optim="adamw_torch",
            weight_decay=0.0,
            adam_beta1=0.9,
            adam_beta2=0.999,
            max_grad_norm=1.0,
            max_steps=cfg.run.steps * NUM_MINIBATCHES,
            beta=0.0,
            epsilon=CLIP_LOW,
            epsilon_high=CLIP_HIGH,
            importance_sampling_level="sequence",
            loss_type="grpo",
            scale_rewards="group",
            shuffle_dataset=False,
            logging_steps=NUM_MINIBATCHES,
            save_strategy="no",
            disable_tqdm=True,
            seed=cfg.run.seed,
            dataloader_num_workers=0,
            log_completions=False,
        )
        ends: list[tuple[float, float]] = []

        class Clock(TrainerCallback):
            """Wall time at train start and after every 4th optimizer step (one rollout)."""

            def on_train_begin(self, args, state, control, **kw):
                ends.append(_now())

            def on_step_end(self, args, state, control, **kw):
                if state.global_step % NUM_MINIBATCHES == 0:
                    ends.append(_now())

        # One warm-up convention on both sides (docs/algorithms.md, "Parity with TRL"): gspo's
        # factor (i + 1) / W, handed to TRL as its scheduler. transformers' constant_with_warmup
        # is i / W, whose first optimizer step runs at lr 0: a 0.5-relative weight difference
        # after a few steps (tests/test_trl_parity.py).
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.optim.lr, betas=(0.9, 0.999), weight_decay=0.0
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(WARMUP_OPT_STEPS))
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[exact_match],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Clock()],
            optimizers=(optimizer, schedule),
        )
        base_rss = _rss_mb()
        trainer.train()
        model.generate = inner_generate
        trained = trainer.model
        trained.eval()
        held = _held_out(trained, tokenizer, cfg, task, fmt) if spec["eval"] else None
        if encoded != first_prompt_ids:
            raise RuntimeError(
                "TRL's prompt token ids differ from gspo's: "
                f"{first_prompt_ids[:2]} vs {encoded[:2]}"
            )
        clip = [
            r.get("clip_ratio/region_mean", 0.0)
            for r in trainer.state.log_history
            if "clip_ratio/region_mean" in r
        ]
        zero_std = [
            r["frac_reward_zero_std"]
            for r in trainer.state.log_history
            if "frac_reward_zero_std" in r
        ]
    return _summarize(
        spec,
        ends,
        gen_tokens,
        train_tokens,
        rollout_s,
        rewards,
        {
            "recompute_s": None,
            "clip_fraction": statistics.fmean(clip) if clip else None,
            "zero_adv_fraction": statistics.fmean(zero_std) if zero_std else None,
            "held_out_greedy": held,
            "base_rss_mb": base_rss,
            "params": sum(p.numel() for p in trained.parameters()),
            "prompt_ids_identical": True,
        },
    )


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------


def prepare_init(workload: str, threads: int, cache: Path) -> tuple[str, dict[str, float]]:
    """The starting checkpoint of a workload: a gspo SFT cold start (made once, cached), or the
    named pretrained model itself. Returns (model path or name, its held-out metrics)."""
    w = WORKLOADS[workload]
    if w["sft_steps"] == 0:
        return w["model"], {}
    folder = cache / f"sft-{workload}"
    meta = folder / "vs_trl_sft.json"
    if meta.exists():
        return str(folder), json.loads(meta.read_text())
    code = (
        f"import json,sys,torch; torch.set_num_threads({threads})\n"
        "from gspo.config import SFTConfig, build\n"
        "from gspo.compose.sft import run_sft\n"
        "cfg = build(SFTConfig, overrides=json.loads(sys.argv[1]))\n"
        "r = run_sft(cfg)\n"
        "print(json.dumps({**r.eval, 'seconds': r.seconds}))\n"
    )
    overrides = {
        **w["size"],
        "model": w["model"],
        "task": w["task"],
        "difficulty": w["difficulty"],
        "steps": w["sft_steps"],
        "batch_size": w.get("sft_batch_size", 256),
        "n_test": w.get("sft_n_test", 200),
        "lr": w["sft_lr"],
        "max_new_tokens": w["max_new_tokens"],
        "output_dir": str(folder),
        "progress": False,
        "device": "cpu",
        "threads": threads,
        "seed": SEED,
    }
    print(f"cold start SFT for {workload} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(overrides)],
        capture_output=True,
        text=True,
        env=bl.env_with_src(dict(os.environ), bl.src_for("gspo", {})),  # this checkout's gspo
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise RuntimeError(f"SFT for {workload} failed")
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    meta.write_text(json.dumps(metrics))
    return str(folder), metrics


def run_in_subprocess(spec: dict[str, Any], script: str | None = None) -> dict[str, Any]:
    """One run in a fresh interpreter: ``script --one SPEC`` (this file unless named)."""
    cmd = [sys.executable, script or str(Path(__file__).resolve()), "--one", json.dumps(spec)]
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TOKENIZERS_PARALLELISM": "false"}
    # gspo from this checkout, or from the baseline's worktree for gspo@REF (not whichever one
    # happens to be installed).
    env = bl.env_with_src(env, Path(spec.get("gspo_src") or bl.src_for("gspo", {})))
    if spec.get("inductor_cache"):  # gspo-compile: this invocation's own compile cache
        env["TORCHINDUCTOR_CACHE_DIR"] = spec["inductor_cache"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise RuntimeError(f"{spec['system']} on {spec['workload']} failed ({proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over repetitions of each per-run figure."""

    def med(key: str) -> float | None:
        vals = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    keys = (
        "step_s",
        "cpu_step_s",
        "gen_tokens_per_s",
        "train_tokens_per_s",
        "rollout_s",
        "recompute_s",
        "peak_rss_mb",
        "base_rss_mb",
        "reward_last",
        "held_out_greedy",
        "gen_tokens_per_step",
        "clip_fraction",
        "zero_adv_fraction",
    )

    def mean_se(key: str) -> dict[str, float | None]:
        vals = [r[key] for r in runs if r.get(key) is not None]
        if not vals:
            return {f"{key}_mean": None, f"{key}_se": None}
        se = statistics.stdev(vals) / len(vals) ** 0.5 if len(vals) > 1 else 0.0
        return {f"{key}_mean": statistics.fmean(vals), f"{key}_se": se}

    learning = mean_se("reward_last") | mean_se("held_out_greedy")
    return {k: med(k) for k in keys} | learning | {"reps": len(runs), "params": runs[0]["params"]}


def _version(package: str) -> str | None:
    """An installed distribution's version (None when absent: TRL is only needed for "trl")."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _pm(a: dict[str, Any], key: str) -> str:
    """'mean ± se' over repetitions (just the mean for one)."""
    mean, se = a.get(f"{key}_mean"), a.get(f"{key}_se")
    if mean is None:
        return "-"
    return f"{mean:.3f}" if not se else f"{mean:.3f} ± {se:.3f}"


def table(
    summary: dict[str, dict[str, dict[str, Any]]],
    paired: dict[str, dict[str, dict[str, dict[str, RatioInterval]]]],
) -> str:
    """The Markdown table: medians over rounds, and the step-time ratios paired by round with
    their 95% interval (``paired``: ``paired_ratios`` per workload)."""
    head = [
        "workload",
        "system",
        "s/step",
        "CPU s/step",
        "gen tok/s",
        "train tok/s",
        "rollout s",
        "peak RSS MB",
        "base RSS MB",
        "reward (last)",
        "held-out",
        "zero-adv rows",
        "speed vs TRL (95% CI)",
        "speed vs baseline (95% CI)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for workload, systems in summary.items():
        for system, a in systems.items():
            mine = paired.get(workload, {}).get(system, {})
            to_trl = mine.get("vs trl", {}).get("speedup_step")
            to_base = next((r["speedup_step"] for k, r in mine.items() if k != "vs trl"), None)
            ratio = "1.00" if system == "trl" else "-" if to_trl is None else to_trl.text()
            lines.append(
                "| "
                + " | ".join(
                    [
                        workload,
                        system,
                        _f(a["step_s"], ".3f"),
                        _f(a["cpu_step_s"], ".3f"),
                        _f(a["gen_tokens_per_s"], ".0f"),
                        _f(a["train_tokens_per_s"], ".0f"),
                        _f(a["rollout_s"], ".3f"),
                        _f(a["peak_rss_mb"], ".0f"),
                        _f(a["base_rss_mb"], ".0f"),
                        _pm(a, "reward_last"),
                        _pm(a, "held_out_greedy"),
                        _f(a.get("zero_adv_fraction"), ".2f"),
                        ratio,
                        "-" if to_base is None else to_base.text(),
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def portable(value: Any, places: dict[str, str]) -> Any:
    """``value`` with every path under one of ``places`` (a folder -> its label) written relative
    to that label: a results file names no folder of the machine it ran on."""
    if isinstance(value, dict):
        return {k: portable(v, places) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v, places) for v in value]
    if isinstance(value, str):
        for folder, label in sorted(places.items(), key=lambda kv: -len(kv[0])):
            if value == folder or value.startswith(folder.rstrip("/") + "/"):
                return label + value[len(folder.rstrip("/")) :]
    return value


def learning(runs: dict[str, dict[str, list[dict[str, Any]]]], n_test: int) -> dict[str, Any]:
    """Each gspo system against TRL (and against its ``@REF`` baseline) on held-out accuracy and
    end-of-run train reward: the paired comparison of gspo.core.comparison (DESIGN.md, "How
    learning is compared"), pairing the runs of one seed. A baseline's runs serve every system
    compared with it: the report says so."""
    from gspo.core.comparison import compare_paired

    out: dict[str, Any] = {}
    for workload, by in runs.items():
        pairs = [(s, "trl") for s in by if s != "trl" and "trl" in by]
        pairs += [(s, b) for s in by if (b := bl.split(s)[0]) != s and b in by]
        if "gspo-groups" in by and "gspo" in by:  # grouped against shuffled minibatches
            pairs.append(("gspo-groups", "gspo"))
        if COMPILED in by and "gspo" in by:  # compiled against eager: the same update, rounded
            pairs.append((COMPILED, "gspo"))
        for key, problems in (("held_out_greedy", n_test), ("reward_last", None)):
            for system, base in pairs:
                shared = sum(1 for _, b in pairs if b == base)

                a, b = (
                    {r["seed"]: r[key] for r in by[name] if r.get(key) is not None}
                    for name in (system, base)
                )
                c = compare_paired(
                    a,
                    b,
                    names=(system, base),
                    problems=problems,
                    shared_baseline=shared,
                )
                if c.n:
                    out.setdefault(workload, {}).setdefault(key, []).append(c)
    return out


PAIRED = (
    # (ratio name, per-run figure, True: system / reference (throughput, memory), False:
    # reference / system (a time: above 1 is faster than the reference))
    ("speedup_step", "step_s", False),
    ("cpu_speedup_step", "cpu_step_s", False),
    ("gen_tokens_per_s", "gen_tokens_per_s", True),
    ("train_tokens_per_s", "train_tokens_per_s", True),
    ("rollout_speedup", "rollout_s", False),
    ("peak_rss", "peak_rss_mb", True),
)
"""The ratios against TRL that get a paired interval (against a baseline: the first two)."""
HALF_WIDTH_GOAL = 0.05
"""A speed interval wider than ±5% cannot show a 5% change: the report says so."""


def paired_ratios(
    by: dict[str, list[dict[str, Any]]],
) -> dict[str, dict[str, dict[str, RatioInterval]]]:
    """Per system, its ratios to TRL (``vs trl``) and to its ``@REF`` twin (``vs REF``), each
    paired by round (a round runs every system once, back to back) with its 95% interval
    (gspo.core.comparison.ratio_interval)."""
    from gspo.core.comparison import ratio_interval

    def by_round(system: str, key: str) -> dict[int, float | None]:
        return {r["rep"]: r.get(key) for r in by[system]}

    out: dict[str, dict[str, dict[str, RatioInterval]]] = {}
    for system in by:
        if system == "trl" or bl.split(system)[1] is not None:
            continue  # TRL and the baseline twins are references only
        refs = [("trl", PAIRED)] if "trl" in by else []
        refs += [(t, PAIRED[:2]) for t in by if t != system and bl.split(t)[0] == system]
        for reference, figures in refs:
            for ratio, key, system_over_reference in figures:
                mine, theirs = by_round(system, key), by_round(reference, key)
                rounds = sorted(set(mine) & set(theirs))
                a, b = [mine[r] for r in rounds], [theirs[r] for r in rounds]
                iv = ratio_interval(*((a, b) if system_over_reference else (b, a)))
                if iv is not None:
                    out.setdefault(system, {}).setdefault(f"vs {reference}", {})[ratio] = iv
    return out


def ratios(summary: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """gspo / TRL for every throughput figure, TRL / gspo for times, per workload and system."""
    out: dict[str, dict[str, Any]] = {}
    for workload, systems in summary.items():
        trl = systems.get("trl")
        for system, a in systems.items():
            if system == "trl" or not trl:
                continue

            def div(x: float | None, y: float | None) -> float | None:
                return None if x is None or not y else x / y

            out.setdefault(workload, {}).setdefault(system, {}).update(
                {
                    "speedup_step": div(trl["step_s"], a["step_s"]),
                    "gen_tokens_per_s": div(a["gen_tokens_per_s"], trl["gen_tokens_per_s"]),
                    "train_tokens_per_s": div(a["train_tokens_per_s"], trl["train_tokens_per_s"]),
                    "rollout_speedup": div(trl["rollout_s"], a["rollout_s"]),
                    "peak_rss": div(a["peak_rss_mb"], trl["peak_rss_mb"]),
                    "reward_last": div(a["reward_last"], trl["reward_last"]),
                    "held_out_greedy": div(a["held_out_greedy"], trl["held_out_greedy"]),
                }
            )
        vs_base = bl.speed_ratios({s: a["step_s"] for s, a in systems.items()})
        for system, r in vs_base.items():
            out.setdefault(workload, {}).setdefault(system, {})["speedup_vs_baseline"] = r
    return out


def speed_lines(paired: dict[str, dict[str, dict[str, dict[str, RatioInterval]]]]) -> str:
    """Every paired ratio with its 95% interval, one line each; a note where the interval is
    wider than ``HALF_WIDTH_GOAL`` (it could not show a change of that size)."""
    names = {
        "speedup_step": "step speedup",
        "cpu_speedup_step": "CPU-time speedup",
        "gen_tokens_per_s": "gen tok/s",
        "train_tokens_per_s": "train tok/s",
        "rollout_speedup": "rollout speedup",
        "peak_rss": "peak RSS",
    }
    lines = []
    for workload, per in paired.items():
        for system, by in per.items():
            for reference, ivs in by.items():
                other = "TRL" if reference == "vs trl" else reference.removeprefix("vs ")
                for key, iv in ivs.items():
                    line = f"{workload} {system} / {other}: {names[key]} {iv.ratio:.2f}x"
                    if iv.rounds >= 2:
                        line += (
                            f", 95% CI {iv.low:.2f}-{iv.high:.2f}x "
                            f"(±{100 * iv.half_width:.1f}%, {iv.rounds} paired rounds)"
                        )
                        if key != "peak_rss" and iv.half_width > HALF_WIDTH_GOAL:
                            line += f"; wider than ±{HALF_WIDTH_GOAL:.0%}: more --reps or --steps"
                    else:
                        line += " (1 round: no interval)"
                    lines.append(line)
    return "\n".join(lines)


def combine(paths: list[str], n_test: int, out: Path) -> None:
    """Merge results files' runs (a run per seed and system; a later file's run of the same seed
    replaces an earlier one) and compare them as one call of this script would have."""
    runs: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for path in paths:
        for workload, by in json.loads(Path(path).read_text())["runs"].items():
            for system, rs in by.items():
                runs.setdefault(workload, {}).setdefault(system, {}).update(
                    {r["seed"]: r for r in rs}
                )
    merged = {w: {s: list(rs.values()) for s, rs in by.items()} for w, by in runs.items()}
    compared = learning(merged, n_test)
    for by in compared.values():
        for key, cs in by.items():
            for c in cs:
                print(f"{key}: {c.line()}")
    report = {
        "benchmark": "vs_trl",
        "command": " ".join(["python benchmarks/vs_trl.py --combine", *paths, "--out", str(out)]),
        "learning": {
            w: {k: [c.to_json() for c in cs] for k, cs in by.items()} for w, by in compared.items()
        },
        "runs": merged,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--workloads", default="d64-add,d128-rev", help=f"of {', '.join(WORKLOADS)}")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join(SYSTEMS)}")
    ap.add_argument(
        "--ablate", action="store_true", help="also gspo with each optimization off alone"
    )
    ap.add_argument("--steps", type=int, default=16, help="RL steps per run (first is warm-up)")
    ap.add_argument(
        "--reps",
        type=int,
        default=3,
        help="paired rounds: each runs every system once, the order reversed every other round",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads in every run")
    ap.add_argument(
        "--cpus",
        default=None,
        help="pin every run to these CPUs (comma-separated ids, e.g. 1; like taskset -c); "
        "default: wherever the OS places it",
    )
    ap.add_argument(
        "--n-test",
        type=int,
        default=800,
        help="held-out problems for the accuracy (learning comparisons want >= 800: DESIGN.md)",
    )
    ap.add_argument("--no-eval", action="store_true", help="skip the held-out accuracy")
    ap.add_argument("--reward-window", type=int, default=5, help="last steps averaged")
    ap.add_argument(
        "--vary-seed",
        action="store_true",
        help="repetition r uses seed r (data order, sampling) in both systems; default: seed 0",
    )
    ap.add_argument(
        "--seed", type=int, default=SEED, help="seed of repetition 0 (--vary-seed: r adds r)"
    )
    ap.add_argument("--cache", default=None, help="folder for SFT cold starts (default: tmp)")
    ap.add_argument("--out", default=None, help=OUT_HELP)
    ap.add_argument(
        "--baseline",
        metavar="REF",
        help="also run each gspo system on commit REF (its own temp worktree) as SYSTEM@REF, "
        "alternating; the table adds the speed ratio current/baseline",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help=f"also {COMPILED}: gspo with compile=True (torch.compile of the training pass), "
        "with its compile seconds (cold, then warm) and break-even step in a second table",
    )
    ap.add_argument(
        "--combine",
        nargs="+",
        metavar="JSON",
        help="run nothing: merge the runs of these results files (e.g. seeds split across two "
        "calls), print the paired learning comparisons and write them with the runs to --out",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.out is None:  # never overwrite committed results
        args.out = str(dated_result("vs_trl"))
    if args.combine:
        combine(args.combine, args.n_test, Path(args.out))
        return

    if args.one:
        spec = json.loads(args.one)
        if spec.get("cpus"):  # before torch starts its threads: they inherit the affinity
            os.sched_setaffinity(0, spec["cpus"])
        runners = {"trl": run_trl, "init": run_init_eval}
        runner = runners.get(spec["system"], run_gspo)
        print(json.dumps(runner(spec)))
        return

    workloads = [w for w in args.workloads.split(",") if w]
    systems = [s for s in args.systems.split(",") if s]
    if args.ablate:
        systems += [f"gspo-no-{o}" for o in OPTIMIZATIONS if o != "shared-prefill"]
    if args.compile and COMPILED not in systems:
        systems.append(COMPILED)
    valid = {*SYSTEMS, COMPILED, *(f"gspo-no-{o}" for o in OPTIMIZATIONS)}
    bad = [w for w in workloads if w not in WORKLOADS] + [s for s in systems if s not in valid]
    if bad:
        ap.error(f"unknown workload/system {bad}")
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is a warm-up)")
    try:
        args.cpus = [int(c) for c in args.cpus.split(",") if c] if args.cpus else None
    except ValueError:
        ap.error(f"--cpus {args.cpus!r}: not a comma-separated list of CPU ids")
    if args.cpus and not set(args.cpus) <= os.sched_getaffinity(0):
        ap.error(f"--cpus {args.cpus}: not all of them are available here")
    with contextlib.ExitStack() as stack:
        worktrees: dict[str, Path] = {}
        if args.baseline:
            try:
                ref = bl.resolve(args.baseline)
                worktrees[ref] = stack.enter_context(bl.worktree(ref))
            except bl.BaselineError as err:
                ap.error(str(err))
            systems = bl.baseline_systems(systems, ref)
        _run_all(args, argv, workloads, systems, worktrees)


def _run_all(args, argv, workloads: list[str], systems: list[str], worktrees) -> None:
    """Every workload x repetition x system, alternating; then the table and the JSON."""
    cache = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="vs-trl-cache-"))
    cache.mkdir(parents=True, exist_ok=True)
    # gspo-compile's inductor cache: empty at the start of every invocation (rep 0 is cold).
    inductor = tempfile.mkdtemp(prefix="vs-trl-inductor-")

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    rounds: dict[str, list[dict[str, Any]]] = {}  # per round: order, loads, each system's s/step
    inits: dict[str, dict[str, Any]] = {}
    started = time.time()
    load_at_start = os.getloadavg()
    for workload in workloads:
        init, sft_metrics = prepare_init(workload, args.threads, cache)
        inits[workload] = {"init": init, "sft_eval": sft_metrics}
        if not args.no_eval:
            # The starting point on the runs' own held-out problems (they depend on the seed).
            seeds = sorted({args.seed + (r if args.vary_seed else 0) for r in range(args.reps)})
            start = {}
            for seed in seeds:
                spec = {
                    "workload": workload,
                    "system": "init",
                    "init": init,
                    "steps": args.steps,
                    "threads": args.threads,
                    "n_test": args.n_test,
                    "seed": seed,
                }
                start[str(seed)] = run_in_subprocess(spec)["held_out_greedy"]
                print(
                    f"    {workload} start checkpoint, seed {seed}: held-out greedy "
                    f"{start[str(seed)]:.3f} ({args.n_test} problems)",
                    file=sys.stderr,
                    flush=True,
                )
            inits[workload]["held_out_greedy_by_seed"] = start
        for rep in range(args.reps):
            # A round runs every system once, back to back; the order reverses every other
            # round (A B, B A, ...), so a drift in machine load hits both alike.
            order = systems if rep % 2 == 0 else systems[::-1]
            this_round = {"round": rep, "order": order, "load_1min_before": os.getloadavg()[0]}
            for system in order:
                spec = {
                    "workload": workload,
                    "system": system,
                    "init": init,
                    "steps": args.steps,
                    "threads": args.threads,
                    "n_test": args.n_test,
                    "eval": not args.no_eval,
                    "reward_window": args.reward_window,
                    "rep": rep,
                    "seed": args.seed + rep if args.vary_seed else args.seed,
                    "gspo_src": str(bl.src_for(system, worktrees)),
                    "cpus": args.cpus,
                    "inductor_cache": inductor if system == COMPILED else None,
                }
                print(
                    f"[{time.time() - started:6.0f}s] {workload} rep {rep} {system} "
                    f"(load {os.getloadavg()[0]:.1f}) ...",
                    file=sys.stderr,
                    flush=True,
                )
                load_before = os.getloadavg()[0]
                r = run_in_subprocess(spec) | {"rep": rep, "load_avg_1min_at_start": load_before}
                this_round.setdefault("step_s", {})[system] = r["step_s"]
                print(
                    f"    {r['step_s']:.3f} s/step, reward {r['reward_last']:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
                runs.setdefault(workload, {}).setdefault(system, []).append(r)
            this_round["load_1min_after"] = os.getloadavg()[0]
            rounds.setdefault(workload, []).append(this_round)

    summary = {w: {s: aggregate(rs) for s, rs in by.items()} for w, by in runs.items()}
    compiled = {w: rows for w, by in runs.items() if (rows := compile_rows(by))}
    compared = learning(runs, args.n_test) if not args.no_eval else {}
    paired = {w: paired_ratios(by) for w, by in runs.items()}
    import torch
    import transformers

    report = {
        "benchmark": "vs_trl",
        "command": None,  # below, once the paths to hide are known
        "settings": {
            "workloads": {w: WORKLOADS[w] for w in workloads},
            "systems": systems,
            "baseline": sorted(worktrees),  # commits (their temp worktrees are not kept)
            "steps": args.steps,
            "warmup_steps_excluded": 1,
            "reps": args.reps,
            "threads": args.threads,
            "cpus": args.cpus,
            "clip": [CLIP_LOW, CLIP_HIGH],
            "num_minibatches": NUM_MINIBATCHES,
            "inits": inits,
        },
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": _version("trl"),
            "cpu_count": os.cpu_count(),
            "load_avg_at_start": load_at_start,
            "load_avg_at_end": os.getloadavg(),
            "wall_s": time.time() - started,
        },
        "summary": summary,
        "ratios": ratios(summary),
        "paired_ratios": {
            w: {
                s: {ref: {k: iv.to_json() for k, iv in ivs.items()} for ref, ivs in by.items()}
                for s, by in per.items()
            }
            for w, per in paired.items()
        },
        "rounds": rounds,
        "compile": compiled,
        "learning": {
            w: {k: [c.to_json() for c in cs] for k, cs in by.items()} for w, by in compared.items()
        },
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    places = {str(cache): "<cache>", str(bl.REPO): "<repo>", inductor: "<inductor cache>"}
    places[tempfile.gettempdir()] = "<tmp>"
    places |= {str(path): f"<worktree of {ref}>" for ref, path in worktrees.items()}
    # The command's own paths (--cache, --out) too: each argument is a path or none.
    args_given = portable(list(argv if argv is not None else sys.argv[1:]), places)
    report["command"] = " ".join(["python benchmarks/vs_trl.py", *args_given])
    out.write_text(json.dumps(portable(report, places), indent=2) + "\n")
    print(table(summary, paired))
    if compiled:
        print("\n" + compile_table(compiled))
    for workload, init in inits.items():
        for seed, acc in init.get("held_out_greedy_by_seed", {}).items():
            print(f"{workload} start checkpoint (seed {seed}): held-out greedy {acc:.3f}")
    print(speed_lines(paired))
    load_now = os.getloadavg()
    print(
        "load average (1, 5, 15 min): "
        + ", ".join(f"{x:.2f}" for x in load_at_start)
        + " at the start, "
        + ", ".join(f"{x:.2f}" for x in load_now)
        + " at the end"
        + (f"; runs pinned to CPUs {args.cpus}" if args.cpus else "")
    )
    for workload, by in compared.items():
        for key, cs in by.items():
            print(f"\n{workload}, {key} (paired by seed; gspo.core.comparison):")
            for c in cs:
                print("  " + c.line())
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
