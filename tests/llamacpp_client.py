"""The official OpenAI Python client against Spillway in front of llama.cpp's own server.

Run by tests/llamacpp.rs with BASE_URL (the proxy's /v1) and MODEL. llama-server runs
with --ignore-eos, so every answer has exactly max_tokens tokens. Exits non-zero on the
first failed check.
"""

import os

import openai

BASE_URL = os.environ["BASE_URL"]
MODEL = os.environ["MODEL"]

client = openai.OpenAI(base_url=BASE_URL, api_key="unused", max_retries=0, timeout=60)
MESSAGES = [{"role": "user", "content": "Say hello"}]

# Non-streaming chat completion.
chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6)
assert chat.object == "chat.completion", chat
assert chat.choices[0].message.role == "assistant", chat
assert chat.choices[0].finish_reason == "length", chat
assert chat.usage.completion_tokens == 6, chat.usage
assert chat.usage.total_tokens == chat.usage.prompt_tokens + 6, chat.usage


def streamed_chat(max_tokens):
    """One streamed chat completion: its chunk count, finish reason and usage."""
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks, finish, usage = 0, None, None
    for chunk in stream:
        chunks += 1
        assert chunk.object == "chat.completion.chunk", chunk
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.finish_reason:
                finish = choice.finish_reason
    return chunks, finish, usage


# Streaming chat completion: chunks, the finish reason, then the usage.
chunks, finish, usage = streamed_chat(8)
assert chunks >= 3, chunks
assert finish == "length", finish
assert usage is not None and usage.completion_tokens == 8, usage

# Legacy completions, streamed: llama-server puts the usage in the last chunk.
finish, usage = None, None
for c in client.completions.create(model=MODEL, prompt="Once upon", max_tokens=5, stream=True):
    usage = c.usage or usage
    for choice in c.choices:
        finish = choice.finish_reason or finish
assert finish == "length", finish
assert usage is not None and usage.completion_tokens == 5, usage

# Streams back to back on the client's kept-alive connections (llama-server closes its
# own after each stream).
for i in range(10):
    _, finish, usage = streamed_chat(3)
    assert finish == "length" and usage.completion_tokens == 3, (i, finish, usage)

print("llama.cpp openai client checks passed")
