#!/usr/bin/env python3
"""A tiny local "model" folder for Dynamo's mocker and frontend: a word-level tokenizer and
the config files they read. No weights: the mocker only needs the tokenizer (to count
prompt tokens and to detokenize the random token ids it generates) and the model card.

  python -m spillbench.dynamo_model DIR [--vocab 4096]   (Dynamo's venv: it needs tokenizers)

For bench/overload/dynamo.sh and bench/prefix/dynamo.sh. The vocabulary holds the single-
prompt load generator's filler words (spillbench.loadgen) and w0 … wN, so every id the
mocker may sample (it draws ids up to a few thousand) decodes to a non-empty word; with a
smaller vocabulary replies come back empty and the load generator counts no tokens.
"""

import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
# The words spillbench.loadgen puts in prompts, and the chat template's role markers.
WORDS = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "user", "assistant",
         "system", ":"]

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} : {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--vocab", type=int, default=4096)
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    vocab = {}
    for w in SPECIAL + WORDS:
        vocab.setdefault(w, len(vocab))
    i = 0
    while len(vocab) < a.vocab:
        vocab[f"w{i}"] = len(vocab)
        i += 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.save(os.path.join(a.dir, "tokenizer.json"))
    with open(os.path.join(a.dir, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
            "model_max_length": 32768,
            "add_bos_token": False, "add_eos_token": False,
            "chat_template": CHAT_TEMPLATE,
        }, f, indent=1)
    with open(os.path.join(a.dir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "pad_token": "<pad>"}, f, indent=1)
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": len(vocab), "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
            "head_dim": 64, "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
        }, f, indent=1)
    with open(os.path.join(a.dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}, f, indent=1)


if __name__ == "__main__":
    main()
