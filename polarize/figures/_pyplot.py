"""matplotlib, loaded on first use (the one deliberate lazy import of the figures), and
the two things every figure here does to stay cheap to draw.

`import polarize` and the CLI's parsing do not pay for matplotlib (about 0.25-0.4 s): it
loads with the first figure, once a sweep's results are on disk.

Measured on a 2-core CPU (benchmarks/NOTES.md, "Time to result"):
a layout engine (constrained or tight) took half of a figure's time, finding where the
labels fit; the ticks of logarithmic axes (a few artists each, minor ticks in every
decade) were most of the rest, and matplotlib labels their decades in mathtext
($10^{-3}$), parsed at every draw. Figures here lay out on fixed margins in inches
(`fixed_layout`), and logarithmic time axes draw their decades only, labelled in plain
text (`log_scale`); short logarithmic axes label their ticks as plain numbers.
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


def short_axis_label(value: float, low: float, high: float) -> str:
    """The tick label of `value` on a logarithmic axis from `low` to `high`.

    Over more than two decades, `decade_label`. Over fewer, where the decades alone would
    leave one label or none, plain numbers: at every tick (20, 30, ..., 90, 100) over
    less than 0.7 of a decade, at 1, 2 and 5 times a power of ten (20, 50, 100, 200)
    over more, so that labels do not run into each other.
    """
    low, high = sorted((low, high))
    if not (value > 0 and low > 0 and math.isfinite(high)) or math.log10(high / low) > 2:
        return decade_label(value)
    mantissa = round(value / 10.0 ** math.floor(math.log10(value) + 1e-9), 6)
    shown = (1, 2, 5) if math.log10(high / low) > 0.7 else range(1, 10)
    return f"{value:g}" if mantissa in shown else ""


def log_scale(ax, axis: str = "x", *, minor: bool = False) -> None:
    """A logarithmic `axis` ("x" or "y") of `ax`, its decades labelled by `decade_label`.

    Time axes (from the first saved time to t1, many decades) draw no minor ticks: each
    tick is a few artists, and they were most of a figure's drawing. An axis of values
    that may span two decades or less keeps them (`minor=True`), labelled by
    `short_axis_label` from the axis' range when it is drawn.
    """
    plt = pyplot()
    getattr(ax, f"set_{axis}scale")("log")
    scale = getattr(ax, f"{axis}axis")
    if not minor:
        scale.set_major_formatter(plt.FuncFormatter(decade_label))
        scale.set_minor_locator(plt.NullLocator())
        return
    label = plt.FuncFormatter(lambda value, _position: short_axis_label(value, *scale.get_view_interval()))
    scale.set_major_formatter(label)
    scale.set_minor_formatter(label)


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
