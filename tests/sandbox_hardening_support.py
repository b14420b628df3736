"""Helpers shared by test_sandbox_hardening.py and the files split from it.

Imported by name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from sandbox_checks import history_mark, leftovers, needs, needs_root

from gspo.envs.sandbox import (
    SandboxConfig,
    isolation,
    run_python,
)
from gspo.envs.sandbox import seccomp as sandbox_seccomp
from gspo.envs.tasks.base import Example

MACHINE = os.uname().machine


def ex(**meta: object) -> Example:
    return Example(prompt="", answer="", meta=dict(meta))


@pytest.fixture(autouse=True)
def no_leftovers():
    mark = history_mark()
    yield
    assert leftovers(mark) == [], "a sandboxed process outlived its run"


def needs_seccomp() -> None:
    needs(
        MACHINE in sandbox_seccomp.AUDIT_ARCH,
        f"the seccomp filter is for x86_64/aarch64, not {MACHINE}",
    )


def needs_full_isolation() -> None:
    needs_root()
    missing = {"mountns", "netns", "pidns", "uid", "seccomp", "keyring"} - isolation().mechanisms
    needs(not missing, f"needs {sorted(missing)} (missing: {isolation().missing})")


def inside(code: str, **config: object) -> dict:
    """Run ``code`` (which prints one JSON object last) in the sandbox; return that object."""
    result = run_python(textwrap.dedent(code), config=SandboxConfig(timeout_s=20, **config))
    assert result.ok, (result.returncode, result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


# A ctypes syscall(2) for programs in the sandbox.
SYSCALL = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
"""
