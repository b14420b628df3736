"""The public API (``gspo.__all__``): every name resolves to the object of its one home module,
importing ``gspo`` loads no torch, and docs/api.md lists exactly these names."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import gspo

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_is_its_home_modules_object():
    for name in gspo.__all__:
        home = importlib.import_module(gspo._HOMES[name])
        value = getattr(gspo, name)
        assert value is getattr(home, name), name
        # its home is where it is defined, not a module that imports it
        assert getattr(value, "__module__", home.__name__) == home.__name__, name


def test_importing_gspo_loads_no_torch():
    code = "import sys, gspo; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_name_is_an_attribute_error():
    try:
        gspo.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("gspo.no_such_name resolved")


def test_docs_api_lists_exactly_the_public_names():
    text = (ROOT / "docs" / "api.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    listed = {n for line in table for n in re.findall(r"`(\w+)`", line.split("|")[2])}
    assert listed == set(gspo.__all__)
