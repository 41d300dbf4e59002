//! Request classes (HAProxy's priority classes, the Gateway API's criticality): which
//! requests absorb the shedding first. Pure: parsing a header value and the per-class
//! view of the busy thresholds.

use serde::Serialize;

use super::Thresholds;

/// A request's class, most important first. Under overload `sheddable` is refused first
/// (it sees workers busy earlier and may fill only part of a worker's slots), `critical`
/// last; queued requests are served by class, then first come, first served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Critical,
    #[default]
    Standard,
    Sheddable,
}

impl Class {
    pub const ALL: [Class; 3] = [Class::Critical, Class::Standard, Class::Sheddable];

    /// The metrics label and the `class` field of refusal bodies.
    pub fn label(self) -> &'static str {
        match self {
            Class::Critical => "critical",
            Class::Standard => "standard",
            Class::Sheddable => "sheddable",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// A header or config value: the label, any ASCII case, surrounding blanks ignored.
    /// `None` for anything else (the caller falls back to the default, never an error).
    pub fn parse(value: &[u8]) -> Option<Class> {
        let v = value.trim_ascii();
        Class::ALL
            .into_iter()
            .find(|c| v.eq_ignore_ascii_case(c.label().as_bytes()))
    }
}

impl Thresholds {
    /// The thresholds as a class with `scale` sees them: each configured one times
    /// `scale` (a sheddable class at 0.8 sees a worker busy at 80 % of the model's
    /// thresholds). The decode fraction stays within 1.0.
    pub fn scaled(&self, scale: f64) -> Thresholds {
        if scale == 1.0 {
            return *self;
        }
        Thresholds {
            active_decode_blocks_threshold: self
                .active_decode_blocks_threshold
                .map(|t| (t * scale).min(1.0)),
            active_prefill_tokens_threshold: self
                .active_prefill_tokens_threshold
                .map(|t| (t as f64 * scale) as u64),
            active_prefill_tokens_threshold_frac: self
                .active_prefill_tokens_threshold_frac
                .map(|t| t * scale),
            waiting_requests_threshold: self
                .waiting_requests_threshold
                .map(|t| (t as f64 * scale) as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARSE: &[(&[u8], Option<Class>)] = &[
        (b"critical", Some(Class::Critical)),
        (b" Standard ", Some(Class::Standard)),
        (b"SHEDDABLE", Some(Class::Sheddable)),
        (b"", None),
        (b"batch", None),
        (b"critical,sheddable", None),
        (b"criticall", None),
    ];

    #[test]
    fn parse_table() {
        for (value, class) in PARSE {
            assert_eq!(
                Class::parse(value),
                *class,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn order_is_importance() {
        assert!(Class::Critical < Class::Standard && Class::Standard < Class::Sheddable);
        assert_eq!(Class::default(), Class::Standard);
    }

    #[test]
    fn scaled_thresholds() {
        let t = Thresholds {
            active_decode_blocks_threshold: Some(0.9),
            active_prefill_tokens_threshold: Some(512),
            active_prefill_tokens_threshold_frac: None,
            waiting_requests_threshold: Some(5),
        };
        let s = t.scaled(0.5);
        assert_eq!(s.waiting_requests_threshold, Some(2));
        assert_eq!(s.active_decode_blocks_threshold, Some(0.45));
        assert_eq!(s.active_prefill_tokens_threshold, Some(256));
        assert_eq!(s.active_prefill_tokens_threshold_frac, None);
        assert_eq!(t.scaled(2.0).active_decode_blocks_threshold, Some(1.0));
        assert_eq!(t.scaled(1.0), t);
    }
}
