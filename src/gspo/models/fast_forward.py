"""A lean forward for Llama-family decoders (Llama, Qwen2, Qwen3): rollout decoding and the
training pass, computed from the Hugging Face module's own parameters with far fewer ops.

Why: for the small models this project trains on CPU, a forward through the Hugging Face
modules is mostly per-op and Python overhead (module wrappers, mask construction, a
``DynamicCache`` that concatenates keys and values every decode step), not arithmetic. This
module computes the same function with:

- q/k/v and gate/up projections fused into one matmul each (weights concatenated per call;
  under autograd the concatenation is differentiable, so gradients reach the original
  parameters), for models small enough that this pays (``FUSE_MAX_PARAMS``);
- Qwen3's q- and k-norms as one RMSNorm over all heads, RoPE on q and k in one pass, written
  as ``x * cos + roll(x) * signed_sin`` (bit-identical to ``rotate_half``);
- RoPE cos/sin from the model's own rotary module, computed once for all positions;
- for decoding (:class:`gspo.rollout.torch_decode.FastDecoder`, the torch engine's, built on
  :class:`LeanStack`): a preallocated static KV cache written in place, with left-padded
  prompts every row writes the same column each step;
- for training (:func:`completion_logits`): rows that share a prompt (the G samples of a
  group) run that prompt's forward once; its keys and values are gathered for every sample,
  which then run only their completion tokens. Gradients are those of the full pass up to
  float rounding (the gather sums the samples' gradients into the shared prompt).

:func:`supports` says whether this path computes exactly what the model's own forward
computes; anything else (MoE, LoRA/peft wrappers, sliding-window layers, forward hooks such as
routing capture, RoPE types whose table depends on the sequence length) uses the Hugging Face
forward. Tests check log-probs and gradients against it (1e-9 in float64).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

__all__ = [
    "BLOCKED_MIN_TOKENS",
    "CAUSAL_MIN_TOKENS",
    "FUSE_MAX_PARAMS",
    "QUERY_BLOCKS",
    "LeanStack",
    "completion_logits",
    "distinct_prompts",
    "has_forward_hooks",
    "shared_prompt_logits",
    "supports",
]

_SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
FUSE_MAX_PARAMS = 50_000_000
"""Fuse q/k/v and gate/up weights only below this many parameters: the fused copy costs one
more copy of those weights per call, which pays only while per-op overhead dominates."""
CAUSAL_MIN_TOKENS = 768
"""Completions at least this long run the training pass's attention as plain causal attention
(``is_causal``, no mask) over a layout with each row's prompt padding moved to its end
(:func:`completion_logits`): SDPA's CPU kernel then skips the blocks above the diagonal and
builds no [N, 1, L, P+L] mask, about half of the attention work; below it the layout's extra
gathers and the prompt's dummy queries cost as much as that saves (d64, one alternating
forward + backward run, ``benchmarks/attention_layout.py``: 1.42x at 1024 tokens, 0.87-1.09x
at 512, slower at 256 and below)."""
BLOCKED_MIN_TOKENS = 320
"""Below :data:`CAUSAL_MIN_TOKENS`, completions at least this long run the masked layout's
attention in :data:`QUERY_BLOCKS` blocks of queries, each over the keys up to its last query
only (a later key is masked for all of them): PyTorch's CPU flash kernel takes up to 512 keys
in one block, so with one call it computes the whole square and masks half of it away. Same
function, other float rounding (float64 test: tests/test_fast_forward.py). d64, 8 rows,
forward + backward of the training pass, alternating (``benchmarks/attention_layout.py``,
``masked`` against ``unblocked``): see docs/performance.md, "The length exponent"."""
QUERY_BLOCKS = 4


def has_forward_hooks(model: torch.nn.Module) -> bool:
    """Whether any forward (pre-)hook is registered on ``model``'s modules or globally."""
    glob = torch.nn.modules.module
    if (
        getattr(glob, "_global_forward_hooks", None)
        or getattr(glob, "_global_forward_pre_hooks", None)
        or getattr(glob, "_global_forward_hooks_always_called", None)
    ):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def supports(model: torch.nn.Module) -> bool:
    """Whether this module computes exactly what ``model``'s own forward computes."""
    if type(model).__name__ not in _SUPPORTED or has_forward_hooks(model):
        return False
    cfg = model.config
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "layers"):
        return False
    if (
        getattr(cfg, "hidden_act", "silu") != "silu"
        or (getattr(cfg, "pretraining_tp", 1) or 1) != 1
    ):
        return False
    if getattr(inner.rotary_emb, "rope_type", "default") not in _STATIC_ROPE:
        return False
    if model.training and float(getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0:
        return False  # attention dropout is not modelled
    if type(model.lm_head) is not torch.nn.Linear:
        return False
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        mlp = getattr(layer, "mlp", None)
        if attn is None or mlp is None or getattr(attn, "sliding_window", None) is not None:
            return False
        linears = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(type(m) is torch.nn.Linear for m in linears):
            return False  # e.g. a LoRA or quantized wrapper
    return True


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm exactly as transformers writes it: in float32, cast back, then the weight.
    (``F.rms_norm`` gave the same value in float32 but no measurable speed-up.)"""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _cat_linear(mods: tuple[torch.nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One (weight, bias) computing all of ``mods`` side by side (outputs concatenated)."""
    weight = torch.cat([m.weight for m in mods], dim=0)  # [sum(out), in]
    if all(m.bias is None for m in mods):
        return weight, None
    bias = torch.cat(
        [m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in mods]
    )
    return weight, bias


class LeanStack:
    """The model's parameters arranged for the lean forward, and its RoPE tables."""

    def __init__(self, model: torch.nn.Module, max_len: int, fuse: bool | None = None) -> None:
        cfg = model.config
        inner = model.model
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        attn0 = inner.layers[0].self_attn
        self.head_dim = int(getattr(attn0, "head_dim", cfg.hidden_size // self.n_heads))
        self.scaling = float(getattr(attn0, "scaling", self.head_dim**-0.5))
        self.eps = float(cfg.rms_norm_eps)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        if fuse is None:
            fuse = sum(x.numel() for x in model.parameters()) <= FUSE_MAX_PARAMS
        self.layers = [self._layer(layer, fuse) for layer in inner.layers]
        self.embed = inner.embed_tokens.weight  # [V, hidden]
        # nn.Embedding's padding_idx: the row gets no gradient from a lookup (a sampled pad token
        # in a completion). Without it the fast path gave that row a gradient nn.Embedding never
        # does, and a zero-initialized pad row's RMSNorm gradient (~1/sqrt(eps)) then dominated
        # the clipped gradient norm (found by tests/test_trl_parity.py).
        self.padding_idx = inner.embed_tokens.padding_idx
        self.norm = inner.norm.weight  # [hidden]
        self.lm_head = (model.lm_head.weight, model.lm_head.bias)
        # RoPE tables for positions 0..max_len-1, from the model's own rotary module.
        with torch.no_grad():
            pos = torch.arange(max_len, device=self.device)[None]  # [1, T]
            probe = torch.zeros((), device=self.device, dtype=self.dtype)
            cos, sin = inner.rotary_emb(probe, pos)  # [1, T, D] each
        half = self.head_dim // 2
        self.cos = cos[0]  # [T, D]
        # rotate_half(x) * sin == roll(x, half) * [-sin[:half], sin[half:]], exactly.
        self.sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)  # [T, D]

    def _layer(self, layer: torch.nn.Module, fuse: bool) -> dict:
        a, m = layer.self_attn, layer.mlp
        w: dict = {
            "ln1": layer.input_layernorm.weight,
            "ln2": layer.post_attention_layernorm.weight,
            "o": (a.o_proj.weight, a.o_proj.bias),
            "down": (m.down_proj.weight, m.down_proj.bias),
            "qk_norm": None,
        }
        qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        if qn is not None and kn is not None:
            d = self.head_dim
            # One weight row per head: q heads then k heads, [H + KV, D].
            w["qk_norm"] = torch.cat(
                [qn.weight.expand(self.n_heads, d), kn.weight.expand(self.n_kv, d)]
            )
        qkv = (a.q_proj, a.k_proj, a.v_proj)
        gu = (m.gate_proj, m.up_proj)
        if fuse:
            w["qkv"], w["gate_up"] = [_cat_linear(qkv)], [_cat_linear(gu)]
        else:
            w["qkv"] = [(x.weight, x.bias) for x in qkv]
            w["gate_up"] = [(x.weight, x.bias) for x in gu]
        return w

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings [..., hidden] of token ids, as the model's ``nn.Embedding`` gives them."""
        return F.embedding(ids, self.embed, padding_idx=self.padding_idx)

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [N, 1, T, D] at positions ``pos`` [N, T] (once per forward)."""
        return self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)

    def qkv(self, w: dict, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """q [N, H, T, D], k and v [N, KV, T, D] of hidden states ``x`` [N, T, hidden], with
        ``rope`` = :meth:`rope` of their positions."""
        n, t, _ = x.shape
        h = _rms(x, w["ln1"], self.eps)
        parts = [F.linear(h, wt, b) for wt, b in w["qkv"]]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)  # [N, T, (H+2KV)*D]
        d, nq, nkv = self.head_dim, self.n_heads, self.n_kv
        qk = out[..., : (nq + nkv) * d].view(n, t, nq + nkv, d)  # [N, T, H+KV, D]
        v = out[..., (nq + nkv) * d :].view(n, t, nkv, d)  # [N, T, KV, D]
        if w["qk_norm"] is not None:
            qk = _rms(qk, w["qk_norm"], self.eps)  # Qwen3: per-head RMSNorm of q and k
        qk = qk.transpose(1, 2)  # [N, H+KV, T, D]
        cos, sin = rope  # [N, 1, T, D] each
        qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
        return qk[:, :nq], qk[:, nq:], v.transpose(1, 2)

    def out_and_mlp(self, w: dict, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Residual + o_proj(o), then residual + SwiGLU MLP; ``o`` is [N, T, H*D]."""
        x = x + F.linear(o, *w["o"])
        h = _rms(x, w["ln2"], self.eps)
        if len(w["gate_up"]) == 1:
            gate, up = F.linear(h, *w["gate_up"][0]).chunk(2, dim=-1)
        else:
            gate, up = (F.linear(h, wt, b) for wt, b in w["gate_up"])
        return x + F.linear(F.silu(gate) * up, *w["down"])

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] of hidden states ``x`` [..., hidden] (final norm, LM head)."""
        return F.linear(_rms(x, self.norm, self.eps), *self.lm_head)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, blocks: int = 1
    ):
        """SDPA of q [N, H, Tq, D] over k, v [N, KV, Tk, D] with a bool ``mask``
        [N, 1, Tq, Tk]; returns [N, Tq, H*D]. ``blocks`` > 1: the queries in that many blocks,
        block [a, b) over keys [0, Tk - Tq + b) only; needs a mask under which no query sees a
        key of a later query (the last Tq keys are the queries' own, causal)."""
        groups = self.n_heads // self.n_kv
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)  # [N, H, Tk, D]; head h uses kv h // groups
            v = v.repeat_interleave(groups, dim=1)
        tq, pre = q.shape[2], k.shape[2] - q.shape[2]
        edges = [tq * i // blocks for i in range(blocks + 1)]
        o = torch.cat(
            [
                F.scaled_dot_product_attention(
                    q[:, :, a:b],
                    k[:, :, : pre + b],
                    v[:, :, : pre + b],
                    attn_mask=mask[..., a:b, : pre + b],
                    scale=self.scaling,
                )
                for a, b in itertools.pairwise(edges)
            ]
            if blocks > 1
            else [F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)],
            dim=2,
        )  # [N, H, Tq, D]
        return o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    def prompt_pass(self, ids: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor):
        """Left-padded prompts ``ids`` [U, P] (``valid`` [U, P] bool): the last position's
        hidden state [U, hidden] and each layer's keys and values [U, KV, P, D]."""
        p = ids.shape[1]
        causal = torch.ones((p, p), dtype=torch.bool, device=ids.device).tril()  # [P, P]
        # Padded query positions attend to themselves only, so no row is fully masked (that
        # would give NaN, and NaN values times zero weights poison real rows); their outputs
        # are never used and their keys are masked for every real query.
        eye = torch.eye(p, dtype=torch.bool, device=ids.device)  # [P, P]
        mask = ((causal & valid[:, None, :]) | eye)[:, None]  # [U, 1, P, P]
        x = self.embed_ids(ids)  # [U, P, hidden]
        kv = []
        rope = self.rope(pos)
        for w in self.layers:
            q, k, v = self.qkv(w, x, rope)
            kv.append((k, v))
            x = self.out_and_mlp(w, x, self.attend(q, k, v, mask))
        return x[:, -1], kv


def completion_logits(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    prompt_index: torch.Tensor,
    *,
    causal: bool | None = None,
) -> torch.Tensor:
    """Logits [N, L, V] predicting each completion token (row i, token j from position
    P - 1 + j), as the model's forward over ``cat(prompt, completion)`` gives them.

    Rows with equal ``prompt_index`` [N] must hold the same prompt (the samples of one group):
    that prompt's forward runs once, its keys and values are shared by those rows, and each row
    then runs only its first L - 1 completion tokens (float64 models: no sharing, see
    :func:`distinct_prompts`). Differentiable. Needs :func:`supports`. ``causal`` picks the
    attention layout of the completion tokens (None: by length, :data:`CAUSAL_MIN_TOKENS`);
    both compute the same function, up to float rounding.
    """
    first, inv = distinct_prompts(model, prompt_index)
    return shared_prompt_logits(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, first, inv, causal=causal
    )


def distinct_prompts(
    model: torch.nn.Module, prompt_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(first [U], inv [N]) of rows' ``prompt_index`` [N]: one row of each of the U distinct
    prompts, and each row's distinct prompt. Its output shape depends on the values, so it runs
    outside a compiled graph (:mod:`gspo.models.compiled_forward`)."""
    n = prompt_index.shape[0]
    if next(model.parameters()).dtype == torch.float64:
        # transformers' RMSNorm runs in float32 even in a float64 model, so its gradient carries
        # float32 rounding, and summing the samples' gradients before or after that cast differs
        # at ~1e-7. float64 runs exist to check invariances (micro-batching, resume) exactly:
        # there every row runs its own prompt, as the plain forward does.
        prompt_index = torch.arange(n, device=prompt_index.device)
    uniq, inv = torch.unique(prompt_index, return_inverse=True)  # inv: row -> distinct prompt
    first = torch.zeros(len(uniq), dtype=torch.long, device=prompt_index.device)
    first.scatter_(0, inv, torch.arange(n, device=prompt_index.device))  # one row per prompt
    return first, inv


def shared_prompt_logits(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    first: torch.Tensor,
    inv: torch.Tensor,
    *,
    causal: bool | None = None,
) -> torch.Tensor:
    """:func:`completion_logits` given its :func:`distinct_prompts` ``first`` [U] and ``inv``
    [N]: every shape here is the inputs', so it compiles to one graph per shape."""
    n, p = prompt_ids.shape
    length = completion_ids.shape[1]
    stack = LeanStack(model, max_len=p + length)
    valid = prompt_mask.bool()  # [N, P]
    positions = (torch.cat([prompt_mask, completion_mask], dim=1).long().cumsum(-1) - 1).clamp(
        min=0
    )  # [N, P+L], as gspo.models.logprobs.positions_from_mask
    last, kv = stack.prompt_pass(prompt_ids[first], valid[first], positions[first, :p])
    out = [stack.logits(last)[inv][:, None]]  # [N, 1, V]: predicts completion token 0
    lc = length - 1
    if lc > 0:
        x = stack.embed_ids(completion_ids[:, :lc])  # [N, Lc, hidden]
        rope = stack.rope(positions[:, p : p + lc])  # at positions [N, Lc]
        if causal if causal is not None else lc >= CAUSAL_MIN_TOKENS:
            out.append(_causal_completion(stack, x, rope, kv, inv, valid))  # [N, Lc, V]
            return torch.cat(out, dim=1)  # [N, L, V]
        # Completion query j sees the row's real prompt tokens and completion tokens 0..j.
        tri = torch.ones((lc, lc), dtype=torch.bool, device=prompt_ids.device).tril()
        mask = torch.cat([valid[:, None, :].expand(n, lc, p), tri.expand(n, lc, lc)], dim=-1)[
            :, None
        ]  # [N, 1, Lc, P+Lc]
        blocks = QUERY_BLOCKS if lc >= BLOCKED_MIN_TOKENS else 1
        for w, (kp, vp) in zip(stack.layers, kv, strict=True):
            q, k, v = stack.qkv(w, x, rope)
            keys = torch.cat([kp[inv], k], dim=2)  # [N, KV, P+Lc, D]
            values = torch.cat([vp[inv], v], dim=2)
            x = stack.out_and_mlp(w, x, stack.attend(q, keys, values, mask, blocks))
        out.append(stack.logits(x))  # [N, Lc, V]
    return torch.cat(out, dim=1)  # [N, L, V]


def _causal_completion(stack: LeanStack, x, rope, kv, inv, valid) -> torch.Tensor:
    """The completion tokens' layers with causal attention, no mask: logits [N, Lc, V].

    Each row's sequence (shared prompt keys/values, then its completion) is rolled left by its
    prompt padding, so its real tokens come first and its pads last: plain causal attention over
    that layout is exactly the masked attention (a real query sees only real keys before it;
    RoPE positions were taken before the roll). The prompt's own query slots hold zeros and
    their outputs are dropped (they give no gradient to any key or value).
    """
    n, lc, _ = x.shape
    p = valid.shape[1]
    t = p + lc
    pad = (~valid).sum(dim=1, keepdim=True)  # [N, 1] left pads per row
    ar = torch.arange(t, device=x.device)
    # Column i of the rolled layout holds original column (i + pad) % T; completion token j
    # (original column P + j) lands at P - pad + j.
    roll = ((ar[None] + pad) % t)[:, None, :, None]  # [N, 1, T, 1]
    back = (ar[None, :lc] + p - pad)[:, None, :, None]  # [N, 1, Lc, 1]
    d, nq, nkv = stack.head_dim, stack.n_heads, stack.n_kv
    for w, (kp, vp) in zip(stack.layers, kv, strict=True):
        q, k, v = stack.qkv(w, x, rope)  # q [N, H, Lc, D], k and v [N, KV, Lc, D]
        kv_idx = roll.expand(n, nkv, t, d)
        keys = torch.cat([kp[inv], k], dim=2).gather(2, kv_idx)  # [N, KV, T, D] rolled
        values = torch.cat([vp[inv], v], dim=2).gather(2, kv_idx)  # [N, KV, T, D]
        queries = torch.cat([q.new_zeros((n, nq, p, d)), q], dim=2)  # [N, H, T, D]
        queries = queries.gather(2, roll.expand(n, nq, t, d))
        groups = nq // nkv
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)  # [N, H, T, D]; head h: kv h // groups
            values = values.repeat_interleave(groups, dim=1)
        o = F.scaled_dot_product_attention(
            queries, keys, values, is_causal=True, scale=stack.scaling
        )  # [N, H, T, D]
        o = o.gather(2, back.expand(n, nq, lc, d))  # [N, H, Lc, D]: the completion's queries
        x = stack.out_and_mlp(w, x, o.transpose(1, 2).reshape(n, lc, -1))
    return stack.logits(x)  # [N, Lc, V]
