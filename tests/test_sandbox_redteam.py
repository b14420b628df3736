"""The sandbox against a third, red-team round (after issue 34's fixes): attacks written as a
hostile policy's solutions. Fixed ones are asserted as fixed; contained ones whose only check
was the filter's interpreter are observed from inside; the gaps it found are closed
and asserted as such (docs/sandbox.md, "What is not guaranteed", lists what remains)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from sandbox_support import (
    MACHINE,
    SYSCALL,
    ex,
    needs_full_isolation,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.sandbox import SandboxConfig, code_reward, run_python, seccomp

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def run(code: str) -> object:
    return run_python(textwrap.dedent(code), config=SandboxConfig(timeout_s=20))


def test_host_writeback_is_refused() -> None:
    # sync(2) flushes every host file system and syncfs(2) a bound one: host I/O a run could
    # force in a loop. Both used to succeed.
    needs_full_isolation()
    sync, syncfs = {"x86_64": (162, 306), "aarch64": (81, 267)}[MACHINE]
    result = run(
        SYSCALL
        + f"""
fd = os.open("/usr", os.O_RDONLY)
print(json.dumps([call({sync})[1], call({syncfs}, fd)[1]]))
"""
    )
    assert result.ok, result.stderr[-2000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [errno.EPERM, errno.EPERM]


@pytest.mark.skipif(MACHINE != "x86_64", reason="x32 and i386 entries exist on x86_64 only")
def test_other_x86_abis_kill_the_process() -> None:
    # socket(2) through the x32 numbering, and getpid through the i386 `int 0x80` entry (code
    # mapped below 4 GiB), would each bypass checks written for x86_64 numbers: the filter's
    # architecture check kills the process first (SIGSYS), as observed here from inside.
    needs_full_isolation()
    x32 = run(SYSCALL + "call(41 | 0x40000000, 2, 1, 0)\nprint('survived')")
    assert x32.returncode == -signal.SIGSYS and "survived" not in x32.stdout
    i386 = run(
        """
        import ctypes
        libc = ctypes.CDLL(None)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        page = libc.mmap(None, 4096, 7, 0x22 | 0x40, -1, 0)  # rwx, private anon, MAP_32BIT
        code = b"\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3"  # mov eax, 20; int 0x80; ret
        ctypes.memmove(page, code, len(code))
        ctypes.CFUNCTYPE(ctypes.c_long)(page)()
        print("survived")
        """
    )
    assert i386.returncode == -signal.SIGSYS and "survived" not in i386.stdout


# Gaps of this round closed by issue 47 (tests/test_sandbox_judge.py has the other forms).

ASSERT_ROW = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}


def test_assert_tests_cannot_be_forged_from_the_harness_frames() -> None:
    needs_full_isolation()
    forge = """
import json, os, sys
frame = sys._getframe()
while "nonce" not in frame.f_locals:
    frame = frame.f_back
h = frame.f_locals
for i in range(len(h["cases"])):
    h["out"].write(json.dumps({"nonce": h["nonce"], "i": i, "ok": True}) + "\\n")
h["out"].flush()
os._exit(0)
"""
    assert code_reward(forge, ex(**ASSERT_ROW)) == 0.0


def test_a_test_cannot_use_more_than_its_cpu_limit() -> None:
    # 0.6 s of CPU in one test with a 0.3 s limit, the in-process timer switched off: the
    # run's cgroup counter, read per test by the judge, fails the test all the same.
    needs_full_isolation()
    slow = """
import signal, time
signal.setitimer(signal.ITIMER_PROF, 0)
end = time.process_time() + 0.6
while time.process_time() < end:
    pass
a, b = map(int, input().split())
print(a + b)
"""
    row = ex(inputs=["1 2\n", "3 4\n"], outputs=["3", "7"])
    assert code_reward(slow, row, test_timeout_s=0.3) < 1.0


def test_core_dumps_are_impossible() -> None:
    # RLIMIT_CORE of exactly 1 byte is what stops a piped core_pattern (a root helper on the
    # host); 0 does not. The hard limit stays: the program cannot raise it.
    needs_full_isolation()
    result = run(
        """
        import json, resource
        limits = list(resource.getrlimit(resource.RLIMIT_CORE))
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (2, 2))
            raised = False
        except (ValueError, OSError):
            raised = True
        print(json.dumps([limits, raised]))
        """
    )
    assert json.loads(result.stdout.splitlines()[-1]) == [[1, 1], True]


def test_page_cache_probes_and_huge_pages_are_refused() -> None:
    # preadv2/pwritev2 with RWF_NOWAIT tell whether a bound host file is in the page cache
    # (a channel between runs without timing); MAP_HUGETLB takes uncharged host huge pages.
    # Both fail with EPERM; the same calls without the flag work.
    needs_full_isolation()
    result = run(
        """
        import errno, json, mmap, os
        out = []
        fd = os.open(os.__file__, os.O_RDONLY)
        for flags in (os.RWF_NOWAIT, 0):
            try:
                out.append(os.preadv(fd, [bytearray(16)], 0, flags))
            except OSError as exc:
                out.append(errno.errorcode[exc.errno])
        w = os.open("scratch", os.O_RDWR | os.O_CREAT)
        try:
            os.pwritev(w, [b"x"], 0, os.RWF_NOWAIT)
            out.append("written")
        except OSError as exc:
            out.append(errno.errorcode[exc.errno])
        try:
            mmap.mmap(-1, 2 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000)
            out.append("mapped")
        except OSError as exc:
            out.append(errno.errorcode[exc.errno])
        print(json.dumps(out))
        """
    )
    assert json.loads(result.stdout.splitlines()[-1]) == ["EPERM", 16, "EPERM", "EPERM"]


@pytest.mark.parametrize("machine", sorted(seccomp.AUDIT_ARCH))
def test_filter_checks_the_flag_arguments(machine: str) -> None:
    program = seccomp.build_filter(machine)
    assert program is not None
    arch = seccomp.AUDIT_ARCH[machine]
    allow, eperm = 0x7FFF0000, 0x00050000 | errno.EPERM
    for nr in seccomp.RWV2[machine]:
        assert seccomp.run_filter(program, nr, arch, arg5=seccomp.RWF_NOWAIT) == eperm
        assert seccomp.run_filter(program, nr, arch, arg5=0) == allow
    mmap_nr = seccomp.MMAP[machine]
    assert seccomp.run_filter(program, mmap_nr, arch, arg3=0x22 | seccomp.MAP_HUGETLB) == eperm
    assert seccomp.run_filter(program, mmap_nr, arch, arg3=0x22) == allow


def test_only_the_interpreters_files_are_visible_under_usr() -> None:
    # Another Python bundled under /usr (an SDK's in /usr/lib/NAME, a /usr/local install, the
    # distribution's when another interpreter runs) used to run inside with its own packages
    # importable: /usr was bound whole. Planted here as a package directory of each kind;
    # inside, none exists, the distribution's interpreter cannot start, and the run's own
    # interpreter and the system's programs (/usr/bin) still work.
    needs_full_isolation()
    tops = [Path(f"{base}/gspo-test-{os.getpid()}") for base in ("/usr/lib", "/usr/local/lib")]
    tops.append(Path(f"/usr/share/gspo-test-{os.getpid()}"))
    planted = [tops[0] / "python" / "site-packages", tops[1] / "site-packages", tops[2]]
    distribution_python = "/usr/bin/python3"
    other = os.path.exists(distribution_python) and os.path.realpath(
        distribution_python
    ) != os.path.realpath(sys.executable)
    try:
        for path in planted:
            path.mkdir(parents=True)
            (path / "planted_gspo.py").write_text("SECRET = 1\n")
        result = run(
            f"""
            import json, os, subprocess, sys
            out = {{"seen": [p for p in {[str(p) for p in planted]!r} if os.path.exists(p)]}}
            if {other!r}:
                out["other"] = subprocess.run(
                    [{distribution_python!r}, "-S", "-c", "print(1)"], capture_output=True
                ).returncode
            out["echo"] = subprocess.run(["/bin/echo", "hi"], capture_output=True).stdout
            out["echo"] = out["echo"].decode().strip()
            out["own"] = sys.version_info[:2] == {tuple(sys.version_info[:2])!r}
            print(json.dumps(out))
            """
        )
    finally:
        for top in tops:
            shutil.rmtree(top, ignore_errors=True)
    assert result.ok, result.stderr[-2000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen.pop("seen") == []
    assert seen.pop("other", 1) != 0
    assert seen == {"echo": "hi", "own": True}
