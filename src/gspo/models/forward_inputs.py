"""What a training forward takes beyond a micro-batch's tokens: its rows' image inputs and the
MoE routing to replay and record, with the load-balancing term that routing adds to the loss.

The update (:mod:`gspo.backend.update`) runs every micro-batch through
:meth:`ForwardInputs.forward` the same way, for a dense text model, a vision-language model or
an MoE model: what differs is this model side's business, decided once per batch from the
model's kind (:func:`gspo.models.logprobs.model_kind`). Image inputs go on to
:func:`gspo.models.logprobs.token_logprobs`, whose pixel type knows its model's keywords
(:meth:`gspo.models.vision.PixelInputs.forward_inputs`); an MoE model's routing goes through the
router hooks of :mod:`gspo.models.moe`. A dense model's forward runs no MoE code at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gspo.models.logprobs import model_kind, token_logprobs

from . import compiled_forward, moe

Tokens = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""A micro-batch's prompt ids, prompt mask, completion ids, completion mask: [n, P'], [n, L']."""


def independent_rows(model: nn.Module) -> bool:
    """Whether a row's loss and gradient depend on that row alone: not for MoE models, whose
    load-balancing loss and routing records span the whole forward."""
    return not model_kind(model).moe


@dataclass
class Forward:
    """One micro-batch forward: per-token log-probs (under grad when asked), entropy, and the
    model's own loss term and metrics (MoE: the load-balancing loss, ``moe/*``)."""

    logprobs: torch.Tensor  # [n, L']
    entropy: torch.Tensor  # [n, L'] detached
    aux: torch.Tensor | None  # router_aux_loss_coef x share x aux loss; None: no such term
    metrics: dict[str, float]  # moe/* of this forward ({} for dense models)

    def loss(self, policy_loss: torch.Tensor) -> torch.Tensor:
        """The micro-batch's loss: the policy loss plus the model's own term, if any."""
        return policy_loss if self.aux is None else policy_loss + self.aux


@dataclass
class ForwardInputs:
    """A batch's inputs to its training forwards beyond the tokens, indexed by batch row [N]."""

    prompt_index: torch.Tensor  # [N] equal index: the same prompt (run once for its rows)
    pixels: Any  # PixelInputs of the batch's image prompts, one entry per pixel_index; None
    pixel_index: torch.Tensor  # [N] each row's entry of ``pixels``
    replay: moe.Routing | None  # routing the forwards replay (routing_replay), over [N, P+L]
    old_routing: moe.Routing | None  # the pre-update policy's, for moe/routing_change_loss
    aux_coef: float  # router_aux_loss_coef
    temperature: float
    routed: bool
    """An MoE model: its forwards replay and record routing and add the load-balancing term."""
    compiled: bool = False
    """The ``compile`` option, where it applies: the forwards run compiled."""

    @classmethod
    def of(
        cls,
        model: nn.Module,
        rollout: Any,
        *,
        pixels: Any,
        pixel_index: torch.Tensor,
        routing_replay: str | None,
        aux_coef: float,
        temperature: float,
        compiled: bool = False,
    ) -> ForwardInputs:
        """The inputs of ``rollout``'s forwards (its routing records read from its extras);
        ``compiled``: compile the forwards (:mod:`gspo.models.compiled_forward`)."""
        routed = model_kind(model).moe
        return cls(
            prompt_index=rollout.prompt_index,
            pixels=pixels,
            pixel_index=pixel_index,
            # MoE Routing Replay: the expert choice recorded by the old pass (R2) or the engine
            # (R3); replay_source refuses a mode the model or the rollout cannot serve.
            replay=None
            if routing_replay in (None, "none")
            else moe.replay_source(routing_replay, rollout, model),
            old_routing=moe.old_routing(rollout) if routed else None,
            aux_coef=aux_coef,
            temperature=temperature,
            routed=routed,
            compiled=compiled,
        )

    @property
    def whole_width(self) -> bool:
        """Every forward keeps the batch's full width: MoE routing records are laid out over it."""
        return self.routed

    def keywords(self, rows: torch.Tensor) -> dict[str, Any]:
        """:func:`token_logprobs` keywords of batch rows ``rows`` [n]."""
        return {
            "prompt_index": self.prompt_index[rows],  # a group's prompt runs once
            "pixels": self.pixels,  # image prompts: the rollout's own
            "pixel_index": self.pixel_index[rows],
        }

    def forward(
        self, model: nn.Module, tokens: Tokens, rows: torch.Tensor, *, grad: bool, share: float
    ) -> Forward:
        """The training forward of batch rows ``rows`` (under grad when ``grad``); ``share``:
        their part of the minibatch's sequences (weights the MoE aux loss)."""
        if not self.routed:  # a dense model: the scores alone
            with torch.set_grad_enabled(grad):
                logprobs, entropy = self._scores(model, tokens, rows, grad)
            return Forward(logprobs, entropy, None, {})
        # MoE: replay/capture the routing of this forward.
        with (
            torch.set_grad_enabled(grad),
            moe.training_forward(model, self.replay, rows, aux=True) as routes,
        ):
            logprobs, entropy = self._scores(model, tokens, rows, grad)
        prompt_mask, completion_mask = tokens[1], tokens[3]
        aux, metrics = moe.micro_batch_terms(
            model,
            routes,
            self.old_routing,
            prompt_mask,
            completion_mask,
            rows,
            aux_coef=self.aux_coef,
            weight=share,
        )
        return Forward(logprobs, entropy, aux, metrics)

    def _scores(
        self, model: nn.Module, tokens: Tokens, rows: torch.Tensor, grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[n, L'] log-probs and entropy of the rows' completions: compiled where it applies."""
        if self.compiled:  # set only where it applies; no-grad: a graph of its own
            return compiled_forward.token_logprobs(
                model, *tokens, self.prompt_index[rows], temperature=self.temperature
            )
        return token_logprobs(
            model, *tokens, temperature=self.temperature, with_entropy=True, **self.keywords(rows)
        )

    def reference(self, ref_model: nn.Module | None, tokens: Tokens, rows: torch.Tensor):
        """[n, L'] log-probs of the frozen reference model for these rows (None: no KL term)."""
        if ref_model is None:
            return None
        with torch.no_grad():
            ref, _ = token_logprobs(
                ref_model, *tokens, temperature=self.temperature, **self.keywords(rows)
            )
        return ref
