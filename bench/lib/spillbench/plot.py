"""matplotlib, headless (bench/work/venv; bench/lib/common.sh ensure_venv)."""


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plain_numbers():
    """A tick formatter that writes 20 and 300, not 2×10¹ (log axes)."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:g}")
