//! The monitor's timers on the control thread: fold tracked load in and publish what
//! changed every `monitor_interval_ms`; scrape workers with the `scrape` source every
//! `scrape_interval_ms` (one scrape per worker in flight at a time).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::{Control, scrape};
use crate::config::MetricsFormat;
use crate::http::limits::{SCRAPE_TIMEOUT_MAX_MS, SCRAPE_TIMEOUT_MIN_MS};
use crate::runtime::clock;
use crate::state::SlotSet;
use crate::state::Worker;

/// Folds tracked load in and republishes on a fixed interval.
pub async fn tick(control: Rc<RefCell<Control>>) {
    loop {
        let interval = control
            .borrow()
            .shared
            .snapshot
            .load()
            .config
            .monitor_interval_ms;
        monoio::time::sleep(Duration::from_millis(interval)).await;
        control.borrow_mut().tick();
    }
}

/// Polls every worker with the `scrape` source once per interval.
pub async fn scrape_loop(control: Rc<RefCell<Control>>) {
    let in_flight: Rc<RefCell<SlotSet>> = Rc::default();
    loop {
        let snap = control.borrow().shared.snapshot.load_full();
        let interval = Duration::from_millis(snap.config.scrape_interval_ms);
        let timeout = interval.clamp(
            Duration::from_millis(SCRAPE_TIMEOUT_MIN_MS),
            Duration::from_millis(SCRAPE_TIMEOUT_MAX_MS),
        );
        for w in snap.workers.iter().filter(|w| w.cfg.load_sources.scrape) {
            if in_flight.borrow_mut().insert(w.state.slot) {
                monoio::spawn(scrape_one(control.clone(), in_flight.clone(), w, timeout));
            }
        }
        monoio::time::sleep(interval).await;
    }
}

/// One scrape of one worker, applied and republished when it lands.
fn scrape_one(
    control: Rc<RefCell<Control>>,
    in_flight: Rc<RefCell<SlotSet>>,
    w: &Worker,
    timeout: Duration,
) -> impl std::future::Future<Output = ()> + 'static {
    let (slot, addr) = (w.state.slot, w.metrics_addr);
    let (host, path) = (w.cfg.metrics.to_string(), w.cfg.metrics_path.clone());
    // llama.cpp says its slot count in `/props` (asked each time: a restarted server
    // may have another); a configured `total_slots` wins.
    let props = w.cfg.metrics_format == MetricsFormat::Llamacpp && w.cfg.total_slots.is_none();
    async move {
        let result = scrape::fetch(addr, &host, &path, timeout).await;
        let slots = match props && result.is_ok() {
            true => scrape::llamacpp_slots(addr, &host, timeout).await,
            false => None,
        };
        in_flight.borrow_mut().remove(&slot);
        let mut c = control.borrow_mut();
        let snap = c.shared.snapshot.load_full();
        c.monitor
            .apply_scrape(&snap, slot, (result, slots), clock::now_ms());
        c.republish();
    }
}
