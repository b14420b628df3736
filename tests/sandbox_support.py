"""Helpers shared by test_sandbox.py and the files split from it.

Imported by name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import pytest
from sandbox_checks import (
    ROOT,
    history_mark,
    leftovers,
    needs,
)

from gspo.envs.sandbox import (
    isolation,
)
from gspo.envs.tasks.base import Example

# Slack on top of a time limit: process start-up and teardown on a loaded 2-core machine.
SLACK_S = 3.0


def ex(**meta: object) -> Example:
    return Example(prompt="", answer="", meta=dict(meta))


@pytest.fixture(autouse=True)
def no_leftovers():
    # Scoped to the runs this test started: other suites may run sandboxes meanwhile.
    mark = history_mark()
    yield
    assert leftovers(mark) == [], "a sandboxed process outlived its run"


# What a root caller on Linux must get (CI runs as root): with it, each test's conditional
# assertions below ("if iso.network_blocked") always run, so a missing mechanism fails them.
FULL_ISOLATION = {
    "uid",
    "nproc",
    "no_new_privs",
    "mountns",
    "netns",
    "pidns",
    "ipcns",
    "utsns",
    "seccomp",
    "keyring",
}


@pytest.fixture(scope="module")
def iso():
    found = isolation()
    if ROOT:
        needs(
            found.mechanisms >= FULL_ISOLATION,
            f"needs namespaces and seccomp as root (a container without CAP_SYS_ADMIN lacks "
            f"them); missing: {found.missing}",
        )
    return found
