"""The test harness inside the sandbox: :mod:`gspo.envs.sandbox.harness` sends this file's
text as the run's program (``main.py``); the package never imports it.

Two kinds of process, so that nothing the solution runs can reach a verdict:

* the **judge** (this program) holds the tests, the result channel and the per-test limits.
  It makes itself non-dumpable first, so another process of the same uid can open none of
  its ``/proc`` files (memory, descriptors) and ptrace is refused besides by seccomp. It
  never runs the solution's code: assert tests run here, with the solution's functions
  bound to proxies that send plain values (:func:`encode`) to a worker and get plain values
  back, so frame walking, patched builtins or serializers, always-equal objects and
  ``sys.exit`` in the solution meet nothing of the judge's;
* **workers**, fresh interpreters (``-c`` this source, never a fork of the judge, which
  would copy the tests into them) that run the solution: one per stdin/stdout test, and one
  for the assert and call tests, started again after a test kills it.

Per-test CPU time is the run's cgroup CPU counter (every process and thread of the run),
read by the judge through a descriptor the caller passed in, so no timer, signal mask,
child or thread of the solution changes it; without a cgroup, the worker's own CPU clock
(its threads, not its children). Each test also has a wall-clock limit, ``wall_s``
(:func:`gspo.envs.sandbox.harness.test_wall_s`). A test over either limit fails and every
process of the test is killed (the whole pid namespace but the judge, when there is one).
"""

import builtins
import contextlib
import io
import json
import os
import stat
import sys
import time

# select, signal and subprocess are imported by the judge only (Judge.__init__): a worker
# starts once per stdin test, and its imports are part of every test's time.

MAX_MESSAGE = 8 << 20  # a value passed between judge and worker, as JSON
_HEADER = 8


class TestTimeout(BaseException):
    pass


class WorkerGone(Exception):
    pass


# --- plain values between judge and worker -----------------------------------------------


def encode(value):
    """A JSON form of a plain value (exact builtin types only: a subclass could carry an
    ``__eq__`` of the solution's); TypeError for anything else."""
    kind = type(value)
    if value is None or kind in (bool, int, str, float):
        return value
    if kind is list:
        return [encode(v) for v in value]
    if kind is tuple:
        return {"t": [encode(v) for v in value]}
    if kind is dict:
        return {"d": [[encode(k), encode(v)] for k, v in value.items()]}
    if kind is set:
        return {"s": [encode(v) for v in value]}
    if kind is frozenset:
        return {"f": [encode(v) for v in value]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    raise TypeError(f"a {kind.__name__} cannot pass between the tests and the solution")


def decode(data):
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    ((tag, body),) = data.items()
    if tag == "t":
        return tuple(decode(v) for v in body)
    if tag == "d":
        return {decode(k): decode(v) for k, v in body}
    if tag == "s":
        return {decode(v) for v in body}
    if tag == "f":
        return frozenset(decode(v) for v in body)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "c":
        return complex(*body)
    raise ValueError(f"unknown value tag {tag!r}")


def send(fd, message):
    data = json.dumps(message).encode()
    data = len(data).to_bytes(_HEADER, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def read_exact(fd, n, wait=None):
    chunks = []
    while n:
        if wait is not None:
            wait(fd)
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise WorkerGone("the solution's process ended")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive(fd, wait=None):
    size = int.from_bytes(read_exact(fd, _HEADER, wait), "big")
    if size > MAX_MESSAGE:
        raise WorkerGone(f"a value over {MAX_MESSAGE} bytes")
    return json.loads(read_exact(fd, size, wait))


def describe(exc):
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:500] + "..."


# --- the worker -------------------------------------------------------------------------


def load(init, namespace):
    """Run the setup and the solution in ``namespace``; the names the solution defined."""
    source = init["code"]
    try:
        code = compile(source, "solution.py", "exec")
    except SyntaxError:
        if not (init["setup"] and source[:1] in (" ", "\t")):
            raise
        # A function body alone: a base model continuing HumanEval's prompt (the setup).
        code = compile(init["setup"] + source, "solution.py", "exec")
    exec(compile(init["setup"], "<setup>", "exec"), namespace)
    before = dict(namespace)
    exec(code, namespace)
    defined = {}
    for name, value in namespace.items():
        if name.startswith("__") or before.get(name, before) is value:
            continue
        if callable(value):
            defined[name] = "call"
        else:
            try:  # modules and other objects stay the solution's own
                encode(value)
                defined[name] = "value"
            except (TypeError, ValueError, RecursionError):
                pass
    return defined


def stdio_test(init, text):
    """In a fresh fork: the input on fd 0 and the output on fd 1 are files (as in a real run:
    ``open(0)``, ``sys.stdin.buffer`` and ``os.write(1, ...)`` all work), then the program."""
    for name in ("stdin.txt", "stdout.txt"):  # made anew: a FIFO or link may be left there
        if os.path.lexists(name):
            os.unlink(name)
    with open("stdin.txt", "w", encoding="utf-8") as f:
        f.write(text)
    for path, flags, target in (
        ("stdin.txt", os.O_RDONLY, 0),
        ("stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 1),
    ):
        fd = os.open(path, flags, 0o600)
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    try:
        load(init, {"__name__": "__main__", "__builtins__": builtins})
        status = 0
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    # What the interpreter's exit does, without its slow teardown of every module: join the
    # threads the program started, run its atexit functions, flush.
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException:
        status = status or 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 1
    return status


def exit_status(exc):
    """The exit status the interpreter gives ``SystemExit(code)``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def worker(req, resp):
    builtins.exit = builtins.quit = sys.exit  # missing under python -S; solutions use them
    sys.argv = ["solution.py"]
    init = receive(req)
    if init["kind"] == "stdio":
        # A fork server: each test runs in a fork of this process, which never runs the
        # solution itself, so every test starts from the same clean state, without the cost
        # of an interpreter start.
        while True:
            try:
                request = receive(req)
            except WorkerGone:
                return
            pid = os.fork()
            if pid == 0:
                os.close(req)
                os.close(resp)
                os._exit(stdio_test(init, request["input"]))
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            send(resp, {"status": status})
    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        defined = load(init, namespace)
        target = None
        if init["kind"] == "call":
            name = init["func_name"]
            cls = namespace.get("Solution")
            target = (
                getattr(cls(), name)
                if isinstance(cls, type) and hasattr(cls, name)
                else namespace[name]
            )
        reply = {"defined": defined}
    except BaseException as exc:
        reply = {"exc": ["load", describe(exc)]}
    send(resp, reply)
    while True:
        try:
            request = receive(req)
        except WorkerGone:  # the judge is done with this worker
            return
        try:
            if request["op"] == "target":
                value = target(*request["args"])
                text = json.dumps(value, default=repr)
                reply = {"json": text}
            elif request["op"] == "get":
                reply = {"value": encode(namespace[request["name"]])}
            else:
                fn = namespace[request["name"]]
                value = fn(*decode(request["args"]), **decode(request["kwargs"]))
                reply = {"value": encode(value)}
        except BaseException as exc:
            reply = {"exc": [type(exc).__name__, str(exc)[:500]]}
        sys.stdout.flush()
        send(resp, reply)


# --- the judge ---------------------------------------------------------------------------


class Judge:
    def __init__(self, cfg, source, first):
        self.cfg = cfg
        self.limit = cfg["timeout_s"]
        self.wall = cfg["wall_s"]
        self.out = os.fdopen(int(os.environ.pop("GSPO_RESULT_FD")), "w", encoding="utf-8")
        cpu_fd = os.environ.pop("GSPO_CPU_FD", None)
        self.cpu_fd = int(cpu_fd) if cpu_fd else None
        self.cpu_scale = 1e-9 if os.environ.pop("GSPO_CPU_UNIT", "") == "ns" else 1e-6
        worker_source = source
        if os.environ.pop("GSPO_AUDIT_HOOK", None):
            worker_source = cfg["audit_hook"] + "\n" + source
        flags = ["-I", "-B"] + (["-S"] if sys.flags.no_site else [])
        self.argv = [sys.executable, *flags, "-c", worker_source, "worker"]
        # In a pid namespace (the judge is init's only child) every process but init and the
        # judge belongs to the solution; without one, only the worker's process group.
        self.own_pidns = os.getpid() == 2 and os.getppid() == 1
        global select, signal, subprocess
        import select
        import signal
        import subprocess

        self.proc = None
        self.first = first
        self.start_cpu = 0.0
        self.deadline = 0.0

    def report(self, i, ok, **fields):
        record = {"nonce": self.cfg["nonce"], "i": i, "ok": ok, **fields}
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.out.flush()

    def cpu(self):
        if self.cpu_fd is not None:
            text = os.pread(self.cpu_fd, 4096, 0).decode()
            if self.cpu_scale == 1e-6:  # cgroup v2 cpu.stat
                text = text.split("usage_usec", 1)[1].split()[0]
            return int(text) * self.cpu_scale
        if self.proc is None:
            return time.process_time()
        try:
            clock = time.clock_getcpuclockid(self.proc.pid)
            return time.process_time() + time.clock_gettime(clock)
        except OSError:
            return time.process_time()

    def begin(self):
        self.start_cpu = self.cpu()
        self.deadline = time.monotonic() + self.wall

    def check(self):
        if self.cpu() - self.start_cpu > self.limit:
            raise TestTimeout(f"over the {self.limit:g} s CPU time limit")
        if time.monotonic() > self.deadline:
            raise TestTimeout(f"over the {self.wall:g} s wall-clock limit")

    def wait(self, fd):
        while True:
            self.check()
            left = self.deadline - time.monotonic()
            if select.select([fd], [], [], max(0.0, min(left, 0.01)))[0]:
                return

    def kill(self):
        if self.own_pidns:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
        elif self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for fd in self.fds:
                os.close(fd)
            self.proc = None

    def spawn(self):
        if self.first is not None:  # forked before the tests were read: no start-up cost
            self.proc, self.fds = self.first[0], self.first[1:]
            self.first = None
        else:
            req_r, req_w = os.pipe()
            resp_r, resp_w = os.pipe()
            self.proc = subprocess.Popen(
                [*self.argv, str(req_r), str(resp_w)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(req_r, resp_w),
                start_new_session=True,
                cwd=os.getcwd(),
            )
            os.close(req_r)
            os.close(resp_w)
            self.fds = [req_w, resp_r]
        req_w, resp_r = self.fds
        send(req_w, {k: self.cfg[k] for k in ("code", "setup", "kind", "func_name")})
        return req_w, resp_r

    def request(self, message):
        if self.proc is None:
            raise WorkerGone("the solution's process ended in an earlier test")
        try:
            send(self.fds[0], message)
            reply = receive(self.fds[1], self.wait)
        except (WorkerGone, OSError):
            self.kill()
            raise WorkerGone("the solution's process ended") from None
        if "exc" in reply:
            name, text = reply["exc"]
            cls = getattr(builtins, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception):
                raise cls(text)
            raise RuntimeError(f"{name}: {text}")
        return reply

    def start_worker(self):
        """A worker with the solution loaded (its own CPU and wall limits); its names."""
        self.spawn()
        self.begin()
        try:
            reply = receive(self.fds[1], self.wait)
            self.check()
        except (TestTimeout, WorkerGone, OSError, ValueError) as exc:
            self.kill()
            raise RuntimeError("loading the solution failed: " + describe(exc)) from None
        if "exc" in reply:
            self.kill()
            raise RuntimeError("loading the solution failed: " + reply["exc"][1])
        return reply["defined"]

    def run_rpc(self, cases):
        cfg = self.cfg
        namespace = {"__name__": "tests", "__builtins__": builtins}
        try:
            defined = self.start_worker()
            exec(compile(cfg["setup"], "<setup>", "exec"), namespace)
            own = set(namespace)
            entry = cfg["entry_point"]
            names = {n: k for n, k in defined.items() if not (entry and n in own)}
            if entry:
                names[entry] = "call"
            self.begin()
            for name, kind in names.items():
                if kind == "call":
                    namespace[name] = self.proxy(name)
                else:
                    namespace[name] = decode(self.request({"op": "get", "name": name})["value"])
            exec(compile(cfg["test_setup"], "<test setup>", "exec"), namespace)
        except BaseException as exc:
            for i in range(len(cases)):
                self.report(i, False, error=describe(exc))
            return
        for i, case in enumerate(cases):
            try:
                if self.proc is None:
                    self.start_worker()
                self.begin()
                if cfg["kind"] == "call":
                    text = self.request({"op": "target", "args": case})["json"]
                    self.check()
                    self.report(i, True, json=text)
                else:
                    exec(compile(case, f"<test {i}>", "exec"), namespace)
                    self.check()
                    self.report(i, True)
            except TestTimeout as exc:
                self.kill()
                self.report(i, False, error=str(exc))
            except BaseException as exc:
                self.report(i, False, error=describe(exc))
        self.kill()

    def proxy(self, name):
        def call(*args, **kwargs):
            message = {"op": "call", "name": name, "args": encode(list(args))}
            message["kwargs"] = encode(kwargs)
            return decode(self.request(message)["value"])

        call.__name__ = call.__qualname__ = name
        return call

    def run_stdio(self, cases):
        for i, text in enumerate(cases):
            error = value = None
            try:
                if self.proc is None:
                    self.spawn()
                self.begin()
                status = self.request({"op": "stdio", "input": text})["status"]
                self.check()
                value = self.output()
                if status != 0:
                    error = f"exit status {status}"
            except TestTimeout as exc:
                self.kill()
                error = str(exc)
            except BaseException as exc:
                error = describe(exc)
            self.report(i, error is None, value=value if error is None else None, error=error)
        self.kill()

    def output(self):
        """The test's whole stdout, or TestTimeout's failure past the cap (not cut short)."""
        cap = self.cfg["output_bytes"]
        fd = os.open("stdout.txt", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("stdout.txt is not a file")
            data = bytearray()
            while len(data) <= cap:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        if len(data) > cap:
            raise TestTimeout(f"output over the {cap} byte limit")
        return data.decode("utf-8", "replace")


class Forked:
    """A worker forked by the judge (the interface of ``subprocess.Popen`` used here)."""

    def __init__(self, pid):
        self.pid = pid
        self.reaped = False

    def kill(self):
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, 9)

    def wait(self):
        if not self.reaped:
            os.waitpid(self.pid, 0)
            self.reaped = True


def fork_first_worker():
    """The first worker, forked before the judge reads the tests (so it holds nothing of
    them) and before it becomes non-dumpable; it drops the judge's descriptors at once."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.close(req_w)
            os.close(resp_r)
            for name in ("GSPO_RESULT_FD", "GSPO_CPU_FD"):
                fd = os.environ.pop(name, "")
                if fd:
                    os.close(int(fd))
            os.environ.pop("GSPO_CPU_UNIT", None)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.close(null)
            worker(req_r, resp_w)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    return Forked(pid), req_w, resp_r


def main():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]))
        return
    # With the audit hook (no namespaces), workers must start with it: none is forked here.
    first = None if os.environ.get("GSPO_AUDIT_HOOK") else fork_first_worker()
    try:  # PR_SET_DUMPABLE 0: no /proc access to the judge for the solution's uid, no core
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except (ImportError, OSError, AttributeError):
        pass
    with open("tests.json", encoding="utf-8") as f:
        cfg = json.load(f)
    os.remove("tests.json")
    with open(sys.argv[0], encoding="utf-8") as f:
        source = f.read()
    judge = Judge(cfg, source, first)
    if cfg["kind"] == "stdio":
        judge.run_stdio(cfg["cases"])
    else:
        judge.run_rpc(cfg["cases"])
    judge.out.close()


if __name__ == "__main__":
    main()
