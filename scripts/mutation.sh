#!/usr/bin/env bash
# Mutation testing of the algorithm core, the trainer and the rollout engine with mutmut.
#
#   pip install -e ".[dev]"                      # mutmut (the dev extra)
#   scripts/mutation.sh losses                    # one target (or: all)
#   scripts/mutation.sh trainer 'gspo.backend.update.x_update_policy__mutmut_*'   # a subset of mutants
#   MUTMUT_CHILDREN=2 scripts/mutation.sh all
#   MUTMUT_PYTHON=/path/to/venv/bin/python scripts/mutation.sh losses   # mutmut in another env
#
# Targets: losses, advantages, trainer, engine (src/gspo/rollout/torch_engine.py), all.
# Each target mutates one module and runs only the test files that exercise it, in a scratch
# copy of the working tree (mutmut writes a mutants/ folder and a setup.cfg there), so the
# checkout stays clean. mutmut runs, per mutant, only the tests that reached the mutated
# function. Results (score, survivors) are printed and kept under $MUTMUT_WORK/<target>/.
# Not part of CI: a full run takes longer than CI should. Re-run it when a layer changes and
# record the score and the survivors in docs/testing.md.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${MUTMUT_WORK:-${TMPDIR:-/tmp}/gspo-mutation}"
children="${MUTMUT_CHILDREN:-1}"
python="${MUTMUT_PYTHON:-python3}"
"$python" -c "import mutmut" 2>/dev/null || {
    echo "mutmut not found: pip install -e \".[dev]\" (or set MUTMUT_PYTHON to a python with it)" >&2
    exit 2
}

# mutmut imports the mutated copy (mutants/src) in-process; an editable install of gspo on
# sys.path would shadow it and every mutant would report "no tests". Drop such entries.
# mutmut forks one child per mutant from a process that has run torch: one intra-op thread
# (OMP/MKL) keeps a forked child from waiting forever on the parent's thread pool.
mutmut() {
    PYTHONPATH= OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$python" -c '
import os, sys
here = os.getcwd()
sys.path[:] = [p for p in sys.path if not (p.endswith("/src") and not p.startswith(here))]
sys.argv = ["mutmut", *sys.argv[1:]]
from mutmut.__main__ import cli
cli()' "$@"
}

module_of() {
    case "$1" in
        losses) echo "src/gspo/core/losses.py" ;;
        advantages) echo "src/gspo/core/losses.py" ;;
        trainer) echo "src/gspo/backend/update.py" ;;
        engine) echo "src/gspo/rollout/torch_engine.py" ;;
        *) echo "unknown target $1 (losses, advantages, trainer, engine, all)" >&2; exit 2 ;;
    esac
}

tests_of() {
    case "$1" in
        losses) echo "tests/test_losses.py tests/test_losses_registry.py tests/test_losses_properties.py tests/test_loss_checks.py" ;;
        advantages) echo "tests/test_advantages.py" ;;
        trainer) echo "tests/test_trainer.py tests/test_trainer_zero_advantage.py tests/test_wiring.py tests/test_wiring_optimizer.py tests/test_learning_direction.py tests/test_engine_contract.py tests/test_moe.py tests/test_moe_training.py" ;;
        engine) echo "tests/test_rollout.py tests/test_rollout_sampling.py tests/test_engine_contract.py" ;;
    esac
}

run_target() {
    local target="$1"
    shift
    local module tests dir
    module="$(module_of "$target")"
    tests="$(tests_of "$target")"
    dir="$work/$target"
    rm -rf "$dir"
    mkdir -p "$dir"
    # The working tree as it is (tracked and untracked, not ignored files).
    (cd "$repo" && git ls-files -co --exclude-standard -z) | (cd "$repo" && xargs -0 cp --parents -t "$dir")
    # setup.cfg, not pyproject.toml: mutmut reads [mutmut] there when pyproject has no
    # [tool.mutmut] table, so each target gets its own scope without touching pyproject.
    {
        echo "[mutmut]"
        echo "source_paths=src"
        echo "only_mutate=$module"
        echo "pytest_add_cli_args_test_selection="
        for t in $tests; do echo "    $t"; done
        printf 'pytest_add_cli_args=\n    -p\n    no:cacheprovider\n'
        echo "mutate_only_covered_lines=false"
    } >"$dir/setup.cfg"
    echo "== $target: mutating $module with $tests (children: $children)"
    start=$(date +%s)
    (cd "$dir" && mutmut run --max-children "$children" "$@") || true
    end=$(date +%s)
    (cd "$dir" && mutmut results --all true >"$dir/results.txt" 2>&1) || true
    local killed survived other
    killed=$(grep -c ": killed$" "$dir/results.txt" || true)
    survived=$(grep -c ": survived$" "$dir/results.txt" || true)
    other=$(grep -v -c -E ": (killed|survived)$" "$dir/results.txt" || true)
    echo "== $target: killed $killed, survived $survived, not run or other $other, $((end - start)) s"
    grep ": survived$" "$dir/results.txt" || true
}

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(all)
if [ "${targets[0]}" = "all" ]; then
    for t in losses advantages trainer engine; do run_target "$t"; done
else
    t="${targets[0]}"
    run_target "$t" "${targets[@]:1}"
fi
