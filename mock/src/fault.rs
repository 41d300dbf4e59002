//! Fault modes: how a sick engine looks from the network, to test what sits in front of
//! it. Set at start (`--fault`) and switched at runtime with `POST /fault`. No I/O here.

use std::cell::Cell;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// A fault mode. Each applies to the requests read while it is in force; a response
/// already under way finishes as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// A healthy engine.
    #[default]
    None,
    /// An engine core dead behind a live API server that answers fast: every `/v1/*`
    /// request gets `500` at once; `/health` and `/metrics` still answer.
    Fail,
    /// A hung process: every request is read and never answered, `/health` included.
    /// Connections stay open until the client closes them; load pushes stop.
    Hang,
    /// `/health` answers; every `/v1/*` request is read and never answered. Only a real
    /// generation (a canary) tells it from a healthy engine.
    DeadCore,
    /// Healthy for the flap period, then `Fail` for as long, and so on, starting healthy
    /// when the mode is set.
    Flap,
}

impl Fault {
    /// Every mode's name, for messages.
    pub const NAMES: &'static str = "none, fail, hang, dead-core, flap";

    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Fail => "fail",
            Fault::Hang => "hang",
            Fault::DeadCore => "dead-core",
            Fault::Flap => "flap",
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Fault, String> {
        Ok(match s {
            "none" => Fault::None,
            "fail" => Fault::Fail,
            "hang" => Fault::Hang,
            "dead-core" => Fault::DeadCore,
            "flap" => Fault::Flap,
            _ => {
                return Err(format!(
                    "unknown fault mode `{s}` (expected one of: {})",
                    Fault::NAMES
                ));
            }
        })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a request read now meets: the mode, with a flap resolved to its phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Serve,
    Fail,
    /// Read it and never answer, whatever it asks.
    HangAll,
    /// Read `/v1/*` requests and never answer them.
    HangApi,
}

/// Whether a flap that started `elapsed` ago is in its failing half-cycle.
pub fn flap_failing(elapsed: Duration, period: Duration) -> bool {
    let period = period.as_micros().max(1);
    (elapsed.as_micros() / period) % 2 == 1
}

/// The answer to `POST /fault` and `GET /fault`: `{"mode":"fail"}`, with the period for a
/// flap (`{"mode":"flap","flap_period_ms":2000}`).
pub fn render(mode: Fault, period: Duration) -> Vec<u8> {
    let mut out = format!(r#"{{"mode":"{}""#, mode.name());
    if mode == Fault::Flap {
        out.push_str(&format!(r#","flap_period_ms":{}"#, period.as_millis()));
    }
    out.push('}');
    out.into_bytes()
}

/// The body of `POST /fault`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Switch<'a> {
    #[serde(borrow)]
    mode: std::borrow::Cow<'a, str>,
    flap_period_ms: Option<u64>,
}

/// Reads `{"mode":"<mode>"}`, optionally with `"flap_period_ms":N` (at least 1).
pub fn parse_switch(body: &[u8]) -> Result<(Fault, Option<Duration>), String> {
    let switch: Switch<'_> =
        serde_json::from_slice(body).map_err(|e| format!("expected {{\"mode\":..}}: {e}"))?;
    let mode = switch.mode.parse()?;
    match switch.flap_period_ms {
        Some(0) => Err("flap_period_ms must be at least 1".into()),
        p => Ok((mode, p.map(Duration::from_millis))),
    }
}

/// The mode in force, and since when (a flap's phases count from it).
#[derive(Debug)]
pub struct FaultState {
    mode: Cell<Fault>,
    since: Cell<Instant>,
    period: Cell<Duration>,
}

impl FaultState {
    pub fn new(mode: Fault, period: Duration, now: Instant) -> FaultState {
        FaultState {
            mode: Cell::new(mode),
            since: Cell::new(now),
            period: Cell::new(period),
        }
    }

    pub fn set(&self, mode: Fault, period: Option<Duration>, now: Instant) {
        self.mode.set(mode);
        self.since.set(now);
        if let Some(p) = period {
            self.period.set(p);
        }
    }

    pub fn mode(&self) -> Fault {
        self.mode.get()
    }

    pub fn period(&self) -> Duration {
        self.period.get()
    }

    /// Whether the whole process plays hung (nothing answered, nothing pushed).
    pub fn hung(&self) -> bool {
        self.mode.get() == Fault::Hang
    }

    pub fn behaviour(&self, now: Instant) -> Behaviour {
        match self.mode.get() {
            Fault::None => Behaviour::Serve,
            Fault::Fail => Behaviour::Fail,
            Fault::Hang => Behaviour::HangAll,
            Fault::DeadCore => Behaviour::HangApi,
            Fault::Flap => {
                let elapsed = now.saturating_duration_since(self.since.get());
                if flap_failing(elapsed, self.period.get()) {
                    Behaviour::Fail
                } else {
                    Behaviour::Serve
                }
            }
        }
    }
}

/// What `Fail` answers every `/v1/*` request with (status 500).
pub const FAIL_BODY: &[u8] =
    br#"{"error":{"message":"engine failed","type":"InternalServerError","code":500}}"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in [
            Fault::None,
            Fault::Fail,
            Fault::Hang,
            Fault::DeadCore,
            Fault::Flap,
        ] {
            assert_eq!(m.name().parse::<Fault>(), Ok(m));
            assert_eq!(m.to_string(), m.name());
        }
        assert!("Hang".parse::<Fault>().unwrap_err().contains("dead-core"));
    }

    #[test]
    fn a_flap_starts_healthy_and_alternates() {
        let p = Duration::from_millis(100);
        let at = |ms| flap_failing(Duration::from_millis(ms), p);
        assert!(!at(0) && !at(99));
        assert!(at(100) && at(199));
        assert!(!at(200) && at(350));
        let t0 = crate::clock::now();
        let s = FaultState::new(Fault::Flap, p, t0);
        assert_eq!(s.behaviour(t0), Behaviour::Serve);
        assert_eq!(
            s.behaviour(t0 + Duration::from_millis(150)),
            Behaviour::Fail
        );
        // Switching again restarts the cycle, healthy first.
        s.set(Fault::Flap, None, t0 + Duration::from_millis(150));
        assert_eq!(
            s.behaviour(t0 + Duration::from_millis(200)),
            Behaviour::Serve
        );
        assert_eq!(s.period(), p);
    }

    #[test]
    fn switches() {
        assert_eq!(parse_switch(br#"{"mode":"hang"}"#), Ok((Fault::Hang, None)));
        assert_eq!(
            parse_switch(br#"{"mode":"flap","flap_period_ms":500}"#),
            Ok((Fault::Flap, Some(Duration::from_millis(500))))
        );
        for bad in [
            &br#"{"mode":"sick"}"#[..],
            br#"{"mode":1}"#,
            br#"{}"#,
            br#"{"mode":"fail","extra":1}"#,
            br#"{"mode":"flap","flap_period_ms":0}"#,
            b"mode=fail",
            b"",
            b"\xff\xfe",
        ] {
            assert!(parse_switch(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            render(Fault::DeadCore, Duration::ZERO),
            br#"{"mode":"dead-core"}"#
        );
        assert_eq!(
            render(Fault::Flap, Duration::from_millis(2000)),
            br#"{"mode":"flap","flap_period_ms":2000}"#
        );
    }
}
