"""The official OpenAI Python client against Spillway in front of mock engines.

Run by tests/openai.rs with: BASE_URL (the proxy's /v1), ADMIN_URL, MODEL, WORKERS
(comma-separated worker names), BROKEN_MODEL (served by a worker whose streams break off
after one event). Exits non-zero on the first failed check.
"""

import json
import os
import urllib.request

import openai

BASE_URL = os.environ["BASE_URL"]
ADMIN_URL = os.environ["ADMIN_URL"]
MODEL = os.environ["MODEL"]
WORKERS = os.environ["WORKERS"].split(",")
BROKEN_MODEL = os.environ["BROKEN_MODEL"]

client = openai.OpenAI(base_url=BASE_URL, api_key="unused", max_retries=0, timeout=30)

# Non-streaming chat completion.
chat = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Say hello"}],
    max_tokens=6,
)
assert chat.object == "chat.completion", chat
assert chat.choices[0].message.role == "assistant"
assert chat.choices[0].message.content, chat
assert chat.choices[0].finish_reason == "length", chat
assert chat.usage.completion_tokens == 6, chat.usage
assert chat.usage.total_tokens == chat.usage.prompt_tokens + 6

# Streaming chat completion: deltas arrive as chunks and add up.
stream = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Count to five"}],
    max_tokens=5,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
assert len(pieces) == 5, pieces
assert finish == "length", finish
assert usage is not None and usage.completion_tokens == 5, usage

# Legacy completions, streamed.
text = "".join(
    c.choices[0].text
    for c in client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4, stream=True)
    if c.choices
)
assert text.strip(), text

# A stream whose worker dies after one event: the SDK raises Spillway's last error
# event as an APIError instead of returning a truncated answer as complete.
stream = client.chat.completions.create(
    model=BROKEN_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
)
deltas = []
try:
    for chunk in stream:
        deltas.extend(c.delta.content for c in chunk.choices if c.delta.content)
except openai.APIConnectionError as e:
    raise AssertionError(f"a broken stream surfaced as a connection error: {e!r}")
except openai.APIError as e:
    assert "broke off" in e.message, e.message
    assert e.body["code"] == 502, e.body
else:
    raise AssertionError(f"a broken stream ended as if complete: {deltas}")
assert deltas == ["Hel"], deltas

# Models list.
assert MODEL in [m.id for m in client.models.list().data]


def admin_post(path, body):
    req = urllib.request.Request(
        ADMIN_URL + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200, resp.status


# Every worker busy: a 529 surfaces as the client's documented error for statuses >= 500.
admin_post("/busy_threshold", {"model": MODEL, "active_prefill_tokens_threshold": 0})
admin_post("/load", [{"worker_id": w, "active_prefill_tokens": 1000} for w in WORKERS])
try:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
except openai.InternalServerError as e:
    assert e.status_code == 529, e.status_code
    assert e.response.headers.get("retry-after") == "1", e.response.headers
    body = e.response.json()
    dynamo = {k: body[k] for k in ("message", "type", "code")}
    assert dynamo == {"message": "Service temporarily overloaded", "type": "Overloaded", "code": 529}, body
    assert body["knob"] == "prefill_tokens" and body["threshold"] == 0, body
else:
    raise AssertionError("expected a 529")

# An unknown model is the client's NotFoundError.
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
except openai.NotFoundError as e:
    assert e.status_code == 404
else:
    raise AssertionError("expected a 404")

print("openai client checks passed")
