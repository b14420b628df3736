"""The compiled training forward (gspo.models.compiled_forward): padding rows, prompts and columns
up to 2 changes no real value (eager, float64: to 1e-12), and the compiled graph gives the eager
log-probs and gradients at any count of rows and any widths (float32, slow: it compiles)."""

from __future__ import annotations

import pytest
import torch
from test_fast_forward import MODELS, _batch

from gspo.models import compiled_forward as cf
from gspo.models.logprobs import token_logprobs


def test_padded_shapes():
    assert cf.padded_shape(12, 4, 7, 5) == (12, 4, 7, 5)  # every size as it comes
    assert cf.padded_shape(1, 1, 1, 1) == (2, 2, 2, 2)  # dynamic sizes: at least 2 (no 0/1 graph)


@pytest.fixture(scope="module")
def tok():
    from gspo.models.char_tokenizer import build_char_tokenizer

    return build_char_tokenizer()


def _both(model, batch, **kw):
    index = batch[4]
    plain = token_logprobs(model, *batch[:4], prompt_index=index, with_entropy=True)
    padded = cf.token_logprobs(model, *batch[:4], index, temperature=1.0, **kw)
    return plain, padded


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("length", [6, 12])  # masked and causal completion layouts
def test_padding_changes_no_value_float64(name, length, tok):
    model = MODELS[name]().double().train()
    batch = _batch(tok, length=length, seed=4)
    (lp, ent), (lp_pad, ent_pad) = _both(model, batch, eager=True)
    assert lp_pad.shape == lp.shape == batch[3].shape
    torch.testing.assert_close(lp_pad, lp, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent_pad, ent, atol=1e-12, rtol=0)
    params = list(model.parameters())
    weights = torch.randn(lp.shape, dtype=lp.dtype, generator=torch.Generator().manual_seed(0))
    for a, b in zip(
        torch.autograd.grad((lp_pad * weights).sum(), params),
        torch.autograd.grad((lp * weights).sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_padding_up_to_two_changes_no_value_float64(tok):
    """One row, one distinct prompt and one completion token: each padded to 2."""
    model = MODELS["qwen3"]().double().train()
    p_ids, p_mask, c_ids, c_mask, index = _batch(tok, length=6, seed=4)
    batch = (p_ids[:1, -2:], p_mask[:1, -2:], c_ids[:1, :1], c_mask[:1, :1].fill_(1), index[:1])
    (lp, ent), (lp_pad, ent_pad) = _both(model, batch, eager=True)
    assert lp_pad.shape == lp.shape == (1, 1)
    torch.testing.assert_close(lp_pad, lp, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent_pad, ent, atol=1e-12, rtol=0)


def test_padding_with_shared_prompts_float32(tok):
    """float32 shares a group's prompt (float64 does not): the padded prompts are exercised."""
    model = MODELS["qwen3"]().train()
    batch = _batch(tok, length=6, seed=5)
    (lp, ent), (lp_pad, ent_pad) = _both(model, batch, eager=True)
    torch.testing.assert_close(lp_pad, lp, atol=2e-5, rtol=0)
    torch.testing.assert_close(ent_pad, ent, atol=2e-5, rtol=0)


@pytest.mark.slow
def test_compiled_equals_eager_float32(tok):
    """One graph per grad mode: log-probs to 2e-5 and gradients to 1e-4 relative of eager's;
    micro-batches of other row and prompt counts and completion widths run the same graph
    (dynamic dimensions), with no recompile; under no_grad, one more (forward-only) graph.
    (~2.5 min: inductor.)"""
    model = MODELS["qwen3"]().train()
    params = list(model.parameters())
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for seed, n_rep, keep, length in ((6, 3, 12, 6), (7, 4, 16, 9), (8, 3, 5, 4), (9, 4, 1, 7)):
        batch = tuple(x[:keep] for x in _batch(tok, n_rep=n_rep, length=length, seed=seed))
        (lp, _), (lp_c, _) = _both(model, batch)
        torch.testing.assert_close(lp_c, lp, atol=2e-5, rtol=0)
        weights = torch.randn(lp.shape, generator=torch.Generator().manual_seed(seed))
        for a, b in zip(
            torch.autograd.grad((lp_c * weights).sum(), params),
            torch.autograd.grad((lp * weights).sum(), params),
            strict=True,
        ):
            torch.testing.assert_close(a, b, atol=1e-4 * float(b.abs().max()) + 1e-7, rtol=1e-4)
    assert len([k for k in cf.RECORD.keys if k[0] == "update"]) == 1
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 1
    # The no-grad pass (zero-advantage rows' metrics): a forward-only graph of its own, shared
    # by its row counts too; log-probs and entropy as eager's.
    for seed, keep, length in ((10, 12, 6), (11, 7, 10)):
        batch = tuple(x[:keep] for x in _batch(tok, n_rep=3, length=length, seed=seed))
        with torch.no_grad():
            (lp, ent), (lp_c, ent_c) = _both(model, batch)
        assert not lp_c.requires_grad
        torch.testing.assert_close(lp_c, lp, atol=2e-5, rtol=0)
        torch.testing.assert_close(ent_c, ent, atol=2e-5, rtol=0)
    assert len([k for k in cf.RECORD.keys if k[0] == "update"]) == 2
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 2


def test_idle_rows_leave_the_gradient_pass_compiled_or_not():
    """Zero-advantage rows leave the gradient pass for a no-grad one (over zero_advantage_split)
    with compile on as off (the compiled pass no longer pads rows, so they would cost their
    backward); without their metrics (zero_advantage_metrics off) they get no pass."""
    from types import SimpleNamespace

    from gspo.backend.update import micro_batches
    from gspo.config import TrainConfig

    ones = torch.ones(8, 3, dtype=torch.long)
    rollout = SimpleNamespace(
        prompt_ids=ones, prompt_mask=ones, completion_ids=ones, completion_mask=ones,
        policy_mask=ones.bool(),
    )  # fmt: skip
    batch = SimpleNamespace(rollout=rollout, num_samples=8)
    idle = torch.tensor([True, True, True, True, False, False, False, False])  # half idle
    minibatch = torch.arange(8)
    for metrics, compiled, want in (
        (True, False, [(4, True), (4, False)]),  # half is over zero_advantage_split
        (True, True, [(4, True), (4, False)]),
        (False, True, [(4, True)]),
    ):
        cfg = TrainConfig.of(zero_advantage_metrics=metrics, compile=compiled)
        micros = micro_batches(cfg, batch, minibatch, idle, False, None)
        assert [(len(m.rows), m.grad) for m in micros] == want


@pytest.mark.slow
def test_sync_metrics_fixture_run_compiled_is_close(tmp_path, monkeypatch):
    """The metrics fixtures' one-turn run (float64) with compile on: the same sampled tokens and
    rewards, every float metric within 1e-6 relative or 1e-8 absolute of the before-file (the
    differences are float32-sized: transformers' RMSNorm computes in float32 and inductor fuses
    the casts around it). Seconds with a warm inductor cache; ~3 min cold (its graphs)."""
    import json
    import math

    import test_metrics_fixtures as fx

    monkeypatch.setitem(fx.RUNS, "sync", {**fx.RUNS["sync"], "compile": True})
    got = fx._run("sync", tmp_path / "sync")
    want = [json.loads(x) for x in (fx.FIXTURES / "sync.jsonl").read_text().splitlines()]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w)
        for k, v in w.items():
            if isinstance(v, float) and not math.isnan(v):
                assert math.isclose(g[k], v, rel_tol=1e-6, abs_tol=1e-8), (k, g[k], v)
            elif not isinstance(v, float):
                assert g[k] == v, k


def _loss_inputs(seed: int, rows: int, width: int):
    """A micro-batch's loss inputs, float32: log-probs (with grad), old log-probs, per-sequence
    advantages, a ragged response mask (one empty row), correction weights, reference log-probs."""
    g = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(rows, width, generator=g) * 3).requires_grad_()
    old = logprobs.detach() + 0.05 * torch.randn(rows, width, generator=g)
    advantages = torch.randn(rows, generator=g)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    lengths[0] = 0
    mask = torch.arange(width)[None, :] < lengths[:, None]  # [rows, width]
    weights = torch.rand(rows, generator=g) + 0.5
    ref = logprobs.detach() + 0.1 * torch.randn(rows, width, generator=g)
    return logprobs, old, advantages, mask, weights, ref


@pytest.mark.slow
def test_compiled_loss_equals_eager_float32():
    """The compile option's loss graph (:func:`gspo.models.compiled_forward.loss_core`): loss,
    its gradient and every metric as the eager core's, for GSPO and GRPO (token ratios, dual
    clip) with correction weights and a KL penalty; micro-batches of other row counts and widths
    run the same graph (one per loss and grad mode: a loss without a gradient, the idle rows'
    metrics, is one more)."""
    from gspo.core.losses import policy_loss

    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for algo, options in (("gspo", None), ("grpo", {"dual_clip": 3.0})):
        for seed, rows, width in ((0, 6, 5), (1, 9, 12), (2, 4, 3)):
            logprobs, old, adv, mask, weights, ref = _loss_inputs(seed, rows, width)
            kw = dict(
                num_sequences=7, num_tokens=30, ref_logprobs=ref, kl_coef=0.1, weights=weights,
                options=options,
            )  # fmt: skip
            loss, metrics = policy_loss(algo, logprobs, old, adv, mask, **kw)
            loss_c, metrics_c = policy_loss(algo, logprobs, old, adv, mask, core=cf.loss_core, **kw)
            torch.testing.assert_close(loss_c, loss, atol=1e-6, rtol=1e-6)
            (grad,) = torch.autograd.grad(loss, logprobs)
            (grad_c,) = torch.autograd.grad(loss_c, logprobs)
            torch.testing.assert_close(grad_c, grad, atol=1e-7, rtol=1e-5)
            assert metrics_c.keys() == metrics.keys()
            for k, v in metrics.items():
                assert metrics_c[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 2
    logprobs, old, adv, mask, _, _ = _loss_inputs(3, 5, 4)
    _, metrics = policy_loss("gspo", logprobs.detach(), old, adv, mask)
    _, metrics_c = policy_loss("gspo", logprobs.detach(), old, adv, mask, core=cf.loss_core)
    assert metrics_c == pytest.approx(metrics, rel=1e-5, abs=1e-7)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 3
    assert {k for k in cf.RECORD.keys if k[0] == "loss"} >= {
        ("loss", "gspo_terms", torch.float32, True),
        ("loss", "grpo_terms", torch.float32, True),
        ("loss", "gspo_terms", torch.float32, False),
    }
