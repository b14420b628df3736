"""Moved to `gspo.core.losses`; this path stays so existing imports keep working."""

import sys

from gspo.core import losses as _moved

sys.modules[__name__] = _moved
