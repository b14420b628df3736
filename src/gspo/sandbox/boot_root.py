"""Boot stage of the sandbox, first part: the libc calls the standard library lacks, and the
sandbox's own root filesystem (a tmpfs with the system and Python directories bound read-only,
the run's files in its working directory) that init pivots into.

Imported by :mod:`gspo.sandbox.boot` in the boot process only; standard library only.
"""

from __future__ import annotations

# Everything is imported up front, not where used: after pivot_root the boot interpreter's own
# library directory may no longer be visible (when the program runs another interpreter).
import ctypes
import os
from typing import Any

from gspo.sandbox import seccomp as sandbox_seccomp

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_NOATIME = 1024
_MS_NODIRATIME = 2048
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MS_RELATIME = 1 << 21
_MNT_DETACH = 2
_KEYCTL_JOIN_SESSION_KEYRING = 1
_KEYCTL_CLEAR = 7
_KEY_SPEC_USER_KEYRING = -4
_KEY_SPEC_USER_SESSION_KEYRING = -5
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}

_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_WORKDIR = "/work"


class _Libc:
    """The few libc calls the standard library does not wrap (Python 3.10/3.11 lack unshare)."""

    def __init__(self) -> None:
        self._ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            errno = self._ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    def unshare(self, flags: int) -> None:
        self._check(self.lib.unshare(flags), f"unshare({flags:#x})")

    def mount(
        self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None
    ) -> None:
        def enc(s: str | None) -> bytes | None:
            return None if s is None else os.fsencode(s)

        c = self._ctypes
        result = self.lib.mount(enc(source), enc(target), enc(fstype), c.c_ulong(flags), enc(data))
        self._check(result, f"mount {source} on {target}")

    def umount2(self, target: str, flags: int) -> None:
        self._check(self.lib.umount2(os.fsencode(target), flags), f"umount {target}")

    def prctl(self, option: int, arg: int) -> None:
        c = self._ctypes
        result = self.lib.prctl(option, c.c_ulong(arg), c.c_ulong(0), c.c_ulong(0), c.c_ulong(0))
        self._check(result, f"prctl({option})")

    def keyctl(self, operation: int, arg: int) -> None:
        """keyctl(2) through syscall(2): glibc has no wrapper (libkeyutils does)."""
        machine = os.uname().machine
        column = {"x86_64": 0, "aarch64": 1}.get(machine)
        if column is None:
            raise OSError(0, f"keyctl: unknown syscall number on {machine}")
        c = self._ctypes
        number = sandbox_seccomp.DENIED_EPERM["keyctl"][column]
        result = self.lib.syscall(c.c_long(number), c.c_long(operation), c.c_long(arg))
        self._check(0 if result >= 0 else result, f"keyctl({operation})")

    def fresh_session_keyring(self) -> None:
        """Join a new anonymous session keyring: the caller's keys are out of reach."""
        self.keyctl(_KEYCTL_JOIN_SESSION_KEYRING, 0)

    def clear_user_keyrings(self) -> None:
        """Empty the user and user-session keyrings of the current uid."""
        self.keyctl(_KEYCTL_CLEAR, _KEY_SPEC_USER_KEYRING)
        self.keyctl(_KEYCTL_CLEAR, _KEY_SPEC_USER_SESSION_KEYRING)

    def sethostname(self, name: str) -> None:
        data = name.encode()
        self._check(self.lib.sethostname(data, ctypes.c_size_t(len(data))), "sethostname")

    def pivot_root(self, new_root: str, put_old: str) -> None:
        number = _SYS_PIVOT_ROOT.get(os.uname().machine)
        if number is None:
            raise OSError(0, f"pivot_root: unknown syscall number on {os.uname().machine}")
        c = self._ctypes
        result = self.lib.syscall(c.c_long(number), os.fsencode(new_root), os.fsencode(put_old))
        self._check(result, "pivot_root")


def _mount_flags_of(path: str) -> int:
    """Flags of the mount holding ``path`` that a bind remount must keep.

    In a user namespace the kernel refuses to clear locked flags (nosuid, nodev, noexec,
    atime) of the original mount, so the remount has to repeat them.
    """
    st = os.statvfs(path)
    flags = 0
    for st_flag, ms_flag in (
        (os.ST_NOSUID, _MS_NOSUID),
        (os.ST_NODEV, _MS_NODEV),
        (os.ST_NOEXEC, _MS_NOEXEC),
        (getattr(os, "ST_NOATIME", 1024), _MS_NOATIME),
        (getattr(os, "ST_NODIRATIME", 2048), _MS_NODIRATIME),
        (getattr(os, "ST_RELATIME", 4096), _MS_RELATIME),
    ):
        if st.f_flag & st_flag:
            flags |= ms_flag
    return flags


def _bind(libc: _Libc, source: str, target: str, *, writable: bool = False) -> None:
    """Bind ``source`` on ``target`` (created as needed), then make it nosuid, nodev (and ro)."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a"):
            pass
    libc.mount(source, target, None, _MS_BIND, None)
    flags = _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _mount_flags_of(source)
    if not writable:
        flags |= _MS_RDONLY
    libc.mount(None, target, None, flags, None)


def _build_root(libc: _Libc, spec: dict[str, Any], new_root: str, proc: bool) -> None:
    """Assemble the sandbox's filesystem on a fresh tmpfs at ``new_root`` and pivot into it."""
    libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)  # keep our mounts to ourselves
    os.makedirs(new_root, exist_ok=True)
    libc.mount(
        "tmpfs",
        new_root,
        "tmpfs",
        _MS_NOSUID | _MS_NODEV,
        f"size={spec['tmpfs_mb']}m,nr_inodes=16384,mode=755",
    )
    for path in spec["system_dirs"]:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            os.symlink(os.readlink(path), new_root + path)
        elif os.path.isdir(path):
            _bind(libc, path, new_root + path)
    for path in _SYSTEM_FILES:
        if os.path.islink(path):
            os.makedirs(os.path.dirname(new_root + path), exist_ok=True)
            os.symlink(os.readlink(path), new_root + path)
        elif os.path.isfile(path):
            _bind(libc, path, new_root + path)
    for path in spec["python_dirs"]:
        _bind(libc, path, new_root + path)
    for path in spec["hidden_dirs"]:  # site-packages, unless asked for: an empty read-only dir
        target = new_root + path
        if os.path.isdir(target):
            libc.mount("tmpfs", target, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, "size=4k")
    dev = new_root + "/dev"
    os.makedirs(dev)
    for name in _DEVICES:
        if os.path.exists("/dev/" + name):
            _bind(libc, "/dev/" + name, f"{dev}/{name}", writable=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{dev}/{name}")
    os.symlink("/proc/self/fd/1", f"{dev}/stdout")
    os.symlink("/proc/self/fd/2", f"{dev}/stderr")
    for path in ("/tmp", "/dev/shm"):
        os.makedirs(new_root + path, exist_ok=True)
        os.chmod(new_root + path, 0o1777)
    if proc:
        # A procfs of the new pid namespace shows only the sandbox's own processes.
        os.makedirs(new_root + "/proc")
        libc.mount("proc", new_root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    _populate_workdir(spec, new_root + _WORKDIR)
    # pivot_root(".", ".") stacks the old root under the new one; detaching it leaves no path
    # back to the host filesystem (unlike chroot, which a process with CAP_SYS_CHROOT escapes).
    os.chdir(new_root)
    try:
        libc.pivot_root(".", ".")
        libc.umount2(".", _MNT_DETACH)
    except OSError:
        os.chroot(".")  # an architecture without a known syscall number: second best
    os.chdir("/")


def _populate_workdir(spec: dict[str, Any], workdir: str) -> None:
    """Copy the run's files into ``workdir``, owned by the sandbox uid."""
    os.makedirs(workdir, exist_ok=True)
    uid, gid = spec["uid"], spec["gid"]
    source = spec["files_dir"]
    for name in os.listdir(source):
        with open(os.path.join(source, name), "rb") as src:
            data = src.read()
        target = os.path.join(workdir, name)
        with open(target, "wb") as dst:
            dst.write(data)
        if uid is not None:
            os.chown(target, uid, gid)
    os.chmod(workdir, 0o700)
    if uid is not None:
        os.chown(workdir, uid, gid)
