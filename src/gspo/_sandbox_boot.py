"""Boot stage of :mod:`gspo.sandbox`: namespaces, filesystem, limits, privilege drop, exec.

Run by the sandbox as ``python -I -S -B -c "...; main()" SPEC`` in a fresh process (as root
when the caller is root), never imported into the caller's process for its side effects. It
uses only the standard library and stays small because every sandboxed run pays its import.
"""

from __future__ import annotations

# Everything is imported up front, not where used: after pivot_root the boot interpreter's own
# library directory may no longer be visible (when the program runs another interpreter).
import contextlib
import ctypes
import json
import os
import resource
import sys
from typing import Any

from gspo import sandbox_seccomp

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
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
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
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


def _write_status(fd: int, message: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _set_limits(spec: dict[str, Any], nproc: bool) -> None:
    cpu = spec["cpu_s"]
    limits = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # soft: SIGXCPU, hard: SIGKILL
        (resource.RLIMIT_AS, spec["memory_bytes"], spec["memory_bytes"]),
        (resource.RLIMIT_FSIZE, spec["file_bytes"], spec["file_bytes"]),
        (resource.RLIMIT_NOFILE, spec["nofile"], spec["nofile"]),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_MEMLOCK, 0, 0),
    ]
    if hasattr(resource, "RLIMIT_MSGQUEUE"):
        limits.append((resource.RLIMIT_MSGQUEUE, 0, 0))
    if nproc:
        limits.append((resource.RLIMIT_NPROC, spec["nproc"], spec["nproc"]))
    for which, soft, hard in limits:
        resource.setrlimit(which, (soft, hard))


def _exec_program(libc: _Libc, spec: dict[str, Any], status_fd: int, nproc: bool) -> None:
    """Last stage (child of init): limits, drop privileges, exec the interpreter. No return."""
    try:
        init_pid = os.getppid()
        _set_limits(spec, nproc)
        if spec["uid"] is not None:
            os.setgroups([])
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        if "keyring" in spec["applied"]:
            # A session keyring of the program's own (boot's belongs to root), and nothing
            # left in the uid's keyrings by an earlier run.
            libc.fresh_session_keyring()
            if spec["uid"] is not None:
                libc.clear_user_keyrings()
        # Setuid binaries reachable under /usr can no longer raise privileges.
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1)
        # Set after setuid: changing credentials clears the parent-death signal.
        libc.prctl(_PR_SET_PDEATHSIG, 9)
        if os.getppid() != init_pid:
            os._exit(1)
        # Only stdio, the status pipe (closed on exec) and the result channel stay open.
        keep = sorted(
            {2, status_fd} | ({spec["result_fd"]} if spec["result_fd"] is not None else set())
        )
        for low, high in zip(keep, [*keep[1:], spec["nofile_before"]], strict=True):
            os.closerange(low + 1, high)
        os.set_inheritable(status_fd, False)  # closes on exec: EOF tells the caller nothing
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": spec["cwd"],
            "TMPDIR": spec["tmpdir"],
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }
        if spec["result_fd"] is not None:
            env["GSPO_RESULT_FD"] = str(spec["result_fd"])
        os.chdir(spec["cwd"])
        if "seccomp" in spec["applied"]:
            # Last, so that nothing above needs a denied call; it survives the exec.
            sandbox_seccomp.install(libc.lib, os.uname().machine)
        os.execve(spec["python"], spec["argv"], env)
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, PermissionError) and exc.filename == spec["python"]:
            message += (
                " (the sandbox uid cannot reach this interpreter; without a mount namespace "
                "pass SandboxConfig(python=...) with a world-readable one, e.g. /usr/bin/python3)"
            )
        try:
            _write_status(status_fd, {"error": message})
        finally:
            os._exit(127)


def _init_stage(libc: _Libc, spec: dict[str, Any], status_fd: int, applied: list[str]) -> None:
    """Child of boot: pid 1 of the new pid namespace if there is one. Builds the filesystem,
    runs the program as its child, reports how it ended. No return."""
    try:
        boot_pid = os.getppid()
        libc.prctl(_PR_SET_PDEATHSIG, 9)  # the caller kills boot on timeout: take all with it
        if os.getppid() != boot_pid:
            os._exit(1)
        missing = list(spec["missing"])
        if "mountns" in applied:
            try:
                _build_root(libc, spec, spec["new_root"], proc="pidns" in applied)
                spec["cwd"] = _WORKDIR
                spec["tmpdir"] = "/tmp"
            except OSError as exc:
                # A half-built root is unusable: stop rather than run with the host's files.
                _write_status(status_fd, {"error": f"building the sandbox root failed: {exc}"})
                os._exit(126)
        else:
            _populate_workdir(spec, spec["cwd"])
            spec["tmpdir"] = spec["cwd"]
        if "utsns" in applied:
            with contextlib.suppress(OSError):  # cosmetic: hides the host's name
                libc.sethostname("sandbox")
        nproc = spec["uid"] is not None or "userns" in applied
        if nproc:
            applied.append("nproc")
        else:
            missing.append("nproc: no dedicated uid or user namespace (it would count the caller)")
        applied.append("no_new_privs")
        if not spec["seccomp"]:
            missing.append("seccomp: disabled (SandboxConfig.seccomp=False)")
        elif sandbox_seccomp.build_filter(os.uname().machine) is None:
            missing.append(f"seccomp: no filter for {os.uname().machine}")
        else:
            applied.append("seccomp")
        if spec["audit_hook"]:
            applied.append("audit_hook")
        spec["applied"] = applied
        _write_status(status_fd, {"started": True, "isolation": applied, "missing": missing})
        child = os.fork()
        if child == 0:
            _exec_program(libc, spec, status_fd, nproc)
        # As pid 1, also reap orphans so that zombies do not pile up against RLIMIT_NPROC.
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                os._exit(0)
            except InterruptedError:
                continue
            if pid == child:
                break
        if os.WIFSIGNALED(status):
            _write_status(status_fd, {"exit": None, "signal": os.WTERMSIG(status)})
        else:
            _write_status(status_fd, {"exit": os.WEXITSTATUS(status), "signal": None})
        os._exit(0)  # as pid 1 this kills every process left in the namespace
    except BaseException as exc:
        try:
            _write_status(status_fd, {"error": f"sandbox init failed: {type(exc).__name__}: {exc}"})
        finally:
            os._exit(126)


def main(spec_path: str | None = None) -> None:
    """Entry point of the boot stage: unshare namespaces, fork init, wait for it."""
    with open(spec_path or sys.argv[1]) as f:
        spec = json.load(f)
    # Move the pipes from the caller's (possibly high) descriptor numbers to the lowest free
    # ones, below the sandbox's RLIMIT_NOFILE, so the program can use the result channel.
    originals = []
    for key in ("status_fd", "result_fd"):
        if spec[key] is not None:
            originals.append(spec[key])
            spec[key] = os.dup(spec[key])
    for fd in originals:
        if fd not in (spec["status_fd"], spec["result_fd"]):
            os.close(fd)
    if spec["result_fd"] is not None:
        os.set_inheritable(spec["result_fd"], True)  # dup() made it close-on-exec
    status_fd = spec["status_fd"]
    libc = _Libc()
    applied: list[str] = []
    missing: list[str] = list(spec["missing_before"])
    # If the caller dies, so does the run (init and the program follow boot).
    libc.prctl(_PR_SET_PDEATHSIG, 9)
    if os.getppid() != spec["caller_pid"]:
        os._exit(1)
    try:
        # Join the run's cgroup before anything else: every process of the run is then in it.
        for path in spec["cgroup_procs"]:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
    except OSError as exc:
        _write_status(status_fd, {"error": f"joining the run's cgroup failed: {exc}"})
        os._exit(125)
    if spec["cgroup_procs"]:
        applied.append("cgroup")
    try:
        libc.fresh_session_keyring()  # the caller's session keyring stays with the caller
        applied.append("keyring")
    except OSError as exc:
        missing.append(f"keyring: {exc}")
    if spec["uid"] is not None:
        applied.append("uid")
    wanted = [
        ("mountns", _CLONE_NEWNS),
        ("netns", _CLONE_NEWNET),
        ("pidns", _CLONE_NEWPID),
        ("ipcns", _CLONE_NEWIPC),
        ("utsns", _CLONE_NEWUTS),
    ]
    if spec["namespaces"]:
        if os.geteuid() != 0:
            # Unprivileged: a user namespace grants the capabilities to create the others.
            uid, gid = os.getuid(), os.getgid()
            try:
                libc.unshare(_CLONE_NEWUSER)
                for path, text in (
                    ("/proc/self/setgroups", "deny"),
                    ("/proc/self/uid_map", f"{uid} {uid} 1"),
                    ("/proc/self/gid_map", f"{gid} {gid} 1"),
                ):
                    with open(path, "w") as f:
                        f.write(text)
                applied.append("userns")
            except OSError as exc:
                missing.append(f"userns: {exc}")
        all_flags = 0
        for _, flag in wanted:
            all_flags |= flag
        try:
            libc.unshare(all_flags)
            applied.extend(name for name, _ in wanted)
        except OSError:
            for name, flag in wanted:  # get what we can, and say what failed
                try:
                    libc.unshare(flag)
                    applied.append(name)
                except OSError as exc:
                    missing.append(f"{name}: {exc}")
    else:
        missing.extend(f"{name}: namespaces disabled" for name, _ in wanted)
    spec["missing"] = missing
    # No network namespace: fall back to the (weak) in-interpreter audit hook.
    spec["audit_hook"] = "netns" not in applied
    if spec["audit_hook"]:
        spec["argv"] = spec["audit_argv"]
    if spec["require_isolation"]:
        needed = {"netns", "mountns", "pidns"} | ({"uid"} if os.geteuid() == 0 else {"userns"})
        absent = needed - set(applied)
        if absent:
            _write_status(
                status_fd,
                {"error": f"required isolation unavailable: {sorted(absent)}; {missing}"},
            )
            os._exit(125)
    pid = os.fork()
    if pid == 0:
        _init_stage(libc, spec, status_fd, applied)
    _wait(pid)
    if spec["uid"] is not None and "keyring" in applied:
        # Teardown: leave nothing in the uid's keyrings (a killed run is cleared by the caller).
        # Boot itself becomes the uid (it exits next): after the pid namespace's init has
        # exited, this process can no longer fork.
        with contextlib.suppress(OSError):
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
            libc.clear_user_keyrings()
    os._exit(0)


def _wait(pid: int) -> None:
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except InterruptedError:
            continue
