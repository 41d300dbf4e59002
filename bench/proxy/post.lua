-- wrk/wrk2 request: a small chat-completions POST on keep-alive connections.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"bench-model","messages":[{"role":"user","content":"Say hello in one word."}],"max_tokens":8}'
