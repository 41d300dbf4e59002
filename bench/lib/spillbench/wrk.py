"""wrk, wrk2 and oha outputs: requests, rate, latency percentiles, errors."""

import json
import re

UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def dur(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def parse_wrk(text):
    """wrk and wrk2 text output: requests, rps, percentiles, non-2xx and socket errors."""
    out = {"p": {}}
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", text)
    if m:
        out["requests"] = int(m.group(1))
        out["elapsed"] = float(m.group(2)) * UNITS[m.group(3)]
    m = re.search(r"Requests/sec:\s*([\d.]+)", text)
    if m:
        out["rps"] = float(m.group(1))
    # wrk: "     50%    1.23ms"; wrk2: " 50.000%    1.23ms" (the first block is the recorded one).
    for m in re.finditer(r"^\s*(\d+(?:\.\d+)?)%\s+([\d.]+(?:us|ms|s|m))\s*$", text, re.M):
        q = float(m.group(1))
        key = {50.0: "p50", 90.0: "p90", 99.0: "p99", 99.9: "p99.9"}.get(q)
        if key and key not in out["p"]:
            out["p"][key] = dur(m.group(2))
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    out["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    out["sock_errors"] = sum(int(x) for x in m.groups()) if m else 0
    out["ok"] = out.get("requests", 0) - out["non2xx"]
    return out


def parse_oha(text):
    j = json.loads(text)
    s = j["summary"]
    lp = j.get("latencyPercentiles", {})
    codes = {int(k): v for k, v in j.get("statusCodeDistribution", {}).items()}
    # Requests still in flight when -z ends are aborted by oha itself: not errors.
    errors = sum(v for k, v in j.get("errorDistribution", {}).items() if "deadline" not in k)
    total = sum(codes.values())
    return {
        "requests": total,
        "ok": codes.get(200, 0),
        "non2xx": total - codes.get(200, 0),
        "sock_errors": errors,
        "elapsed": s.get("total"),
        "rps": s.get("requestsPerSec"),
        "p": {k: lp.get(k) for k in ("p50", "p90", "p99", "p99.9")},
    }


def failed(e):
    """What parse() returns for an output that could not be read."""
    return {"error": f"{type(e).__name__}: {e}", "p": {}, "ok": 0, "requests": 0,
            "non2xx": 0, "sock_errors": 0}


def parse(tool, path):
    """One run's output file, by tool (oha: JSON; wrk, wrk2: text)."""
    try:
        text = open(path).read()
        return parse_oha(text) if tool == "oha" else parse_wrk(text)
    except (OSError, ValueError, KeyError) as e:
        return failed(e)
