"""Moved to `gspo.interface.compare`; this path stays so existing imports keep working."""

import sys

from gspo.interface import compare as _moved

sys.modules[__name__] = _moved
