//! The requests of a disaggregated request's two stages (docs/behaviour.md §23), built in
//! the connection's buffers by splicing (`route::handoff`): no JSON tree, and no
//! allocation once the buffers have grown. While stage 1 runs, `to_worker` holds the
//! prefill worker's request and `kept` the client's; stage 2's request is the client's
//! with the prefill answer's `kv_transfer_params` spliced in, or the client's own when
//! there are none (the decode worker then prefills it itself). SGLang's one request, for
//! both workers, is the client's with the prefill worker's bootstrap fields.

use super::exchange::Exchange;
use crate::http::write::set_content_length;
use crate::route::handoff::{
    Bootstrap, Handed, kv_transfer_params, sglang, vllm_decode, vllm_prefill,
};
use crate::route::peek::peek;

/// Puts stage 1's request in `to_worker` and the client's in `kept`. False (and nothing
/// moved) when the body cannot be rewritten.
pub(super) fn prefill_request(ex: &mut Exchange<'_, '_>) -> bool {
    let io = &mut *ex.io;
    let body = io.to_worker.get(ex.head_len..).unwrap_or_default();
    if vllm_prefill(body, &mut io.kept).is_err() {
        return false;
    }
    std::mem::swap(&mut io.to_worker, &mut io.kept);
    with_client_head(ex);
    true
}

/// Puts stage 2's request in `to_worker`: the client's (in `kept`) with the
/// `kv_transfer_params` of stage 1's answer (collected in `to_client`), or the client's
/// own when that answer has none.
pub(super) fn decode_request(ex: &mut Exchange<'_, '_>) -> Handed {
    let io = &mut *ex.io;
    let params = match kv_transfer_params(&io.to_client) {
        Ok(Some((start, end))) => &io.to_client[start..end],
        Ok(None) | Err(_) => return client_request(ex),
    };
    let body = io.kept.get(ex.head_len..).unwrap_or_default();
    if vllm_decode(body, params, &mut io.to_worker).is_err() {
        return client_request(ex);
    }
    io.to_client.clear();
    with_client_head(ex);
    Handed::Remote
}

/// Copies the client's request to `kept`, for [`sglang_request`] to build from.
pub(super) fn keep_client_request(ex: &mut Exchange<'_, '_>) {
    let io = &mut *ex.io;
    io.kept.clear();
    io.kept.extend_from_slice(&io.to_worker);
}

/// Puts SGLang's request in `to_worker`: the client's (in `kept`) with the bootstrap
/// fields `at`. False when the body cannot be rewritten.
pub(super) fn sglang_request(ex: &mut Exchange<'_, '_>, at: Bootstrap<'_>) -> bool {
    let io = &mut *ex.io;
    let body = io.kept.get(ex.head_len..).unwrap_or_default();
    if sglang(body, at, &mut io.to_worker).is_err() {
        return false;
    }
    with_client_head(ex);
    true
}

/// Puts the client's own request back in `to_worker`.
pub(super) fn client_request(ex: &mut Exchange<'_, '_>) -> Handed {
    let io = &mut *ex.io;
    std::mem::swap(&mut io.to_worker, &mut io.kept);
    io.to_client.clear();
    let prompt = &ex.req.prompt;
    ex.prompt_at = ex.head_len + prompt.start..ex.head_len + prompt.end;
    Handed::Fallback
}

/// `to_worker` holds a stage's body: the client's head (from `kept`) goes before it, its
/// `content-length` says the body's length, and the prompt's place is found again.
fn with_client_head(ex: &mut Exchange<'_, '_>) {
    let io = &mut *ex.io;
    let head = io.kept.get(..ex.head_len).unwrap_or_default();
    let body_len = io.to_worker.len();
    io.to_worker.splice(0..0, head.iter().copied());
    let mut body_at = ex.head_len;
    if let Some(at) = ex.length_at.clone() {
        let digits = set_content_length(&mut io.to_worker, at.clone(), body_len);
        body_at = body_at + digits.len() - at.len();
    }
    let body = io.to_worker.get(body_at..).unwrap_or_default();
    let prompt = peek(body).ok().and_then(|p| p.prompt).unwrap_or_default();
    ex.prompt_at = body_at + prompt.0..body_at + prompt.1;
}
