"""Moved to `gspo.interface.evaluate`; this path stays so existing imports keep working."""

import sys

from gspo.interface import evaluate as _moved

sys.modules[__name__] = _moved
