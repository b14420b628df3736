"""Moved to `gspo.interface.cli`; this path stays so existing imports, the ``gspo`` console
script (``gspo.cli:main``) and ``python -m gspo.cli`` keep working."""

import sys

from gspo.interface import cli as _moved

if __name__ == "__main__":  # python -m gspo.cli: run, rather than alias __main__
    raise SystemExit(_moved.main())
sys.modules[__name__] = _moved
