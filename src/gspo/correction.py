"""Moved to `gspo.core.correction`; this path stays so existing imports keep working."""

import sys

from gspo.core import correction as _moved

sys.modules[__name__] = _moved
