"""The task's options: what a run trains on (``TaskOptions``, with the episode limits it shares
with ``gspo eval`` and ``gspo sft``: ``EpisodeLimits``) and how completions are scored
(``RewardOptions``). Torch-free dataclasses, declared as :mod:`gspo.config.options` describes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .fields import _doc
from .names import COMPARE_MODES, one_of
from .options import _collect, _Options


@dataclass(frozen=True)
class EpisodeLimits:
    """Limits of one multi-turn episode: part of ``TaskOptions``, and a base of the flat configs
    that run episodes outside training (``gspo eval``, ``gspo sft``'s held-out score)."""

    max_turns: int = _doc("Multi-turn tasks: policy turns per episode.", 4)
    max_tokens_per_turn: int = _doc(
        "Multi-turn tasks: tokens one policy turn may sample; 0: max_new_tokens.", 0
    )
    max_total_tokens: int = _doc(
        "Multi-turn tasks: policy + environment tokens after the prompt per episode.", 128
    )
    env_timeout_s: float = _doc(
        "Environments without step_batch (the multi-turn tasks'): seconds one environment "
        "step may take before the episode fails (counted in episode/failed); 0: no limit.",
        30.0,
    )
    tool_timeout_s: float = _doc(
        "Multi-turn tasks: seconds one tool call may take before the episode fails.", 10.0
    )

    def episode_problems(self) -> list[str]:
        problems, need = _collect()
        need(self.max_turns >= 1, f"max_turns must be >= 1, got {self.max_turns}")
        need(
            self.max_total_tokens >= 1,
            f"max_total_tokens must be >= 1, got {self.max_total_tokens}",
        )
        need(self.max_tokens_per_turn >= 0, "max_tokens_per_turn must be >= 0")
        return problems


@dataclass(frozen=True)
class TaskOptions(EpisodeLimits, _Options):
    """The task, its data files and prompts, and the multi-turn environments' limits (the
    episode limits first: ``EpisodeLimits``)."""

    task: str = _doc(
        "Built-in task (addition, reversal, sorting, countdown, scratchpad, multiply, "
        "word_problems, code; with images: shapes; multi-turn: calculator, guess, code_feedback), 'file' for "
        "--train-file, a task a plugin registers, module:builder (your builder, see "
        "docs/plugins.md), or an outside package's: reasoning_gym:NAME, textarena:ID, "
        "verifiers:TASKSET (docs/integrations.md).",
        "addition",
    )
    difficulty: int | None = _doc(
        "Task difficulty (digits, length, ...); None: the task's default.", None
    )
    n_train: int = _doc("Training problems drawn for built-in tasks.", 5000)
    n_test: int = _doc("Held-out problems used for evaluation.", 200)
    train_file: str | None = _doc(
        "jsonl/json/parquet training data (task='file'); SFT learns its demonstrations.", None
    )
    test_file: str | None = _doc("jsonl/json/parquet held-out data (task='file').", None)
    prompt_key: str = _doc("Column holding the prompt in data files.", "prompt")
    answer_key: str = _doc("Column holding the reference answer in data files.", "answer")
    image_key: str | None = _doc(
        "Column holding each row's image(s) in data files (a path relative to the file, bytes, "
        "or a list of them; the prompt's <image> placeholders say where, else images go "
        "first). Needs a vision-language model (--model tiny-vl). None: text rows.",
        None,
    )
    answer_format: str = _doc(
        "How data files hold the final answer: 'raw' (the answer field itself), 'gsm8k' (after "
        "the last '####') or 'boxed' (the last \\boxed{...}, e.g. MATH's solution field).",
        "raw",
    )
    bad_rows: str = _doc(
        "Bad data-file rows (invalid JSON, not UTF-8, missing or empty field, bad image): "
        "'error' stops, listing each with file, row and field; 'skip' drops them and logs the "
        "counts (data/skipped_rows, and per kind data/skipped_rows_<kind>).",
        "error",
    )
    max_prompt_tokens: int = _doc(
        "Longest prompt in tokens; 0: what the model's context length (max_position_embeddings; "
        "256 for the tiny models) leaves after max_new_tokens (multi-turn tasks: after "
        "max_total_tokens). A larger value is an error.",
        0,
    )
    long_prompts: str = _doc(
        "Prompts over max_prompt_tokens: 'error', 'truncate' (keep the last tokens) or 'skip'; "
        "counts are logged as data/prompts_truncated and data/prompts_skipped, and for "
        "held-out prompts (cut on their text) data/test_prompts_truncated and "
        "data/test_prompts_skipped. A held-out set left empty stops the run.",
        "error",
    )
    dedupe: bool = _doc(
        "Drop duplicate prompts within each split and held-out prompts that also appear in "
        "training (whitespace-insensitive; the first of each stays). Either way they are "
        "counted: data/duplicates, data/test_duplicates, data/train_test_overlap.",
        False,
    )
    env: str | None = _doc(
        "module:factory of the task's environment, factory(task, opts, chat) -> Environment "
        "(as register_env's); None: the environment registered for the task, if any.",
        None,
    )
    plugins: tuple[str, ...] = _doc(
        "Modules imported first, each registering what it defines (tasks, rewards, "
        "environments, losses): --plugin NAME, repeatable; in config files a list.",
        (),
    )
    endpoint_host: str = _doc(
        "Agent environments: address the OpenAI-compatible endpoint of their episodes listens "
        "on (docs/endpoint.md); 0.0.0.0 lets agents on other machines reach it.",
        "127.0.0.1",
    )
    endpoint_port: int = _doc("Agent environments: the endpoint's port; 0: a free one.", 0)
    episode_timeout_s: float = _doc(
        "Agent environments: seconds one whole episode may take; past it the episode is cut "
        "like a turn limit (the environment's cut_reward, episode/timeout_fraction); 0: no "
        "limit.",
        600.0,
    )

    def problems(self) -> list[str]:
        problems, need = _collect()
        need(
            0 <= self.endpoint_port <= 65535,
            f"endpoint_port must be in 0..65535 (0: a free port), got {self.endpoint_port}",
        )
        need(bool(self.endpoint_host), "endpoint_host must be an address, e.g. 127.0.0.1")
        need(
            self.episode_timeout_s >= 0,
            f"episode_timeout_s must be >= 0 (0: no limit), got {self.episode_timeout_s}",
        )
        need(self.n_train > 0, f"n_train must be positive, got {self.n_train}")
        need(self.n_test > 0, f"n_test must be positive, got {self.n_test}")
        if self.task == "file":
            need(self.train_file is not None, "task='file' needs train_file")
        problems += self.episode_problems()
        need(
            self.bad_rows in ("error", "skip"), one_of("bad_rows", self.bad_rows, ("error", "skip"))
        )
        need(
            self.max_prompt_tokens >= 0,
            f"max_prompt_tokens must be >= 0, got {self.max_prompt_tokens}",
        )
        need(
            self.long_prompts in ("error", "truncate", "skip"),
            one_of("long_prompts", self.long_prompts, ("error", "truncate", "skip")),
        )
        return problems


@dataclass(frozen=True)
class RewardOptions(_Options):
    """How completions are scored: the reward, its limits, the code sandbox's limits."""

    reward: str | None = _doc(
        "Reward name for data files (exact_match, numeric, math_verify, format, countdown, code, "
        "or one a plugin registers) or module:function (your reward, see docs/plugins.md).",
        None,
    )
    reward_timeout_s: float = _doc(
        "Seconds a reward call may take before it scores 0 and counts in reward/errors; 0: no limit.",
        0.0,
    )
    reward_workers: int = _doc(
        "Reward calls scored at once (threads); 0: one per core, at most 8, for sandboxed code "
        "rewards and 1 for others (gspo.envs.rewards.reward_workers).",
        0,
    )
    code_test_timeout_s: float = _doc(
        "Code reward: seconds each unit test may run (an alarm inside the sandbox).", 2.0
    )
    code_total_timeout_s: float = _doc(
        "Code reward: wall-clock seconds of one whole sandboxed run (all of a completion's "
        "tests); 0: code_test_timeout_s per test plus 2 s.",
        0.0,
    )
    code_memory_mb: int = _doc(
        "Code reward: address-space limit of each sandboxed process in MiB (RLIMIT_AS).", 512
    )
    code_run_memory_mb: int = _doc(
        "Code reward: memory of a whole sandboxed run in MiB (its cgroup: processes, tmpfs "
        "files, page cache), where the host gives cgroups.",
        1024,
    )
    code_compare: str = _doc(
        "Code reward: how answers compare, unless a row's 'compare' field says: 'auto' (an "
        "expected string as text, a number as a number), 'text' or 'number' (numbers written "
        "as text too, within 1e-6). See docs/sandbox.md.",
        "auto",
    )
    format_reward_weight: float = _doc(
        "Training reward += this x a format reward (1 when the answer is in \\boxed{} or after "
        "'####'); held-out evaluation scores the task's own reward only.",
        0.0,
    )

    def problems(self) -> list[str]:
        problems, need = _collect()
        need(
            self.reward_timeout_s >= 0,
            f"reward_timeout_s must be >= 0, got {self.reward_timeout_s}",
        )
        need(self.reward_workers >= 0, f"reward_workers must be >= 0, got {self.reward_workers}")
        test_s, total_s = self.code_test_timeout_s, self.code_total_timeout_s
        need(
            math.isfinite(test_s) and test_s > 0,
            f"code_test_timeout_s must be a positive number of seconds, got {test_s}",
        )
        need(
            math.isfinite(total_s) and total_s >= 0,
            "code_total_timeout_s must be >= 0 (0: per-test limit times tests + 2 s), "
            f"got {total_s}",
        )
        need(self.code_memory_mb >= 64, f"code_memory_mb must be >= 64, got {self.code_memory_mb}")
        need(
            self.code_run_memory_mb >= 64,
            f"code_run_memory_mb must be >= 64, got {self.code_run_memory_mb}",
        )
        need(
            self.code_compare in COMPARE_MODES,
            one_of("code_compare", self.code_compare, COMPARE_MODES),
        )
        need(
            math.isfinite(self.format_reward_weight),
            f"format_reward_weight must be finite, got {self.format_reward_weight}",
        )
        return problems
