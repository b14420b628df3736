"""The sandbox's seccomp deny list, observed from inside: the filter program decides every
call, its numbers match the kernel headers, each denied call fails inside while normal
programs still run, and no nested namespaces or capabilities are reachable. Split from
test_sandbox_hardening; tests that need root or a particular machine skip with a reason (and
fail in CI, see sandbox_support).
"""

from __future__ import annotations

import errno
import re
import sys
from pathlib import Path

import pytest
from sandbox_support import (
    MACHINE,
    SYSCALL,
    ex,
    inside,
    needs,
    needs_full_isolation,
    needs_seccomp,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.sandbox import (
    code_reward,
)
from gspo.sandbox import seccomp as sandbox_seccomp

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


# --------------------------------------------------------------------------------------------
# seccomp
# --------------------------------------------------------------------------------------------


def test_seccomp_filter_program_decides_every_call() -> None:
    """The BPF program, interpreted: denied calls EPERM, clone3 ENOSYS, clone with namespace
    flags EPERM, other calls allowed, a foreign ABI killed; on both architectures."""
    for machine, arch in sandbox_seccomp.AUDIT_ARCH.items():
        program = sandbox_seccomp.build_filter(machine)
        assert program is not None and len(program) < 200
        run = sandbox_seccomp.run_filter
        denied = sandbox_seccomp.denied_syscalls(machine)
        for name in (
            "keyctl",
            "add_key",
            "request_key",
            "unshare",
            "mount",
            "memfd_create",
            "bpf",
            "ptrace",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "perf_event_open",
            "setns",
            "shmget",
            "userfaultfd",
        ):
            assert run(program, denied[name], arch) == 0x00050000 | errno.EPERM, (machine, name)
        assert run(program, sandbox_seccomp.CLONE3, arch) == 0x00050000 | errno.ENOSYS
        clone = sandbox_seccomp.CLONE[machine]
        assert run(program, clone, arch, 0x10000000 | 17) == 0x00050000 | errno.EPERM  # NEWUSER
        assert run(program, clone, arch, 0x40000000) == 0x00050000 | errno.EPERM  # NEWNET
        assert run(program, clone, arch, 0x003D0F00) == 0x7FFF0000  # pthread_create's flags
        allowed = {0, 1, 2, 3, 9, 59, 60, 231} - set(denied.values())  # read, write, ...
        assert all(run(program, nr, arch) == 0x7FFF0000 for nr in allowed)
        assert run(program, 0, 0x40000003) == 0x80000000  # i386: kill
    x86 = sandbox_seccomp.build_filter("x86_64")
    assert sandbox_seccomp.run_filter(x86, 0x40000000 | 1, 0xC000003E) == 0x80000000  # x32
    assert sandbox_seccomp.build_filter("riscv64") is None


def test_seccomp_numbers_match_the_kernel_headers() -> None:
    header = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    needs(header.exists(), f"needs the x86_64 kernel headers ({header})")
    table = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+) (\d+)", header.read_text())}
    for name, number in sandbox_seccomp.denied_syscalls("x86_64").items():
        assert table[name] == number, name
    assert table["clone"] == sandbox_seccomp.CLONE["x86_64"] and table["clone3"] == 435


def test_each_denied_call_fails_inside() -> None:
    needs_seccomp()
    needs_full_isolation()
    denied = sandbox_seccomp.denied_syscalls(MACHINE)
    clone = sandbox_seccomp.CLONE[MACHINE]
    code = (
        SYSCALL
        + f"""
denied = {denied!r}
out = {{name: call(nr, 0, 0, 0, 0, 0)[1] for name, nr in denied.items()}}
for name, flag in (("clone_newuser", 0x10000000), ("clone_newns", 0x20000), ("clone_newnet", 0x40000000)):
    r, e = call({clone}, flag | 17, 0, 0, 0, 0)
    if r == 0:
        os._exit(0)  # (the child, were it allowed)
    out[name] = e
out["clone3"] = call(435, 0, 0)[1]
print(json.dumps(out))
"""
    )
    seen = inside(code)
    wrong = {
        k: errno.errorcode.get(v, v) for k, v in seen.items() if v != errno.EPERM and k != "clone3"
    }
    assert wrong == {}, wrong
    assert seen["clone3"] == errno.ENOSYS


def test_normal_programs_still_run() -> None:
    needs_seccomp()
    code = """
    import json, os, subprocess, sys, threading, multiprocessing, tempfile, time, select
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("thread", True)); t.start(); t.join()
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    out["fork"] = os.WEXITSTATUS(os.waitpid(pid, 0)[1])
    out["subprocess"] = subprocess.run([sys.executable, "-S", "-c", "print(6*7)"],
                                       capture_output=True, text=True).stdout.strip()
    out["echo"] = subprocess.run(["/bin/echo", "hi"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * 100000); f.seek(0); out["file"] = len(f.read())
    r, w = os.pipe(); os.write(w, b"p"); out["pipe"] = os.read(r, 1).decode()
    out["seccomp"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0]
    out["sum"] = sum(range(10**6))
    print(json.dumps(out))
    """
    seen = inside(code)
    assert seen == {
        "thread": True,
        "fork": 7,
        "subprocess": "42",
        "echo": "hi",
        "file": 100000,
        "pipe": "p",
        "seccomp": "2",
        "sum": 499999500000,
    }
    assert (
        code_reward("```python\ndef f(x):\n    return 2 * x\n```", ex(tests=["assert f(2) == 4"]))
        == 1.0
    )


# --------------------------------------------------------------------------------------------
# Nested user namespaces and netfilter
# --------------------------------------------------------------------------------------------


def test_no_nested_namespaces_or_capabilities() -> None:
    needs_seccomp()
    needs_full_isolation()
    code = (
        SYSCALL
        + """
import socket
out = {}
for name, flags in (("user", 0x10000000), ("net", 0x40000000), ("user+net", 0x50000000)):
    out[name] = errno.errorcode.get(libc.unshare(flags) and ctypes.get_errno(), "made")
out["setns"] = errno.errorcode[call(308 if os.uname().machine == "x86_64" else 268, 0, 0)[1]]
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapEff", "CapPrm", "CapBnd", "CapAmb"))]
out["caps"] = [int(c, 16) for c in caps]
# Netfilter needs CAP_NET_ADMIN in the namespace owning the netns: a rule change is refused.
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
    s.bind((0, 0))
    import struct
    # nfnetlink NFNL_SUBSYS_NFTABLES (10) NFT_MSG_NEWTABLE (0), with NLM_F_REQUEST|ACK|CREATE.
    msg = struct.pack("=IHHII", 20, (10 << 8) | 0, 0x1 | 0x4 | 0x400, 1, 0) + struct.pack("=BBH", 2, 0, 0)
    s.sendto(msg, (0, 0))
    reply = s.recv(4096)
    out["netfilter"] = -struct.unpack("=i", reply[16:20])[0]
except OSError as e:
    out["netfilter"] = e.errno
print(json.dumps(out))
"""
    )
    seen = inside(code)
    assert seen["user"] == seen["net"] == seen["user+net"] == "EPERM"
    assert seen["setns"] == "EPERM"
    assert seen["caps"][:2] == [0, 0]  # no effective or permitted capability
    assert seen["netfilter"] in (
        errno.EPERM,
        errno.EACCES,
        errno.EAFNOSUPPORT,
        errno.EPROTONOSUPPORT,
    )
