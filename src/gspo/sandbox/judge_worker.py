"""The worker half of the test harness inside the sandbox, and what judge and worker share
(plain values, messages). :mod:`gspo.sandbox.harness` joins this file's text and
:mod:`gspo.sandbox.judge`'s into the run's program; the package never imports it.
"""

import builtins
import collections
import contextlib
import io
import json
import os
import sys

MAX_MESSAGE = 8 << 20  # a value passed between judge and worker, as JSON
_HEADER = 8


class TestTimeout(BaseException):
    pass


class WorkerGone(Exception):
    pass


# --- plain values between judge and worker -----------------------------------------------

# Builtin types may cross by name (MBPP passes `int` to a solution); each side maps the name
# to its own type, taken before any solution ran.
TYPES = {
    t.__name__: t
    for t in (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset, object)
}


def encode(value, other=None):
    """A JSON form of a plain value (exact builtin types only: a subclass could carry an
    ``__eq__`` of the solution's); anything else is ``other(value)`` (a handle), or TypeError."""
    kind = type(value)
    if value is None or kind in (bool, int, str, float):
        return value
    if kind is list:
        return [encode(v, other) for v in value]
    if kind is tuple:
        return {"t": [encode(v, other) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, other), encode(v, other)] for k, v in value.items()]}
    if kind is set:
        return {"s": [encode(v, other) for v in value]}
    if kind is frozenset:
        return {"f": [encode(v, other) for v in value]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    if kind is type and TYPES.get(value.__name__) is value:
        return {"T": value.__name__}
    # The standard library's containers (MBPP's answers are Counters and defaultdicts): each
    # side rebuilds its own, so their equality is the standard library's.
    if kind in (collections.Counter, collections.OrderedDict):
        tag = "C" if kind is collections.Counter else "O"
        return {tag: [[encode(k, other), encode(v, other)] for k, v in value.items()]}
    if kind is collections.defaultdict:
        factory = value.default_factory
        name = getattr(factory, "__name__", None)
        name = name if type(factory) is type and TYPES.get(name) is factory else None
        return {"D": [name, [[encode(k, other), encode(v, other)] for k, v in value.items()]]}
    if kind is collections.deque:
        return {"Q": [[encode(v, other) for v in value], value.maxlen]}
    if other is not None:
        return {"h": other(value)}
    raise TypeError(f"a {kind.__name__} cannot pass between the tests and the solution")


def decode(data, handle=None):
    """The value of :func:`encode`'s form; ``handle(number)`` for a handle."""
    if isinstance(data, list):
        return [decode(v, handle) for v in data]
    if not isinstance(data, dict):
        return data
    ((tag, body),) = data.items()
    if tag == "t":
        return tuple(decode(v, handle) for v in body)
    if tag == "d":
        return {decode(k, handle): decode(v, handle) for k, v in body}
    if tag == "s":
        return {decode(v, handle) for v in body}
    if tag == "f":
        return frozenset(decode(v, handle) for v in body)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "c":
        return complex(*body)
    if tag == "T" and body in TYPES:
        return TYPES[body]
    if tag in ("C", "O"):
        kind = collections.Counter if tag == "C" else collections.OrderedDict
        return kind({decode(k, handle): decode(v, handle) for k, v in body})
    if tag == "D":
        name, items = body
        factory = TYPES.get(name)
        return collections.defaultdict(
            factory, ((decode(k, handle), decode(v, handle)) for k, v in items)
        )
    if tag == "Q":
        items, maxlen = body
        return collections.deque((decode(v, handle) for v in items), maxlen)
    if tag == "h" and handle is not None and type(body) is int:
        return handle(body)
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
    # MBPP's test_setup_code: objects built from the solution's classes, for the tests.
    exec(compile(init["fixture"], "<fixture>", "exec"), namespace)
    defined = {}
    for name, value in namespace.items():
        if name.startswith("__") or before.get(name, before) is value:
            continue
        if type(value) is type(sys):
            # Tests may use a module the solution imported (MBPP's `math.isclose`): the
            # judge imports its own copy, by name, from the standard library.
            defined[name] = "module:" + str(value.__name__)
        elif callable(value):
            defined[name] = "call"
        else:
            try:
                encode(value)
                defined[name] = "value"
            except (TypeError, ValueError, RecursionError):
                defined[name] = "object"  # stays here; the tests get a handle
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
                if init["audit_hook"]:
                    exec(init["audit_hook"], {})
                os._exit(stdio_test(init, request["input"]))
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            send(resp, {"status": status})
    if init["audit_hook"]:
        exec(init["audit_hook"], {})
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
    # Objects that are not plain values (an instance of the solution's class) stay here; the
    # judge gets a number for each, which it can pass back, call, or read attributes of.
    kept = []

    def keep(value):
        kept.append(value)
        return len(kept) - 1

    while True:
        try:
            request = receive(req)
        except WorkerGone:  # the judge is done with this worker
            return
        try:
            op = request["op"]
            if op == "target":
                value = target(*request["args"])
                text = json.dumps(value, default=repr)
                reply = {"json": text}
            elif op == "get":
                reply = {"value": encode(namespace[request["name"]], keep)}
            elif op == "attr":
                reply = {"value": encode(getattr(kept[request["h"]], request["name"]), keep)}
            else:
                fn = kept[request["h"]] if op == "callh" else namespace[request["name"]]
                args = decode(request["args"], kept.__getitem__)
                kwargs = decode(request["kwargs"], kept.__getitem__)
                reply = {"value": encode(fn(*args, **kwargs), keep)}
        except BaseException as exc:
            reply = {"exc": [type(exc).__name__, str(exc)[:500]]}
        sys.stdout.flush()
        send(resp, reply)


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
