//! One generation on a connection: submit the request to the engine, then relay its tokens
//! as the scheduler produces them, as SSE events or one JSON body, while watching the
//! client so that leaving aborts the sequence at once.

use std::io;
use std::rc::Rc;
use std::task::Poll;

use super::conn::Conn;
use super::handoff::Job;
use super::{Mock, SeqGuard, Slot};
use crate::clock;
use crate::disagg::{self, Plan};
use crate::http::{self, LAST_CHUNK};
use crate::openai::{self, Api, ApiError, DONE_EVENT, Generate, Renderer, Text, Usage};
use crate::sim::{SeqId, SubmitError};

/// A generation under way: what it renders with, and what it has relayed.
struct Generation<'a> {
    g: Generate,
    plan: Plan,
    id: SeqId,
    renderer: Renderer<'a>,
    text: Text,
    /// HTTP/1.1: events go out as chunks; HTTP/1.0 delimits a stream by the close.
    chunked: bool,
    keep_alive: bool,
    /// Tokens rendered so far.
    sent: u32,
    /// The answer so far, when not streaming.
    content: String,
}

impl Conn {
    /// Runs one generation: submits it, then relays its tokens as they are produced,
    /// streaming them or collecting them into one body. Returns whether the connection
    /// stays open.
    pub(super) async fn generate(&mut self, job: Job, chunked: bool, keep_alive: bool) -> bool {
        let mock = self.mock.clone();
        let Job { g, prefix, plan } = job;
        let id = match submit(&mock, &g, prefix, &plan) {
            Ok(id) => id,
            Err(e) => {
                let body = ApiError::bad_request(e.to_string()).body();
                self.reply(400, "application/json", &body, keep_alive, true);
                return self.flush().await && keep_alive;
            }
        };
        let slot = Rc::new(Slot::default());
        mock.slots.borrow_mut().insert(id, slot.clone());
        let _guard = SeqGuard { mock: &mock, id };
        mock.kick.notify();

        mock.count(|c| c.decided(&plan));
        let mut run = Generation {
            g,
            plan,
            id,
            renderer: Renderer {
                api: g.api,
                id: mix(mock.cfg.seed, id),
                created: clock::unix_secs(),
                model_json: &mock.model_json,
                fingerprint: &mock.fingerprint,
            },
            text: Text::new(mock.cfg.seed, id),
            chunked,
            keep_alive: keep_alive && (chunked || !g.stream),
            sent: 0,
            content: String::new(),
        };
        tracing::debug!(
            seq = id,
            prompt_tokens = g.prompt_tokens,
            max_tokens = g.max_tokens,
            stream = g.stream,
            prefill = run.plan.prefill(),
            "request queued"
        );
        self.relay(&mut run, &slot).await
    }

    /// Sends the stream's head, then each batch of tokens the scheduler leaves in `slot`,
    /// until the sequence is done or the client leaves.
    async fn relay(&mut self, run: &mut Generation<'_>, slot: &Slot) -> bool {
        if run.g.stream {
            self.out.clear();
            http::response_head(
                &mut self.out,
                200,
                "text/event-stream",
                None,
                run.chunked,
                run.keep_alive,
                prefill_header(&run.plan),
            );
            if !self.flush().await {
                return false;
            }
        }
        self.reader.watch();
        loop {
            match self.woken(slot, run.sent).await {
                Some(Ok(0)) | Some(Err(_)) => {
                    tracing::debug!(seq = run.id, tokens = run.sent, "client left");
                    return false;
                }
                // A pipelined request: it stays buffered for after this one.
                Some(Ok(_)) => continue,
                None => {}
            }
            let done = slot.done.get();
            self.out.clear();
            self.render_tokens(run, slot.generated.get(), done);
            if done {
                return self.finish(run, slot).await;
            }
            if !self.flush().await {
                tracing::debug!(seq = run.id, tokens = run.sent, "client left mid-stream");
                return false;
            }
        }
    }

    /// Waits for new tokens (`None`) or for the client's read to complete.
    async fn woken(&mut self, slot: &Slot, sent: u32) -> Option<io::Result<usize>> {
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = self.reader.poll_read(cx) {
                return Poll::Ready(Some(r));
            }
            if slot.generated.get() > sent || slot.done.get() {
                return Poll::Ready(None);
            }
            slot.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }

    /// Renders the tokens up to `generated`: as events into `out`, or into the answer.
    fn render_tokens(&mut self, run: &mut Generation<'_>, generated: u32, done: bool) {
        while run.sent < generated {
            let (space, word) = run.text.next_token();
            run.sent += 1;
            let finish = (done && run.sent == generated).then_some(run.g.finish);
            if !run.g.stream {
                run.content.push_str(space);
                run.content.push_str(word);
                continue;
            }
            let renderer = &run.renderer;
            if run.sent == 1 && run.g.api == Api::Chat {
                self.event(run.chunked, |e| renderer.role_event(e));
            }
            self.event(run.chunked, |e| {
                renderer.token_event(e, &[space, word], finish)
            });
        }
    }

    /// Ends the response: usage and `[DONE]` for a stream, the whole body otherwise.
    async fn finish(&mut self, run: &mut Generation<'_>, slot: &Slot) -> bool {
        let usage = Usage {
            prompt_tokens: run.g.prompt_tokens,
            completion_tokens: run.sent,
            cached_tokens: self
                .mock
                .engine_cfg
                .enable_prefix_caching
                .then(|| slot.cached.get()),
        };
        let renderer = &run.renderer;
        if run.g.stream {
            if run.g.include_usage {
                self.event(run.chunked, |e| renderer.usage_event(e, usage));
            }
            self.event(run.chunked, |e| e.extend_from_slice(DONE_EVENT));
            if run.chunked {
                self.out.extend_from_slice(LAST_CHUNK);
            }
        } else {
            self.event.clear();
            renderer.response(&mut self.event, &run.content, run.g.finish, usage);
            if let Plan::PrefillVllm(ids) = &run.plan {
                let mut params = Vec::with_capacity(256);
                disagg::render_params(&mut params, ids, &self.mock.disagg.identity);
                openai::append_field(&mut self.event, "kv_transfer_params", &params);
            }
            http::response_head(
                &mut self.out,
                200,
                "application/json",
                Some(self.event.len()),
                true,
                run.keep_alive,
                prefill_header(&run.plan),
            );
            self.out.extend_from_slice(&self.event);
        }
        if let Some(protocol) = run.plan.prefill_for() {
            self.mock.count(|c| c.prefilled(protocol));
        }
        tracing::debug!(
            seq = run.id,
            completion_tokens = run.sent,
            "request finished"
        );
        self.flush().await && run.keep_alive
    }
}

/// Queues a job in the engine: a received prompt lands after its transfer time.
fn submit(mock: &Mock, g: &Generate, prefix: Vec<u64>, plan: &Plan) -> Result<SeqId, SubmitError> {
    let now = mock.now();
    let mut engine = mock.engine.borrow_mut();
    match *plan {
        Plan::Receive(_, blocks) => {
            let landing = now + mock.transfer_us(blocks);
            engine.submit_remote(now, g.prompt_tokens, g.max_tokens, landing)
        }
        _ => engine.submit_prefixed(now, g.prompt_tokens, g.max_tokens, prefix),
    }
}

/// The `x-mock-prefill` header line: where the prompt was prefilled.
fn prefill_header(plan: &Plan) -> &'static [u8] {
    if matches!(plan, Plan::Receive(..)) {
        b"x-mock-prefill: remote\r\n"
    } else {
        b"x-mock-prefill: local\r\n"
    }
}

/// A response id from the seed and the sequence id (splitmix64's finalizer).
fn mix(seed: u64, id: SeqId) -> u64 {
    let mut x = seed ^ id.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
