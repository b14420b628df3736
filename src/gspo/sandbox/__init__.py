"""Run untrusted, model-written Python in a contained process; bound the time of any reward.

Two tools live here:

* :func:`run_python` runs a program in a separate process with a CPU-time limit for all its
  processes (and a wall-clock backstop), a fair CPU share, an address-space limit, a process-count limit, a file-size limit, a fresh private
  working directory, no network and no view of the caller's files. :func:`code_reward` builds
  on it: it extracts the code from a completion, runs it against the unit tests stored in
  ``example.meta`` and returns the share of tests passed. What is and is not guaranteed is
  written down in ``docs/sandbox.md``; :func:`isolation` says which mechanisms are active on
  the machine at hand.
* :func:`with_timeout` wraps any reward function so that a call that hangs raises
  :class:`RewardTimeout` after a bound (``gspo.envs.rewards.score`` then scores it 0 and counts it).

How a run is contained (Linux, as root; see ``docs/sandbox.md`` for the fallbacks):

    caller ──Popen──► boot (root, own session) ──unshare(mnt, net, pid, ipc, uts)──► fork
        ──► init (pid 1 of a new pid namespace): builds a tmpfs root with the system and
            Python directories bind-mounted read-only, pivots into it, then forks
        ──► program: rlimits, setuid to a dedicated unprivileged uid, no_new_privs, exec python

The boot stage (:mod:`~gspo.sandbox.boot`) runs in a fresh interpreter
(``python -I -S -B``), so it needs nothing beyond the standard library and never runs in the
(possibly multi-threaded) caller: ``preexec_fn`` is not used because it is unsafe in a process
with threads.

Modules, by job: ``config`` (limits, results), ``run`` (the caller side of a run), ``boot`` and
``boot_root`` (isolation setup in the boot process), ``interpreter``, ``cgroup``, ``slots`` and
``seccomp`` (the isolation mechanisms), ``suite``, ``layouts``, ``extract``, ``harness`` and
``compare`` (unit tests, benchmark row layouts, code in a completion, judging answers),
``judge`` and ``judge_worker`` (the harness program inside a run, never imported),
``timeout`` (bounded-time reward calls).
"""

from gspo.sandbox.compare import outputs_match, parse_results, short_repr, values_match
from gspo.sandbox.config import (
    DEFAULT_CONFIG,
    Isolation,
    RunResult,
    SandboxConfig,
    SandboxError,
)
from gspo.sandbox.harness import TestReport, code_reward, run_tests, with_code_limits
from gspo.sandbox.run import isolation, run_python
from gspo.sandbox.suite import TestSuite, extract_code
from gspo.sandbox.timeout import RewardTimeout, RewardWorkerError, with_timeout

__all__ = [
    "DEFAULT_CONFIG",
    "Isolation",
    "RewardTimeout",
    "RewardWorkerError",
    "RunResult",
    "SandboxConfig",
    "SandboxError",
    "TestReport",
    "TestSuite",
    "code_reward",
    "extract_code",
    "isolation",
    "outputs_match",
    "parse_results",
    "run_python",
    "run_tests",
    "short_repr",
    "values_match",
    "with_code_limits",
    "with_timeout",
]
