"""Which directories of an interpreter the sandbox binds, and which site-packages it hides.

A program in the sandbox gets the standard library only (unless
``SandboxConfig(site_packages=True)``): every site-packages / dist-packages directory the
interpreter could reach is hidden behind an empty read-only mount, those of its own prefix,
of the base interpreter when it is a venv (``sys.base_prefix``), and the system ones of a
distribution's Python (``/usr/lib/python3/dist-packages``, ``/usr/local/lib/...``). ``-S``
alone is not enough: a program can append any of them to ``sys.path`` itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

# Host directories the interpreter needs, bound read-only at the same path. /etc, /home, /root,
# /tmp, /var, /work, /mnt, /opt, /srv... are not bound, so they do not exist inside.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")

# Run by (or, for the caller's own interpreter, in) the interpreter in question.
_QUERY = r"""
import json, site, sys, sysconfig
prefixes = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
dirs = set(site.getsitepackages(prefixes))
for p in prefixes:
    for key in ("purelib", "platlib"):
        dirs.add(sysconfig.get_path(key, vars={"base": p, "platbase": p}))
dirs.update(sysconfig.get_path(key) for key in ("purelib", "platlib"))
result = {"prefixes": prefixes, "site": sorted(dirs)}
"""

_cache: dict[str, dict[str, list[str]]] = {}
_lock = threading.Lock()


def interpreter_info(python: str) -> dict[str, list[str]]:
    """{"prefixes": [...], "site": [...]} of ``python`` (asked once per path, then cached)."""
    with _lock:
        if python not in _cache:
            if os.path.abspath(python) == os.path.abspath(sys.executable):
                namespace: dict[str, object] = {}
                exec(_QUERY, namespace)
                _cache[python] = namespace["result"]  # type: ignore[assignment]
            else:
                # Without -S: a venv's sys.prefix is set by the site module.
                out = subprocess.run(
                    [python, "-I", "-c", _QUERY + "print(json.dumps(result))"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                if out.returncode != 0:
                    raise OSError(f"cannot query interpreter {python}: {out.stderr[-500:]}")
                _cache[python] = json.loads(out.stdout)
        return _cache[python]


def python_dirs(python: str, site_packages: bool) -> tuple[list[str], list[str]]:
    """(directories to bind for the interpreter, site-packages directories to hide)."""
    info = interpreter_info(python)
    # <prefix>/bin/python -> <prefix>, both for the path as given (a venv) and its target.
    candidates = {
        os.path.dirname(os.path.dirname(os.path.realpath(python))),
        os.path.dirname(os.path.dirname(os.path.abspath(python))),
        *info["prefixes"],
    }
    dirs: list[str] = []
    for path in sorted(os.path.realpath(p) for p in candidates):
        if not os.path.isdir(path):
            continue
        # Already visible through a system directory, or through a shorter prefix here?
        if any(path == d or path.startswith(d.rstrip("/") + "/") for d in (*SYSTEM_DIRS, *dirs)):
            continue
        dirs.append(path)
    hidden: list[str] = []
    if not site_packages:
        for p in info["site"]:
            real = os.path.realpath(p)
            if os.path.isdir(real) and real not in hidden:
                hidden.append(real)
    return dirs, hidden
