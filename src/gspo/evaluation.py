"""Moved to `gspo.orchestration.evaluation`; this path stays so existing imports keep working."""

import sys

from gspo.orchestration import evaluation as _moved

sys.modules[__name__] = _moved
