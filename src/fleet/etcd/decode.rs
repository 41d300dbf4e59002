//! The gateway's JSON, both ways, without I/O: request bodies for a prefix, and the
//! range and watch answers decoded into [`Kv`] and [`Event`]. int64 fields arrive as JSON
//! strings (numbers are accepted too); keys and values are base64. A key that is not
//! UTF-8 is skipped, in a range and in a watch alike: it cannot name a worker, and one
//! stray key must not blind the source to the others.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use super::{EtcdError, Event, Kv};

/// etcd's prefix rule: the prefix with its last byte below 0xff incremented (the bytes
/// after it dropped); a prefix of only 0xff bytes, or none, ends at `"\0"` (no end).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

/// The key a prefix read starts at: the prefix itself, or `"\0"` (every key) for "".
fn prefix_key(prefix: &str) -> Vec<u8> {
    if prefix.is_empty() {
        vec![0]
    } else {
        prefix.as_bytes().to_vec()
    }
}

/// `POST /v3/kv/range` body reading every key under `prefix`.
pub fn range_body(prefix: &str) -> Vec<u8> {
    serde_json::json!({
        "key": STANDARD.encode(prefix_key(prefix)),
        "range_end": STANDARD.encode(prefix_end(prefix.as_bytes())),
    })
    .to_string()
    .into_bytes()
}

/// `POST /v3/kv/range` body counting the keys under `prefix` (no keys or values sent back).
pub fn count_body(prefix: &str) -> Vec<u8> {
    serde_json::json!({
        "key": STANDARD.encode(prefix_key(prefix)),
        "range_end": STANDARD.encode(prefix_end(prefix.as_bytes())),
        "count_only": true,
    })
    .to_string()
    .into_bytes()
}

/// `POST /v3/watch` body watching `prefix` from `start_revision` (0: from now).
pub fn watch_body(prefix: &str, start_revision: i64) -> Vec<u8> {
    serde_json::json!({
        "create_request": {
            "key": STANDARD.encode(prefix_key(prefix)),
            "range_end": STANDARD.encode(prefix_end(prefix.as_bytes())),
            "start_revision": start_revision.to_string(),
        }
    })
    .to_string()
    .into_bytes()
}

/// An int64 as the gateway writes it (a string), or as a plain number.
#[derive(Deserialize)]
#[serde(untagged)]
enum Int64 {
    Text(String),
    Number(i64),
}

fn int(v: Option<&Int64>, field: &str) -> Result<i64, EtcdError> {
    match v {
        None => Ok(0),
        Some(Int64::Number(n)) => Ok(*n),
        Some(Int64::Text(s)) => s
            .parse()
            .map_err(|_| EtcdError::Protocol(format!("{field} is not an integer: {s:?}"))),
    }
}

#[derive(Deserialize)]
struct Header {
    revision: Option<Int64>,
}

#[derive(Deserialize)]
struct RawKv {
    key: Option<String>,
    value: Option<String>,
    mod_revision: Option<Int64>,
    lease: Option<Int64>,
}

#[derive(Deserialize)]
struct RangeAnswer {
    header: Option<Header>,
    #[serde(default)]
    kvs: Vec<RawKv>,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: Option<String>,
    kv: Option<RawKv>,
}

#[derive(Deserialize)]
struct WatchResult {
    header: Option<Header>,
    #[serde(default)]
    created: bool,
    #[serde(default)]
    canceled: bool,
    compact_revision: Option<Int64>,
    #[serde(default)]
    cancel_reason: String,
    #[serde(default)]
    events: Vec<RawEvent>,
}

/// One object of the watch stream: `{"result": ..}` or `{"error": ..}`.
#[derive(Deserialize)]
struct WatchFrame {
    result: Option<WatchResult>,
    error: Option<serde_json::Value>,
}

/// What one object of the watch stream says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMsg {
    /// The watch exists; events from its start revision follow.
    Created,
    /// Changes, in order. Empty for a progress notification (or only skipped keys).
    Events { revision: i64, events: Vec<Event> },
}

fn decode_b64(field: &str, text: &str) -> Result<Vec<u8>, EtcdError> {
    STANDARD
        .decode(text)
        .map_err(|e| EtcdError::Protocol(format!("{field} is not base64: {e}")))
}

/// The key of `kv` as text; `None` when it is not UTF-8 (skipped, see the header).
fn key_of(kv: &RawKv) -> Result<Option<String>, EtcdError> {
    let Some(key) = kv.key.as_deref() else {
        return Err(EtcdError::Protocol("kv without a key".into()));
    };
    Ok(String::from_utf8(decode_b64("key", key)?).ok())
}

fn kv_of(raw: &RawKv) -> Result<Option<Kv>, EtcdError> {
    let Some(key) = key_of(raw)? else {
        return Ok(None);
    };
    Ok(Some(Kv {
        key,
        value: decode_b64("value", raw.value.as_deref().unwrap_or(""))?,
        mod_revision: int(raw.mod_revision.as_ref(), "mod_revision")?,
        lease: int(raw.lease.as_ref(), "lease")?,
    }))
}

fn revision(header: Option<&Header>) -> Result<i64, EtcdError> {
    let revision = int(header.and_then(|h| h.revision.as_ref()), "revision")?;
    if revision <= 0 {
        return Err(EtcdError::Protocol(
            "answer without a header revision".into(),
        ));
    }
    Ok(revision)
}

fn json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, EtcdError> {
    serde_json::from_slice(body).map_err(|e| EtcdError::Protocol(format!("bad JSON: {e}")))
}

/// A `/v3/kv/range` answer: the store's revision and the keys (non-UTF-8 keys skipped).
pub fn decode_range(body: &[u8]) -> Result<(i64, Vec<Kv>), EtcdError> {
    let answer: RangeAnswer = json(body)?;
    let revision = revision(answer.header.as_ref())?;
    let mut kvs = Vec::with_capacity(answer.kvs.len());
    for raw in &answer.kvs {
        kvs.extend(kv_of(raw)?);
    }
    Ok((revision, kvs))
}

fn event_of(raw: &RawEvent) -> Result<Option<Event>, EtcdError> {
    let Some(kv) = raw.kv.as_ref() else {
        return Err(EtcdError::Protocol("watch event without a kv".into()));
    };
    match raw.kind.as_deref() {
        None | Some("PUT") => Ok(kv_of(kv)?.map(Event::Put)),
        Some("DELETE") => {
            let mod_revision = int(kv.mod_revision.as_ref(), "mod_revision")?;
            Ok(key_of(kv)?.map(|key| Event::Delete { key, mod_revision }))
        }
        Some(other) => Err(EtcdError::Protocol(format!("unknown event type {other:?}"))),
    }
}

/// Why the gateway sent `{"error": ..}`: its message when it has one.
fn error_text(error: &serde_json::Value) -> String {
    match error {
        serde_json::Value::String(s) => s.clone(),
        v => v
            .get("message")
            .and_then(|m| m.as_str())
            .map_or_else(|| v.to_string(), str::to_string),
    }
}

/// One JSON object of the watch stream. A cancel with a compact revision is
/// [`EtcdError::Compacted`]; any other cancel or error object is [`EtcdError::Server`].
pub fn decode_watch(object: &[u8]) -> Result<WatchMsg, EtcdError> {
    let frame: WatchFrame = json(object)?;
    if let Some(error) = frame.error.as_ref() {
        return Err(EtcdError::Server(error_text(error)));
    }
    let Some(result) = frame.result else {
        return Err(EtcdError::Protocol("watch object without a result".into()));
    };
    if result.canceled {
        let compacted = int(result.compact_revision.as_ref(), "compact_revision")?;
        return Err(if compacted > 0 {
            EtcdError::Compacted(compacted)
        } else {
            EtcdError::Server(format!("watch canceled: {}", result.cancel_reason))
        });
    }
    if result.created {
        return Ok(WatchMsg::Created);
    }
    let revision = revision(result.header.as_ref())?;
    let mut events = Vec::with_capacity(result.events.len());
    for raw in &result.events {
        events.extend(event_of(raw)?);
    }
    Ok(WatchMsg::Events { revision, events })
}

#[cfg(test)]
mod tests;
