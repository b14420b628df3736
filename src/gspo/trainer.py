"""Moved to `gspo.orchestration.trainer`; this path stays so existing imports keep working."""

import sys

from gspo.orchestration import trainer as _moved

sys.modules[__name__] = _moved
