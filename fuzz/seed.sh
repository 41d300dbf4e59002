#!/usr/bin/env bash
# Regenerates the seed corpora (fuzz/corpus/<target>/seed-*) from the cases the tests use:
# the wire tables of src/http/{request,response,chunked}.rs, tests/bad_input.rs, the
# request-smuggling probes of tests/framing/cases.json, the scanner table of
# src/route/peek.rs, the example configuration and presets (tuning/), the load events of
# tests/shedding.rs, the bodies of tests/busy_threshold.rs and the exposition texts of
# src/monitor/scrape.rs. Seeds only; what libFuzzer finds is not kept.
#
# Inputs of the stream targets (chunked, codec, relay) start with two control bytes that
# say how the stream is cut (fuzz/src/lib.rs, `Pieces`): "E0" cuts it into pieces of
# 1..16 bytes under default limits, "F0" 1..100, "@0" not at all, "A0" byte by byte.
set -euo pipefail
cd "$(dirname "$0")"
C=corpus
rm -f "$C"/*/seed-*

# put TARGET NAME TEXT: TEXT with printf %b escapes (\r, \n, \0, \xHH) decoded.
put() { mkdir -p "$C/$1"; printf '%b' "$3" >"$C/$1/seed-$2"; }
# raw TARGET NAME TEXT: TEXT as is (JSON keeps its own backslash escapes).
raw() { mkdir -p "$C/$1"; printf '%s' "$3" >"$C/$1/seed-$2"; }

# --- request heads: src/http/request.rs WIRE, tests/bad_input.rs -------------------
n=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  n=$((n + 1))
  put request_head "$(printf %02d $n)" "$line"
done <<'EOF'
GET / HTTP/1.1\r\nHost: a\r\n\r\n
GET / HTTP/1.1\r\nHost: a\r\n
GET / HTTP/1.0\r\n\r\n
GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n
GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n
POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n
POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n
POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n
POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n
POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n
POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n
POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n
POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n
POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n
GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n
GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n
GET / HTTP/2.0\r\nHost: a\r\n\r\n
G@T / HTTP/1.1\r\nHost: a\r\n\r\n
GET / HTTP/1.1\r\nHo st: a\r\n\r\n
GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n
GET foo HTTP/1.1\r\nHost: a\r\n\r\n
POST http://example.com/v1/completions?x=1 HTTP/1.1\r\nHost: e\r\n\r\n
GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, x-0,x-1,x-2\r\nX-1: v\r\nX-Kept: v\r\n\r\n
POST /v1/chat HTTP/1.1\r\nHost: h\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Authorization: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\nX-Request-Id: abc\r\nX-Forwarded-For: 1.2.3.4\r\nContent-Type: application/json\r\nX-Keep: y\r\n\r\n
GARBAGE\r\n\r\n
POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 999999999\r\n\r\n
POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 1x\r\n\r\n
POST /v1/completions HTTP/1.1\r\nHost: h\r\nX-Worker-Id: w1\r\nAuthorization: Bearer t\r\nX-Request-Id: has space\r\nContent-Length: 13\r\n\r\n
EOF

# --- response heads: src/http/response.rs WIRE -----------------------------------
n=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  n=$((n + 1))
  put response_head "$(printf %02d $n)" "$line"
done <<'EOF'
HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc
HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n
HTTP/1.1 200 OK\r\n\r\n
HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n
HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n
HTTP/1.1 204 No Content\r\n\r\n
HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n
HTTP/1.1 100 Continue\r\n\r\n
HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n
HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n
HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n
HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n
HTTP/2 200 OK\r\n\r\n
HTTP/1.1 529 \r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}
HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\nX-Request-Id: up\r\nKeep-Alive: 5\r\nConnection: X-Gone\r\nX-Gone: 1\r\nX-Kept: 1\r\n\r\n
EOF

# --- chunked bodies: src/http/chunked.rs wire table, SSE payloads ------------------
n=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  n=$((n + 1))
  put chunked "$(printf %02d $n)" "E0$line"
done <<'EOF'
5\r\nhello\r\n0\r\n\r\n
5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nNEXT
5;ext=1\r\nhello\r\n0\r\n\r\n
A\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n
0\r\n\r\n
zz\r\nhello\r\n0\r\n\r\n
5\r\nhelloXX0\r\n\r\n
ffffffffffffffffffff\r\n
0\r\nX-T 1\r\n\r\n
0\r\n\n
5\r\nhel
1c\r\ndata: {"choices":[{"x":1}]}\n\n\r\n10\r\ndata: [DONE]\n\n\r\n0\r\n\r\n
EOF

# --- whole responses through the relay: src/http/reframe/tests.rs, tests/upstream_faults.rs
n=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  n=$((n + 1))
  put relay "$(printf %02d $n)" "$line"
done <<'EOF'
E0HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n13\r\ndata: {"token":0}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n
A0HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n13\r\ndata: {"token":0}\n\n\r\n40\r\ndata: {"tok
F0HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\nHTTP/1.1 200 OK\r\n\r\nSTALE
@0HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {"a":1}\n\ndata: {"b":2}\n
E0HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloSTALE
C0HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nhello
E0HTTP/1.1 204 No Content\r\n\r\nSTALE
E0HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\ndata: {}\r\n
B0HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n13\r\ndata: {"token":0}\n\n\r\nzz\r\n
E0HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}
EOF

# --- request bodies: src/route/peek.rs table --------------------------------------
n=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  n=$((n + 1))
  raw peek "$(printf %02d $n)" "$line"
done <<'EOF'
{"model":"m1","messages":[]}
  {  "model" : "m1" }  
{"messages":[{"model":"nested"}],"model":"top"}
{"x":{"model":"nested","y":[1,{"model":"deeper"}]}}
{"prompt":"say \"model\": \"fake\"","model":"real"}
{"model":"Qwen\/Qwen3-0.6B"}
{"model":"caf\u00e9 \ud83d\ude00"}
{"\u006dodel":"escaped-key"}
{"a":[],"b":{},"c":null,"d":-1.5e3,"model":"m"}
{"model":"m1",}
{"a":{]}
{"model":"a","mod\u0065l":"b"}
{"model":"\ud800"}
{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}]}
{"model":"m","stream":false,"max_tokens":5,"max_completion_tokens":7,"prompt":["a","b"]}
{"model":"m","input":"embed me","messages":[{"role":"user","content":[{"type":"text","text":"x"}]},7]}
EOF

# --- whole requests through the codec: pipelined, chunked, tests/bad_input.rs -------
put codec 01 'E0POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nContent-Length: 57\r\n\r\n{"model":"m","messages":[{"role":"user","content":"hi"}]}GET /v1/models HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n'
put codec 02 'F0POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n7\r\n{"model\r\na;x=y\r\n":"m","pro\r\n0d\r\nmpt":"hello"}\r\n0\r\nX-T: 1\r\n\r\nPOST /v1/completions HTTP/1.0\r\nContent-Length: 13\r\n\r\n{"model":"m"}'
put codec 03 'A0POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 17\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n'
put codec 04 'E0POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{"model":"m"}\r\n0\r\n\r\n'
put codec 05 '\xc5\xbfPOST http://h/v1/chat/completions HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 10.0.0.1\r\nX-Request-Id: abc\r\nContent-Length: 13\r\n\r\n{"model":"m"}GET / HTTP/1.1\r\nHost: h\r\n\r\n'
put codec 06 '@0GET /v1/models HTTP/1.0\r\n\r\n'

# The request-smuggling and malformed-framing probes of tests/framing/cases.json (one
# character per byte), cut into pieces of 1..16 bytes.
python3 - "$C/codec" <<'PY'
import json, sys
for case in json.load(open("../tests/framing/cases.json"))["cases"]:
    with open(f"{sys.argv[1]}/seed-framing-{case['name']}", "wb") as f:
        f.write(b"E0" + case["request"].encode("latin-1"))
PY

# --- configuration: tuning/ --------------------------------------------------------
mkdir -p "$C/config"
cp ../tuning/spillway.toml "$C/config/seed-example"
for f in ../tuning/presets/*.toml; do cp "$f" "$C/config/seed-$(basename "$f" .toml)"; done
put config small '[[models]]\nname = "m"\nrouter_mode = "kv"\nactive_decode_blocks_threshold = 0.5\n[[models.workers]]\nurl = "http://127.0.0.1:1"\nname = "a"\nkv_total_blocks = 100\ndp_size = 2\nload_sources = ["push", "scrape"]\nmetrics_format = "sglang"\n[[models.workers]]\nurl = "http://[::1]:2"\nname = "b"\nengine_request_limit = 4\n'
put config bad '[[models]]\nname = "m"\n[[models.workers]]\nurl = "ftp://x"\ndp_size = 0\n'

# --- admin /load: tests/shedding.rs -----------------------------------------------
n=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  n=$((n + 1))
  raw admin_load "$(printf %02d $n)" "$line"
done <<'EOF'
{"worker_id":"a","active_decode_blocks":60,"kv_total_blocks":100}
[{"worker_id":"a","dp_rank":1,"active_prefill_tokens":1001,"max_num_batched_tokens":1000},{"worker_id":7,"kv_used_blocks":5}]
{"worker_id":"b","dp_size":3,"dp_rank":2,"active_decode_blocks":1}
{"worker_id":"nobody","active_decode_blocks":1}
[{"worker_id":"a","active_decode_blocks":1},{"worker_id":"ghost"}]
{"worker_id":"a","active_decode_blocks":-1}
{"worker_id":"a","bogus":1}
{"worker_id":"a","dp_rank":3}
{"worker_id":"a","dp_size":1024,"dp_rank":1023,"kv_used_blocks":18446744073709551615}
not json
EOF

# --- admin /busy_threshold: tests/busy_threshold.rs -------------------------------
n=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  n=$((n + 1))
  raw busy_threshold "$(printf %02d $n)" "$line"
done <<'EOF'
{"model":"m","active_decode_blocks_threshold":0.85}
{"model":"m","active_decode_blocks_threshold":null,"active_prefill_tokens_threshold_frac":1.5}
{"model":"m"}
{"model":"m","active_decode_blocks_threshold":1.5}
{"model":"m","active_prefill_tokens_threshold":-5}
{"model":"m","active_prefill_tokens_threshold":2.5}
{"model":"m","active_decode_blocks_threshold":"high"}
{"active_decode_blocks_threshold":0.5}
{"model":"m","typo_threshold":"x"}
EOF

# --- engine metrics: src/monitor/scrape.rs ----------------------------------------
put scrape vllm '# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.5\nvllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.25\nvllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 7.0\nvllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 2.0\nvllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2000",prefix="a\\"b,c=d"} 1.0\nvllm:gpu_cache_usage_perc{engine="1"} 0.1\n'
put scrape sglang 'sglang:token_usage{dp_rank="0"} 0.5\nsglang:token_usage{dp_rank="1"} +Inf\nsglang:max_total_num_tokens{dp_rank="1"} 32000\nsglang:num_running_reqs{dp_rank="0"} 3\nsglang:num_queue_reqs 1e3\n'
put scrape llamacpp 'llamacpp:kv_cache_usage_ratio 0.3\nllamacpp:requests_processing 1\nllamacpp:requests_deferred\t4\n'

# --- NATS server operations: src/fleet/nats/proto/tests.rs ----------------------------
# Control bytes as for the stream targets; a second byte with its top bit set ("\xa0")
# picks the tiny payload bound.
put nats_proto 01 'A0INFO {"server_id":"x","max_payload":1048576,"headers":true}\r\n+OK\r\nPING\r\n'
put nats_proto 02 'E0MSG load.a 1 5\r\nhello\r\nMSG load.b.c 1 _INBOX.7 0\r\n\r\nPONG\r\n'
put nats_proto 03 'F0-ERR \x27Stale Connection\x27\r\nping\r\nmsg x 2 2\r\n\r\n\r\n'
put nats_proto 04 'A\xa0MSG a 1 40\r\n0123456789012345678901234567890123456789\r\n'
put nats_proto 05 '@0HMSG a 1 10 12\r\nNATS/1.0\r\n\r\nhi\r\n'
put nats_proto 06 'C0MSG a 99999999999999999999 1\r\nx\r\nPING\n'

# --- TLS records: a control byte (version, cipher, first sequence number), a cut, bytes
put tls_record 01 '\x01\x01GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n'
put tls_record 02 '\x02\x05\x17\x03\x03\x00\x20aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'
put tls_record 03 '\x07\x00\x14\x03\x03\x00\x01\x01\x17\x03\x03\x40\x11'
put tls_record 04 '\x00\x02\x17\x03\x03\x00\x00\x15\x03\x03\x00\x02\x01\x00'

echo "$(ls "$C"/*/seed-* | wc -l) seeds, $(cat "$C"/*/seed-* | wc -c) bytes"
