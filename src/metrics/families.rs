//! A small builder over the prometheus crate's protobuf types: families of counters,
//! gauges and histograms, encoded as text.

use prometheus::Encoder as _;
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

use crate::state::counters::{self, ModelCore, ModelMetrics};

pub(super) struct Families(Vec<MetricFamily>);

pub(super) fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name((*k).to_string());
            l.set_value((*v).to_string());
            l
        })
        .collect()
}

impl Families {
    pub(super) fn new() -> Families {
        Families(Vec::new())
    }

    fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut MetricFamily {
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        self.0.push(f);
        self.0.last_mut().unwrap_or_else(|| unreachable!())
    }

    pub(super) fn counter(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Vec<LabelPair>, f64)>,
    ) {
        let f = self.family(name, help, MetricType::COUNTER);
        for (l, v) in series {
            let mut c = Counter::default();
            c.set_value(v);
            let mut m = Metric::default();
            m.set_label(l);
            m.set_counter(c);
            f.mut_metric().push(m);
        }
    }

    pub(super) fn gauge(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Vec<LabelPair>, f64)>,
    ) {
        let f = self.family(name, help, MetricType::GAUGE);
        for (l, v) in series {
            let mut g = Gauge::default();
            g.set_value(v);
            let mut m = Metric::default();
            m.set_label(l);
            m.set_gauge(g);
            f.mut_metric().push(m);
        }
    }

    pub(super) fn histogram(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Vec<LabelPair>, Histogram)>,
    ) {
        let f = self.family(name, help, MetricType::HISTOGRAM);
        for (l, h) in series {
            let mut m = Metric::default();
            m.set_label(l);
            m.set_histogram(h);
            f.mut_metric().push(m);
        }
    }

    pub(super) fn encode(mut self) -> Vec<u8> {
        self.0.retain(|f| !f.get_metric().is_empty());
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(e) = prometheus::TextEncoder::new().encode(&self.0, &mut out) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// A model's histogram of seconds summed over cores, in Prometheus' cumulative form.
pub(super) fn histogram<const N: usize>(
    bounds: &[f64; N],
    metrics: &ModelMetrics,
    pick: impl Fn(&ModelCore) -> &counters::Histogram<N>,
) -> Histogram {
    histogram_in(bounds, metrics, pick, 1e9)
}

/// A model's histogram of counts (`observe_count`: the sum is in whole units).
pub(super) fn count_histogram<const N: usize>(
    bounds: &[f64; N],
    metrics: &ModelMetrics,
    pick: impl Fn(&ModelCore) -> &counters::Histogram<N>,
) -> Histogram {
    histogram_in(bounds, metrics, pick, 1.0)
}

fn histogram_in<const N: usize>(
    bounds: &[f64; N],
    metrics: &ModelMetrics,
    pick: impl Fn(&ModelCore) -> &counters::Histogram<N>,
    per_unit: f64,
) -> Histogram {
    let mut counts = vec![0u64; N + 1];
    let mut sum_ns = 0u64;
    for core in metrics.cores.iter() {
        pick(core).accumulate(&mut counts, &mut sum_ns);
    }
    let mut cumulative = 0;
    let buckets = bounds
        .iter()
        .zip(&counts)
        .map(|(&b, &c)| {
            cumulative += c;
            let mut bucket = Bucket::default();
            bucket.set_upper_bound(b);
            bucket.set_cumulative_count(cumulative);
            bucket
        })
        .collect();
    let mut h = Histogram::default();
    h.set_bucket(buckets);
    h.set_sample_count(counts.iter().sum());
    h.set_sample_sum(sum_ns as f64 / per_unit);
    h
}
