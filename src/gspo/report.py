"""Moved to `gspo.interface.report`; this path stays so existing imports keep working."""

import sys

from gspo.interface import report as _moved

sys.modules[__name__] = _moved
