"""Which files of an interpreter the sandbox binds, and which package directories it hides.

A program in the sandbox gets the standard library only (unless
``SandboxConfig(site_packages=True)``). The rule is to bind exactly what the interpreter
imports from, not the prefix it lives in: its executable, its standard library directories
(``sysconfig``'s ``stdlib``/``platstdlib`` and ``lib-dynload``) and the library directory
holding ``libpython`` and the libraries extension modules link against, in which every
subdirectory other than the standard library's is hidden behind an empty read-only mount, as
is the standard library's own ``site-packages``. So nothing next to the interpreter is visible:
not ``~/.local`` when the interpreter is reached as ``~/.local/bin/python3.X`` (uv, pipx), not
a venv's packages, not the user site. ``/usr`` is bound whole for the system's tools and
libraries, so every distribution package directory under it (``/usr/lib/python3/dist-packages``,
``/usr{,/local}/lib*/python3*/{site,dist}-packages``) is hidden too, whichever interpreter
runs: a program can append any path to ``sys.path`` itself, ``-S`` alone is not enough.

With ``site_packages=True`` the interpreter's prefixes are bound whole (the program asked for
its packages) and nothing is hidden.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading

# Host directories the interpreter needs, bound read-only at the same path. /etc, /home, /root,
# /tmp, /var, /work, /mnt, /opt, /srv... are not bound, so they do not exist inside.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# Package directories of a distribution's Pythons under SYSTEM_DIRS (Debian's dist-packages,
# Fedora's lib64, /usr/local's pip installs): hidden for every interpreter.
SYSTEM_PACKAGE_GLOBS = (
    "/usr/lib/python3/dist-packages",
    "/usr/local/lib/python3/dist-packages",
    "/usr/lib*/python3*/site-packages",
    "/usr/lib*/python3*/dist-packages",
    "/usr/local/lib*/python3*/site-packages",
    "/usr/local/lib*/python3*/dist-packages",
)

# Run by (or, for the caller's own interpreter, in) the interpreter in question.
_QUERY = r"""
import json, os, site, sys, sysconfig
prefixes = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
dirs = set(site.getsitepackages(prefixes))
for p in prefixes:
    for key in ("purelib", "platlib"):
        dirs.add(sysconfig.get_path(key, vars={"base": p, "platbase": p}))
dirs.update(sysconfig.get_path(key) for key in ("purelib", "platlib"))
stdlib = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
stdlib.update(p for p in sys.path if os.path.basename(p) == "lib-dynload")
libdirs = {os.path.join(p, sys.platlibdir) for p in (sys.base_prefix, sys.base_exec_prefix)}
libdirs.add(sysconfig.get_config_var("LIBDIR") or "")
result = {"prefixes": prefixes, "site": sorted(dirs), "stdlib": sorted(stdlib),
          "libdirs": sorted(d for d in libdirs if d), "executable": sys.executable}
"""

_cache: dict[str, dict[str, list[str]]] = {}
_lock = threading.Lock()


def interpreter_info(python: str) -> dict[str, list[str]]:
    """{"prefixes", "site", "stdlib", "libdirs", "executable"} of ``python`` (asked once per
    path, then cached)."""
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


def _under(path: str, dirs: list[str] | tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def system_package_dirs() -> list[str]:
    """The distribution package directories under the bound system directories."""
    found = {os.path.realpath(p) for pattern in SYSTEM_PACKAGE_GLOBS for p in glob.glob(pattern)}
    return sorted(p for p in found if os.path.isdir(p))


def python_dirs(python: str, site_packages: bool) -> tuple[list[str], list[str], str]:
    """(paths to bind for the interpreter, package directories to hide, the executable to run).

    The executable is the real file behind ``python`` (a venv's or ``~/.local/bin``'s link is
    followed), so the interpreter finds its standard library from the bound paths alone.
    """
    info = interpreter_info(python)
    if site_packages:
        # The program asked for the installed packages: the prefixes whole (a venv's included).
        candidates = {os.path.dirname(os.path.dirname(os.path.realpath(python))), *info["prefixes"]}
        binds: list[str] = []
        for path in sorted(os.path.realpath(p) for p in candidates):
            if os.path.isdir(path) and not _under(path, (*SYSTEM_DIRS, *binds)):
                binds.append(path)
        return binds, [], os.path.abspath(python)
    # A link under the bound system directories works inside as it is (and keeps its name);
    # elsewhere (a venv, ~/.local/bin) the link itself is not bound: run its target.
    given = os.path.abspath(python)
    executable = given if _under(given, SYSTEM_DIRS) else os.path.realpath(python)
    stdlib = sorted({os.path.realpath(p) for p in info["stdlib"] if os.path.isdir(p)})
    binds, hidden = [], []
    for libdir in sorted({os.path.realpath(p) for p in info["libdirs"]}):
        if not os.path.isdir(libdir) or _under(libdir, (*SYSTEM_DIRS, *binds)):
            continue
        binds.append(libdir)
        # Keep only the subdirectories on the way to the standard library.
        for entry in sorted(os.listdir(libdir)):
            sub = os.path.join(libdir, entry)
            on_the_way = any(s == sub or s.startswith(sub + "/") for s in stdlib)
            if os.path.isdir(sub) and not os.path.islink(sub) and not on_the_way:
                hidden.append(sub)
    for path in stdlib:
        if not _under(path, (*SYSTEM_DIRS, *binds)):
            binds.append(path)
    if not _under(executable, SYSTEM_DIRS):
        binds.append(executable)
    # Package directories inside what is bound: the interpreter's own and its base's
    # site-packages, and every distribution package directory under /usr.
    for p in [*info["site"], *system_package_dirs()]:
        real = os.path.realpath(p)
        if os.path.isdir(real) and real not in hidden and _under(real, (*SYSTEM_DIRS, *binds)):
            hidden.append(real)
    return binds, hidden, executable
