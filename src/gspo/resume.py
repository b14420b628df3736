"""Moved to `gspo.interface.resume`; this path stays so existing imports keep working."""

import sys

from gspo.interface import resume as _moved

sys.modules[__name__] = _moved
