"""Moved to `gspo.core.kl`; this path stays so existing imports keep working."""

import sys

from gspo.core import kl as _moved

sys.modules[__name__] = _moved
