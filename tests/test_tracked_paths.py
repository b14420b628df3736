"""No tracked file names a path of one machine: a home folder, the root user's, a temporary
folder a run or a test happened to use (a results JSON written from ``/tmp/xyz``, a report of a
pytest temp folder). Such a path means nothing on another machine and says where someone
worked."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HOME = r"/root/|/home/[A-Za-z_][A-Za-z0-9_.-]*/|/Users/[A-Za-z_][A-Za-z0-9_.-]*/"
MAC_TEMP = r"/private/var/folders/"
GENERATED_TEMP = r"/tmp/(?:tmp[a-z0-9_]{4,}|pytest-of-|gspo-baseline-[a-z0-9_]{6,})"
"""Temporary folders made by mkdtemp or pytest: in any file, a path of one machine's run."""

WORKSPACE = r"/work/"
"""Where this project's checkouts and worktrees lay on the machines it was built on."""
DATA = re.compile(f"{HOME}|{MAC_TEMP}|/tmp/|{WORKSPACE}")
"""Results and other data (JSON): no machine path at all, /tmp included (paths there are made
relative to where the run worked)."""
TEXT = re.compile(f"{HOME}|{MAC_TEMP}|{GENERATED_TEMP}")
"""Code and docs: a scratch folder in an example command (``--cache /tmp/vstrl-cache``) or a
fixed system path in code (Ray's ``/tmp/ray``) is the same on every machine; a home folder or
a generated temporary one is not."""

ALLOWED = {
    # The sandbox tests try to read the root user's files from inside the sandbox.
    ("tests/test_sandbox_escape.py", "/root/"),
}
SELF = "tests/test_tracked_paths.py"  # its own examples of what it finds
CHECKED = (".json", ".jsonl", ".md", ".py", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".sh", ".txt")


def tracked_files() -> list[str]:
    try:
        proc = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        proc = None
    if proc is None or proc.returncode != 0 or not proc.stdout.strip():
        pytest.skip("not a git checkout: no tracked files to scan")
    return [f for f in proc.stdout.splitlines() if f.endswith(CHECKED) or f == ".importlinter"]


def machine_paths(name: str, text: str) -> list[str]:
    pattern = DATA if name.endswith((".json", ".jsonl")) else TEXT
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in pattern.finditer(line):
            if (name, match.group(0)) not in ALLOWED:
                found.append(f"{name}:{number}: {line.strip()[:120]}")
                break
    return found


def test_no_tracked_file_names_a_machine_path():
    found = []
    for name in tracked_files():
        path = ROOT / name
        if name == SELF:
            continue
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        found += machine_paths(name, path.read_text(encoding="utf-8", errors="replace"))
    assert not found, "machine paths in tracked files:\n" + "\n".join(found[:40])


def test_the_scan_finds_each_kind_of_machine_path():
    assert machine_paths("r.json", '{"out": "/tmp/i21/exp3"}')
    assert machine_paths("r.json", '{"data": "/home/alice/data.jsonl"}')
    assert machine_paths("r.json", '{"gspo_src": "/work/wt-x/src"}')
    assert machine_paths("doc.md", "see /private/var/folders/x1/T/run")
    assert machine_paths("doc.md", "from /tmp/pytest-of-bob/pytest-3/run")
    assert machine_paths("code.py", 'ROOT = "/root/work"')
    assert not machine_paths("doc.md", "python bench.py --cache /tmp/vstrl-cache")
    assert not machine_paths("code.py", 'DEFAULT_TEMP_DIR = "/tmp/ray"')
