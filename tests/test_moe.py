"""Tiny MoE models, router capture, routing-change metrics, Routing Replay (R2 / R3).

The trainer integration (smoke runs, the aux loss, SFT cold start) is in test_moe_training.

Exactness checks run in float64 (the experts kernel is then ``eager``: ``grouped_mm`` has no
float64 kernel), where engine (KV-cached) and full-forward routing agree bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from gspo.compose.parts import build_policy_for
from gspo.config import TrainConfig, build
from gspo.models import moe
from gspo.models.char_tokenizer import build_char_tokenizer
from gspo.models.logprobs import token_logprobs
from gspo.rollout.base import GenerationRequest, SamplingParams
from gspo.rollout.torch_engine import TorchEngine


def tiny_moe(dtype: torch.dtype = torch.float64, **kw) -> torch.nn.Module:
    args = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, num_experts=8, top_k=2)
    args.update(kw)
    model = moe.build_tiny_moe_model(len(build_char_tokenizer()), seed=0, **args).to(dtype)
    return moe.fit_experts_kernel(model)


def batch(n: int = 4, prompt: int = 5, length: int = 6, seed: int = 0):
    """Random prompt/completion ids with left-padded prompts and ragged completions."""
    g = torch.Generator().manual_seed(seed)
    p_ids = torch.randint(3, 98, (n, prompt), generator=g)  # [N, P]
    p_mask = torch.ones(n, prompt, dtype=torch.long)  # [N, P]
    p_mask[0, :2] = 0  # left padding on row 0
    p_ids[0, :2] = 0
    c_ids = torch.randint(3, 98, (n, length), generator=g)  # [N, L]
    c_mask = torch.ones(n, length, dtype=torch.long)  # [N, L]
    c_mask[1, 3:] = 0  # row 1 ends early
    c_ids[1, 3:] = 0
    return p_ids, p_mask, c_ids, c_mask


def routing_of(model, p_ids, p_mask, c_ids, c_mask, replay=None):
    """(log-probs [N, L], routing [R, N, P+L, k]) of one full forward, optionally replayed."""
    with moe.routing_hooks(model, replay=replay) as rec:
        logp, _ = token_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    return logp, rec.routing(p_ids.shape[0], p_ids.shape[1] + c_ids.shape[1])


def perturbed(model, scale: float) -> torch.nn.Module:
    """A copy whose router weights moved by ``scale`` x Gaussian noise (fixed seed)."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for r in moe.moe_routers(other):
            r.weight.add_(scale * torch.randn(r.weight.shape, generator=g, dtype=r.weight.dtype))
    return other


# --------------------------------------------------------------------------------------------
# Models and capture
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True])
def test_tiny_moe_builds_and_hooks_leave_it_untouched(shared):
    model = tiny_moe(torch.float32, shared_expert=shared)
    name = "Qwen2MoeForCausalLM" if shared else "Qwen3MoeForCausalLM"
    assert type(model).__name__ == name
    assert len(moe.moe_routers(model)) == 2 and moe.is_moe(model)
    assert any("shared_expert" in k for k in model.state_dict()) == shared
    assert model.config._experts_implementation == "grouped_mm"  # the fast CPU default
    p_ids, p_mask, c_ids, c_mask = batch()
    plain, _ = token_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    keys = list(model.state_dict())
    with moe.capture_routing(model) as rec:
        hooked, _ = token_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    assert rec is not None
    assert torch.equal(plain, hooked)  # capture observes, never changes
    assert list(model.state_dict()) == keys  # no module surgery
    assert all(not r._forward_hooks for r in moe.moe_routers(model))  # hooks removed on exit


def test_dense_model_is_not_moe_and_blocks_are_no_ops():
    from gspo.models.tiny_model import build_tiny_model

    dense = build_tiny_model(98, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    assert not moe.is_moe(dense)
    with moe.capture_routing(dense) as rec:
        pass
    assert rec is None
    assert moe.fit_experts_kernel(dense) is dense


def test_float64_switches_to_eager_experts():
    model = tiny_moe(torch.float64)
    assert model.config._experts_implementation == "eager"
    cfg = build(TrainConfig, overrides=dict(model="tiny-moe", dtype="float64", device="cpu"))
    built, _ = build_policy_for(cfg, torch.device("cpu"))
    assert built.config._experts_implementation == "eager"


def test_capture_shapes_and_agreement_with_hf_router_logits():
    model = tiny_moe()
    p_ids, p_mask, c_ids, c_mask = batch()
    n, p = p_ids.shape
    length = c_ids.shape[1]
    with moe.capture_routing(model, keep_logits=True) as rec:
        token_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    routing = rec.routing(n, p + length)
    assert routing.indices.shape == (2, n, p + length, 2)  # [R, N, P+L, k]
    assert routing.indices.dtype == torch.long
    assert int(routing.indices.min()) >= 0 and int(routing.indices.max()) < 8
    # Without replay, the experts used are the router's own top-k ...
    assert torch.equal(routing.indices, rec.routing(n, p + length, own=True).indices)
    # ... and equal the top-k of the router logits transformers itself reports.
    ids = torch.cat([p_ids, c_ids], 1)
    attn = torch.cat([p_mask, c_mask], 1)
    out = model(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        output_router_logits=True,
    )
    for layer, logits in enumerate(out.router_logits):  # [N*T, E] each
        top = logits.topk(2, dim=-1).indices.reshape(n, p + length, 2)
        assert torch.equal(top, routing.indices[layer])
    # The aux loss computed from the capture is transformers' own aux_loss.
    aux = moe.aux_loss(model, rec, attn)
    assert torch.allclose(aux, out.aux_loss.to(aux.dtype), rtol=1e-6)
    # Row slicing (trainer micro-batches) keeps positions.
    part = torch.tensor([2, 0])
    assert torch.equal(routing.rows(part).indices, routing.indices[:, part])


def test_scored_positions():
    c_mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    pos = moe.scored_positions(2, c_mask)
    # Completion token j is predicted at position P-1+j = 1+j.
    assert pos.tolist() == [[False, True, True, True, False], [False, True, False, False, False]]


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def test_routing_change_by_hand():
    def r(x):
        return moe.Routing(torch.tensor(x).view(1, 1, -1, 2), num_experts=4)  # [1, 1, T, 2]

    pos = torch.ones(1, 3, dtype=torch.bool)
    a = r([[0, 1], [2, 3], [0, 2]])
    b = r([[1, 0], [2, 1], [3, 1]])  # same set, one of two changed, both changed
    out = moe.routing_change(a, b, pos)
    assert out["change"] == pytest.approx((0 + 1 + 2) / 6)
    assert out["any"] == pytest.approx(2 / 3)
    assert out["token"] == pytest.approx(2 / 3)
    assert moe.routing_change(b, a, pos) == out  # symmetric
    # Unrecorded (-1) and unscored positions do not count.
    c = r([[0, 1], [-1, -1], [0, 2]])
    assert moe.routing_change(a, c, pos)["change"] == 0.0
    assert moe.routing_change(a, b, torch.tensor([[True, False, False]]))["change"] == 0.0


def test_load_stats():
    balanced = moe.Routing(torch.tensor([[0, 1], [2, 3]]).view(1, 1, 2, 2), num_experts=4)
    pos = torch.ones(1, 2, dtype=torch.bool)
    assert moe.load_stats(balanced, pos) == pytest.approx({"max_share": 0.25, "cv": 0.0})
    skewed = moe.Routing(torch.tensor([[0, 1], [0, 1]]).view(1, 1, 2, 2), num_experts=4)
    stats = moe.load_stats(skewed, pos)
    assert stats["max_share"] == pytest.approx(0.5)  # 1/k: the worst case
    assert stats["cv"] == pytest.approx(1.0)


def test_routing_change_zero_for_same_weights_positive_after_perturbation():
    model = tiny_moe()
    p_ids, p_mask, c_ids, c_mask = batch()
    pos = moe.scored_positions(p_ids.shape[1], c_mask)
    _, a = routing_of(model, p_ids, p_mask, c_ids, c_mask)
    _, same = routing_of(copy.deepcopy(model), p_ids, p_mask, c_ids, c_mask)
    assert moe.routing_change(a, same, pos) == {"change": 0.0, "any": 0.0, "token": 0.0}
    _, moved = routing_of(perturbed(model, 1.0), p_ids, p_mask, c_ids, c_mask)
    assert moe.routing_change(a, moved, pos)["change"] > 0.1


# --------------------------------------------------------------------------------------------
# Routing Replay
# --------------------------------------------------------------------------------------------


def reference_moe_forward(block, forced: torch.Tensor):
    """An independent Qwen3-MoE block forward with experts ``forced`` [M, k]: every expert is run
    on every token and weighted by the softmax of the router logits over the forced experts."""
    experts = block.experts

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        b, s, h = hidden.shape
        x = hidden.reshape(-1, h)  # [M, H]
        logits = x @ block.gate.weight.T  # [M, E]
        chosen = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, forced, True)  # [M, E]
        # Like the HF router: softmax over all experts in float32 (even for a float64 model),
        # renormalized over the chosen ones (norm_topk_prob). A float64 softmax would differ
        # at ~1e-7 relative.
        probs = logits.float().softmax(-1) * chosen  # [M, E], 0 off the chosen
        gates = (probs / probs.sum(-1, keepdim=True)).to(x.dtype)  # [M, E]
        out = torch.zeros_like(x)
        for e in range(experts.num_experts):
            gate, up = (x @ experts.gate_up_proj[e].T).chunk(2, dim=-1)  # [M, I] each
            y = (F.silu(gate) * up) @ experts.down_proj[e].T  # [M, H]
            out = out + gates[:, e : e + 1] * y
        return out.reshape(b, s, h)

    return forward


def test_replay_gives_zero_change_and_forced_expert_logprobs(monkeypatch):
    old = tiny_moe()
    new = perturbed(old, 1.0)  # a policy that routes differently
    p_ids, p_mask, c_ids, c_mask = batch()
    p = p_ids.shape[1]
    pos = moe.scored_positions(p, c_mask)
    _, old_routing = routing_of(old, p_ids, p_mask, c_ids, c_mask)
    _, own = routing_of(new, p_ids, p_mask, c_ids, c_mask)
    assert moe.routing_change(old_routing, own, pos)["change"] > 0.1  # replay has work to do

    replayed_logp, seen = routing_of(new, p_ids, p_mask, c_ids, c_mask, replay=old_routing)
    # The routing the loss's forward saw is the old policy's: change 0.
    assert moe.routing_change(old_routing, seen, pos)["change"] == 0.0
    assert torch.equal(seen.indices, old_routing.indices)

    # Log-probs equal an independent forward with those experts forced.
    for layer, router in enumerate(moe.moe_routers(new)):
        block = next(m for m in new.modules() if getattr(m, "gate", None) is router)
        forced = old_routing.indices[layer].reshape(-1, 2)  # [N*T, k]
        monkeypatch.setattr(block, "forward", reference_moe_forward(block, forced))
    reference, _ = token_logprobs(new, p_ids, p_mask, c_ids, c_mask)
    assert torch.allclose(replayed_logp, reference, atol=1e-12, rtol=0)


def test_replay_of_own_routing_is_bitwise_a_plain_forward_and_router_gets_gradients():
    model = tiny_moe(torch.float32)
    p_ids, p_mask, c_ids, c_mask = batch()
    plain, routing = routing_of(model, p_ids, p_mask, c_ids, c_mask)
    replayed, _ = routing_of(model, p_ids, p_mask, c_ids, c_mask, replay=routing)
    assert torch.equal(plain, replayed)

    other = perturbed(tiny_moe(torch.float64), 1.0)
    _, old_routing = routing_of(tiny_moe(torch.float64), p_ids, p_mask, c_ids, c_mask)
    with moe.replay_routing(other, old_routing):
        logp, _ = token_logprobs(other, p_ids, p_mask, c_ids, c_mask)
    logp.sum().backward()
    for router in moe.moe_routers(other):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_replay_rejects_mismatched_rows():
    model = tiny_moe()
    p_ids, p_mask, c_ids, c_mask = batch()
    _, routing = routing_of(model, p_ids, p_mask, c_ids, c_mask)
    with (
        pytest.raises(ValueError, match="same rows and positions"),
        moe.replay_routing(model, routing.rows(torch.tensor([0, 1]))),
    ):
        token_logprobs(model, p_ids, p_mask, c_ids, c_mask)


def test_engine_routing_matches_full_forward_float64():
    """R3's record: the engine's prefill + decode routing equals a full forward's for every
    position that scores a sampled token (float64: exact)."""
    model = tiny_moe()
    tok = build_char_tokenizer()
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
    prompts = [tok("12+34=")["input_ids"], tok("5+6=")["input_ids"]]  # left padding on row 1
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    rollout = moe.generate_with_routing(
        engine, GenerationRequest(prompts, 3, params, torch.Generator().manual_seed(0))
    )
    eng = rollout.extras["routing"]
    n, p = rollout.prompt_ids.shape
    length = rollout.completion_ids.shape[1]
    assert eng.indices.shape == (2, n, p + length, 2)
    assert (eng.indices[:, :, -1] == -1).all()  # the last token is never fed to the engine
    _, full = routing_of(
        model,
        rollout.prompt_ids,
        rollout.prompt_mask,
        rollout.completion_ids,
        rollout.completion_mask,
    )
    pos = moe.scored_positions(p, rollout.completion_mask)
    recorded = pos.unsqueeze(0).unsqueeze(-1).expand_as(eng.indices)
    assert torch.equal(eng.indices[recorded], full.indices[recorded])
    assert moe.routing_change(full, eng, pos)["change"] == 0.0
