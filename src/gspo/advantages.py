"""Moved to `gspo.core.advantages`; this path stays so existing imports keep working."""

import sys

from gspo.core import advantages as _moved

sys.modules[__name__] = _moved
