"""Prometheus /metrics dumps and process logs, as the benches save them after a run."""

import re

OVERLOAD_LOG = r"\b(WARN|ERROR)\b|panic|ALERT"


def read(path):
    """A saved file's text; '' when there is none (no path, or it cannot be read)."""
    if not path:
        return ""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except (OSError, TypeError):
        return ""


def value(line):
    return float(line.rsplit(" ", 1)[1])


def requests_by_outcome(path):
    """dynamo_frontend_requests_total by status (and error_type) from a /metrics dump
    (Spillway's and Dynamo's frontend's own outcome counter)."""
    out = {}
    for line in read(path).splitlines():
        if not line.startswith("dynamo_frontend_requests_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        key = labels.get("status", "?")
        if labels.get("error_type"):
            key += f" ({labels['error_type']})"
        out[key] = out.get(key, 0) + value(line)
    return out


def counter_sum(lines, name):
    """Sum of a counter's samples in /metrics lines (any labels); None when absent."""
    total, seen = 0.0, False
    for line in lines:
        head = line.split("{", 1)[0].split(" ", 1)[0]
        if head == name:
            try:
                total += value(line)
                seen = True
            except (ValueError, IndexError):
                pass
    return total if seen else None


def engine_backlog(paths):
    """(running, waiting) summed over the engines' /metrics dumps; None when missing."""
    running = waiting = 0
    seen = False
    for path in paths or []:
        try:
            text = open(path).read()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("vllm:num_requests_running{"):
                running += value(line); seen = True
            elif line.startswith("vllm:num_requests_waiting{"):
                waiting += value(line); seen = True
    return (int(running), int(waiting)) if seen else None


def log_lines(path):
    """A log's lines without terminal colours; [] when there is none."""
    return re.sub(r"\x1b\[[0-9;]*m", "", read(path)).splitlines()


def log_problems(path, pattern=OVERLOAD_LOG):
    """The log lines that match `pattern` (by default warnings, errors, panics, alerts)."""
    return [l for l in read(path).splitlines() if re.search(pattern, l)]


def log_summary(path):
    """The report's line on Spillway's log: how many warning/error lines, and one of them
    (bench/proxy, bench/tls); [] when the log cannot be read."""
    try:
        probs = [l for l in open(path, errors="replace").read().splitlines()
                 if re.search(r"WARN|ERROR|panic", l)]
    except OSError:
        return []
    return [f"- Spillway log: {len(probs)} warning/error lines"
            + (f", e.g. `{probs[0][-200:]}`" if probs else ".")]
