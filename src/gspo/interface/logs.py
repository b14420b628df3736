"""How much the libraries underneath gspo print: quiet by default, ``--log-level`` for more."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings


def set_log_level(level: str) -> None:
    """How much the libraries underneath print. Set through their environment variables, which
    they read when imported (before any of them is) and which reach their worker processes:
    at the default, error, vLLM's INFO lines and warnings (with the traceback it logs when it
    skips a warm-up) and datasets' "Generating train split" bars stay hidden; --log-level
    warning, info or debug shows them. The default leaves variables the user set alone."""
    quiet = level == "error"
    values = {
        "VLLM_LOGGING_LEVEL": level.upper(),
        "TRANSFORMERS_VERBOSITY": level,
        "DATASETS_VERBOSITY": level,
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "0" if level in ("info", "debug") else "1",
    }
    for name, value in values.items():
        if quiet:
            os.environ.setdefault(name, value)
        else:
            os.environ[name] = value
    # vLLM logs a few warnings before its own logging is set up ("Triton is installed, but
    # doesn't include CPU backend"), and some of its modules warn through Python's warnings.
    with contextlib.suppress(ValueError):  # a level name logging does not know: vLLM's to say
        logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
    if quiet:
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    if level in ("info", "debug"):  # Python's own last-resort handler shows warnings only
        logging.basicConfig(level=level.upper())


def quiet_transformers() -> None:
    """transformers' warnings and progress bars off, unless --log-level asks for them."""
    if os.environ.get("TRANSFORMERS_VERBOSITY") in ("warning", "info", "debug"):
        return  # transformers read that level when it was imported
    from transformers.utils import logging as hf_logging  # heavy (seconds): only when a run starts

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
