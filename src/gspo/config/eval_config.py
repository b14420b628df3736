"""Plain config data: ``EvalConfig`` (``gspo eval``), flat. Imports only the config's plain-data
modules."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import _doc
from .options_task import EpisodeLimits
from .train import EngineFields


@dataclass(frozen=True)
class EvalConfig(EngineFields, EpisodeLimits):
    """``gspo eval``: score a model on a data file or a built-in task's held-out split (a task
    with a registered environment: its episodes, multi-turn within the EpisodeLimits)."""

    model: str = _doc(
        "'smollm2-135m-instruct', a local Hugging Face checkpoint directory (e.g. a run's "
        "final/), or 'tiny' (random init: a smoke test only).",
        "smollm2-135m-instruct",
    )
    dtype: str = _doc("Model dtype: float32, bfloat16, float16 or float64.", "float32")
    device: str = _doc("'cpu', 'cuda' or 'auto'.", "auto")
    threads: int = _doc("torch CPU threads (0 keeps torch's default).", 0)
    seed: int = _doc("Seed of the held-out split of built-in tasks and of sampling.", 0)
    hidden_size: int = _doc("Tiny model: hidden width.", 64)
    num_layers: int = _doc("Tiny model: transformer layers.", 2)
    num_heads: int = _doc("Tiny model: attention heads.", 4)
    num_kv_heads: int = _doc("Tiny model: key/value heads.", 2)
    chat_template: str = _doc("Prompt formatting: 'auto', 'none' or 'always'.", "auto")
    system_prompt: str | None = _doc("System turn of chat-formatted prompts.", None)
    data: str | None = _doc(
        "A local .jsonl/.json/.parquet file of problems; None: the held-out split of --task.",
        None,
    )
    task: str = _doc(
        "Task whose held-out split is scored when --data is not given: built-in, registered by "
        "a plugin, module:builder, or reasoning_gym:NAME, textarena:ID, verifiers:TASKSET.",
        "word_problems",
    )
    difficulty: int | None = _doc("Task difficulty; None: the task's default.", None)
    n_test: int = _doc("Held-out problems drawn from the built-in task.", 200)
    train_file: str | None = _doc(
        "Passed to a task builder that takes it (--task module:builder), as gspo train does.",
        None,
    )
    test_file: str | None = _doc(
        "Passed to a task builder that takes it (--task module:builder), as gspo train does.",
        None,
    )
    prompt_key: str = _doc("Prompt column of --data (GSM8K: question, MATH: problem).", "prompt")
    answer_key: str = _doc("Answer column of --data (MATH: solution).", "answer")
    image_key: str | None = _doc(
        "Image column of --data (paths relative to the file, or bytes); needs a "
        "vision-language model. None: text rows.",
        None,
    )
    answer_format: str = _doc(
        "How data files hold the final answer: 'raw' (the answer field itself), 'gsm8k' (after "
        "the last '####') or 'boxed' (the last \\boxed{...}, e.g. MATH's solution field).",
        "raw",
    )
    reward: str = _doc(
        "Reward for --data (exact_match, numeric, math_verify, format, code, one a plugin registers, "
        "or module:function).",
        "math_verify",
    )
    completions_key: str | None = _doc(
        "Score the completions this field of each problem holds (e.g. HumanEval's "
        "canonical_solution) with the reward, loading no model; None: generate them.",
        None,
    )
    env: str | None = _doc(
        "module:factory of the task's environment (as --env of gspo train); None: the one "
        "registered for the task, if any.",
        None,
    )
    plugins: tuple[str, ...] = _doc(
        "Modules imported first, each registering what it defines: --plugin NAME, repeatable; "
        "in config files a list.",
        (),
    )
    max_prompt_tokens: int = _doc(
        "Longest prompt in tokens; 0: what the model's context leaves after max_new_tokens "
        "(training's rule; multi-turn tasks: after max_total_tokens). A larger value is an "
        "error.",
        0,
    )
    long_prompts: str = _doc(
        "Prompts over max_prompt_tokens: 'error' (stop, naming the row), 'truncate' (keep the "
        "prompt's end) or 'skip'; truncated and skipped rows are counted in the report.",
        "error",
    )
    limit: int = _doc("Score only the first N problems; 0: all.", 0)
    samples: int = _doc(
        "Sampled completions per problem (k of avg@k and pass@k; multi-turn tasks: sampled "
        "episodes, also their success rate); 0: none.",
        4,
    )
    greedy: bool = _doc("Also score one greedy completion per problem.", True)
    max_new_tokens: int = _doc("Maximum completion length in tokens.", 256)
    temperature: float = _doc("Sampling temperature of the k samples.", 1.0)
    top_p: float = _doc("Nucleus sampling mass (1 disables it).", 1.0)
    batch_size: int = _doc("Sequences generated together.", 64)
    output: str | None = _doc(
        "Write the JSON report here (an existing file is refused unless --overwrite); None: "
        "print only.",
        "eval.json",
    )
    show: int = _doc(
        "Per-problem records (prompt, completions, rewards) kept in the JSON; 0: all.", 20
    )
    progress: bool = _doc("Show a live progress bar.", True)
