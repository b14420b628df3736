"""Read back what a plot shows: the series drawn on each panel of every figure saved while a
test runs (a pass-through wrapper around ``Figure.savefig``), so tests check the plotted
numbers rather than the size of a PNG."""

from __future__ import annotations

from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

Series = tuple[list[float], list[float]]


def capture_plots(monkeypatch) -> dict[str, dict[str, dict[str, Series]]]:
    """{saved file name: {panel title: {line label: (x, y)}}}, filled as figures are saved."""
    from matplotlib.figure import Figure

    saved: dict[str, dict[str, dict[str, Series]]] = {}
    inner = Figure.savefig

    def spy(self, fname, *args, **kwargs):
        saved[Path(fname).name] = {
            ax.get_title(): {
                line.get_label(): (
                    [float(v) for v in line.get_xdata()],
                    [float(v) for v in line.get_ydata()],
                )
                for line in ax.get_lines()
            }
            for ax in self.axes
        }
        return inner(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return saved


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC
