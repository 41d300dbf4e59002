//! The request bodies of disaggregated serving's stages (issue 32):
//! an OpenAI-style body rewritten for a prefill or a decode worker by splicing byte ranges
//! into a caller's buffer. No JSON tree is built: the top-level members are found by
//! [`walk`], those the stage replaces are left out, every other member is copied verbatim
//! (escapes, spacing and order kept), and the stage's own members are written after them.
//! A key is matched after decoding its escapes, as the engine's parser reads it, so an
//! escaped spelling of a replaced key is left out too; so is every copy of a repeated one.
//! `out` is cleared first and only grows when it is too small, so a buffer kept per
//! connection makes the rewrites allocation-free in steady state.
//!
//! `proxy/stages.rs` builds both handoffs' requests with these.

use super::peek::{JsonStr, PeekError, walk};

/// How a disaggregated request's stage 2 began (`spillway_handoffs_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handed {
    /// With the prefill answer's transfer parameters: the decode worker pulls the KV cache.
    Remote,
    /// With the client's own request: stage 1 failed or kept nothing.
    Fallback,
    /// Without stage 1: the prompt was short enough (uncached) to prefill where it decodes.
    Local,
}

impl Handed {
    pub const ALL: [Handed; 3] = [Handed::Remote, Handed::Fallback, Handed::Local];

    pub fn label(self) -> &'static str {
        match self {
            Handed::Remote => "remote",
            Handed::Fallback => "fallback",
            Handed::Local => "local",
        }
    }
}

/// vLLM's stage 1 asks the prefill worker to keep the KV blocks for a remote decode
/// (NixlConnector's request to a prefill instance, as vLLM's disaggregated proxies send it).
const VLLM_PREFILL_PARAMS: &[u8] = br#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// Top-level keys vLLM's stage 1 replaces.
const VLLM_PREFILL_REPLACED: [&[u8]; 5] = [
    b"stream",
    b"stream_options",
    b"max_tokens",
    b"max_completion_tokens",
    b"kv_transfer_params",
];

/// Top-level keys SGLang's handoff replaces.
const SGLANG_REPLACED: [&[u8]; 3] = [b"bootstrap_host", b"bootstrap_port", b"bootstrap_room"];

/// Copies `body`'s top-level members into `out` as an object, leaving out those whose key
/// `drop` names (it sees every key), and leaves the object open (no closing brace):
/// returns whether a member was written (so the next one needs a comma).
fn copy_members(
    body: &[u8],
    mut drop: impl FnMut(&JsonStr<'_>) -> bool,
    out: &mut Vec<u8>,
) -> Result<bool, PeekError> {
    out.clear();
    out.push(b'{');
    let mut wrote = false;
    walk(body, |m| {
        if drop(&m.key) {
            return Ok(());
        }
        if wrote {
            out.push(b',');
        }
        out.extend_from_slice(&body[m.span.0..m.span.1]);
        wrote = true;
        Ok(())
    })?;
    Ok(wrote)
}

/// Appends `"key":value` (value as raw JSON) after `wrote` members.
fn member(out: &mut Vec<u8>, wrote: &mut bool, key: &[u8], value: &[u8]) {
    if *wrote {
        out.push(b',');
    }
    out.push(b'"');
    out.extend_from_slice(key);
    out.extend_from_slice(b"\":");
    out.extend_from_slice(value);
    *wrote = true;
}

/// vLLM's stage 1: `body` for a prefill worker, into `out`: `stream` false, `max_tokens` 1
/// (and `max_completion_tokens` 1 when the request has it), no `stream_options`, and
/// `kv_transfer_params` asking for a remote decode; every other member as sent.
pub fn vllm_prefill(body: &[u8], out: &mut Vec<u8>) -> Result<(), PeekError> {
    let mut completion = false;
    let replaced = |k: &JsonStr<'_>| {
        completion |= k.is(b"max_completion_tokens");
        VLLM_PREFILL_REPLACED.iter().any(|r| k.is(r))
    };
    let mut wrote = copy_members(body, replaced, out)?;
    member(out, &mut wrote, b"stream", b"false");
    member(out, &mut wrote, b"max_tokens", b"1");
    if completion {
        member(out, &mut wrote, b"max_completion_tokens", b"1");
    }
    member(out, &mut wrote, b"kv_transfer_params", VLLM_PREFILL_PARAMS);
    out.push(b'}');
    Ok(())
}

/// The `kv_transfer_params` value of a prefill worker's response body, as its raw JSON
/// (start, end) in `response`: what stage 2 splices in verbatim. `None` when absent or
/// `null` (the prefill worker did not keep the blocks).
pub fn kv_transfer_params(response: &[u8]) -> Result<Option<(usize, usize)>, PeekError> {
    let mut found = None;
    walk(response, |m| {
        if m.key.is(b"kv_transfer_params") {
            let value = (m.value_at, m.span.1);
            found = Some(value).filter(|&(a, b)| &response[a..b] != b"null");
        }
        Ok(())
    })?;
    Ok(found)
}

/// vLLM's stage 2: the client's `body` for a decode worker, into `out`, with `params` (a
/// prefill response's `kv_transfer_params`, raw JSON) in place of any it had.
pub fn vllm_decode(body: &[u8], params: &[u8], out: &mut Vec<u8>) -> Result<(), PeekError> {
    let mut wrote = copy_members(body, |k| k.is(b"kv_transfer_params"), out)?;
    member(out, &mut wrote, b"kv_transfer_params", params);
    out.push(b'}');
    Ok(())
}

/// Where an SGLang prefill worker's KV cache is fetched from, and the transfer's room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bootstrap<'a> {
    /// The prefill worker's host (written as a JSON string: quotes and backslashes
    /// escaped, control characters left out).
    pub host: &'a str,
    pub port: u16,
    /// A fresh random number below 2^63 per request.
    pub room: u64,
}

/// SGLang's handoff: `body` for both the prefill and the decode worker, into `out`, with
/// `bootstrap_host`, `bootstrap_port` and `bootstrap_room` in place of any it had.
pub fn sglang(body: &[u8], at: Bootstrap<'_>, out: &mut Vec<u8>) -> Result<(), PeekError> {
    let replaced = |k: &JsonStr<'_>| SGLANG_REPLACED.iter().any(|r| k.is(r));
    let mut wrote = copy_members(body, replaced, out)?;
    let mut digits = itoa::Buffer::new();
    if wrote {
        out.push(b',');
    }
    out.extend_from_slice(b"\"bootstrap_host\":\"");
    for &b in at.host.as_bytes().iter().filter(|b| !b.is_ascii_control()) {
        if b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
    wrote = true;
    member(
        out,
        &mut wrote,
        b"bootstrap_port",
        digits.format(at.port).as_bytes(),
    );
    let room = at.room & (u64::MAX >> 1);
    member(
        out,
        &mut wrote,
        b"bootstrap_room",
        digits.format(room).as_bytes(),
    );
    out.push(b'}');
    Ok(())
}

#[cfg(test)]
mod tests;
