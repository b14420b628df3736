"""A plain-PyTorch rollout engine: batched KV-cached sampling with any HF causal LM.

It is the reference engine: no extra dependency, runs on CPU or one GPU, and records log-probs
by exactly the convention of ``gspo.rollout.base`` (log softmax of logits / T, before top-p), so
with shared weights its log-probs equal ``gspo.models.logprobs.token_logprobs`` up to float
rounding.
"""

from __future__ import annotations

import copy

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

from gspo.models.fast_forward import has_forward_hooks
from gspo.models.logprobs import forward_kwargs_support, model_kind, positions_from_mask
from gspo.models.vision import block_tokens, check_pixels
from gspo.models.vision_qwen import decode_positions, mrope_positions
from gspo.rollout.base import PIXELS, EngineBuild, GenerationRequest, Rollout
from gspo.rollout.stops import encode_stop
from gspo.rollout.torch_decode import (
    DecodeState,
    FastDecoder,
    ResumableGeneration,
    check_request,
    float_logits,
    left_pad,
    sample_next,
)


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _normalize_device(device: str | torch.device) -> torch.device:
    # "cuda" and "cuda:0" are the same place; without an index, comparing them to the model's
    # device would make an unneeded copy.
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _new_cache(model: torch.nn.Module) -> DynamicCache:
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers: no config argument
        return DynamicCache()


class TorchEngine:
    """Samples completions with a Hugging Face causal LM and a ``DynamicCache``.

    With ``share_weights=True`` (and no dtype or device change) the engine samples from the very
    module the trainer optimises, so ``update_weights`` is a no-op. Otherwise it holds a frozen
    deep copy, optionally cast to ``dtype`` (e.g. bfloat16 to emulate a training/inference
    precision mismatch) or moved to ``device``, which ``update_weights`` refreshes.

    ``tokenizer`` is needed only for ``SamplingParams.stop_strings``: each stop string is encoded
    once (no special tokens) and matched against the tail of the generated ids. That is exact
    for the char tokenizer; with BPE tokenizers a string produced by a different tokenisation
    would not be matched.

    ``fast=True`` (default) decodes through :class:`gspo.rollout.torch_decode.FastDecoder`
    (static KV cache, fused projections, few ops per step) whenever it supports the model
    (dense Llama / Qwen2 / Qwen3 without hooks or adapters); other models, and ``fast=False``,
    use the model's own Hugging Face forward with a ``DynamicCache``. Both give the same
    log-probs up to float rounding. ``compiled=True`` (the ``compile`` option) runs the fast
    path's decode step under ``torch.compile`` (:mod:`gspo.rollout.compiled_decode`), also equal
    up to float rounding.

    Output tensors live on the engine's device; log-probs are float32 (float64 for a float64
    model).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_id: int,
        eos_id: int,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        share_weights: bool = True,
        tokenizer: PreTrainedTokenizerBase | None = None,
        fast: bool = True,
        compiled: bool = False,
    ) -> None:
        self.fast = fast
        self.compiled = compiled
        self.pad_id = int(pad_id)
        self.eos_id = int(eos_id)
        self.tokenizer = tokenizer
        self._stop_seqs: dict[str, list[int]] = {}
        self.device = _normalize_device(device) if device is not None else _model_device(model)
        self.dtype = dtype if dtype is not None else _model_dtype(model)
        same_place = self.device == _model_device(model) and self.dtype == _model_dtype(model)
        self.shares_weights = share_weights and same_place
        if self.shares_weights:
            self.model = model
        else:
            self.model = copy.deepcopy(model).to(device=self.device, dtype=self.dtype)
            self.model.requires_grad_(False)
            for p in self.model.parameters():
                p.grad = None  # deepcopy also copies the trainer's gradients
            self.model.eval()

    # ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def update_weights(self, model: torch.nn.Module) -> None:
        """Sample from ``model``'s current weights from now on (a copy, cast to the engine's
        dtype, unless weights are shared)."""
        if self.shares_weights:
            self.model = model  # same object in the usual case: nothing to copy
            return
        # load_state_dict copies in place and casts each tensor to the engine's dtype/device.
        self.model.load_state_dict(model.state_dict())

    def _stop_ids(self, text: str) -> list[int]:
        return encode_stop(self.tokenizer, self._stop_seqs, text, "TorchEngine")

    def _forward(self, kw: dict, **inputs: torch.Tensor) -> torch.Tensor:
        """Last-position logits [N, V] of one cached forward, in at least float32."""
        out = self.model(**inputs, **kw)
        # A vision-language policy never samples its image placeholder (token_logprobs agrees).
        logits = float_logits(out.logits[:, -1])  # [N, V]
        blocked = model_kind(self.model).blocked
        return block_tokens(logits, blocked) if blocked else logits

    def generate(self, request: GenerationRequest) -> Rollout:
        """Sample the request's completions; row ``i * n + j`` is sample j of prompt i.

        ``request.pixels`` (:class:`gspo.models.vision.PixelInputs`, one entry per prompt) are
        the image inputs of vision-language prompts: the prefill takes them (once per prompt
        when its samples share the prefill), the KV cache carries them through the decode."""
        check_request(request)
        stop_seqs = [self._stop_ids(s) for s in request.params.stop_strings]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                out = self._generate(request, stop_seqs)
        finally:
            self.model.train(was_training)
        # Tensors made under inference_mode cannot enter autograd later (the trainer feeds
        # these ids into a forward with grad); cloning outside the mode makes normal tensors.
        return Rollout(
            prompt_ids=out["prompt_ids"].clone(),
            prompt_mask=out["prompt_mask"].clone(),
            completion_ids=out["completion_ids"].clone(),
            completion_mask=out["completion_mask"].clone(),
            logprobs=out["logprobs"].clone(),
            finish_reasons=out["finish_reasons"],
            prompt_index=out["prompt_index"].clone(),
            # Image prompts: the pixel inputs (per prompt) go with the rollout to the update.
            extras={} if request.pixels is None else {PIXELS: request.pixels},
        )

    def partial(self, request: GenerationRequest) -> ResumableGeneration:
        """A generation that can stop after any token and continue under new weights
        (:class:`~gspo.rollout.base.PartialGeneration`); run to the end without a pause it
        equals :meth:`generate` bit for bit."""
        return ResumableGeneration(self, request)

    def _start(
        self,
        base_ids: torch.Tensor,
        base_mask: torch.Tensor,
        n: int,
        max_new: int,
        pixels=None,
        base_index: torch.Tensor | None = None,
    ):
        """Prefill the distinct prompts ``base_ids`` [B, P] once and repeat their state for the
        ``n`` samples of each (rows laid out ``i * n + j``); return (last-position logits
        [N, V], ``advance``), where ``advance(tokens [N], positions [N])`` feeds one token per
        row and returns the next logits [N, V].

        Uses :class:`FastDecoder` when it supports the model, else the model's own forward with
        a ``DynamicCache``. A model with forward hooks (e.g. MoE routing capture, which records
        every row's prefill) gets the plain per-row prefill. ``pixels`` (image prompts) feed
        the prefill only; ``base_index`` [B] says which of their prompts each base row is
        (default: row b is prompt b).
        """
        positions = positions_from_mask(base_mask)  # [B, P]
        num = base_ids.shape[0] * n
        if model_kind(self.model).vision:
            check_pixels(self.model, base_ids, pixels)
        vision: dict = {}
        deltas = None  # [N] M-RoPE: how far each row's positions run ahead of its token count
        if pixels is not None:
            if base_index is None:
                base_index = torch.arange(base_ids.shape[0])
            pixels = pixels.to(self.device, self.dtype)
            vision = pixels.rows(base_index)  # [B, I, ...]
            # M-RoPE (Qwen2.5-VL): 3-D positions [3, B, P] from the model's own rope index.
            mrope = mrope_positions(self.model, base_ids, base_mask, vision)
            if mrope is not None:
                positions, deltas = mrope[0], mrope[1].repeat_interleave(n)  # [3, B, P], [N]
        if self.fast and not vision and FastDecoder.supports(self.model):
            dec = FastDecoder(
                self.model, batch=num, max_len=base_ids.shape[1] + max_new, compiled=self.compiled
            )
            logits = float_logits(dec.prefill(base_ids, base_mask, positions, repeats=n))

            def advance_fast(tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
                return float_logits(dec.decode(tok, pos))

            return logits, advance_fast

        supported = forward_kwargs_support(self.model)
        cache = _new_cache(self.model)
        # transformers 5 renamed past_key_values -> cache; the cache is filled in place.
        cache_kw = "cache" if "cache" in supported else "past_key_values"
        kw = {cache_kw: cache, "use_cache": True}
        prefill_kw = dict(kw)
        if "logits_to_keep" in supported:
            prefill_kw["logits_to_keep"] = 1  # only the last position is sampled from
        share = (
            n > 1
            and not has_forward_hooks(self.model)
            and hasattr(cache, "batch_repeat_interleave")
        )
        if share:
            logits = self._forward(
                prefill_kw,
                input_ids=base_ids,
                attention_mask=base_mask,
                position_ids=positions,
                **vision,
            ).repeat_interleave(n, dim=0)  # [N, V]
            cache.batch_repeat_interleave(n)
        else:
            if vision:  # each repeated row its prompt's images (Qwen's are flat patches)
                vision = pixels.rows(base_index.repeat_interleave(n))  # [N, I, ...]
            logits = self._forward(
                prefill_kw,
                input_ids=base_ids.repeat_interleave(n, dim=0),
                attention_mask=base_mask.repeat_interleave(n, dim=0),
                position_ids=positions.repeat_interleave(n, dim=-2),  # [N, P] or [3, N, P]
                **vision,
            )  # [N, V]
        attn = [base_mask.repeat_interleave(n, dim=0)]  # [N, P], grows by one column per step
        ones = torch.ones_like(attn[0][:, :1])  # [N, 1]

        def advance_hf(tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            attn[0] = torch.cat([attn[0], ones], dim=1)  # [N, P+t+1]
            return self._forward(
                kw,
                input_ids=tok.unsqueeze(1),
                attention_mask=attn[0],
                position_ids=decode_positions(pos, deltas),  # [N, 1] or [3, N, 1]
            )

        return logits, advance_hf

    def _record(self, st: DecodeState, t: int, tok: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
        """Write step ``t``'s sampled tokens [N] and log-probs [N] (pad / 0 for finished rows)
        into ``st`` and update its stop flags in place; return the tokens to feed next."""
        active = ~st.finished  # [N]
        tok = tok.masked_fill(st.finished, self.pad_id)  # [N]
        st.tokens[:, t] = tok
        st.logps[:, t] = lp.to(st.logps.dtype).masked_fill(st.finished, 0.0)
        st.cmask[:, t] = active.long()
        hit = torch.isin(tok, st.stop_tokens)  # [N]
        for seq in st.stop_seqs:
            k = seq.numel()
            if t + 1 >= k:
                tail = st.tokens[:, t + 1 - k : t + 1]  # [N, k]
                hit |= (tail == seq).all(dim=1)
        st.stopped |= active & hit
        st.finished |= hit
        return tok

    def _generate(self, request: GenerationRequest, stop_seqs: list[list[int]]) -> dict:
        prompts, n, params = request.prompts, request.n, request.params
        dev = self.device
        num = len(prompts) * n
        # Left-pad each prompt once, then repeat rows so sample j of prompt i is row i*n+j.
        base_ids, base_mask = left_pad(prompts, self.pad_id, dev)  # [B, P]
        prompt_ids = base_ids.repeat_interleave(n, dim=0)  # [N, P]
        prompt_mask = base_mask.repeat_interleave(n, dim=0)  # [N, P]
        prompt_index = torch.arange(len(prompts), device=dev).repeat_interleave(n)  # [N]

        max_new = int(params.max_new_tokens)
        logp_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        tokens = torch.full((num, max(max_new, 0)), self.pad_id, dtype=torch.long, device=dev)
        logps = torch.zeros((num, max(max_new, 0)), dtype=logp_dtype, device=dev)  # [N, M]
        cmask = torch.zeros((num, max(max_new, 0)), dtype=torch.long, device=dev)  # [N, M]
        finished = torch.zeros(num, dtype=torch.bool, device=dev)  # [N]
        stopped = torch.zeros(num, dtype=torch.bool, device=dev)  # [N] ended by a stop rule
        stop_tokens = torch.tensor(
            sorted({self.eos_id, *params.stop_token_ids}), dtype=torch.long, device=dev
        )  # [S]
        stop_tensors = [torch.tensor(s, dtype=torch.long, device=dev) for s in stop_seqs]

        state = DecodeState(tokens, logps, cmask, finished, stopped, stop_tokens, stop_tensors)
        steps = 0
        if max_new > 0:
            logits, advance = self._start(base_ids, base_mask, n, max_new, request.pixels)
            next_pos = prompt_mask.sum(dim=1)  # [N] position of the next token in each row
            for t in range(max_new):
                tok, lp = sample_next(logits, params.temperature, params.top_p, request.generator)
                tok = self._record(state, t, tok, lp)  # [N]
                steps = t + 1
                if t == max_new - 1 or bool(finished.all()):
                    break  # one host sync per step, to stop once every row is done
                # Finished rows keep decoding pad tokens (cheaper than compacting the batch);
                # their outputs are masked out above.
                logits = advance(tok, next_pos)  # [N, V]
                next_pos = next_pos + 1

        length = int(cmask[:, :steps].sum(dim=1).max().item()) if steps else 0
        reasons = ["stop" if s else "length" for s in stopped.tolist()]
        return {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": tokens[:, :length],  # [N, L]
            "completion_mask": cmask[:, :length],  # [N, L]
            "logprobs": logps[:, :length],  # [N, L]
            "finish_reasons": reasons,
            "prompt_index": prompt_index,
        }


def require() -> None:
    """The torch engine runs wherever gspo does."""


def build(b: EngineBuild) -> TorchEngine:
    """The torch engine of a run (``gspo.config.options.ROLLOUT_ENGINES``'s ``torch``)."""
    return TorchEngine(
        b.model, pad_id=b.pad_id, eos_id=b.eos_id, tokenizer=b.tokenizer, **b.torch_kw
    )
