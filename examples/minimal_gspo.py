"""The whole GSPO loop on the demo task (2-digit addition) in one file.

    python examples/minimal_gspo.py --steps 20               # a random-init tiny model
    gspo demo && python examples/minimal_gspo.py --model runs/demo/sft   # from the cold start

One RL step: sample a group of completions per prompt, score them, turn the rewards into
group-normalized advantages, then a few minibatch updates of GSPO's clipped *sequence*-ratio
objective, and now and then a held-out evaluation. The library's pieces it stands on are only
the task, the model builder, the rollout engine, the training forward (token log-probs) and
the seeding helpers; the loop itself is written out below, top to bottom.

It does exactly what ``gspo train --preset demo`` does (same random streams, same operations in
the same order), so with the same settings and seed its metrics equal the library's bit for bit
(tests/test_minimal_example.py checks it, on CPU). Where it does something for that reason
alone (the column trimming and the zero-advantage split of the update), a comment says so.
What it leaves out of ``gspo train``: checkpoints, resume, metrics.jsonl, multi-turn tasks,
KL, other algorithms, vLLM, Ray.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from gspo import (
    ENVIRONMENTS,
    TASKS,
    GenerationRequest,
    SamplingParams,
    TorchEngine,
    build_policy,
    build_prompt_format,
    decode_completions,
    group_advantages,
    make_task,
    prompt_indices,
    step_generator,
    token_logprobs,
)
from gspo.config.options import ModelOptions


# ---- the decisions: `gspo train --preset demo`'s settings ------------------------------------
@dataclass
class Settings:
    model: str = "tiny"  # "tiny": a random-init char model; or a checkpoint folder (SFT output)
    hidden_size: int = 64  # tiny model shape (ignored for a checkpoint)
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    dtype: str = "float32"
    device: str = "auto"  # cuda when there is one
    threads: int = 0  # torch CPU threads; 0 keeps torch's default
    seed: int = 0  # model init, problems, prompt order, sampling, minibatch shuffles
    task: str = "addition"  # any single-turn built-in task: its reward scores a completion
    n_train: int = 5000
    n_test: int = 200
    steps: int = 800
    prompts_per_step: int = 16
    group_size: int = 8  # G completions per prompt: the group each is compared with
    max_new_tokens: int = 6
    temperature: float = 1.0
    top_p: float = 1.0
    num_minibatches: int = 4  # optimizer steps per rollout: the 1st on-policy, the rest off
    clip_low: float = 3e-4  # GSPO's band for the sequence ratio: [1 - 3e-4, 1 + 4e-4]
    clip_high: float = 4e-4
    lr: float = 1e-4
    warmup_steps: int = 10  # optimizer steps of linear LR warm-up
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    zero_advantage_split: float = 0.25  # see update(): when zero-advantage rows skip backward
    eval_every: int = 25  # held-out evaluation every N steps, at the start and at the end
    eval_batch: int = 256  # held-out prompts per generate call


CORRECT = 1.0 - 1e-9  # a completion is correct when its reward is (about) 1
LOG_RATIO_CLAMP = 20.0  # exp never overflows: a sequence ratio is at most e^20


class Means:
    """Weighted means of metrics over micro-batches and minibatches (the library's pooling)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, float] = {}

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value * weight
        self.weights[key] = self.weights.get(key, 0.0) + weight

    def extreme(self, key: str, value: float, pick) -> None:
        self.extremes[key] = pick(self.extremes.get(key, value), value)

    def result(self) -> dict[str, float]:
        out = {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}
        return {**out, **self.extremes}


def gspo_loss(logprobs, old, adv, mask, n_seq: int, s: Settings, stats: Means) -> torch.Tensor:
    """-J of GSPO on one micro-batch: J = (1/n_seq) Σ_i min(s_i A_i, clip(s_i) A_i), where
    s_i = exp(mean_t log(π/π_old)) is the geometric mean of sequence i's token ratios. n_seq is
    the whole minibatch's count, so micro-batch losses add up to the minibatch's."""
    m = mask.bool()  # [n, L] response tokens
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lengths = m.sum(dim=1).clamp(min=1)  # [n]
    log_ratio = torch.where(m, logprobs - old, zero)  # [n, L]
    seq_log_ratio = (log_ratio.sum(dim=1) / lengths).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(seq_log_ratio)  # [n] s_i: one ratio per sequence, not per token
    clipped_ratio = ratio.clamp(1.0 - s.clip_low, 1.0 + s.clip_high)  # [n]
    # Pessimistic: a sequence that moved past the band in its advantage's direction gets no
    # gradient (the min picks the constant clipped branch).
    term = torch.minimum(ratio * adv, clipped_ratio * adv)  # [n]
    # The term on every token, then the token mean per sequence: that mean is the term itself
    # (up to rounding; written as the library's aggregation so that the bits match).
    per_token = term[:, None] * m  # [n, L]
    per_seq = per_token.sum(dim=1) / lengths.to(per_token.dtype)  # [n]
    loss = -(per_seq.sum() / float(max(n_seq, 1)))

    with torch.no_grad():  # metrics, each pooled over what it averages
        tokens, n_tok = int(m.sum()), max(int(m.sum()), 1)
        r = ratio.detach()
        clipped = ((r > 1.0 + s.clip_high) & (adv > 0)) | ((r < 1.0 - s.clip_low) & (adv < 0))
        stats.add("clip/fraction", int((clipped[:, None] & m).sum()) / n_tok, tokens)
        nonempty = m.any(dim=1)  # [n]
        ratios = r[nonempty]  # [n'] non-empty sequences
        if ratios.numel():
            # A sum over a count, as the library's loss_core returns it (its one host read).
            mean = float(torch.where(nonempty, r, 0.0).sum()) / ratios.numel()
            stats.add("ratio/mean", mean, float(ratios.numel()))
            stats.extreme("ratio/min", float(ratios.min()), min)
            stats.extreme("ratio/max", float(ratios.max()), max)
        d = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [n, L]
        kl = (torch.exp(d) - d - 1.0) * m  # [n, L] k3 estimate of KL(π_old || π)
        stats.add("kl/old_new", float(kl.sum()) / n_tok, tokens)
    return loss


def used_columns(rollout, rows) -> tuple[slice, slice]:
    """The prompt and completion columns that are not padding in every row of ``rows``
    (prompts are left-padded, completions right-padded): fewer FLOPs, the same values, and the
    library's shapes (so its float rounding too)."""
    p_used = rollout.prompt_mask[rows].any(dim=0).nonzero()  # [P', 1]
    c_used = rollout.completion_mask[rows].any(dim=0).nonzero()  # [L', 1]
    # Every row has a prompt token and a first sampled token: neither is ever empty.
    return slice(int(p_used[0]), None), slice(0, int(c_used[-1]) + 1)


def update(model, optimizer, scheduler, rollout, advantages, step: int, s: Settings):
    """num_minibatches optimizer steps over one rollout; the engine's own log-probs are the old
    policy's (no recompute pass: the first minibatch is exactly on-policy)."""
    model.train()
    n = rollout.num_samples
    gen = step_generator(s.seed, step, stream=1, device=torch.device("cpu"))
    minibatches = torch.randperm(n, generator=gen).chunk(s.num_minibatches)  # K x [N/K]
    zero = advantages == 0  # [N] groups whose rewards all agree: nothing to learn from
    stats = Means()
    stats.add("advantage/zero_fraction", float(zero.float().mean()))
    for mb in minibatches:
        n_seq = int((rollout.completion_mask[mb].sum(dim=1) > 0).sum())
        # A zero-advantage row adds exactly 0 to the loss and its gradient. When such rows are
        # many, they skip the backward (a no-grad forward still measures them); when few, they
        # stay in the gradient pass, which is cheaper than a second forward.
        live, idle = mb[~zero[mb]], mb[zero[mb]]
        if len(idle) < s.zero_advantage_split * len(mb):
            live, idle = mb, mb[:0]
        if len(live) == 0:  # a zero gradient still moves Adam's moments, as a backward would
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        mb_loss = 0.0
        for rows, with_grad in ((live, True), (idle, False)):
            if len(rows) == 0:
                continue
            p_cols, c_cols = used_columns(rollout, rows)
            mask = rollout.completion_mask[rows][:, c_cols]  # [n, L']
            with torch.set_grad_enabled(with_grad):
                logprobs, entropy = token_logprobs(
                    model,
                    rollout.prompt_ids[rows][:, p_cols],
                    rollout.prompt_mask[rows][:, p_cols],
                    rollout.completion_ids[rows][:, c_cols],
                    mask,
                    temperature=s.temperature,
                    with_entropy=True,
                    prompt_index=rollout.prompt_index[rows],  # a group's prompt runs once
                )  # [n, L'] each
            old = rollout.logprobs[rows][:, c_cols].to(logprobs.dtype)  # [n, L'] π_old
            adv = advantages[rows].to(logprobs.dtype)  # [n]
            loss = gspo_loss(logprobs, old, adv, mask, n_seq, s, stats)
            if with_grad:
                loss.backward()  # micro-batch gradients add up to the minibatch's
            tokens = int(mask.sum())
            stats.add("entropy", float((entropy * mask).sum()) / max(tokens, 1), tokens)
            mb_loss += float(loss.detach())
        stats.add("loss", mb_loss)
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm))
        if math.isfinite(norm) and math.isfinite(mb_loss):
            stats.add("grad_norm", norm)
            optimizer.step()
            scheduler.step()
        # (else: a non-finite loss or gradient would poison the weights and Adam: skip it)
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return stats.result()


def sample_and_score(engine, tokenizer, task, prompts, examples, n, params, gen):
    """``n`` completions of each prompt (row i*n + j: sample j of prompt i), their rewards
    [N] float64 and the rollout."""
    rollout = engine.generate(GenerationRequest(prompts, n, params, gen))
    texts = decode_completions(tokenizer, rollout.completion_ids, rollout.completion_mask)
    rows = rollout.prompt_index.tolist()
    rewards = [float(task.reward(t, examples[i])) for t, i in zip(texts, rows, strict=True)]
    return torch.tensor(rewards, dtype=torch.float64), rollout  # [N]


def evaluate(engine, tokenizer, task, test_prompts, stops, step: int, s: Settings):
    """One greedy and one sampled completion per held-out problem."""
    out = {}
    greedy = SamplingParams(s.max_new_tokens, temperature=0.0, stop_token_ids=stops)
    sampled = SamplingParams(s.max_new_tokens, s.temperature, s.top_p, stop_token_ids=stops)
    gen = step_generator(s.seed, step, stream=3, device=engine.device)
    for name, params, g in (("greedy_accuracy", greedy, None), ("avg@1", sampled, gen)):
        rewards = []
        for i in range(0, len(task.test), s.eval_batch):
            r, _ = sample_and_score(
                engine, tokenizer, task, test_prompts[i : i + s.eval_batch],
                task.test[i : i + s.eval_batch], 1, params, g,
            )  # fmt: skip
            rewards += r.tolist()
        values = [float(x >= CORRECT) for x in rewards] if name == "greedy_accuracy" else rewards
        out[f"eval/{name}"] = sum(values) / len(values)
    return out


def run(s: Settings, log=None) -> list[dict]:
    """Train as ``s`` says; every record (a step's metrics, an evaluation) goes to ``log`` and
    into the returned list."""
    records: list[dict] = []

    def emit(record: dict) -> None:
        records.append(record)
        if log is not None:
            log(record)

    if s.threads > 0:
        torch.set_num_threads(s.threads)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if s.device == "auto" else s.device)
    opts = ModelOptions.of(s)  # the model's options (the rest as `gspo train`'s defaults)
    model, tokenizer = build_policy(opts, device, seed=s.seed)  # seeded init, or a checkpoint
    fmt = build_prompt_format(opts, tokenizer, model)  # raw prompts or a chat template; stop ids
    task = make_task(s.task, n_train=s.n_train, n_test=s.n_test, seed=s.seed)
    train_prompts = fmt.encode([e.prompt for e in task.train])  # token ids, no padding
    test_prompts = fmt.encode([e.prompt for e in task.test])
    # The engine samples from the very module the optimizer trains: no weight copy per step.
    engine = TorchEngine(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                         tokenizer=tokenizer)  # fmt: skip
    params = SamplingParams(s.max_new_tokens, s.temperature, s.top_p, fmt.stop_token_ids)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=s.lr, betas=(0.9, 0.999), weight_decay=s.weight_decay,
        fused=device.type in ("cpu", "cuda") or None,  # one kernel: several times faster
    )  # fmt: skip
    warmup = s.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / warmup) if warmup > 0 else 1.0
    )

    if s.eval_every > 0:
        emit({"step": 0, **evaluate(engine, tokenizer, task, test_prompts,
                                    fmt.stop_token_ids, 0, s)})  # fmt: skip
    for step in range(s.steps):  # step: updates done so far; every RNG stream is (seed, step)
        # 1. Sample a group: G completions for each of this step's prompts, with log-probs.
        idx = prompt_indices(len(task.train), step, s.prompts_per_step, s.seed)
        gen = step_generator(s.seed, step, stream=0, device=engine.device)
        prompts, examples = [train_prompts[i] for i in idx], [task.train[i] for i in idx]
        # 2. Score: the task's verifiable reward of each completion.
        rewards, rollout = sample_and_score(
            engine, tokenizer, task, prompts, examples, s.group_size, params, gen
        )  # [N] with N = prompts_per_step * group_size, laid out group after group
        # 3. Advantages: each completion against the others of its group, (r - mean) / std.
        advantages = group_advantages(rewards, s.group_size).to(device)  # [N]
        # 4. Minibatch updates of the clipped sequence-ratio objective.
        train = update(model, optimizer, scheduler, rollout, advantages, step, s)
        lengths = rollout.completion_lengths()  # [N]
        emit({
            "step": step + 1,
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std(correction=0)),
            "response_length/mean": float(lengths.float().mean()),
            **train,
            "lr": scheduler.get_last_lr()[0],
        })  # fmt: skip
        # 5. Evaluate every eval_every steps and after the last.
        if s.eval_every > 0 and ((step + 1) % s.eval_every == 0 or step + 1 == s.steps):
            emit({"step": step + 1, **evaluate(engine, tokenizer, task, test_prompts,
                                               fmt.stop_token_ids, step + 1, s)})  # fmt: skip
    return records


def print_record(record: dict) -> None:
    shown = [f"step {record['step']:4d}"]
    for key, value in record.items():
        if key != "step":
            shown.append(f"{key} {value:.4g}")
    print("  ".join(shown), flush=True)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints its usage too)
        print(f"minimal_gspo.py: {message} (--help lists the flags)", file=sys.stderr)
        sys.exit(2)


def problem(s: Settings) -> str | None:
    """What makes ``s`` unusable here, in one line (or None)."""
    tasks = sorted(set(TASKS) - set(ENVIRONMENTS))  # multi-turn tasks need their environment
    if s.task not in tasks:
        close = difflib.get_close_matches(s.task, tasks, n=1)
        hint = f" — did you mean {close[0]!r}?" if close else ""
        return (f"--task {s.task!r}: not a single-turn built-in task{hint} (one of "
                f"{', '.join(tasks)}; multi-turn ones run with `gspo train`)")  # fmt: skip
    if s.model != "tiny" and not (Path(s.model) / "config.json").is_file():
        return (f"--model {s.model}: no model checkpoint there (no config.json); run `gspo demo` "
                "first (its SFT model is runs/demo/sft) or leave --model out")  # fmt: skip
    n = s.prompts_per_step * s.group_size
    if min(s.prompts_per_step, s.group_size, s.num_minibatches) < 1 or s.num_minibatches > n:
        return (f"--prompts-per-step, --group-size and --num-minibatches must be >= 1, with at "
                f"most prompts x group = {n} minibatches")  # fmt: skip
    return None


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(Settings):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default
        )
    s = Settings(**vars(parser.parse_args(argv)))
    if (message := problem(s)) is not None:
        print(f"minimal_gspo.py: {message}", file=sys.stderr)
        return 2
    run(s, log=print_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
