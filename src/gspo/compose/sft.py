"""Supervised cold start: teach the policy the task's format so RL starts from a model that
sometimes succeeds (the GSPO and LUSPO papers start RL from a cold-start fine-tuned model too)."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..backend import checkpoint as ckpt
from ..backend.base import CheckpointTarget
from ..backend.update import lr_lambda
from ..config import ConfigError, SFTConfig, to_dict
from ..config.options import ModelOptions
from ..config.train import SFT_SAFE_ON_RESUME
from ..core.checkpoint_paths import checkpoint_root, latest_checkpoint
from ..core.seeding import step_generator
from ..models import moe
from ..models.chat import encode_examples
from ..models.logprobs import token_logprobs
from ..models.model_io import save_model
from ..models.policy import build_prompt_format, resolve_device, set_threads
from ..orchestration.evaluation import evaluate_model
from ..orchestration.logging import progress_bar
from ..orchestration.loop import StopRequest
from .evaluate import eval_env
from .parts import build_policy_for, build_task
from .sft_prompts import fit_demonstrations, sft_held_out


@dataclass
class SFTResult:
    output_dir: Path
    losses: list[float]
    """The loss of every step from step 1, across resumes."""
    eval: dict[str, float]
    seconds: float
    interrupted: int | None = None
    """The signal (SIGINT / SIGTERM) that stopped SFT after a step; the model is not saved."""
    checkpoint: Path | None = None
    """The checkpoint written when a signal stopped it (``--resume`` continues from it)."""


def _pad_left(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Padded in Python, then one tensor each: a tensor per row was ~5% of a batch-256 step.
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)  # [B, P]
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])  # [B, P]
    return ids, mask


def _pad_right(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)  # [B, L]
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # [B, L]
    return ids, mask


def run_sft(cfg: SFTConfig, *, resume: bool = False) -> SFTResult:
    """Fine-tune on demonstrations (prompt -> demo + EOS), save the model, report held-out
    accuracy. Checkpoints go to ``<output_dir>/checkpoints`` every ``checkpoint_every`` steps
    and when SIGINT / SIGTERM stop it after a step; ``resume`` continues from the latest one
    (every batch comes from a (seed, step) generator, so the result equals an unbroken run's).
    The saved model replaces the folder, checkpoints included, once all steps are done."""
    set_threads(cfg.threads)
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    out = Path(cfg.output_dir)
    found = latest_checkpoint(out) if resume else None
    if resume and found is None:
        raise FileNotFoundError(f"--resume: no SFT checkpoint under {checkpoint_root(out)}")
    if found is not None:  # the checkpoint must be this SFT's
        saved_cfg = ckpt.load_state(found)["config"]
        now = json.loads(json.dumps(to_dict(cfg)))  # as saved: JSON types
        other = sorted(k for k in now if k not in SFT_SAFE_ON_RESUME and saved_cfg.get(k) != now[k])
        if other:
            raise ConfigError(
                f"--resume: the SFT checkpoint {found} belongs to another run ({', '.join(other)} "
                "differ)"
            )
    # A save_model a kill interrupted leaves its temporary folders beside the model folder.
    for stale in [*out.parent.glob(f".tmp-{out.name}-*"), out.parent / f".tmp-old-{out.name}"]:
        shutil.rmtree(stale, ignore_errors=True)
    if out.is_dir():
        ckpt.clean_stale(out)
        if not resume:  # a new SFT never resumes from another one's checkpoints later
            ckpt.discard_run(out)
    model, tokenizer = build_policy_for(cfg, device)
    task = build_task(cfg)
    demos = [e for e in task.train if (e.demo if e.demo is not None else e.answer)]
    if not demos:
        raise ValueError(f"task {task.name} has no demonstrations for SFT")
    # Chat models see their template and learn to end on its end-of-turn token (<|im_end|>).
    fmt = build_prompt_format(ModelOptions.of(cfg), tokenizer, model)
    prompts, pixels = encode_examples(fmt, demos)  # pixels: image prompts' inputs, or None
    targets = _targets(demos, tokenizer, fmt)
    # Prompt + demonstration within the context (long_prompts), before any step.
    kept, replaced = fit_demonstrations(cfg, task, demos, prompts, targets, model)
    if len(kept) < len(demos):  # re-encoded: the pixel inputs are indexed by demonstration
        demos = [demos[i] for i in kept]
        prompts, pixels = encode_examples(fmt, demos)
        targets = _targets(demos, tokenizer, fmt)
        replaced = {kept.index(i): ids for i, ids in replaced.items()}
    prompts = [replaced.get(i, ids) for i, ids in enumerate(prompts)]
    held_out = sft_held_out(cfg, task, fmt, model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.warmup_steps))
    losses: list[float] = []
    start, seconds = 0, 0.0
    if found is not None:
        saved = ckpt.restore(found, model=model, optimizer=optimizer, scheduler=scheduler)
        start, losses, seconds = int(saved["step"]), list(saved["losses"]), saved["seconds"]
    # The global step out of the total; the ETA is this process's average rate (eta_s).
    bar = progress_bar(cfg.steps, desc="sft", initial=start) if cfg.progress else None
    model.train()

    def save(step: int) -> Path:
        target = CheckpointTarget(out, tokenizer, to_dict(cfg), keep=1)
        extra = {"losses": losses, "seconds": seconds + time.perf_counter() - t0}
        return ckpt.save_checkpoint(target, step, model, optimizer, scheduler, extra)

    with StopRequest() as stop:
        for step in range(start, cfg.steps):
            _sft_step(cfg, step, model, demos, prompts, targets, tokenizer, device, losses, pixels)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            done, every = step + 1, cfg.checkpoint_every
            if done == cfg.steps:  # the saved model below is the result: no checkpoint
                break
            path = save(done) if every > 0 and done % every == 0 else None
            if stop.requested:  # after the step and its checkpoint: a resume continues here
                path = path or save(done)
                if bar is not None:
                    bar.close()
                elapsed = seconds + time.perf_counter() - t0
                return SFTResult(out, losses, {}, elapsed, stop.signum, path)
    if bar is not None:
        bar.close()
    model.eval()
    save_model(model, tokenizer, out)  # replaces the folder: its checkpoints go with it
    # Beside the model, the config that made it: gspo eval reads its generation settings
    # (max_new_tokens, chat_template) and gspo compare reuses a cold start made the same way.
    (out / "sft_config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    metrics: dict[str, float] = {}
    if held_out:  # the task's environment, as training and gspo eval score it
        env, limits = eval_env(cfg, task, fmt.chat)  # as gspo eval and training
        metrics = evaluate_model(
            model,
            tokenizer,
            held_out,
            task.reward,
            max_new_tokens=cfg.max_new_tokens,
            generator=step_generator(cfg.seed, cfg.steps, stream=3, device=device),
            prompt_format=fmt,
            env=env,
            limits=limits,
        )
    return SFTResult(out, losses, metrics, seconds + time.perf_counter() - t0)


def _targets(demos, tokenizer, fmt) -> list[list[int]]:
    """Each demonstration's target ids: the demonstration (or the answer), then the end token."""
    texts = [e.demo if e.demo is not None else e.answer for e in demos]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [[*row, fmt.end_token_id] for row in ids]


def _sft_step(
    cfg, step, model, demos, prompts, targets, tokenizer, device, losses, pixels=None
) -> None:
    """One step's batch (from the (seed, step) generator), loss and gradients."""
    g = step_generator(cfg.seed, step, stream=2, device=torch.device("cpu"))
    idx = torch.randint(len(demos), (cfg.batch_size,), generator=g).tolist()
    p_ids, p_mask = _pad_left([prompts[i] for i in idx], tokenizer.pad_token_id)
    c_ids, c_mask = _pad_right([targets[i] for i in idx], tokenizer.pad_token_id)
    aux_on = cfg.router_aux_loss_coef > 0
    with moe.capture_routing(model, keep_logits=aux_on) as routes:  # None for dense models
        logprobs, _ = token_logprobs(
            model,
            p_ids.to(device),
            p_mask.to(device),
            c_ids.to(device),
            c_mask.to(device),
            prompt_index=None if pixels is None else torch.tensor(idx, device=device),
            pixels=pixels,
        )  # [B, L]
    mask = c_mask.to(device=device, dtype=logprobs.dtype)
    loss = -(logprobs * mask).sum() / mask.sum()  # token-mean cross-entropy on the targets
    if aux_on and routes is not None:  # MoE load-balancing loss
        attn = torch.cat([p_mask, c_mask], dim=1).to(device)  # [B, P+L]
        loss = loss + cfg.router_aux_loss_coef * moe.aux_loss(model, routes, attn)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    losses.append(float(loss.detach()))
