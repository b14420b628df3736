"""List the function-local imports of a source tree (the ones left must say why: see
docs/architecture.md, "Import cycles and function-local imports").

    python scripts/local_imports.py src/gspo          # one line each, then the count
    python scripts/local_imports.py src/gspo --gspo   # only imports of gspo's own modules
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def local_imports(root: Path) -> list[str]:
    """``path:line: function: statement`` for every import inside a function body."""
    found: set[tuple[str, int, str, str]] = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    where = str(path.relative_to(root))
                    found.add((where, node.lineno, fn.name, ast.unparse(node)))
    # A nested function's import is found from both functions: keep the innermost.
    seen: dict[tuple[str, int], tuple[str, int, str, str]] = {}
    for item in sorted(found):
        seen[item[:2]] = item
    return [f"{p}:{line}: {name}: {stmt}" for p, line, name, stmt in seen.values()]


def main(argv: list[str]) -> int:
    own = "--gspo" in argv
    roots = [a for a in argv if not a.startswith("--")] or ["src/gspo"]
    lines = local_imports(Path(roots[0]))
    if own:
        lines = [x for x in lines if ": from gspo" in x or ": from ." in x or ": import gspo" in x]
    print("\n".join(lines))
    print(f"{len(lines)} function-local imports")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
