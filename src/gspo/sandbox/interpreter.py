"""Which files of an interpreter the sandbox binds, and which package directories it hides.

A program in the sandbox gets the standard library only (unless
``SandboxConfig(site_packages=True)``). The rule is to bind exactly what the interpreter
imports from, not the prefix it lives in: its executable, its standard library directories
(``sysconfig``'s ``stdlib``/``platstdlib`` and ``lib-dynload``) and the library directory
holding ``libpython`` and the libraries extension modules link against, in which every
subdirectory other than the standard library's is hidden behind an empty read-only mount, as
is the standard library's own ``site-packages``. So nothing next to the interpreter is visible:
not ``~/.local`` when the interpreter is reached as ``~/.local/bin/python3.X`` (uv, pipx), not
a venv's packages, not the user site. ``/usr`` is not bound whole either (:func:`system_dirs`):
only the system's programs and shared libraries, the locale and time-zone data, and, for an
interpreter under ``/usr``, its own files, so another Python bundled under ``/usr`` (an SDK's,
a ``/usr/local`` install, the distribution's when another interpreter runs) is absent. Every
distribution package directory inside what is bound (``/usr/lib/python3/dist-packages``,
``/usr{,/local}/lib*/python3*/{site,dist}-packages``) is hidden too, whichever interpreter
runs: a program can append any path to ``sys.path`` itself, ``-S`` alone is not enough.

With ``site_packages=True`` the interpreter's prefixes are bound whole (the program asked for
its packages) and nothing is hidden.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import subprocess
import sys
import threading

# Host directories bound read-only at the same path (merged /usr: links into it). /etc, /home,
# /root, /tmp, /var, /work, /mnt, /opt, /srv... are not bound, so they do not exist inside.
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# Of /usr, the system's programs and libraries (their multiarch directory: _system_lib_dirs)
# and the C library's locales; the rest (/usr/local, /usr/share, /usr/lib/NAME, /usr/include)
# is absent but for what the interpreter needs (python_dirs), so no other Python under /usr runs.
USR_DIRS = ("/usr/bin", "/usr/sbin", "/usr/lib64", "/usr/lib32", "/usr/libx32", "/usr/lib/locale")
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
tzpath = (sysconfig.get_config_var("TZPATH") or "").split(os.pathsep)
result = {"prefixes": prefixes, "site": sorted(dirs), "stdlib": sorted(stdlib),
          "libdirs": sorted(d for d in libdirs if d), "executable": sys.executable,
          "tzpath": [p for p in tzpath if p]}
"""

# The shared libraries the interpreter and its extension modules load: each module of
# lib-dynload imported (in a fresh process: the caller's terminal and state stay untouched),
# then the mapped files read from /proc/self/maps.
_LIBRARIES_QUERY = r"""
import glob, importlib, json, os, sys
for d in [p for p in sys.path if os.path.basename(p) == "lib-dynload"]:
    for path in glob.glob(os.path.join(d, "*.so")):
        try:
            importlib.import_module(os.path.basename(path).split(".")[0])
        except BaseException:
            pass
with open("/proc/self/maps") as f:
    maps = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
print(json.dumps(sorted(p for p in maps if p.startswith("/") and ".so" in os.path.basename(p))))
"""

_cache: dict[str, dict[str, list[str]]] = {}
_libraries: dict[str, list[str]] = {}
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
                _cache[python] = _ask(python, ["-I"], _QUERY + "print(json.dumps(result))")
        return _cache[python]


def interpreter_libraries(python: str) -> list[str]:
    """The shared library files ``python`` and its standard extension modules load (asked
    once per path, then cached)."""
    with _lock:
        if python not in _libraries:
            _libraries[python] = _ask(python, ["-I", "-S"], _LIBRARIES_QUERY)
        return _libraries[python]


def _ask(python: str, flags: list[str], code: str):
    """The JSON that ``code`` prints when ``python`` runs it with ``flags``."""
    out = subprocess.run(
        [python, *flags, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    if out.returncode != 0:
        raise OSError(f"cannot query interpreter {python}: {out.stderr[-500:]}")
    return json.loads(out.stdout)


def _under(path: str, dirs: list[str] | tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


@functools.cache  # the C library this process runs on does not change
def _system_lib_dirs() -> tuple[str, ...]:
    """The directories under /usr of the C library and the dynamic loader this process uses
    (``/usr/lib/x86_64-linux-gnu``): the system's shared libraries, for its programs too."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            name = os.path.basename(fields[-1].strip()) if len(fields) == 6 else ""
            if name.startswith(("libc.so", "libc-", "ld-linux", "ld-musl", "ld64.so")):
                found.add(os.path.dirname(os.path.realpath(fields[-1].strip())))
    return tuple(sorted(d for d in found if d.startswith("/usr/lib/")))


def system_dirs() -> tuple[str, ...]:
    """What is bound for every interpreter: :data:`SYSTEM_DIRS` and, of /usr, :data:`USR_DIRS`
    and the system's library directories; those that exist here."""
    usr = [*USR_DIRS, *_system_lib_dirs()]
    return SYSTEM_DIRS + tuple(p for p in usr if os.path.isdir(p) and not os.path.islink(p))


@functools.cache  # asked on every run; the interpreter's libraries stay where they are
def _usr_libraries(python: str, kept: tuple[str, ...]) -> list[str]:
    """Library files ``python`` loads from under /usr outside ``kept``, each with the names
    in its directory that link to it (the names the loader looks up)."""
    paths: list[str] = []
    for real in sorted({os.path.realpath(p) for p in interpreter_libraries(python)}):
        if not real.startswith("/usr/") or _under(real, kept) or not os.path.isfile(real):
            continue
        paths.append(real)
        folder = os.path.dirname(real)
        for entry in sorted(os.listdir(folder)):
            link = os.path.join(folder, entry)
            if os.path.islink(link) and os.path.realpath(link) == real:
                paths.append(link)
    return paths


def system_package_dirs() -> list[str]:
    """The distribution package directories under the bound system directories."""
    found = {os.path.realpath(p) for pattern in SYSTEM_PACKAGE_GLOBS for p in glob.glob(pattern)}
    return sorted(p for p in found if os.path.isdir(p))


def python_dirs(python: str, site_packages: bool) -> tuple[list[str], list[str], str]:
    """(paths to bind for the interpreter, package directories to hide, the executable to run).

    The executable is the real file behind ``python`` (a venv's or ``~/.local/bin``'s link is
    followed), so the interpreter finds its standard library from the bound paths alone. The
    paths come on top of :func:`system_dirs`; under /usr they are the interpreter's own files
    only (its standard library, the libraries it loads from there) and the time-zone data,
    never a directory of /usr whole: /usr/lib and /usr/local/lib hold other Pythons.
    """
    info = interpreter_info(python)
    kept = system_dirs()
    tzdata = sorted({os.path.realpath(p) for p in info.get("tzpath", []) if os.path.isdir(p)})
    tzdata = [p for p in tzdata if not _under(p, kept)]
    if site_packages:
        # The program asked for the installed packages: the prefixes whole (a venv's included).
        candidates = {os.path.dirname(os.path.dirname(os.path.realpath(python))), *info["prefixes"]}
        binds: list[str] = []
        for path in sorted(os.path.realpath(p) for p in candidates):
            if os.path.isdir(path) and not _under(path, (*kept, *binds)):
                binds.append(path)
        binds += [p for p in [*_usr_libraries(python, kept), *tzdata] if not _under(p, binds)]
        return binds, [], os.path.abspath(python)
    # A link under the bound system directories works inside as it is (and keeps its name);
    # elsewhere (a venv, ~/.local/bin, /usr/local/bin) the link itself is not bound: run its
    # target.
    given = os.path.abspath(python)
    executable = given if _under(given, kept) else os.path.realpath(python)
    stdlib = sorted({os.path.realpath(p) for p in info["stdlib"] if os.path.isdir(p)})
    binds, hidden = [], []
    for libdir in sorted({os.path.realpath(p) for p in info["libdirs"]}):
        # Under /usr the library directory holds other Pythons' files: only the libraries
        # the interpreter loads from it are bound (below), and its standard library.
        usr = libdir.startswith("/usr/")
        if not os.path.isdir(libdir) or usr or _under(libdir, (*kept, *binds)):
            continue
        binds.append(libdir)
        # Keep only the subdirectories on the way to the standard library.
        for entry in sorted(os.listdir(libdir)):
            sub = os.path.join(libdir, entry)
            on_the_way = any(s == sub or s.startswith(sub + "/") for s in stdlib)
            if os.path.isdir(sub) and not os.path.islink(sub) and not on_the_way:
                hidden.append(sub)
    for path in stdlib:
        if not _under(path, (*kept, *binds)):
            binds.append(path)
    if not _under(executable, kept):
        binds.append(executable)
    binds += [p for p in [*_usr_libraries(python, kept), *tzdata] if not _under(p, (*kept, *binds))]
    # Package directories inside what is bound: the interpreter's own and its base's
    # site-packages, and every distribution package directory in the bound directories.
    for p in [*info["site"], *system_package_dirs()]:
        real = os.path.realpath(p)
        if os.path.isdir(real) and real not in hidden and _under(real, (*kept, *binds)):
            hidden.append(real)
    return binds, hidden, executable
