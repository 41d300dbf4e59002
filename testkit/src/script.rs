//! Misbehaving workers, scripted: raw bytes and their timing, per request. A script is
//! what the worker does with one request, step by step; [`scripted`] starts a worker that
//! asks the test's function for a script per request, with the request's place (over the
//! worker's life and on its connection).
//!
//! ```ignore
//! // Answers, then 10 ms later writes a second response nobody asked for.
//! let up = scripted(|n, _| Script::new().write(json_response(200, &format!("{n}")))
//!     .sleep_ms(10).write(json_response(200, "STALE")));
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::upstream::{Reply, Seen, Step, Upstream, upstream};

/// What a worker does with one request.
#[derive(Default)]
pub struct Script {
    steps: Vec<Step>,
}

impl Script {
    pub fn new() -> Script {
        Script::default()
    }

    /// Writes these bytes at once.
    pub fn write(mut self, bytes: impl AsRef<[u8]>) -> Script {
        self.steps.push(Step::Write(bytes.as_ref().to_vec()));
        self
    }

    /// Writes these bytes one at a time, `every_ms` apart (the first after one pause).
    pub fn trickle(mut self, bytes: impl AsRef<[u8]>, every_ms: u64) -> Script {
        let every = Duration::from_millis(every_ms);
        self.steps
            .push(Step::Trickle(bytes.as_ref().to_vec(), every));
        self
    }

    pub fn sleep_ms(mut self, ms: u64) -> Script {
        self.steps.push(Step::Sleep(Duration::from_millis(ms)));
        self
    }

    /// Closes the connection (FIN), whatever the response said about keep-alive.
    pub fn close(mut self) -> Script {
        self.steps.push(Step::Close);
        self
    }

    /// Resets the connection (RST).
    pub fn reset(mut self) -> Script {
        self.steps.push(Step::Reset);
        self
    }

    /// Stays silent until the proxy closes the connection.
    pub fn hang(mut self) -> Script {
        self.steps.push(Step::WaitClose);
        self
    }

    pub fn into_reply(self) -> Reply {
        if self.steps.is_empty() {
            // Nothing to say: hang up.
            return Reply::Close;
        }
        Reply::Steps(self.steps)
    }
}

/// A worker that runs `script(n, &request)` for its `n`-th request (0-based, over all its
/// connections); `request.on_connection` is the request's place on its connection.
pub fn scripted(script: impl Fn(usize, &Seen) -> Script + Send + Sync + 'static) -> Upstream {
    let n = AtomicUsize::new(0);
    upstream(move |seen| script(n.fetch_add(1, Ordering::SeqCst), seen).into_reply())
}
