"""The test harness inside the sandbox: :mod:`gspo.sandbox.harness` sends this file's
text as the run's program (``main.py``); the package never imports it.

Two kinds of process, so that nothing the solution runs can reach a verdict:

* the **judge** (this program) holds the tests, the result channel and the per-test limits.
  It makes itself non-dumpable first, so another process of the same uid can open none of
  its ``/proc`` files (memory, descriptors) and ptrace is refused besides by seccomp. It
  never runs the solution's code: assert tests run here, with the solution's functions
  bound to proxies that send plain values (:func:`encode`) to a worker and get plain values
  back, so frame walking, patched builtins or serializers, always-equal objects and
  ``sys.exit`` in the solution meet nothing of the judge's;
* a **worker** that runs the solution: the first forked before the judge reads the tests,
  any later one a fresh interpreter (``-c`` this program; a fork of the judge would copy the
  tests into it), started again after a test kills it. For stdin/stdout tests it is a fork
  server: each test runs in a fork of a worker that never ran the solution.

Per-test CPU time is the run's cgroup CPU counter (every process and thread of the run),
read by the judge through a descriptor the caller passed in, so no timer, signal mask,
child or thread of the solution changes it; without a cgroup, the worker's own CPU clock
(its threads, not its children). Each test also has a wall-clock limit, ``wall_s``
(:func:`gspo.sandbox.harness.test_wall_s`). A test over either limit fails and every
process of the test is killed (the whole pid namespace but the judge, when there is one).
"""

import builtins
import contextlib
import importlib
import json
import os
import stat
import sys
import time

# Not part of the program: harness.py joins judge_worker.py's text and this file's (without
# the lines between these markers) into one program.
# <worker>
from gspo.sandbox.judge_worker import (
    TestTimeout,
    WorkerGone,
    decode,
    describe,
    encode,
    fork_first_worker,
    receive,
    send,
    worker,
)

# </worker>

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
        # Without namespaces, workers install the audit hook before the solution runs.
        self.hook = cfg["audit_hook"] if os.environ.pop("GSPO_AUDIT_HOOK", None) else ""
        flags = ["-I", "-B"] + (["-S"] if sys.flags.no_site else [])
        self.argv = [sys.executable, *flags, "-c", source, "worker"]
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
        init = {k: self.cfg[k] for k in ("code", "setup", "fixture", "kind", "func_name")}
        send(req_w, {**init, "audit_hook": self.hook})
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
            # Never a builtin's name: `def sorted(x): return [1, 2]` would answer the test's
            # own `sorted(f(x)) == [1, 2]`. For HumanEval, the prompt's helpers stay the
            # tests' own: only the entry point is the solution's.
            names = {
                n: k
                for n, k in defined.items()
                if n not in vars(builtins) and not (entry and n in own)
            }
            if entry:
                names[entry] = "call"
            self.begin()
            for name, kind in names.items():
                if kind == "call":
                    namespace[name] = self.proxy(name)
                elif kind.startswith("module:"):
                    module = kind.split(":", 1)[1]
                    if module.split(".")[0] in sys.stdlib_module_names:
                        with contextlib.suppress(ImportError):
                            namespace[name] = importlib.import_module(module)
                else:  # a value (a copy) or an object of the solution's (a handle)
                    value = self.request({"op": "get", "name": name})["value"]
                    namespace[name] = decode(value, lambda n: Handle(self, n))
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

    def remote(self, message, args=(), kwargs=None):
        """A call in the worker; its value, with handles for the solution's objects."""
        message["args"] = encode(list(args), Handle.number)
        message["kwargs"] = encode(kwargs or {}, Handle.number)
        return decode(self.request(message)["value"], lambda n: Handle(self, n))

    def proxy(self, name):
        def call(*args, **kwargs):
            return self.remote({"op": "call", "name": name}, args, kwargs)

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


class Handle:
    """One of the solution's objects, kept in the worker: the tests can pass it back, call it
    and read its attributes (each a call in the worker), nothing else. It equals only itself
    and has no truth value, so an object of the solution's decides no comparison."""

    __slots__ = ("_judge", "_number")

    def __init__(self, judge, number):
        self._judge, self._number = judge, number

    def number(self):
        if type(self) is not Handle:
            raise TypeError(f"a {type(self).__name__} cannot pass to the solution")
        return self._number

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._judge.remote({"op": "attr", "h": self._number, "name": name})

    def __call__(self, *args, **kwargs):
        return self._judge.remote({"op": "callh", "h": self._number}, args, kwargs)

    def __bool__(self):
        raise TypeError("an object of the solution's has no truth value for the tests")

    def __repr__(self):
        return f"<object {self._number} of the solution>"


def main():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]))
        return
    first = fork_first_worker()
    try:  # PR_SET_DUMPABLE 0: no /proc access to the judge for the solution's uid, no core
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except (ImportError, OSError, AttributeError):
        pass
    with open("tests.json", encoding="utf-8") as f:
        cfg = json.load(f)
    os.remove("tests.json")
    # The program's text, for workers started later (main.py may be the caller's loader).
    with open("judge.py" if os.path.exists("judge.py") else sys.argv[0], encoding="utf-8") as f:
        source = f.read()
    judge = Judge(cfg, source, first)
    if cfg["kind"] == "stdio":
        judge.run_stdio(cfg["cases"])
    else:
        judge.run_rpc(cfg["cases"])
    judge.out.close()


if __name__ == "__main__":
    main()
