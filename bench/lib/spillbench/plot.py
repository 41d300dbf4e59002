"""matplotlib, headless (bench/work/venv; bench/lib/common.sh ensure_venv)."""


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def log_y(ax):
    """A log y axis with plain tick labels (20, 300, 10000, not 2×10¹), its minor ticks
    labelled only when the data span less than a decade. Call after plotting."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    lo, hi = ax.get_ylim()
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if hi < 10 * lo else NullFormatter())
