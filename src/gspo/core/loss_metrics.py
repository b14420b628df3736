"""A policy loss's metrics, as :func:`gspo.core.losses.loss_core` computes them: first their sums
as one tensor (:func:`stats`: no Python number read from a tensor, so the ``compile`` option's
graph holds them too), then, after one host read, the Python floats the update logs
(:func:`metrics`): clip shares, ratio mean / min / max and the KL estimates."""

from __future__ import annotations

import torch

from gspo.core.objectives import LOG_RATIO_CLAMP, LossTerms, masked_log_ratio

STATS = (
    "tokens",
    "sequences",
    "clipped",
    "clipped_low",
    "clipped_high",
    "clipped_sequences",
    "ratio_sum",
    "ratio_min",
    "ratio_max",
    "ratio_count",
    "kl_old_new_sum",
    "kl_ref_sum",
)
"""The sums :func:`gspo.core.losses.loss_core` returns, in order: counts over the response mask,
the clip decisions, the ratios (sequence ratios for the GSPO family, token ratios for GRPO), the k3
estimate of KL(π_old || π_θ) and the KL penalty's estimate (0 without one)."""


def stats(
    terms: LossTerms,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_ref: torch.Tensor | None,
) -> torch.Tensor:
    """:data:`STATS` of one loss call: [len(STATS)] float64 (counts are exact up to 2^53)."""
    with torch.no_grad():
        nonempty = mask.any(dim=1)  # [B]
        clipped = terms.clipped_low | terms.clipped_high  # [B, T]
        real = terms.ratio_mask  # [B] or [B, T]
        ratio = terms.ratio.detach()
        inf = torch.full((), float("inf"), dtype=ratio.dtype, device=ratio.device)
        # k3 estimate of KL(π_old || π_θ) with samples from π_old: e^(l-o) - (l-o) - 1.
        d = masked_log_ratio(logprobs.detach(), old_logprobs, mask)
        d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
        kl = (torch.exp(d) - d - 1.0) * mask  # [B, T]
        sums = (
            mask.sum(),
            nonempty.sum(),
            clipped.sum(),
            terms.clipped_low.sum(),
            terms.clipped_high.sum(),
            (clipped.any(dim=1) & nonempty).sum(),
            torch.where(real, ratio, 0.0).sum(),
            torch.where(real, ratio, inf).amin() if ratio.numel() else inf,
            torch.where(real, ratio, -inf).amax() if ratio.numel() else -inf,
            real.sum(),
            kl.sum(),
            kl_ref.detach().sum() if kl_ref is not None else torch.zeros_like(inf),
        )
        return torch.stack([x.to(torch.float64) for x in sums])  # [len(STATS)]


def metrics(sums: list[float], *, kl: bool) -> dict[str, float]:
    """Clip shares and ratio statistics as Python floats, from :func:`stats`' sums (counts
    divided in double precision); ``kl/ref`` only with a KL penalty."""
    s = dict(zip(STATS, sums, strict=True))
    n_tok = max(s["tokens"], 1.0)
    n_seq = max(s["sequences"], 1.0)
    has = s["ratio_count"] > 0
    metrics = {
        "clip/fraction": s["clipped"] / n_tok,
        "clip/low_fraction": s["clipped_low"] / n_tok,
        "clip/high_fraction": s["clipped_high"] / n_tok,
        "clip/seq_fraction": s["clipped_sequences"] / n_seq,
        "ratio/mean": s["ratio_sum"] / s["ratio_count"] if has else 1.0,
        "ratio/min": s["ratio_min"] if has else 1.0,
        "ratio/max": s["ratio_max"] if has else 1.0,
        "ratio/count": s["ratio_count"],  # what ratio/mean averages over, for pooling
        "kl/old_new": s["kl_old_new_sum"] / n_tok,
    }
    if kl:
        metrics["kl/ref"] = s["kl_ref_sum"] / n_tok
    return metrics
