"""Helpers shared by test_sandbox_containment.py and the files split from it.

Imported by name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import os

import pytest
from sandbox_checks import history_mark, leftovers, needs, needs_root

from gspo.envs.sandbox import (
    isolation,
    seccomp,
)
from gspo.envs.tasks.base import Example

MACHINE = os.uname().machine


def ex(**meta: object) -> Example:
    return Example(prompt="", answer="", meta=dict(meta))


@pytest.fixture(autouse=True)
def no_leftovers():
    mark = history_mark()
    yield
    assert leftovers(mark) == [], "a sandboxed process outlived its run"


def needs_full_isolation() -> None:
    needs_root()
    needs(MACHINE in seccomp.AUDIT_ARCH, f"the seccomp filter is for x86_64/aarch64, not {MACHINE}")
    missing = {"mountns", "netns", "pidns", "uid", "seccomp"} - isolation().mechanisms
    needs(not missing, f"needs {sorted(missing)} (missing: {isolation().missing})")
