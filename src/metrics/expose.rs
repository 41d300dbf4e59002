//! Prometheus exposition (filled in with the monitor).
