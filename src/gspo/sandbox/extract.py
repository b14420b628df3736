"""The program in a model's completion: :func:`extract_code`.

Fences are read line by line, as Markdown does: a fence is a line that starts (after
indentation) with three or more backticks. Anchoring at line starts matters: a pattern that
matched backticks anywhere took an empty fence pair before a block for an opening fence and
returned the prose after the code instead of the code.
"""

from __future__ import annotations

import re

_PYTHON = frozenset({"python", "py", "python3", "py3"})
# Indentation, the backtick run, an info string without backticks (its first word is the
# language: "python", "Python", "py title=x", "{python}"), nothing after.
_FENCE = re.compile(r"([ \t]*)(`{3,})[ \t]*\{?([^\s`{}]*)\}?[^`\n]*\Z")


def _blocks(completion: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block, in order; a final unclosed one runs to the end."""
    blocks: list[tuple[str, str]] = []
    current: tuple[str, int, int, list[str]] | None = None  # language, indent, fence, lines
    for line in completion.splitlines():
        fence = _FENCE.match(line)
        if current is None:
            if fence:
                indent = len(fence.group(1).expandtabs(4))
                current = (fence.group(3).lower(), indent, len(fence.group(2)), [])
            continue
        language, indent, width, lines = current
        if fence and len(fence.group(2)) >= width:
            blocks.append((language, "\n".join(lines)))
            current = None
            if fence.group(3):
                # A labelled fence cannot close a block (Markdown would keep it as content),
                # but models write "```\n\n```python": an empty block, then the code.
                new_indent = len(fence.group(1).expandtabs(4))
                current = (fence.group(3).lower(), new_indent, len(fence.group(2)), [])
            continue
        # Strip the fence's own indentation (a block inside a list item), no more.
        stripped = line.expandtabs(4)
        margin = len(stripped) - len(stripped.lstrip(" "))
        lines.append(stripped[min(indent, margin) :] if indent else line)
    if current is not None:
        blocks.append((current[0], "\n".join(current[3])))
    return blocks


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The program in a completion: the last fenced code block, preferring Python ones.

    Blocks labelled ``python`` (any case; also ``py``, ``python3``) win over unlabelled ones,
    which win over other languages; empty blocks are ignored (only empty ones: no code). With ``entry_point`` (the
    function the tests call), the last preferred block that defines it wins, so a usage
    example after the solution is not taken for it. A final fence left open (a truncated
    completion) counts up to the end; text without any fence is taken as code as it is.
    """
    found = _blocks(completion)
    if not found:
        return completion.strip("\n")
    blocks = [(lang, code) for lang, code in found if code.strip()]
    if not blocks:
        return ""  # only empty blocks: the prose around them is not the program
    python = [code for lang, code in blocks if lang in _PYTHON]
    plain = [code for lang, code in blocks if not lang]
    chosen = python or plain or [code for _, code in blocks]
    if entry_point:
        defines = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.M)
        with_entry = [code for code in chosen if defines.search(code)]
        chosen = with_entry or chosen
    return chosen[-1].strip("\n")
