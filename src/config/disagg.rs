//! A model's disaggregated serving (docs/behaviour.md §23): the keys that make a model
//! entry a prefill pool (`role = "prefill"`) or a model whose requests are prefilled on
//! one (`prefill = "<pool>"`), checked per entry and then across entries.

use serde::Serialize;
use toml::Spanned;

use super::file::FileModel;
use super::validate::Validator;
use super::workers::Key;
use super::*;

/// What a model entry's workers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolRole {
    /// Whole requests: the model clients name (aggregated, or the decode pool of a
    /// disaggregated model).
    #[default]
    Serve,
    /// A prefill pool: stage 1 of the requests of the models that name it. Clients cannot
    /// name it.
    Prefill,
}

impl PoolRole {
    /// Dynamo's `worker_type` of its workers.
    pub fn worker_type(self, disaggregated: bool) -> &'static str {
        match self {
            PoolRole::Prefill => "prefill",
            PoolRole::Serve if disaggregated => "decode",
            PoolRole::Serve => "aggregated",
        }
    }
}

/// The engines' handoff protocol between the two stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Handoff {
    /// vLLM's KV connectors (NixlConnector): stage 1 on a prefill worker returns
    /// `kv_transfer_params`, which stage 2 sends to a decode worker.
    Vllm,
    /// SGLang's bootstrap: a prefill and a decode worker get the request at once, with the
    /// prefill worker's bootstrap address and a fresh room.
    Sglang,
}

/// SGLang's default `--disaggregation-bootstrap-port`.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// A disaggregated model's prefill side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disagg {
    /// The prefill pool's model entry (`role = "prefill"`).
    pub prefill: String,
    pub handoff: Handoff,
    /// Prompts estimated under this many uncached tokens are prefilled on the decode
    /// worker itself (Dynamo's conditional disaggregation); 0: every prompt goes to stage 1.
    pub max_local_prefill_tokens: u64,
}

impl Validator<'_> {
    /// One entry's `role`, `prefill`, `handoff` and `max_local_prefill_tokens`.
    pub(super) fn pool(
        &self,
        key: Key<'_>,
        m: &FileModel,
    ) -> Result<(PoolRole, Option<Disagg>), ConfigError> {
        let role = match &m.role {
            None => None,
            Some(r) => match r.get_ref().as_str() {
                "prefill" => Some(PoolRole::Prefill),
                "decode" => Some(PoolRole::Serve),
                other => {
                    let msg = format!("unknown role `{other}` (expected prefill or decode)");
                    return self.err(key("role"), Some(r.span()), msg);
                }
            },
        };
        let Some(prefill) = &m.prefill else {
            let decode_without_pool = matches!(&m.role, Some(r) if r.get_ref() == "decode");
            if decode_without_pool {
                let msg = "a decode pool names its prefill pool: set `prefill`";
                return self.err(key("role"), m.role.as_ref().map(|r| r.span()), msg);
            }
            self.stage_keys_need_a_pool(key, m)?;
            return Ok((role.unwrap_or_default(), None));
        };
        if role == Some(PoolRole::Prefill) {
            let msg = "a prefill pool has no prefill pool of its own";
            return self.err(key("prefill"), Some(prefill.span()), msg);
        }
        Ok((
            PoolRole::Serve,
            Some(Disagg {
                prefill: prefill.get_ref().trim().to_string(),
                handoff: self.handoff(key, &m.handoff)?,
                max_local_prefill_tokens: m.max_local_prefill_tokens.unwrap_or(0),
            }),
        ))
    }

    fn stage_keys_need_a_pool(&self, key: Key<'_>, m: &FileModel) -> Result<(), ConfigError> {
        let msg = "only a model with a prefill pool has stages: set `prefill` too";
        if let Some(h) = &m.handoff {
            return self.err(key("handoff"), Some(h.span()), msg);
        }
        if m.max_local_prefill_tokens.is_some() {
            return self.err(key("max_local_prefill_tokens"), None, msg);
        }
        Ok(())
    }

    fn handoff(&self, key: Key<'_>, h: &Option<Spanned<String>>) -> Result<Handoff, ConfigError> {
        match h.as_ref().map(|h| (h.get_ref().as_str(), h.span())) {
            None | Some(("vllm", _)) => Ok(Handoff::Vllm),
            Some(("sglang", _)) => Ok(Handoff::Sglang),
            Some((other, span)) => {
                let msg = format!("unknown handoff `{other}` (expected vllm or sglang)");
                self.err(key("handoff"), Some(span), msg)
            }
        }
    }

    /// Across entries: each `prefill` names a prefill pool, each prefill pool is named by
    /// a model, and a prefill pool is not routed directly (stage 1 names no worker).
    pub(super) fn pools(
        &self,
        models: &[ModelConfig],
        file: &[FileModel],
    ) -> Result<(), ConfigError> {
        for (mi, (m, fm)) in models.iter().zip(file).enumerate() {
            let key = |k: &str| format!("models[{mi}].{k}");
            if let (Some(d), Some(span)) = (&m.disagg, fm.prefill.as_ref().map(|p| p.span())) {
                let pool = models.iter().find(|p| p.name == d.prefill);
                let Some(pool) = pool.filter(|p| p.role == PoolRole::Prefill) else {
                    let msg = format!(
                        "`{}` is no prefill pool (a model entry with role = \"prefill\")",
                        d.prefill
                    );
                    return self.err(key("prefill"), Some(span), msg);
                };
                if d.handoff == Handoff::Sglang && pool.waiting_room.is_some() {
                    let msg = "SGLang's prefill side is sent at once with the decode side: its prefill pool has no waiting room";
                    let span = fm.handoff.as_ref().map(|h| h.span());
                    return self.err(key("handoff"), span, msg);
                }
            }
            if m.role != PoolRole::Prefill {
                continue;
            }
            if m.router_mode == crate::route::RouterMode::Direct {
                let msg = "stage 1 names no worker: a prefill pool cannot use direct routing";
                let span = fm.router_mode.as_ref().map(|r| r.span());
                return self.err(key("router_mode"), span, msg);
            }
            if !models
                .iter()
                .any(|x| x.disagg.as_ref().is_some_and(|d| d.prefill == m.name))
            {
                let msg = format!("prefill pool `{}` is named by no model's `prefill`", m.name);
                return self.err(key("role"), fm.role.as_ref().map(|r| r.span()), msg);
            }
        }
        Ok(())
    }
}
