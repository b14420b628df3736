"""Moved to `gspo.config.asynchronous`; this path stays so existing imports keep working."""

import sys

from gspo.config import asynchronous as _moved

sys.modules[__name__] = _moved
