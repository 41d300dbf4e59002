"""Writes a tiny `llama`-architecture GGUF with random weights, for tests/llamacpp.rs.

The model says nothing useful: its weights are seeded random numbers, so the file is the
same byte for byte on every run with the same arguments. What it gives a test is a real
llama.cpp server doing real (slow enough) work per token. Its tokenizer is SentencePiece
style (`tokenizer.ggml.model = "llama"`): <unk> 0, <s> 1 (bos), </s> 2 (eos), the 256
byte-fallback tokens <0x00>..<0xFF>, then a few plain pieces. Random weights emit the
eos token now and then; the tests start llama-server with `--ignore-eos`, so every
request generates exactly its `max_tokens`.

Needs the PyPI package `gguf` (and numpy, which it pulls in).

    python3 tiny_gguf.py OUT.gguf [--layers 4] [--width 384] [--heads 6] [--ff 1024]
                                  [--ctx 4096] [--seed 7] [--type f16]
"""

import argparse
import os

import gguf
import numpy as np

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Plain pieces after the byte tokens: "▁" marks a leading space (SentencePiece).
WORDS = ["▁", "▁the", "▁a", "▁and", "▁hello", "▁world", "▁once", "▁upon", "▁time", "▁count"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]


def vocabulary():
    """Tokens, scores and types, in id order."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    # Each piece once (a duplicate is a broken vocabulary to llama.cpp).
    pieces = list(dict.fromkeys(WORDS + LETTERS + ["▁" + c for c in LETTERS]))
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--type", choices=["f16", "f32"], default="f16")
    args = ap.parse_args()
    if args.width % args.heads:
        ap.error("--width must be a multiple of --heads")

    tokens, scores, types = vocabulary()
    n_vocab, d, ff = len(tokens), args.width, args.ff
    rng = np.random.default_rng(args.seed)
    dtype = np.float16 if args.type == "f16" else np.float32

    def matrix(rows, cols):
        # numpy's (rows, cols) is GGUF's [cols, rows]: a matrix mapping cols -> rows.
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(dtype)

    def norm():
        return np.ones(d, dtype=np.float32)

    # Written next to the target, then moved into place: a reader never sees half a file.
    tmp = f"{args.out}.tmp{os.getpid()}"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("spillway-tiny-random")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if args.type == "f16" else gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(n_vocab)
    w.add_context_length(args.ctx)
    w.add_embedding_length(d)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // args.heads)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML)

    w.add_tensor("token_embd.weight", matrix(n_vocab, d))
    for i in range(args.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", matrix(d, d))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(ff, d))
        w.add_tensor(f"blk.{i}.ffn_up.weight", matrix(ff, d))
        w.add_tensor(f"blk.{i}.ffn_down.weight", matrix(d, ff))
    w.add_tensor("output_norm.weight", norm())
    w.add_tensor("output.weight", matrix(n_vocab, d))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
