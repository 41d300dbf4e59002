"""Command-line helpers for the benches' shell scripts and for bench/lib/check_reports.sh.

  python3 -m spillbench capacity --prompt-bytes B | --mean-prompt-tokens P [engine knobs]
      C per engine (req/s) from the mock's time model, every prompt prefilled in full
  python3 -m spillbench measured --capacity RUN.jsonl --capacity-warmup S
      completions per second of a closed-loop run from S to its end (two decimals)
  python3 -m spillbench compare COMMITTED.md REGENERATED.md [NAME]
      exit 1 unless every table of REGENERATED is, line for line, one of COMMITTED's
"""

import argparse
import sys

from spillbench import analysis, markdown, mockmodel


def main():
    p = argparse.ArgumentParser(prog="python3 -m spillbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capacity")
    size = c.add_mutually_exclusive_group(required=True)
    size.add_argument("--prompt-bytes", type=int)
    size.add_argument("--mean-prompt-tokens", type=float)
    mockmodel.add_args(c)
    m = sub.add_parser("measured")
    m.add_argument("--capacity", required=True)
    m.add_argument("--capacity-warmup", type=float, required=True)
    k = sub.add_parser("compare")
    k.add_argument("committed")
    k.add_argument("regenerated")
    k.add_argument("name", nargs="?")
    a = p.parse_args()
    if a.cmd == "capacity":
        if a.prompt_bytes is None:
            a.prompt_bytes = int(round(4 * a.mean_prompt_tokens))
        print(f"{mockmodel.model_capacity(a)[0]:.3f}")
        return 0
    if a.cmd == "measured":
        print(f"{analysis.capacity_measured(a.capacity, a.capacity_warmup)[0]:.2f}")
        return 0
    with open(a.committed) as f, open(a.regenerated) as g:
        ok, notes = markdown.compare(f.read(), g.read(), a.name or a.committed)
    print("\n".join(notes))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
