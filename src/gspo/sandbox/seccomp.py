"""A seccomp filter for sandboxed programs: a classic BPF program assembled here.

Denies the system calls that the sandbox's threat model (``docs/sandbox.md``) names: kernel
keyrings, new namespaces (unshare, setns, clone with namespace flags), mounts, memfd, SysV
shared memory and message queues, bpf, ptrace and cross-process memory access, io_uring,
perf_event_open, userfaultfd, kernel modules, kexec, and the clock / host / swap / reboot
calls; host-wide kernel pools (AIO, message queues, semaphores), inotify, file locks,
host-wide writeback (sync, syncfs), page-cache probes (preadv2/pwritev2 with RWF_NOWAIT) and
huge pages (mmap with MAP_HUGETLB).
Sockets are an allow list: AF_UNIX only. Everything else stays available, so ordinary Python
programs (threads, fork, subprocess, pipes, socketpair) run unchanged.

Why assembled by hand rather than with libseccomp: the filter is installed by the boot stage,
a ``python -I -S`` interpreter that may not be the caller's (``SandboxConfig.python``) and sees
no site-packages, so it must use the standard library only; a deny list of ~70 numbers is a
short, fully tested program. Supported: x86_64 and aarch64 (other machines get no filter, and
the run reports ``seccomp`` missing). The architecture is checked first; a call made through
another ABI (i386 ``int 0x80`` or x32 on x86_64) kills the process.

Pure data + one ``prctl``: importing this module has no side effects.
"""

from __future__ import annotations

import ctypes
import errno
import struct

# Denied with EPERM. Numbers from the kernel's unistd tables (asm/unistd_64.h for x86_64,
# asm-generic/unistd.h for aarch64); tests/test_sandbox_seccomp.py checks the x86_64 ones
# against the installed header when it is present.
DENIED_EPERM: dict[str, tuple[int, int]] = {
    # name: (x86_64, aarch64)
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "mount_setattr": (442, 442),
    "memfd_create": (319, 279),
    "memfd_secret": (447, 447),
    "shmget": (29, 194),
    "msgget": (68, 186),
    "bpf": (321, 280),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "kcmp": (312, 272),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "fanotify_init": (300, 262),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "acct": (163, 89),
    "quotactl": (179, 60),
    "syslog": (103, 116),
    "lookup_dcookie": (212, 18),
    "vhangup": (153, 58),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "adjtimex": (159, 171),
    "clock_adjtime": (305, 266),
    "sethostname": (170, 161),
    "setdomainname": (171, 162),
    # Host-wide kernel pools and host observation (docs/sandbox.md, "Shared kernel pools"):
    # the AIO context pool (fs.aio-max-nr) is one per host, so a run holding it makes every
    # io_setup on the host fail; POSIX message queues and SysV semaphores are refused as a
    # rule even inside the private IPC namespace (nothing a test program needs). inotify on
    # the read-only bound directories would see the trainer's and other runs' file opens;
    # flock (and the fcntl locks, below) on those shared files would be a channel between
    # concurrent runs.
    "io_setup": (206, 0),
    "mq_open": (240, 180),
    "semget": (64, 190),
    "inotify_init1": (294, 26),
    "inotify_add_watch": (254, 27),
    "flock": (73, 32),
    # sync writes back every dirty page of every host file system (the trainer's checkpoints
    # among them) and syncfs that of a bound one's: host I/O a run could force in a loop. The
    # run's own files are on a tmpfs, where neither does anything.
    "sync": (162, 81),
    "syncfs": (306, 267),
}
# x86_64 only (no aarch64 equivalent).
DENIED_EPERM_X86_64: dict[str, int] = {"iopl": 172, "ioperm": 173, "inotify_init": 253}
# socket(2) and socketpair(2) succeed only for these address families (arg0): an allow list,
# so families nobody thought of (AF_VSOCK, whose port space is the host's; AF_NETLINK, whose
# NETLINK_KOBJECT_UEVENT delivers the host's uevents; AF_PACKET, AF_ALG, ...) are refused with
# EAFNOSUPPORT, as if the kernel lacked them. AF_UNIX covers socketpair, asyncio and
# multiprocessing; the run's network namespace has no usable interface, so AF_INET/AF_INET6
# would only add kernel surface.
SOCKET = {"x86_64": 41, "aarch64": 198}
SOCKETPAIR = {"x86_64": 53, "aarch64": 199}
ALLOWED_SOCKET_FAMILIES = {"AF_UNIX": 1}
# fcntl(2) commands refused with EPERM: record locks (classic and open-file-description ones,
# and the F_GETLK that reads them), leases and dnotify. Locks and leases on the files bound
# read-only from the host would cross runs; dnotify is inotify's older form.
FCNTL = {"x86_64": 72, "aarch64": 25}
DENIED_FCNTL_COMMANDS = {
    "F_GETLK": 5,
    "F_SETLK": 6,
    "F_SETLKW": 7,
    "F_OFD_GETLK": 36,
    "F_OFD_SETLK": 37,
    "F_OFD_SETLKW": 38,
    "F_SETLEASE": 1024,
    "F_GETLEASE": 1025,
    "F_NOTIFY": 1026,
}
# preadv2 / pwritev2 with RWF_NOWAIT (flags, arg5) fail with EAGAIN exactly when the data is
# not in the page cache: a channel between runs through the bound host files, without timing.
# Refused (EPERM); the calls without that flag stay.
RWV2 = {"x86_64": (327, 328), "aarch64": (286, 287)}
RWF_NOWAIT = 0x08
# mmap with MAP_HUGETLB (flags, arg3) takes pages from the host's huge-page pool, which the
# run's memory cgroup does not charge: refused (EPERM).
MMAP = {"x86_64": 9, "aarch64": 222}
MAP_HUGETLB = 0x40000
# clone3 passes its flags in a struct the filter cannot read: ENOSYS makes glibc fall back to
# clone (threads, posix_spawn), whose flags the filter does check.
CLONE3 = 435
CLONE = {"x86_64": 56, "aarch64": 220}
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NAMESPACE_FLAGS |= 0x20000000 | 0x40000000

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
# struct seccomp_data: nr, arch, then 64-bit arguments; the low word of each (little endian)
# is what the kernel reads for the int arguments checked here (family, fcntl command).
_OFF_NR, _OFF_ARCH, _OFF_ARG0, _OFF_ARG1, _OFF_ARG3, _OFF_ARG5 = 0, 4, 16, 24, 40, 56

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def denied_syscalls(machine: str) -> dict[str, int]:
    """Names and numbers of the calls that fail with EPERM on ``machine`` (``os.uname()``)."""
    column = {"x86_64": 0, "aarch64": 1}[machine]
    numbers = {name: pair[column] for name, pair in DENIED_EPERM.items()}
    if machine == "x86_64":
        numbers.update(DENIED_EPERM_X86_64)
    return numbers


def build_filter(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The filter as (code, jt, jf, k) instructions; None for an unsupported machine."""
    if machine not in AUDIT_ARCH:
        return None
    denied = sorted(set(denied_syscalls(machine).values()))
    # Assembled with symbolic targets, resolved once the layout is known.
    program: list[tuple[int, object, object, int]] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 0, "kill", AUDIT_ARCH[machine]),
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if machine == "x86_64":
        program.append((_JGE_K, "kill", 0, _X32_SYSCALL_BIT))
    program += [(_JEQ_K, "eperm", 0, nr) for nr in denied]
    program += [
        (_JEQ_K, "enosys", 0, CLONE3),
        (_JEQ_K, "clone", 0, CLONE[machine]),
        (_JEQ_K, "socket", 0, SOCKET[machine]),
        (_JEQ_K, "socket", 0, SOCKETPAIR[machine]),
        (_JEQ_K, "rwv2", 0, RWV2[machine][0]),
        (_JEQ_K, "rwv2", 0, RWV2[machine][1]),
        (_JEQ_K, "mmap", 0, MMAP[machine]),
        (_JEQ_K, "fcntl", "allow", FCNTL[machine]),
    ]
    labels = {"rwv2": len(program)}
    program += [(_LD_W_ABS, 0, 0, _OFF_ARG5), (_JSET_K, "eperm", "allow", RWF_NOWAIT)]
    labels["mmap"] = len(program)
    program += [(_LD_W_ABS, 0, 0, _OFF_ARG3), (_JSET_K, "eperm", "allow", MAP_HUGETLB)]
    labels["clone"] = len(program)
    program += [
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
        (_JSET_K, "eperm", "allow", CLONE_NAMESPACE_FLAGS),
    ]
    labels["socket"] = len(program)
    program.append((_LD_W_ABS, 0, 0, _OFF_ARG0))
    program += [(_JEQ_K, "allow", 0, f) for f in sorted(ALLOWED_SOCKET_FAMILIES.values())]
    program.append((_JEQ_K, "eafnosupport", "eafnosupport", 0))
    labels["fcntl"] = len(program)
    program.append((_LD_W_ABS, 0, 0, _OFF_ARG1))
    program += [(_JEQ_K, "eperm", 0, cmd) for cmd in sorted(DENIED_FCNTL_COMMANDS.values())]
    program.append((_JEQ_K, "allow", "allow", 0))
    end = len(program)
    labels.update(allow=end, eperm=end + 1, enosys=end + 2, kill=end + 3, eafnosupport=end + 4)
    program += [
        (_RET_K, 0, 0, _RET_ALLOW),
        (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
        (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        (_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_RET_K, 0, 0, _RET_ERRNO | errno.EAFNOSUPPORT),
    ]

    def offset(at: int, target: object) -> int:
        if isinstance(target, int):
            return target  # already relative
        jump = labels[str(target)] - at - 1
        if not 0 <= jump <= 255:  # pragma: no cover - the list would have to be huge
            raise ValueError("seccomp filter too long for a conditional jump")
        return jump

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(program)]


def run_filter(
    program: list[tuple[int, int, int, int]],
    nr: int,
    arch: int,
    arg0: int = 0,
    arg1: int = 0,
    arg3: int = 0,
    arg5: int = 0,
) -> int:
    """Interpret ``program`` on one call (what the kernel would return); for tests."""
    data = {
        _OFF_NR: nr,
        _OFF_ARCH: arch,
        _OFF_ARG0: arg0 & 0xFFFFFFFF,
        _OFF_ARG1: arg1 & 0xFFFFFFFF,
        _OFF_ARG3: arg3 & 0xFFFFFFFF,
        _OFF_ARG5: arg5 & 0xFFFFFFFF,
    }
    pc = acc = 0
    while True:
        code, jt, jf, k = program[pc]
        if code == _LD_W_ABS:
            acc = data[k]
            pc += 1
        elif code == _RET_K:
            return k
        else:
            hit = {_JEQ_K: acc == k, _JGE_K: acc >= k, _JSET_K: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(libc: ctypes.CDLL, machine: str) -> bool:
    """Install the filter on the calling thread (no_new_privs must already be set).

    Returns False on an unsupported machine; raises OSError if the kernel refuses.
    """
    program = build_filter(machine)
    if program is None:
        return False
    raw = b"".join(struct.pack("=HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(program), ctypes.cast(buffer, ctypes.c_void_p))
    result = libc.prctl(
        _PR_SET_SECCOMP,
        ctypes.c_ulong(_SECCOMP_MODE_FILTER),
        ctypes.byref(fprog),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(err, err)}")
    return True
