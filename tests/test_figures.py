"""The figures' drawing helpers: decade labels of logarithmic axes, fixed margins."""

import math

import numpy as np
import pytest

from polarize.figures._pyplot import decade_label, fixed_layout, log_scale, pyplot, short_axis_label


@pytest.mark.parametrize("exponent", range(-12, 13))
def test_a_decade_is_labelled_with_its_exponent_in_superscripts(exponent):
    digits = "".join(
        "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"[int(c)] for c in str(abs(exponent))
    )
    want = "10" + ("\u207b" if exponent < 0 else "") + digits
    assert decade_label(10.0**exponent) == want
    # between decades, and outside a log axis' domain, nothing
    assert decade_label(3 * 10.0**exponent) == ""
    assert decade_label(0.0) == decade_label(-10.0) == decade_label(math.nan) == ""


def test_a_log_time_axis_labels_its_decades_and_draws_no_minor_ticks(tmp_path):
    plt = pyplot()
    fig, (time_axis, value_axis) = plt.subplots(1, 2)
    ts = np.geomspace(1e-2, 1e5, 50)
    time_axis.plot(ts, ts)
    log_scale(time_axis, "x")
    value_axis.plot([0, 1], [20.0, 80.0])
    log_scale(value_axis, "y", minor=True)  # less than a decade: matplotlib's minor labels
    fig.savefig(tmp_path / "axes.png")
    shown = [t for t in time_axis.get_xticks() if 1e-2 <= t <= 1e5]
    # powers of ten (matplotlib may skip every other one on a small axis)
    assert len(shown) >= 3 and all(math.log10(t) == round(math.log10(t)) for t in shown)
    labels = dict(zip(time_axis.get_xticks(), [t.get_text() for t in time_axis.get_xticklabels()]))
    assert [labels[t] for t in shown] == [decade_label(t) for t in shown]
    assert len(time_axis.get_xticks(minor=True)) == 0
    minor = [t.get_text() for t in value_axis.get_yticklabels(minor=True) if t.get_text()]
    assert len(value_axis.get_yticks(minor=True)) > 0 and minor  # labels where no decade is
    plt.close(fig)


def test_fixed_layout_keeps_its_margins_in_inches_at_any_size():
    plt = pyplot()
    for width, panels in ((6.0, 1), (18.0, 3)):
        fig, _ = plt.subplots(1, panels, figsize=(width, 4.5))
        fixed_layout(fig, left=0.9, right=0.2, bottom=0.6, top=0.5, gap=1.0)
        boxes = [ax.get_position() for ax in fig.axes]
        assert boxes[0].x0 * width == pytest.approx(0.9)
        assert (1 - boxes[-1].x1) * width == pytest.approx(0.2)
        assert boxes[0].y0 * 4.5 == pytest.approx(0.6) and (1 - boxes[0].y1) * 4.5 == pytest.approx(0.5)
        for a, b in zip(boxes, boxes[1:]):
            assert (b.x0 - a.x1) * width == pytest.approx(1.0)
        plt.close(fig)


def test_a_short_log_axis_labels_its_ticks_as_plain_numbers_that_do_not_collide(tmp_path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3)
    for ax, (low, high) in zip(axes, [(50.0, 100.0), (20.0, 300.0), (1e-5, 1.0)], strict=True):
        ax.plot([0, 1], [low, high])
        ax.set_ylim(low, high)
        log_scale(ax, "y", minor=True)
    fig.savefig(tmp_path / "axes.png")

    def shown(ax):
        ticks = [*ax.get_yticklabels(), *ax.get_yticklabels(minor=True)]
        return {t.get_position()[1]: t.get_text() for t in ticks if t.get_text()}

    # under a decade: every tick, in plain digits (matplotlib would write 6x10^1 in mathtext)
    within = {round(v): text for v, text in shown(axes[0]).items() if 50 <= v <= 100}
    assert within == {v: str(v) for v in (50, 60, 70, 80, 90, 100)}
    # one to two decades: 1, 2 and 5 times a power of ten only
    within = {round(v): text for v, text in shown(axes[1]).items() if 20 <= v <= 300}
    assert within == {20: "20", 50: "50", 100: "100", 200: "200"}
    # more than two decades: the decades, as on a time axis
    within = {v: text for v, text in shown(axes[2]).items() if 1e-5 <= v <= 1}
    assert within and all(text == decade_label(v) for v, text in within.items())
    plt.close(fig)


def test_short_axis_labels_follow_the_axis_range():
    assert short_axis_label(30.0, 20.0, 80.0) == "30"
    assert short_axis_label(30.0, 20.0, 300.0) == "" and short_axis_label(200.0, 300.0, 20.0) == "200"
    assert short_axis_label(30.0, 1.0, 1e4) == "" and short_axis_label(100.0, 1.0, 1e4) == decade_label(100.0)
    assert short_axis_label(0.002, 1e-3, 1e-2) == "0.002"
    assert short_axis_label(0.0, 1.0, 2.0) == "" and short_axis_label(5.0, 0.0, 10.0) == ""
