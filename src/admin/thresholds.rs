//! `/busy_threshold` (semantics §5): get, partial set and unset of a model's thresholds,
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
}

impl<'a> Entry<'a> {
    fn new(model: &'a str, t: Thresholds) -> Entry<'a> {
        Entry {
            model,
            active_decode_blocks_threshold: t.active_decode_blocks_threshold,
            active_prefill_tokens_threshold: t.active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac: t.active_prefill_tokens_threshold_frac,
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

pub fn post(control: &mut Control, req: &Request<'_>) -> Result<Reply, AdminError> {
    let body: Body = parse(req)?;
    let update = Thresholds {
        active_decode_blocks_threshold: body.active_decode_blocks_threshold,
        active_prefill_tokens_threshold: body.active_prefill_tokens_threshold,
        active_prefill_tokens_threshold_frac: body.active_prefill_tokens_threshold_frac,
    };
    update.validate().map_err(AdminError::Invalid)?;
    let known = control
        .shared
        .snapshot
        .load()
        .model(body.model.as_bytes())
        .is_some();
    let current = control
        .monitor
        .thresholds
        .get(&body.model)
        .copied()
        .unwrap_or_default();
    if !update.any() {
        // A get: unknown models read as all-unset, as in Dynamo.
        return Ok(Reply::json(200, &Entry::new(&body.model, current)));
    }
    if !known {
        return Err(not_found(&body.model));
    }
    let merged = current.merged(&update);
    control
        .monitor
        .thresholds
        .insert(body.model.clone(), merged);
    control.republish();
    tracing::info!(model = %body.model, thresholds = ?merged, "busy thresholds set");
    Ok(Reply::json(200, &Entry::new(&body.model, merged)))
}

/// `DELETE /busy_threshold {"model": ..}`: unsets all three (beyond Dynamo).
pub fn delete(control: &mut Control, req: &Request<'_>) -> Result<Reply, AdminError> {
    let body: ModelOnly = parse(req)?;
    if control
        .shared
        .snapshot
        .load()
        .model(body.model.as_bytes())
        .is_none()
    {
        return Err(not_found(&body.model));
    }
    control
        .monitor
        .thresholds
        .insert(body.model.clone(), Thresholds::default());
    control.republish();
    tracing::info!(model = %body.model, "busy thresholds unset");
    Ok(Reply::json(
        200,
        &Entry::new(&body.model, Thresholds::default()),
    ))
}
