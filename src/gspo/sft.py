"""Supervised cold start: teach the policy the task's format so RL starts from a model that
sometimes succeeds (the GSPO and LUSPO papers start RL from a cold-start fine-tuned model too)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import moe
from .build import build_policy, build_prompt_format, build_task, resolve_device, set_threads
from .config import SFTConfig
from .core.seeding import step_generator
from .evaluation import evaluate_model
from .models import save_model, token_logprobs
from .orchestration.logging import progress_bar
from .trainer import lr_lambda


@dataclass
class SFTResult:
    output_dir: Path
    losses: list[float]
    eval: dict[str, float]
    seconds: float


def _pad_left(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [B, P]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, P]
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


def _pad_right(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [B, L]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, L]
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def run_sft(cfg: SFTConfig) -> SFTResult:
    """Fine-tune on demonstrations (prompt -> demo + EOS), save the model, report held-out accuracy."""
    set_threads(cfg.threads)
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    model, tokenizer = build_policy(cfg, device)
    task = build_task(cfg)
    demos = [e for e in task.train if (e.demo if e.demo is not None else e.answer)]
    if not demos:
        raise ValueError(f"task {task.name} has no demonstrations for SFT")
    # Chat models see their template and learn to end on its end-of-turn token (<|im_end|>).
    fmt = build_prompt_format(cfg, tokenizer, model)
    prompts = fmt.encode([e.prompt for e in demos])
    targets = [
        [*ids, fmt.end_token_id]
        for ids in tokenizer(
            [e.demo if e.demo is not None else e.answer for e in demos], add_special_tokens=False
        )["input_ids"]
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.warmup_steps))
    bar = None
    if cfg.progress:
        bar = progress_bar(cfg.steps, desc="sft")
    losses: list[float] = []
    model.train()
    for step in range(cfg.steps):
        g = step_generator(cfg.seed, step, stream=2, device=torch.device("cpu"))
        idx = torch.randint(len(demos), (cfg.batch_size,), generator=g).tolist()
        p_ids, p_mask = _pad_left([prompts[i] for i in idx], tokenizer.pad_token_id)
        c_ids, c_mask = _pad_right([targets[i] for i in idx], tokenizer.pad_token_id)
        aux_on = cfg.router_aux_loss_coef > 0
        with moe.capture_routing(model, keep_logits=aux_on) as routes:  # None for dense models
            logprobs, _ = token_logprobs(
                model, p_ids.to(device), p_mask.to(device), c_ids.to(device), c_mask.to(device)
            )  # [B, L]
        mask = c_mask.to(device=device, dtype=logprobs.dtype)
        loss = -(logprobs * mask).sum() / mask.sum()  # token-mean cross-entropy on the targets
        if aux_on and routes is not None:  # MoE load-balancing loss
            attn = torch.cat([p_mask, c_mask], dim=1).to(device)  # [B, P+L]
            loss = loss + cfg.router_aux_loss_coef * moe.aux_loss(model, routes, attn)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    if bar is not None:
        bar.close()
    model.eval()
    out = Path(cfg.output_dir)
    save_model(model, tokenizer, out)
    metrics: dict[str, float] = {}
    if task.test:
        metrics = evaluate_model(
            model,
            tokenizer,
            task.test,
            task.reward,
            max_new_tokens=cfg.max_new_tokens,
            generator=step_generator(cfg.seed, cfg.steps, stream=3, device=device),
            prompt_format=fmt,
        )
    return SFTResult(out, losses, metrics, time.perf_counter() - t0)
