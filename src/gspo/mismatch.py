"""Moved to `gspo.core.mismatch`; this path stays so existing imports keep working."""

import sys

from gspo.core import mismatch as _moved

sys.modules[__name__] = _moved
