"""Partial rollouts: a torch-engine generation that can stop after any token and continue later,
possibly under new weights, without restarting.

Asynchronous RL (``gspo.orchestration.async_rollout``) lets the engine keep sampling while the
trainer trains. When new weights arrive in the middle of a generation, the generation is paused
at its current token position, the engine loads the weights, and decoding continues from there:
the prompt and the tokens generated so far are prefilled again under the new weights (their KV
cache from the old weights is dropped; verl, slime and OpenRLHF continue partial rollouts the same
way, by re-submitting prompt + partial response), then sampling goes on with the same random
stream.

Every token keeps the log-prob and the policy version of the weights that produced it:
``Rollout.versions`` [N, L] next to ``Rollout.logprobs`` [N, L]. These recorded log-probs are the
behaviour policy of the sample (a product of per-token probabilities from mixed versions), which
is what the losses use as "old" log-probs.

Without a pause the result equals ``TorchEngine.generate`` bit for bit (same prefill, same decode
ops, same random draws). A pause and continuation under the *same* weights equals it token for
token, and log-probs agree up to float rounding (a prefill of P + t tokens instead of t cached
decode steps).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gspo.rollout.base import Rollout, SamplingParams
from gspo.rollout.torch_engine import TorchEngine, _DecodeState, check_request, sample_next

NO_VERSION = -1
"""``Rollout.versions`` value on positions that hold no generated token (padding)."""


class ResumableGeneration:
    """One batched generation (``n`` samples per prompt, rows laid out ``i * n + j`` as in
    ``TorchEngine.generate``) that decodes in chunks.

    ``run(max_tokens, version)`` decodes up to ``max_tokens`` more tokens with the engine's
    current weights and tags them ``version``. Before the engine's weights change, call
    ``pause()`` (it drops the KV cache); a ``run`` with a different ``version`` than the live
    cache also re-prefills, so the old cache is never mixed with new weights.
    """

    def __init__(
        self,
        engine: TorchEngine,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> None:
        check_request(prompts, n, params)
        self.engine, self.n, self.params, self.generator = engine, n, params, generator
        dev = engine.device
        stop_seqs = [engine._stop_ids(s) for s in params.stop_strings]
        width = max(len(p) for p in prompts)
        base_ids = torch.full((len(prompts), width), engine.pad_id, dtype=torch.long)  # [B, P]
        base_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, P]
        for i, p in enumerate(prompts):
            base_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            base_mask[i, width - len(p) :] = 1
        self.base_ids, self.base_mask = base_ids.to(dev), base_mask.to(dev)
        self.prompt_ids = self.base_ids.repeat_interleave(n, dim=0)  # [N, P]
        self.prompt_mask = self.base_mask.repeat_interleave(n, dim=0)  # [N, P]
        self.prompt_index = torch.arange(len(prompts), device=dev).repeat_interleave(n)  # [N]
        num = len(prompts) * n
        self.max_new = max(int(params.max_new_tokens), 0)
        logp_dtype = torch.float64 if engine.dtype == torch.float64 else torch.float32
        self.state = _DecodeState(
            tokens=torch.full((num, self.max_new), engine.pad_id, dtype=torch.long, device=dev),
            logps=torch.zeros((num, self.max_new), dtype=logp_dtype, device=dev),  # [N, M]
            cmask=torch.zeros((num, self.max_new), dtype=torch.long, device=dev),  # [N, M]
            finished=torch.zeros(num, dtype=torch.bool, device=dev),  # [N]
            stopped=torch.zeros(num, dtype=torch.bool, device=dev),  # [N]
            stop_tokens=torch.tensor(
                sorted({engine.eos_id, *params.stop_token_ids}), dtype=torch.long, device=dev
            ),  # [S]
            stop_seqs=[torch.tensor(s, dtype=torch.long, device=dev) for s in stop_seqs],
        )
        # [N, M] policy version of each generated token, NO_VERSION where none was generated.
        self.versions = torch.full((num, self.max_new), NO_VERSION, dtype=torch.long, device=dev)
        self.position = 0  # tokens decoded so far (the next step index)
        self.pauses = 0  # continuations under a re-prefilled cache
        self._logits: torch.Tensor | None = None  # [N, V] next-token logits, None: not computed
        self._advance = None  # the live decoder's step function, None: paused / not started
        self._last: torch.Tensor | None = None  # [N] the last fed-back tokens
        self._live_version: int | None = None
        self._next_pos = self.prompt_mask.sum(dim=1)  # [N] position of the next token per row

    @property
    def done(self) -> bool:
        return self.position >= self.max_new or bool(self.state.finished.all())

    def pause(self) -> None:
        """Drop the KV cache (call before the engine's weights change); ``run`` re-prefills."""
        if self._advance is not None:
            self.pauses += 1
        self._advance, self._logits, self._live_version = None, None, None

    def run(
        self, max_tokens: int | None, version: int, stop: Callable[[], bool] | None = None
    ) -> int:
        """Decode up to ``max_tokens`` more tokens (None: to the end) under the engine's current
        weights, tagged ``version``, stopping early after the first token at which ``stop()``
        is true (e.g. new weights arrived); return how many steps were taken."""
        if self.done:
            return 0
        if self._live_version is not None and self._live_version != version:
            self.pause()
        model = self.engine.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                return self._run(max_tokens, version, stop)
        finally:
            model.train(was_training)

    def _prefill(self) -> torch.Tensor:
        """Start a decoder at the current position; return the next-token logits [N, V]."""
        remaining = self.max_new - self.position
        # The token sampled next is fed back at RoPE position prompt length + position.
        self._next_pos = self.prompt_mask.sum(dim=1) + self.position  # [N]
        if self.position == 0:  # exactly TorchEngine.generate's prefill (prompts shared by n)
            logits, self._advance = self.engine._start(
                self.base_ids, self.base_mask, self.n, remaining
            )
            return logits
        t = self.position
        # Prompt + generated tokens of every row; finished rows carry pads with mask 1, as in
        # the uninterrupted decode (their outputs are masked out).
        ids = torch.cat([self.prompt_ids, self.state.tokens[:, :t]], dim=1)  # [N, P+t]
        mask = torch.cat([self.prompt_mask, torch.ones_like(self.state.tokens[:, :t])], dim=1)
        logits, self._advance = self.engine._start(ids, mask, 1, remaining)  # [N, V]
        return logits

    def _run(self, max_tokens: int | None, version: int, stop: Callable[[], bool] | None) -> int:
        st = self.state
        steps = 0
        while not self.done and (max_tokens is None or steps < max_tokens):
            # Logits are computed lazily at the start of a step, so a pause right after a token
            # wastes no forward pass under the old weights.
            if self._advance is None:
                self._logits = self._prefill()
                self._live_version = version
            elif self._logits is None:
                self._logits = self._advance(self._last, self._next_pos)  # [N, V]
                self._next_pos = self._next_pos + 1
            tok, lp = sample_next(
                self._logits, self.params.temperature, self.params.top_p, self.generator
            )
            active = ~st.finished  # [N]
            t = self.position
            self._last = self.engine._record(st, t, tok, lp)  # [N]
            self.versions[:, t] = torch.where(active, version, NO_VERSION)  # [N]
            self._logits = None
            self.position += 1
            steps += 1
            if stop is not None and stop():
                break
        return steps

    def result(self) -> Rollout:
        """The generation as a ``Rollout`` (with ``versions``); call once ``done``."""
        if not self.done:
            raise RuntimeError(f"generation not finished (position {self.position})")
        st = self.state
        steps = self.position
        length = int(st.cmask[:, :steps].sum(dim=1).max().item()) if steps else 0
        return Rollout(
            prompt_ids=self.prompt_ids.clone(),
            prompt_mask=self.prompt_mask.clone(),
            completion_ids=st.tokens[:, :length].clone(),  # [N, L]
            completion_mask=st.cmask[:, :length].clone(),  # [N, L]
            logprobs=st.logps[:, :length].clone(),  # [N, L]
            finish_reasons=["stop" if s else "length" for s in st.stopped.tolist()],
            prompt_index=self.prompt_index.clone(),
            versions=self.versions[:, :length].clone(),  # [N, L]
        )


def sample_versions(rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """(oldest [N], newest [N]) policy version over each row's generated tokens; a row without
    tokens gets NO_VERSION for both. Needs ``rollout.versions``."""
    if rollout.versions is None:
        raise ValueError("the rollout carries no per-token versions")
    v = rollout.versions  # [N, L]
    has = v != NO_VERSION  # [N, L]
    big = torch.iinfo(torch.long).max
    oldest = v.masked_fill(~has, big).min(dim=1).values if v.shape[1] else v.sum(dim=1)  # [N]
    newest = v.max(dim=1).values if v.shape[1] else v.sum(dim=1)  # [N]
    none = ~has.any(dim=1)  # [N]
    return oldest.masked_fill(none, NO_VERSION), newest.masked_fill(none, NO_VERSION)
