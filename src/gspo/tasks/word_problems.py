"""Moved to `gspo.envs.tasks.word_problems`; this path stays so existing imports keep working."""

import sys

from gspo.envs.tasks import word_problems as _moved

sys.modules[__name__] = _moved
