"""matplotlib, loaded on first use (the one deliberate lazy import of the figures).

`import polarize` and the CLI's parsing do not pay for it (about 0.4 s); a sweep starts
loading it in a thread while its solver compiles (`polarize.runs`).
"""


def pyplot():
    """`matplotlib.pyplot` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
