//! A load event as `POST /load` and NATS carry it (Dynamo's `ActiveLoad`, plus optional
//! capacity fields), read without allocating per worker name, and why a batch of them is
//! refused. Pure.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer as _};

/// A worker id in a load event: the configured name (borrowed from the message unless it
/// had escapes), or a number matched against names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerRef<'a> {
    Name(Cow<'a, str>),
    Number(u64),
}

impl<'de: 'a, 'a> Deserialize<'de> for WorkerRef<'a> {
    /// A string or a non-negative integer, read directly (an untagged enum would buffer
    /// each value first: this runs for every event of every load message).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<WorkerRef<'a>, D::Error> {
        struct Id;
        impl<'de> serde::de::Visitor<'de> for Id {
            type Value = WorkerRef<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a worker name or a non-negative integer")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(WorkerRef::Name(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(WorkerRef::Name(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(WorkerRef::Name(Cow::Owned(v)))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(WorkerRef::Number(v))
            }
        }
        d.deserialize_any(Id)
    }
}

impl WorkerRef<'_> {
    pub fn name(&self) -> String {
        match self {
            WorkerRef::Name(s) => s.to_string(),
            WorkerRef::Number(n) => n.to_string(),
        }
    }
}

/// Dynamo's `ActiveLoad` event, plus optional capacity fields. Borrows its worker name
/// from the message it was read from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadEvent<'a> {
    #[serde(borrow)]
    pub worker_id: WorkerRef<'a>,
    #[serde(default)]
    pub dp_rank: u32,
    pub active_decode_blocks: Option<u64>,
    pub active_prefill_tokens: Option<u64>,
    pub kv_used_blocks: Option<u64>,
    pub kv_total_blocks: Option<u64>,
    pub max_num_batched_tokens: Option<u64>,
    pub dp_size: Option<u32>,
    /// Requests waiting in the engine's queue (Dynamo's `WorkerStats` field name).
    #[serde(default)]
    pub num_requests_waiting: Option<u64>,
    /// The engine's slots, all ranks together (Dynamo's `WorkerStats` field name).
    #[serde(default)]
    pub request_total_slots: Option<u64>,
}

/// Parses a `POST /load` body: one event, or an array of them. The first byte decides,
/// so an array is read straight into a `Vec` (an untagged enum would buffer it first).
///
/// The whole body's UTF-8 is checked once, up front (ASCII goes by words): from bytes,
/// serde_json checks each string it reads, a fifth of the work for these messages.
pub fn parse_events(body: &[u8]) -> serde_json::Result<Vec<LoadEvent<'_>>> {
    let text = std::str::from_utf8(body).map_err(serde::de::Error::custom)?;
    if text.trim_ascii_start().starts_with('[') {
        let mut de = serde_json::Deserializer::from_str(text);
        let events = de.deserialize_seq(EventsVisitor(text.len()))?;
        de.end()?;
        Ok(events)
    } else {
        serde_json::from_str::<LoadEvent>(text).map(|e| vec![e])
    }
}

/// An array of events into a `Vec` sized once from the array's length in bytes (serde's
/// own starts empty and grows, copying as it doubles).
struct EventsVisitor(usize);

/// Bytes per event `EventsVisitor` sizes for: events usually take about 100, so this
/// leaves room for all of them.
const BYTES_PER_EVENT: usize = 64;
/// Most events `EventsVisitor` reserves room for up front (a larger array grows).
const RESERVE_EVENTS: usize = 64;

impl<'de> serde::de::Visitor<'de> for EventsVisitor {
    type Value = Vec<LoadEvent<'de>>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of load events")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut events = Vec::with_capacity((self.0 / BYTES_PER_EVENT).clamp(1, RESERVE_EVENTS));
        while let Some(e) = seq.next_element()? {
            events.push(e);
        }
        Ok(events)
    }
}

impl WorkerRef<'_> {
    /// Runs `f` with the id as text, without allocating for numeric ids.
    pub(super) fn with_name<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            WorkerRef::Name(s) => f(s),
            WorkerRef::Number(n) => f(itoa::Buffer::new().format(*n)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("{0}")]
    Invalid(String),
    #[error("unknown worker_id: {0}")]
    UnknownWorker(String),
}

impl PushError {
    pub fn status(&self) -> u16 {
        match self {
            PushError::Invalid(_) => 400,
            PushError::UnknownWorker(_) => 404,
        }
    }
}
