"""The capacity of `spillway mock-engine` from its time model (mock/src/lib.rs)."""

import math


def add_args(p, kv_blocks=2048):
    """The engine's parameters, with bench/overload's defaults (the mock's own)."""
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--kv-blocks", type=int, default=kv_blocks)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--prefill-tps", type=float, default=20000)
    p.add_argument("--step-ms", type=float, default=8)
    p.add_argument("--step-per-seq-ms", type=float, default=0.25)


def model_capacity(a):
    """Requests/s one engine completes at saturation, its batch and its step (seconds).

    Saturated, the batch holds B sequences (max_num_seqs, unless the KV cache holds fewer).
    Each request stays in the batch for M steps: the step that prefills its prompt samples
    token 1, then M - 1 decode steps. So B / M requests finish per step on average, and the
    same number start, each adding P prompt tokens of prefill to that step:
        step = base + per_seq * B + (B / M) * P / prefill_tps
        C    = (B / M) / step
    `a.prompt_bytes`: the prompt's bytes of `messages` (the mock counts bytes / 4).
    """
    p = a.prompt_bytes // 4
    m = a.max_tokens
    blocks_max = math.ceil((p + m) / a.block_size)
    b = min(a.max_num_seqs, a.kv_blocks // blocks_max)
    step_s = (a.step_ms + a.step_per_seq_ms * b) / 1000 + (b / m) * p / a.prefill_tps
    return (b / m) / step_s, b, step_s
