"""The README and the pages under docs/ agree with the code: task and reward names with the
registries (and ``gspo train --help``), the fields ``--resume`` lets change with
``compose/resume.py``, metric names with what the code logs (both ways: every documented name is
one the code writes, and every name a short run logs is documented), every ``gspo ...`` command
with the parser's subcommands and flags, and every relative link with a file and heading. They
drifted apart before (README names like ``turn_reward_mean`` without their ``episode/`` prefix, a
reward list missing two rewards)."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The README is a short entry page; the guide, metrics and lists live in docs/ (issue 35), so
# every check reads the README and the docs pages as one text.
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS = "\n".join(p.read_text() for p in PAGES)
SRC = ROOT / "src" / "gspo"

# Prefixes of the metric names in metrics.jsonl (a backticked `prefix/name` in the README with
# one of these prefixes is read as a metric name; other slashes are paths).
METRIC_PREFIXES = {
    *("reward", "advantage", "response_length", "response", "clip", "ratio", "kl", "faults"),
    *("time", "throughput", "mismatch", "eval", "data", "episode", "async", "moe", "opsm"),
}
PLAIN_METRICS = {"entropy", "grad_norm", "loss", "lr", "step"}


def _listed(flag: str) -> list[str]:
    """The names of the docs' one-line list ``    --flag: a, b, c`` (docs/environments.md)."""
    lines = re.findall(rf"^ {{4}}{re.escape(flag)}: (.+)$", DOCS, re.M)
    assert len(lines) == 1, f"the docs should hold exactly one '    {flag}: ...' line"
    return [name.strip() for name in lines[0].split(",")]


def test_readme_task_list_is_the_registry():
    from gspo.envs.tasks import TASKS

    listed = _listed("--task")
    assert len(listed) == len(set(listed))
    assert set(listed) == set(TASKS) | {"file"}


def test_readme_reward_list_is_the_registry():
    from gspo.envs.rewards import REWARDS

    assert sorted(_listed("--reward")) == sorted(REWARDS)


def test_train_help_names_every_task_and_reward():
    from gspo.config import TrainConfig, field_docs
    from gspo.envs.rewards import REWARDS
    from gspo.envs.tasks import TASKS

    docs = field_docs(TrainConfig)
    for name in TASKS:
        assert re.search(rf"\b{name}\b", docs["task"]), f"--task help lacks {name}"
    for name in REWARDS:
        assert re.search(rf"\b{name}\b", docs["reward"]), f"--reward help lacks {name}"


def test_readme_resume_fields_are_resume_py():
    from gspo.compose.resume import RESUME_FIELDS, SAFE_ON_RESUME
    from gspo.interface.cli import _parser

    start = DOCS.index("Flags given with it may change only what does not make a different run")
    paragraph = DOCS[start : DOCS.index("each change is printed", start)]
    documented = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert documented == (SAFE_ON_RESUME - {"output_dir"}) | {"rollout_workers"}
    train = _parser()._subparsers._group_actions[0].choices["train"]
    (resume,) = [a for a in train._actions if "--resume" in a.option_strings]
    assert RESUME_FIELDS in resume.help


def _source_names() -> tuple[set[str], list[re.Pattern]]:
    """Every string literal under src/gspo, and every f-string as a pattern (its fields as
    numbers: the numbered metric names, e.g. f"episode/turn{k + 1}_reward_mean")."""
    literals: set[str] = set()
    patterns: list[re.Pattern] = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                parts = [
                    re.escape(v.value) if isinstance(v, ast.Constant) else r"\d+"
                    for v in node.values
                ]
                patterns.append(re.compile("".join(parts)))
    return literals, patterns


def _documented_metrics() -> set[str]:
    names = set()
    for token in re.findall(r"`([^`\s]+)`", DOCS):
        head, _, rest = token.partition("/")
        # `a|b` shorthand is read too, so that the test refuses it: the code logs no such name
        if head in METRIC_PREFIXES and re.fullmatch(r"[a-z0-9_@*|]+", rest):
            names.add(token)
    return names


def test_documented_metric_names_are_logged_by_the_code():
    literals, patterns = _source_names()

    def written(name: str) -> bool:
        return name in literals or any(p.fullmatch(name) for p in patterns)

    missing = []
    for name in sorted(_documented_metrics()):
        head, _, rest = name.partition("/")
        if rest == "*":  # `clip/*`: the family exists
            ok = any(s.startswith(head + "/") for s in literals)
        elif head == "eval":  # the evaluation's keys, logged as f"eval/{key}", and the
            # episode metrics of a multi-turn evaluation under eval/ instead of episode/
            ok = written(rest) or written(name) or written(f"episode/{rest}")
        else:
            ok = written(name)
        if not ok:
            missing.append(name)
    assert not missing, f"the README or docs/ name metrics the code never logs: {missing}"


def _undocumented(keys: set[str]) -> list[str]:
    documented = _documented_metrics() | PLAIN_METRICS
    out = []
    for key in sorted(keys):
        # `_off_policy` and `_se` variants are documented once, by their suffix
        base = re.sub(r"(_off_policy|_se)$", "", key)
        if base not in documented and f"{base.split('/')[0]}/*" not in documented:
            out.append(key)
    return out


@pytest.mark.parametrize(
    "task, extra",
    [("addition", {}), ("calculator", {"max_turns": 2, "max_total_tokens": 48})],
    ids=["one-turn", "multi-turn"],
)
def test_every_metric_a_run_logs_is_documented(tmp_path, task, extra):
    from gspo.compose.train import train
    from gspo.config import TrainConfig, build

    run = dict(output_dir=str(tmp_path / "run"), task=task, device="cpu", threads=1)
    cfg = build(TrainConfig, preset="smoke", overrides=dict(**run, eval_every=2, n_test=4, **extra))
    result = train(cfg)
    keys = {k for record in result.history for k in record}
    assert _undocumented(keys) == []


def test_no_developer_machine_paths_in_docs():
    # a doc citing a file of the machine it was written on (as docs/reproduction.md once cited
    # its notes in a folder of that machine) points a reader at nothing
    skip = {"runs", "build", "venv", "node_modules"}  # outputs and installs, not docs
    docs = [
        p
        for p in [*ROOT.rglob("*.md"), *(ROOT / "docs").rglob("*.json")]  # committed reports too
        if not any(part in skip or part.startswith(".") for part in p.relative_to(ROOT).parts)
    ]
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in docs
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"(?<![\w.~])/(work|home|Users)/", line)
    ]
    assert not found, f"absolute machine paths in docs: {found}"


def test_train_help_lists_flags_in_the_readme_order():
    # the docs' order: run, model and task (guide.md), the objective, then async, vLLM and Ray,
    # one group per part of the config (steps is the run's)
    from gspo.interface.cli import _parser

    train = _parser()._subparsers._group_actions[0].choices["train"]
    flags = [a.option_strings[0] for a in train._actions if a.option_strings]
    order = ["--output-dir", "--steps", "--model", "--task", "--algo", "--max-staleness"]
    order += ["--rollout-engine", "--backend"]
    assert [flags.index(f) for f in order] == sorted(flags.index(f) for f in order)
    assert flags.index("--wandb") < min(flags.index(f) for f in ("--backend", "--max-staleness"))


def _commands() -> list[tuple[str, str]]:
    """(page, command) for every ``gspo ...`` command of the pages: the lines of fenced code
    blocks (continuation lines joined, comments dropped) and inline code spans."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s#\s.*$", "", line).strip()
                if line.startswith("gspo "):
                    found.append((page.name, line))
        for span in re.findall(r"`(gspo [^`]+)`", text):
            found.append((page.name, " ".join(span.split())))
    return found


def test_documented_commands_use_real_subcommands_and_flags():
    # A renamed or removed flag left in a page makes a reader's first command fail; the value
    # of a flag is not checked (the pages show refused values on purpose, `--algo gsop`).
    from gspo.interface.cli import _parser

    subcommands = _parser()._subparsers._group_actions[0].choices
    commands = _commands()
    assert len(commands) > 40, "the command extraction found too few commands"
    bad = []
    for page, command in commands:
        words = shlex.split(command.replace("'", ""))
        sub = subcommands.get(words[1]) if len(words) > 1 else None
        if len(words) > 1 and words[1].startswith("--"):
            sub = _parser()  # `gspo --help`
        if sub is None:
            bad.append(f"{page}: {command} (no subcommand {words[1:2]})")
            continue
        for word in words[2:]:
            flag = word.strip("[]()").split("=")[0]
            if flag.startswith("--") and flag not in sub._option_string_actions:
                bad.append(f"{page}: {command} ({flag})")
    assert not bad, "commands with an unknown subcommand or flag: " + "; ".join(bad)


def test_the_integrations_page_has_a_command_per_package():
    # docs/integrations.md: each outside package named on the command line (issue 49), its
    # commands' flags checked above; the HumanEval/MBPP rows are read with --reward code.
    from gspo.config.names import INTEGRATIONS

    page = ROOT / "docs" / "integrations.md"
    variables = dict(re.findall(r'^(\w+)="(.*)"$', page.read_text(), re.M))  # L="--task ..."
    commands = [re.sub(r"\$(\w+)", lambda m: variables.get(m[1], m[0]), c)
                for name, c in _commands() if name == page.name]  # fmt: skip
    for prefix in INTEGRATIONS:
        assert any(f"--task {prefix}:" in c for c in commands), prefix
    assert any("--completions-key canonical_solution" in c for c in commands)
    assert any("--reward code" in c and "--prompt-key text" in c for c in commands)  # MBPP


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (code blocks' comment lines are not headings)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    anchors: set[str] = set()
    for title in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_relative_links_reach_a_file_and_heading():
    # The split into docs/ pages moved sections between files; a link to the old place reads
    # fine and leads nowhere.
    broken = []
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, f"broken links: {broken}"
