"""matplotlib, loaded on first use (the one deliberate lazy import of the figures), and
the two things every figure here does to stay cheap to draw.

`import polarize` and the CLI's parsing do not pay for matplotlib (about 0.25-0.4 s): the
`polarize sweep` command draws in a second Python that loads it while the sweep runs
(`polarize.runs._drawing`), and `run_sweep` or a study load it in a thread meanwhile.

Measured on a 2-core CPU (benchmarks/NOTES.md, "Warm studies, figures and imports"):
a layout engine (constrained or tight) took half of a figure's time, finding where the
labels fit; the ticks of logarithmic axes (a few artists each, minor ticks in every
decade) were most of the rest, and matplotlib labels their decades in mathtext
($10^{-3}$), parsed at every draw. Figures here lay out on fixed margins in inches
(`fixed_layout`), and logarithmic time axes draw their decades only, labelled in plain
text (`log_scale`).
"""

import math

#: Unicode superscripts of an exponent's characters.
_SUPERSCRIPTS = str.maketrans(
    "-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"
)


def pyplot():
    """`matplotlib.pyplot` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def decade_label(value: float, _position=None) -> str:
    """The tick label of a logarithmic axis: "10⁻³" for a power of ten, "" otherwise."""
    if not value > 0:
        return ""
    exponent = math.log10(value)
    nearest = round(exponent)
    return f"10{str(nearest).translate(_SUPERSCRIPTS)}" if abs(exponent - nearest) < 1e-9 else ""


def log_scale(ax, axis: str = "x", *, minor: bool = False) -> None:
    """A logarithmic `axis` ("x" or "y") of `ax`, its decades labelled by `decade_label`.

    Time axes (from the first saved time to t1, many decades) draw no minor ticks: each
    tick is a few artists, and they were most of a figure's drawing. An axis of values
    that may span less than a decade keeps them (`minor=True`), and with them
    matplotlib's own labels where there is no decade to label.
    """
    plt = pyplot()
    getattr(ax, f"set_{axis}scale")("log")
    scale = getattr(ax, f"{axis}axis")
    scale.set_major_formatter(plt.FuncFormatter(decade_label))
    if not minor:
        scale.set_minor_locator(plt.NullLocator())


def fixed_layout(fig, *, left=0.95, right=0.2, bottom=0.55, top=0.5, gap=1.0) -> None:
    """Margins of `fig` in inches, whatever its size: room for the tick and axis labels
    on the left and at the bottom, for a title on top, and `gap` between panels."""
    width, height = fig.get_size_inches()
    columns = max(len(fig.axes), 1)
    panel = (width - left - right - gap * (columns - 1)) / columns
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=gap / panel if columns > 1 else 0.2,
    )
