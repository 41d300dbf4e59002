"""Result files: the header the shell script wrote, the report's .md and .json, the load
generator's records, tab-separated tables."""

import json


def header(path):
    """The report's first lines: the header file (bench/lib/common.sh machine_header and the
    run's knobs, written by the script), then a blank line."""
    with open(path) as f:
        return [f.read().rstrip(), ""]


def write_md(path, lines, mode="w"):
    with open(path, mode) as f:
        f.write("\n".join(lines) + "\n")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=str)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f]


def load_run(path):
    """A load generator's output (spillbench.loadgen): (metadata, request records)."""
    lines = read_jsonl(path)
    return lines[0], lines[1:]


def read_tsv(path):
    """A tab-separated file with a header line, as dicts of strings."""
    with open(path) as f:
        cols = f.readline().rstrip("\n").split("\t")
        return [dict(zip(cols, line.rstrip("\n").split("\t"))) for line in f]
