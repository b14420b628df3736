"""Boot stage of :mod:`gspo.sandbox`: namespaces, filesystem, limits, privilege drop, exec.

Run by the sandbox as ``python -I -S -B -c "...; main()" SPEC`` in a fresh process (as root
when the caller is root), never imported into the caller's process for its side effects. It
uses only the standard library and stays small because every sandboxed run pays its import.
"""

from __future__ import annotations

# Everything is imported up front, not where used: after pivot_root the boot interpreter's own
# library directory may no longer be visible (when the program runs another interpreter).
import contextlib
import json
import os
import resource
import sys
from typing import Any

from gspo.sandbox import seccomp as sandbox_seccomp
from gspo.sandbox.boot_root import _WORKDIR, _build_root, _Libc, _populate_workdir

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38


def _write_status(fd: int, message: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _set_limits(spec: dict[str, Any], nproc: bool) -> None:
    cpu = spec["cpu_s"]
    limits = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # soft: SIGXCPU, hard: SIGKILL
        (resource.RLIMIT_AS, spec["memory_bytes"], spec["memory_bytes"]),
        (resource.RLIMIT_FSIZE, spec["file_bytes"], spec["file_bytes"]),
        (resource.RLIMIT_NOFILE, spec["nofile"], spec["nofile"]),
        # 1 byte, not 0: the kernel skips a piped core_pattern (apport, systemd-coredump: a
        # root helper on the host) only at exactly 1; 0 stops core files, not pipes.
        (resource.RLIMIT_CORE, 1, 1),
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
        channels = {spec["result_fd"], spec["cpu_fd"]} - {None}
        keep = sorted({2, status_fd} | channels)
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
        if spec["cpu_fd"] is not None:
            env["GSPO_CPU_FD"] = str(spec["cpu_fd"])
            env["GSPO_CPU_UNIT"] = spec["cpu_unit"]
        if spec["audit_hook"] and spec["result_fd"] is not None:
            env["GSPO_AUDIT_HOOK"] = "1"  # the harness hooks its workers (run_python's doc)
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
    for key in ("status_fd", "result_fd", "cpu_fd"):
        if spec[key] is not None:
            originals.append(spec[key])
            spec[key] = os.dup(spec[key])
    for fd in originals:
        if fd not in (spec["status_fd"], spec["result_fd"], spec["cpu_fd"]):
            os.close(fd)
    for key in ("result_fd", "cpu_fd"):
        if spec[key] is not None:
            os.set_inheritable(spec[key], True)  # dup() made it close-on-exec
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
