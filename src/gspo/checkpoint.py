"""Moved to `gspo.backend.checkpoint`; this path stays so existing imports keep working."""

import sys

from gspo.backend import checkpoint as _moved

sys.modules[__name__] = _moved
