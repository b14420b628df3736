"""Moved to `gspo.core.offpolicy`; this path stays so existing imports keep working."""

import sys

from gspo.core import offpolicy as _moved

sys.modules[__name__] = _moved
