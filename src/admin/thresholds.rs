//! `/busy_threshold` (docs/behaviour.md §14.5): get, partial set and unset of a model's thresholds,
//! with Dynamo's error statuses and messages. A change is published to every core before
//! the reply.

use serde::{Deserialize, Serialize};

use super::{AdminError, Reply, Request};
use crate::monitor::Control;
use crate::shed::Thresholds;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    model: String,
    #[serde(default)]
    active_decode_blocks_threshold: Option<f64>,
    #[serde(default)]
    active_prefill_tokens_threshold: Option<u64>,
    #[serde(default)]
    active_prefill_tokens_threshold_frac: Option<f64>,
    #[serde(default)]
    waiting_requests_threshold: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelOnly {
    model: String,
}

#[derive(Debug, Serialize)]
struct Entry<'a> {
    model: &'a str,
    active_decode_blocks_threshold: Option<f64>,
    active_prefill_tokens_threshold: Option<u64>,
    active_prefill_tokens_threshold_frac: Option<f64>,
    /// Beyond Dynamo: shown only when set, so Dynamo's bodies stay byte for byte.
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting_requests_threshold: Option<u64>,
}

impl<'a> Entry<'a> {
    fn new(model: &'a str, t: Thresholds) -> Entry<'a> {
        Entry {
            model,
            active_decode_blocks_threshold: t.active_decode_blocks_threshold,
            active_prefill_tokens_threshold: t.active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac: t.active_prefill_tokens_threshold_frac,
            waiting_requests_threshold: t.waiting_requests_threshold,
        }
    }
}

/// Syntax errors are 400, well-formed JSON of the wrong shape or types 422 (as axum does).
fn parse<'de, T: Deserialize<'de>>(req: &Request<'de>) -> Result<T, AdminError> {
    req.require_json()?;
    serde_json::from_slice(req.body).map_err(|e| {
        let msg = format!("Failed to parse the request body as JSON: {e}");
        if e.is_data() {
            AdminError::WrongShape(msg)
        } else {
            AdminError::BadJson(msg)
        }
    })
}

fn not_found(model: &str) -> AdminError {
    AdminError::NotFound(format!(
        "Model '{model}' not found. Thresholds can only be set for discovered models."
    ))
}

pub fn list(control: &Control) -> Reply {
    let snap = control.shared.snapshot.load_full();
    let entries: Vec<_> = snap
        .models
        .iter()
        .map(|m| {
            Entry::new(
                &m.name,
                control
                    .monitor
                    .thresholds
                    .get(&*m.name)
                    .copied()
                    .unwrap_or_default(),
            )
        })
        .collect();
    #[derive(Serialize)]
    struct List<'a> {
        thresholds: Vec<Entry<'a>>,
    }
    Reply::json(
        200,
        &List {
            thresholds: entries,
        },
    )
}

/// A `POST /busy_threshold` body, parsed and validated: the model and the thresholds it
/// sets (none set: a get).
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub model: String,
    pub thresholds: Thresholds,
}

/// Parses and validates a `POST /busy_threshold` request's body (pure; `fuzz/` drives it).
pub fn parse_post(req: &Request<'_>) -> Result<Update, AdminError> {
    let body: Body = parse(req)?;
    let thresholds = Thresholds {
        active_decode_blocks_threshold: body.active_decode_blocks_threshold,
        active_prefill_tokens_threshold: body.active_prefill_tokens_threshold,
        active_prefill_tokens_threshold_frac: body.active_prefill_tokens_threshold_frac,
        waiting_requests_threshold: body.waiting_requests_threshold,
    };
    thresholds.validate().map_err(AdminError::Invalid)?;
    Ok(Update {
        model: body.model,
        thresholds,
    })
}

/// Parses a `DELETE /busy_threshold` request's body: the model named.
pub fn parse_delete(req: &Request<'_>) -> Result<String, AdminError> {
    parse::<ModelOnly>(req).map(|b| b.model)
}

pub fn post(control: &mut Control, req: &Request<'_>) -> Result<Reply, AdminError> {
    let Update {
        model,
        thresholds: update,
    } = parse_post(req)?;
    let known = control
        .shared
        .snapshot
        .load()
        .model(model.as_bytes())
        .is_some();
    let current = control
        .monitor
        .thresholds
        .get(&model)
        .copied()
        .unwrap_or_default();
    if !update.any() {
        // A get: unknown models read as all-unset, as in Dynamo.
        return Ok(Reply::json(200, &Entry::new(&model, current)));
    }
    if !known {
        return Err(not_found(&model));
    }
    let merged = current.merged(&update);
    control.monitor.thresholds.insert(model.clone(), merged);
    control.republish();
    tracing::info!(model = %model, thresholds = ?merged, "busy thresholds set");
    Ok(Reply::json(200, &Entry::new(&model, merged)))
}

/// `DELETE /busy_threshold {"model": ..}`: unsets all three (beyond Dynamo).
pub fn delete(control: &mut Control, req: &Request<'_>) -> Result<Reply, AdminError> {
    let model = parse_delete(req)?;
    if control
        .shared
        .snapshot
        .load()
        .model(model.as_bytes())
        .is_none()
    {
        return Err(not_found(&model));
    }
    control
        .monitor
        .thresholds
        .insert(model.clone(), Thresholds::default());
    control.republish();
    tracing::info!(model = %model, "busy thresholds unset");
    Ok(Reply::json(200, &Entry::new(&model, Thresholds::default())))
}
