"""matplotlib, headless (bench/work/venv; bench/lib/common.sh ensure_venv)."""


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
