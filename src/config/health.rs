//! `[outlier]`, `[health_check]` (and each model's own) and the retry budget, checked
//! (docs/behaviour.md §22).

use serde::Serialize;
use toml::Spanned;

use super::file::{FileConfig, FileHealthCheck, FileOutlier};
use super::validate::Validator;
use super::*;
use crate::health::{CheckKind, CheckSettings, OutlierSettings};

/// Retries of failed attempts (docs/behaviour.md §22.5): at most `percent` of the model's
/// requests in flight retry at once, and never fewer than `min` (Envoy's retry budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RetryBudget {
    pub percent: u32,
    pub min: u32,
}

impl Default for RetryBudget {
    fn default() -> Self {
        RetryBudget {
            percent: 20,
            min: 3,
        }
    }
}

impl RetryBudget {
    /// Retries that may run at once among `active` requests in flight.
    pub fn allowed(self, active: u64) -> u64 {
        (active.saturating_mul(u64::from(self.percent)) / 100).max(u64::from(self.min))
    }
}

fn dynamo_canary(c: &CanaryOverrides) -> Option<CheckSettings> {
    c.enabled.filter(|&on| on)?;
    Some(CheckSettings {
        interval_ms: c.wait_secs.unwrap_or(10).max(1).saturating_mul(1_000),
        timeout_ms: c.timeout_secs.unwrap_or(3).max(1).saturating_mul(1_000),
        ..CheckSettings::new(CheckKind::Canary)
    })
}

impl Validator<'_> {
    pub(super) fn retry_budget(&self, f: &FileConfig) -> Result<RetryBudget, ConfigError> {
        let d = RetryBudget::default();
        let percent = match &f.retry_budget_percent {
            Some(p) if *p.get_ref() > 100 => {
                return self.err(
                    "retry_budget_percent",
                    Some(p.span()),
                    "must be between 0 and 100",
                );
            }
            Some(p) => *p.get_ref(),
            None => d.percent,
        };
        Ok(RetryBudget {
            percent,
            min: f.retry_budget_min.unwrap_or(d.min),
        })
    }

    pub(super) fn outlier(&self, f: &Option<FileOutlier>) -> Result<OutlierSettings, ConfigError> {
        let d = OutlierSettings::default();
        let Some(o) = f else {
            return Ok(d);
        };
        let ms = |k: &str, v: &Option<Spanned<u64>>, default| {
            self.positive(&format!("outlier.{k}"), v, default)
        };
        let s = OutlierSettings {
            enabled: o.enabled.unwrap_or(d.enabled),
            consecutive_failures: self.positive(
                "outlier.consecutive_failures",
                &o.consecutive_failures,
                d.consecutive_failures,
            )?,
            base_ejection_ms: ms("base_ejection_ms", &o.base_ejection_ms, d.base_ejection_ms)?,
            max_ejection_ms: ms("max_ejection_ms", &o.max_ejection_ms, d.max_ejection_ms)?,
            min_healthy_percent: match &o.min_healthy_percent {
                Some(p) if *p.get_ref() > 100 => {
                    return self.err(
                        "outlier.min_healthy_percent",
                        Some(p.span()),
                        "must be between 0 and 100",
                    );
                }
                Some(p) => *p.get_ref() as u8,
                None => d.min_healthy_percent,
            },
            interval_ms: ms("interval_ms", &o.interval_ms, d.interval_ms)?,
            failure_share_above_peers: match &o.failure_share_above_peers {
                Some(v) if !(*v.get_ref() > 0.0 && *v.get_ref() <= 1.0) => {
                    return self.err(
                        "outlier.failure_share_above_peers",
                        Some(v.span()),
                        "must be above 0 and at most 1",
                    );
                }
                Some(v) => *v.get_ref(),
                None => d.failure_share_above_peers,
            },
            request_volume: o.request_volume.unwrap_or(d.request_volume).max(1),
        };
        if s.max_ejection_ms < s.base_ejection_ms {
            let span = o.max_ejection_ms.as_ref().map(|v| v.span());
            return self.err(
                "outlier.max_ejection_ms",
                span,
                format!("must be at least base_ejection_ms ({})", s.base_ejection_ms),
            );
        }
        Ok(s)
    }

    /// A `[health_check]` table: `None` when absent, `Some(None)` for `kind = "none"`.
    pub(super) fn health_check(
        &self,
        key: &str,
        f: &Option<FileHealthCheck>,
    ) -> Result<Option<Option<CheckSettings>>, ConfigError> {
        let Some(c) = f else {
            return Ok(None);
        };
        let kind = match c.kind.as_ref().map(|k| (k.get_ref().as_str(), k.span())) {
            None | Some(("http", _)) => CheckKind::Http,
            Some(("canary", _)) => CheckKind::Canary,
            Some(("none", _)) => return Ok(Some(None)),
            Some((other, span)) => {
                return self.err(
                    format!("{key}.kind"),
                    Some(span),
                    format!("unknown check kind `{other}` (expected one of: http, canary, none)"),
                );
            }
        };
        let d = CheckSettings::new(kind);
        let path = match &c.path {
            Some(p) if !p.get_ref().starts_with('/') || p.get_ref().bytes().any(|b| b <= b' ') => {
                return self.err(
                    format!("{key}.path"),
                    Some(p.span()),
                    "must start with `/` and hold no spaces or control characters",
                );
            }
            Some(p) => p.get_ref().clone(),
            None => d.path.clone(),
        };
        let k = |name: &str| format!("{key}.{name}");
        Ok(Some(Some(CheckSettings {
            kind,
            path,
            interval_ms: self.positive(&k("interval_ms"), &c.interval_ms, d.interval_ms)?,
            timeout_ms: self.positive(&k("timeout_ms"), &c.timeout_ms, d.timeout_ms)?,
            rise: self.positive(&k("rise"), &c.rise, d.rise)?,
            fall: self.positive(&k("fall"), &c.fall, d.fall)?,
        })))
    }

    /// Each model's checks: its own table, else the top-level one. Checks speak plain
    /// HTTP, so a model with an `https://` worker must set `kind = "none"`. Without
    /// `[health_check]`, `DYN_HEALTH_CHECK_ENABLED=true` gives every model Dynamo's
    /// canary: one every `DYN_CANARY_WAIT_TIME` s (10) of no successful request, each
    /// within `DYN_HEALTH_CHECK_REQUEST_TIMEOUT` s (3).
    pub(super) fn resolve_checks(
        &self,
        f: &FileConfig,
        o: &Overrides,
        models: &mut [ModelConfig],
        workers: &[WorkerConfig],
    ) -> Result<(), ConfigError> {
        let global = match self.health_check("health_check", &f.health_check)? {
            Some(file) => file,
            None => dynamo_canary(&o.canary),
        };
        for (mi, (m, fm)) in models.iter_mut().zip(&f.models).enumerate() {
            let key = format!("models[{mi}].health_check");
            let checks = match self.health_check(&key, &fm.health_check)? {
                Some(own) => own,
                None => global.clone(),
            };
            let https = m
                .workers
                .iter()
                .filter_map(|&i| workers.get(i))
                .find(|w| w.tls);
            if let (Some(_), Some(w)) = (&checks, https) {
                return self.err(
                    key,
                    None,
                    format!(
                        "health checks speak plain HTTP; worker `{}` is https:// (set kind = \"none\" for this model)",
                        w.name
                    ),
                );
            }
            m.health_check = checks;
        }
        Ok(())
    }
}
