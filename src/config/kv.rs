//! `kv` routing's keys (docs/behaviour.md §20.5): per model in the file, else from Dynamo's flags and
//! environment variables (`Overrides::kv`), else Dynamo's defaults.

use super::file::FileModel;
use super::validate::Validator;
use super::*;
use crate::route::KvSettings;
use toml::Spanned;

/// The largest `kv_cache_block_size` (tokens): chunks of up to 1 KiB of prompt.
pub const MAX_KV_BLOCK_SIZE: u32 = 256;

/// `kv` settings from Dynamo's flags and environment variables.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KvOverrides {
    pub router_temperature: Option<f64>,
    pub router_prefill_load_scale: Option<f64>,
    pub kv_cache_block_size: Option<u32>,
    pub router_ttl_secs: Option<f64>,
}

/// What each key accepts, as its error message says it.
fn check(key: &str, v: f64) -> Result<(), &'static str> {
    let ok = v.is_finite()
        && match key {
            "router_temperature" | "router_prefill_load_scale" => v >= 0.0,
            "kv_cache_block_size" => (1.0..=f64::from(MAX_KV_BLOCK_SIZE)).contains(&v),
            _ => v > 0.0,
        };
    if ok {
        return Ok(());
    }
    Err(match key {
        "router_temperature" | "router_prefill_load_scale" => "must be a number of at least 0",
        "kv_cache_block_size" => "must be between 1 and 256 (tokens per KV block)",
        _ => "must be greater than 0 (seconds)",
    })
}

/// Checks the flags' and environment's `kv` values (`Err`: the message for the knob).
pub fn check_overrides(o: &KvOverrides) -> Result<(), String> {
    let values = [
        ("router_temperature", o.router_temperature),
        ("router_prefill_load_scale", o.router_prefill_load_scale),
        ("kv_cache_block_size", o.kv_cache_block_size.map(f64::from)),
        ("router_ttl_secs", o.router_ttl_secs),
    ];
    for (key, v) in values {
        if let Some(v) = v {
            check(key, v).map_err(|msg| format!("{key} = {v}: {msg}"))?;
        }
    }
    Ok(())
}

impl Validator<'_> {
    /// The model's `kv` settings: file keys over the flags over Dynamo's defaults.
    pub(super) fn kv(
        &self,
        key: &dyn Fn(&str) -> String,
        m: &FileModel,
        o: &KvOverrides,
    ) -> Result<KvSettings, ConfigError> {
        let d = KvSettings::default();
        let num = |k: &str, v: Option<&Spanned<f64>>, flag: Option<f64>, default: f64| match v {
            Some(s) => match check(k, *s.get_ref()) {
                Ok(()) => Ok(*s.get_ref()),
                Err(msg) => self.err(key(k), Some(s.span()), msg),
            },
            None => Ok(flag.unwrap_or(default)),
        };
        if let (Some(_), Some(alias)) = (
            &m.router_prefill_load_scale,
            &m.router_kv_overlap_score_weight,
        ) {
            let msg = "is the deprecated name of router_prefill_load_scale: set only one";
            return self.err(
                key("router_kv_overlap_score_weight"),
                Some(alias.span()),
                msg,
            );
        }
        if let Some(events) = m.router_use_kv_events.as_ref().filter(|e| *e.get_ref()) {
            return self.err(key("router_use_kv_events"), Some(events.span()), KV_EVENTS);
        }
        let block = match &m.kv_cache_block_size {
            Some(s) => match check("kv_cache_block_size", f64::from(*s.get_ref())) {
                Ok(()) => *s.get_ref(),
                Err(msg) => return self.err(key("kv_cache_block_size"), Some(s.span()), msg),
            },
            None => o.kv_cache_block_size.unwrap_or(d.kv_cache_block_size),
        };
        let scale_key = if m.router_kv_overlap_score_weight.is_some() {
            "router_kv_overlap_score_weight"
        } else {
            "router_prefill_load_scale"
        };
        let scale = m
            .router_prefill_load_scale
            .as_ref()
            .or(m.router_kv_overlap_score_weight.as_ref());
        Ok(KvSettings {
            router_temperature: num(
                "router_temperature",
                m.router_temperature.as_ref(),
                o.router_temperature,
                d.router_temperature,
            )?,
            router_prefill_load_scale: num(
                scale_key,
                scale,
                o.router_prefill_load_scale,
                d.router_prefill_load_scale,
            )?,
            kv_cache_block_size: block,
            router_ttl_secs: num(
                "router_ttl_secs",
                m.router_ttl_secs.as_ref(),
                o.router_ttl_secs,
                d.router_ttl_secs,
            )?,
        })
    }
}

/// Why KV events cannot be turned on.
pub const KV_EVENTS: &str = "Spillway does not subscribe to KV events: `kv` routing \
    predicts each worker's cache from its own routing decisions (Dynamo's \
    --no-router-kv-events); set false or leave it out";
