"""A load-generator run's figures (spillbench.loadgen's records) over its measured window:
requests that arrived in [warmup, duration), latencies from their scheduled arrival."""

from spillbench.results import load_run
from spillbench.stats import pct


def analyse(meta, recs, warmup, duration, max_tokens):
    """Figures over requests that arrived in [warmup, duration)."""
    hard_end = meta["wall_s"]
    win = [r for r in recs if warmup <= r["sched"] < duration]
    span = duration - warmup
    ok_done = [r for r in recs if r["outcome"] == "ok" and warmup <= r.get("end", -1) < duration]
    admitted = [r for r in win if r.get("status") == 200]
    ttft = [r["ttft"] for r in admitted if "ttft" in r]
    # Admitted but no first token by the run's hard end: the wait so far is a lower bound.
    censored = [hard_end - r["sched"] for r in admitted if "ttft" not in r and r["outcome"] == "cut"]
    # No status line by the hard end (queued in a proxy): fate unknown, wait is a lower bound.
    pending = [hard_end - r["sched"] for r in win if "status" not in r and r["outcome"] == "cut"]
    rejected = [r for r in win if r["outcome"] == "rejected"]
    errors = [r for r in recs if r["outcome"] in ("error", "timeout")]
    lags = [r["lag"] for r in recs if "lag" in r]
    slo_ok = [r for r in ok_done if r.get("ttft", 1e9) <= 1.0]
    all_ttft = ttft + censored

    def third(lo, hi):
        vals = [r["ttft"] if "ttft" in r else hard_end - r["sched"]
                for r in admitted
                if lo <= r["sched"] < hi and ("ttft" in r or r["outcome"] == "cut")]
        return pct(vals, 50), any("ttft" not in r for r in admitted if lo <= r["sched"] < hi)

    t1 = warmup + span / 3
    t2 = warmup + 2 * span / 3
    first_p50, first_b = third(warmup, t1)
    last_p50, last_b = third(t2, duration)
    err_kinds = {}
    for r in errors:
        key = f"status {r['status']}" if "status" in r and r["status"] != 200 else r.get("why", "?")
        err_kinds[key] = err_kinds.get(key, 0) + 1
    statuses = {}
    for r in rejected:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {
        "arrivals": len(win),
        "offered_rps": len(win) / span,
        "completed_rps": len(ok_done) / span,
        # Goodput: the window's arrivals that completed. Unlike completions in the window it
        # does not depend on how many requests were in flight when the window opened.
        "goodput_rps": sum(1 for r in win if r["outcome"] == "ok") / span,
        "inflight_at_warmup": sum(1 for r in recs if r.get("status") == 200
                                  and r["sched"] <= warmup < r.get("end", float("inf"))),
        "completed_tps": sum(r["tokens"] for r in ok_done) / span,
        "slo_rps": len(slo_ok) / span,
        "admitted": len(admitted),
        "ttft_n": len(ttft),
        "ttft_censored": len(censored),
        "ttft_p50": pct(all_ttft, 50),
        "ttft_p99": pct(all_ttft, 99),
        "ttft_bound": bool(censored),
        "ttft_first_third_p50": first_p50,
        "ttft_last_third_p50": last_p50,
        "drift_bound": first_b or last_b,
        "rejected": len(rejected),
        "rejected_share": len(rejected) / max(1, len(win)),
        "reject_statuses": statuses,
        "reject_p50": pct([r["t_status"] for r in rejected], 50),
        "reject_p99": pct([r["t_status"] for r in rejected], 99),
        "pending_no_status": len(pending),
        "errors": len(errors),
        "error_kinds": err_kinds,
        "loadgen_cpu": meta["cpu_share"],
        "lag_p99": pct(lags, 99),
        "wall_s": hard_end,
    }


CLASS_FIELDS = ("arrivals", "offered_rps", "completed_rps", "ttft_p50", "ttft_p99", "ttft_bound",
                "rejected", "rejected_share", "reject_p99", "errors")


def class_stats(meta, recs, warmup, duration, max_tokens):
    """Per request class (the loadgen's --class-mix), the figures of analyse(); None when
    the requests carry no class. Classes in the mix's order, then any others."""
    seen = {r["class"] for r in recs if "class" in r}
    if not seen:
        return None
    order = [c for c in (meta.get("class_mix") or {}) if c in seen] + sorted(
        seen - set(meta.get("class_mix") or {}))
    out = {}
    for c in order:
        s = analyse(meta, [r for r in recs if r.get("class") == c], warmup, duration, max_tokens)
        out[c] = {k: s[k] for k in CLASS_FIELDS}
    return out


def capacity_measured(path, warmup):
    """A closed-loop run's completions per second (and tokens per second) from `warmup` to
    its end, and its metadata."""
    meta, recs = load_run(path)
    end = meta["duration"]
    done = [r for r in recs if r["outcome"] == "ok" and warmup <= r.get("end", -1) < end]
    span = end - warmup
    return len(done) / span, sum(r["tokens"] for r in done) / span, meta


EXPECTED_OUTCOMES = ("success", "error (overload)", "error (cancelled)")


def health_notes(r, gone="proxy process gone after the run", odd="unexpected outcomes counted",
                 log_chars=160):
    """What went wrong in one run (a row of the reports: analyse() and the run's own
    figures): the proxy gone, client-side errors, outcomes Spillway counted besides success,
    overload and cancelled (`odd`: how to say it; None: not checked), log problems."""
    notes = []
    if r["proxy_alive"] != "yes":
        notes.append(gone)
    if r["errors"]:
        notes.append(f"{r['errors']} client-side errors: {r['error_kinds']}")
    if odd:
        other = {k: v for k, v in r["spillway_statuses"].items() if k not in EXPECTED_OUTCOMES}
        if other:
            notes.append(f"{odd}: {other}")
    if r["log_problems"]:
        notes.append("log: " + " / ".join(l[-log_chars:] for l in r["log_problems"][:3]))
    return notes
