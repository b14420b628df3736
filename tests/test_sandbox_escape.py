"""Hostile programs reaching outside the sandbox: reading files outside is refused, writing
outside its directory has no effect, the network is unreachable, and killing the parent fails
while the caller — standing in for the trainer — survives. Split from test_sandbox;
assertions follow the mechanisms the machine provides (:func:`gspo.sandbox.isolation`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sandbox_support
from sandbox_support import (
    ex,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.sandbox import (
    SandboxConfig,
    code_reward,
    run_python,
)

# The module-scoped fixture, shared with the other sandbox files.
iso = sandbox_support.iso

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def test_reading_files_outside_is_refused(iso, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-0600")
    secret.chmod(0o600)
    public = Path(f"/tmp/gspo-test-public-{os.getpid()}.txt")
    public.write_text("WORLD-READABLE-0644")
    public.chmod(0o644)
    readme = Path(__file__).resolve().parents[1] / "README.md"
    try:
        paths = [str(secret), str(public), str(readme), "/root/.bashrc", "/etc/shadow"]
        code = (
            f"for p in {paths!r}:\n"
            "    try:\n        print(open(p).read()[:40])\n"
            "    except OSError as e:\n        print('refused', type(e).__name__)\n"
        )
        result = run_python(code)
        assert result.ok
        assert "TOP-SECRET" not in result.stdout
        if iso.files_hidden:
            # With the mount namespace nothing of the host's /tmp, /work, /root or /etc exists.
            assert result.stdout.count("refused FileNotFoundError") == len(paths)
            assert "WORLD-READABLE" not in result.stdout and "# gspo" not in result.stdout
        solution = f"def f():\n    return open({str(secret)!r}).read()"
        assert code_reward(solution, ex(tests=["assert f() == 'TOP-SECRET-0600'"])) == 0.0
    finally:
        public.unlink()


def test_writing_outside_its_directory_has_no_effect(iso, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # even a world-writable host directory must stay untouched
    targets = [
        shared / "planted",
        Path(f"/tmp/gspo-test-planted-{os.getpid()}"),
        Path("/usr/planted"),
    ]
    code = (
        f"import os\nfor p in {[str(t) for t in targets]!r}:\n"
        "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
        "    except OSError as e:\n        print('refused', p, type(e).__name__)\n"
        "open('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n"
    )
    result = run_python(code)
    assert result.ok and result.stdout.rstrip().endswith("fine")
    for target in targets:
        assert not target.exists(), f"{target} was created on the host"
    solution = f"def f():\n    open({str(shared / 'x')!r}, 'w').write('1')\n    return 1"
    check = f"assert f() == 1 and open({str(shared / 'x')!r}).read() == '1'"
    reward = code_reward(solution, ex(tests=[check]))
    assert not (shared / "x").exists()
    if iso.files_hidden:
        assert reward == 0.0


def test_network_is_unreachable(iso) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 53)]:\n"
        "    try:\n"
        "        s = socket.create_connection(addr, timeout=1)\n"
        "        s.sendall(b'leak'); print('connected', addr)\n"
        "    except OSError as e:\n"
        "        print('refused', type(e).__name__)\n"
    )
    try:
        result = run_python(code, config=SandboxConfig(timeout_s=10))
        assert "connected" not in result.stdout
        with pytest.raises(TimeoutError):
            server.accept()  # nobody got through to the caller's loopback
        if iso.network_blocked:
            assert result.ok and result.stdout.count("refused") == 3
        solution = (
            "import socket\ndef f():\n"
            f"    return socket.create_connection(('127.0.0.1', {port}), timeout=1) is not None"
        )
        assert code_reward(solution, ex(tests=["assert f()"])) == 0.0
    finally:
        server.close()


def test_killing_the_parent_fails_and_the_caller_survives() -> None:
    canary = subprocess.Popen(["sleep", "60"])  # a root-owned bystander
    try:
        code = (
            "import os, signal\n"
            f"for pid in (os.getppid(), {os.getpid()}, {canary.pid}, 1, -1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL); print('killed', pid, flush=True)\n"
            "    except OSError as e:\n        print('refused', pid, type(e).__name__, flush=True)\n"
            "print('done', flush=True)\n"
        )
        result = run_python(code)
        assert "done" in result.stdout
        assert canary.poll() is None, "the sandbox killed a process of the caller"
        solution = f"import os\ndef f():\n    os.kill({os.getpid()}, 9)\n    return 1"
        assert code_reward(solution, ex(tests=["assert f() == 1"])) == 0.0
        assert code_reward("import os\nos.killpg(0, 9)", ex(tests=["assert True"])) == 0.0
    finally:
        canary.kill()
        canary.wait()
    assert threading.main_thread().is_alive()  # we are, evidently, still running
