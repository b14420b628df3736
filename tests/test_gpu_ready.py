"""``benchmarks/gpu_ready.py``: the ``--tiny`` CPU path end to end (the vLLM phases need vLLM,
skipped without it unless GSPO_REQUIRE_VLLM=1), the FLOP count behind its MFU and the peak by
device name. No timing is asserted: only that each figure is there and positive."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_support import needs_vllm

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def phases(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("_gpu_phases", "gpu_ready"):
        sys.modules.pop(name, None)
    yield importlib.import_module("_gpu_phases")
    for name in ("_gpu_phases", "gpu_ready"):
        sys.modules.pop(name, None)


def _run(tmp_path: Path, *extra: str) -> tuple[str, dict]:
    out = tmp_path / "ready.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_ready.py"), "--tiny", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def test_flops_per_token_counts_qwen3_matmuls(phases):
    gpu_ready = importlib.import_module("gpu_ready")
    shape = gpu_ready.QWEN3_06B
    # Qwen3-0.6B's matmul weights: 28 x (q 1024x2048, k and v 1024x1024, o 2048x1024,
    # MLP 3 x 1024x3072) + the tied LM head 151936x1024.
    matmul = 28 * (2 * 1024 * 2048 + 2 * 1024 * 1024 + 3 * 1024 * 3072) + 151936 * 1024
    assert phases.flops_per_token(shape, 0, 128) == 6 * matmul
    # the attention term, 12 x layers x heads x head size per token of sequence length
    extra = phases.flops_per_token(shape, 1000, 64) - phases.flops_per_token(shape, 0, 64)
    assert extra == 12 * 28 * 16 * 64 * 1000


def test_peak_by_device_name(phases):
    assert phases.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert phases.peak_flops("NVIDIA H200") == 989e12
    assert phases.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert phases.peak_flops("NVIDIA H100 NVL") == 835e12
    assert phases.peak_flops("cpu") == 0.0


@pytest.mark.slow
def test_trainer_phase_alone_runs_on_cpu(tmp_path):
    stdout, res = _run(tmp_path, "--phases", "trainer")
    assert res["trainer_tokens_per_s"] > 0 and res["trainer_steps_timed"] >= 1
    assert set(res["skipped"]) >= {"vllm", "mismatch", "e2e", "mfu"}
    assert "| trainer tokens/s |" in stdout and "11,900 (prime-rl, 1xH100)" in stdout
    assert "skipped vllm: not in --phases" in stdout


@needs_vllm
@pytest.mark.slow
def test_tiny_runs_every_phase_end_to_end(tmp_path):
    stdout, res = _run(tmp_path)
    assert set(res["skipped"]) == {"mfu"}, res["skipped"]  # no peak known for a CPU
    assert res["vllm_gen_tokens_per_s"] > 0 and res["e2e_tokens_per_s"] > 0
    assert res["trainer_tokens_per_s"] > 0
    mm = res["mismatch"]
    assert mm["tokens"] > 0
    # bf16 engine vs bf16 trainer on the same weights: close but not equal
    assert 0 <= mm["mean_abs"] <= mm["max_abs"] < 0.5
    assert mm["token_ratio_min"] <= 1 <= mm["token_ratio_max"]
    assert sum(res["e2e_share"].values()) == pytest.approx(1.0)
    assert "| vLLM generation tokens/s |" in stdout and "| end-to-end tokens/s |" in stdout


def test_a_failing_phase_becomes_a_line_and_the_rest_runs(phases, monkeypatch, capsys):
    gpu_ready = importlib.import_module("gpu_ready")

    def broken(*a):
        raise RuntimeError("CUDA error: out of memory\nmore detail")

    monkeypatch.setattr(gpu_ready, "trainer_phase", broken)
    res = gpu_ready.run(gpu_ready.parse(["--tiny", "--phases", "trainer"]))
    assert res["skipped"]["trainer"] == "failed: RuntimeError: CUDA error: out of memory"
    assert "trainer_tokens_per_s" not in res
    assert "skipped trainer: failed: RuntimeError" in gpu_ready.table(res)


@pytest.mark.slow
def test_without_vllm_its_phases_are_lines_and_the_trainer_runs(phases, monkeypatch):
    import gspo.rollout.vllm_engine as vllm_engine

    gpu_ready = importlib.import_module("gpu_ready")
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    res = gpu_ready.run(gpu_ready.parse(["--tiny", "--phases", "vllm,mismatch,trainer,e2e"]))
    assert res["skipped"]["vllm"].startswith("vLLM is not installed")
    assert res["skipped"]["mismatch"] == "no vLLM samples to re-score"
    assert res["skipped"]["e2e"] == "needs the vLLM engine"
    assert res["trainer_tokens_per_s"] > 0


def test_a_phase_past_its_hard_time_box_is_interrupted(phases, monkeypatch):
    gpu_ready = importlib.import_module("gpu_ready")
    monkeypatch.setattr(gpu_ready, "PHASES", {**gpu_ready.PHASES, "trainer": 1})
    monkeypatch.setattr(gpu_ready, "HARD_MARGIN_S", 0.0)

    def hangs(*a):
        time.sleep(600)  # interrupted after 1.5 s (1.5 x the 1 s budget, no margin)

    monkeypatch.setattr(gpu_ready, "trainer_phase", hangs)
    res = gpu_ready.run(gpu_ready.parse(["--tiny", "--phases", "trainer"]))
    assert res["skipped"]["trainer"].startswith("failed: PhaseTimeout: over its hard time box")


def _compiled_figures(res: dict) -> None:
    assert res["compile_graphs"] == 2  # the forward's graph and the loss's
    assert res["compile_s"] > 0 and res["compile_cache"] in ("cold", "warm", "unknown")
    assert res["compiled_step_s"] > 0 and res["compiled_tokens_per_s"] > 0
    assert res["compiled_first_step_s"] >= res["compile_s"]  # the compile is the first step's
    assert res["compile_speedup"] == pytest.approx(res["trainer_step_s"] / res["compiled_step_s"])
    be = res["compile_break_even_step"]
    assert be is None or be == pytest.approx(
        res["compile_s"] / (res["trainer_step_s"] - res["compiled_step_s"])
    )


def test_compiled_phase_wiring_reports_its_figures(phases, monkeypatch):
    """The compiled phase through gspo's compile option, with inductor's graph replaced by the
    same function run eagerly (the real compile is the slow test below): the backend takes the
    compiled forward's path, and the phase reports its compile seconds apart from its steps."""
    from gspo.core import losses
    from gspo.models import compiled_forward as cf

    gpu_ready = importlib.import_module("gpu_ready")
    monkeypatch.setattr(cf, "_compiled", lambda: cf._scores)
    monkeypatch.setattr(cf, "_compiled_loss", lambda: losses.loss_core)
    monkeypatch.setattr(cf, "RECORD", cf.CompileRecord())
    res = gpu_ready.run(gpu_ready.parse(["--tiny", "--phases", "trainer,compiled"]))
    assert set(res["skipped"]) == {"vllm", "mismatch", "e2e", "mfu"}, res["skipped"]
    _compiled_figures(res)
    # Two graphs: the gradient pass and its loss (every dimension is dynamic; no idle rows)
    assert sorted(k[0] for k in cf.RECORD.keys) == ["loss", "update"]
    text = gpu_ready.table(res)
    assert "| compiled speed-up over eager |" in text
    assert "| compile paid for itself at step |" in text


@pytest.mark.slow
def test_compiled_phase_compiles_on_cpu(tmp_path, monkeypatch):
    """The real thing on CPU: inductor compiles the tiny shape's graph into an empty cache
    (57 s for the whole call, 50 s of it the compile, on the shared 2-core machine at load 1.6)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    stdout, res = _run(tmp_path, "--phases", "trainer,compiled")
    assert res["compile_cache"] == "cold"
    _compiled_figures(res)
    assert "| compile s (graphs, inductor cache) |" in stdout
