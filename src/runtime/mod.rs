//! What the threads run on: the monoio runtime of each thread (io_uring, or epoll), thread
//! placement on CPUs, SO_REUSEPORT listeners and the accept loop, the process clock, the
//! client read slot, and name resolution. No proxy logic lives here.

pub mod buffers;
pub mod clock;
pub mod idle_watch;
pub mod listen;
pub mod reader;
pub mod resolve;
pub mod stalls;
pub mod stream;
pub mod tls_io;

use std::io;

use crate::config::Config;

/// The runtime every Spillway thread runs: io_uring when the kernel allows, else epoll.
pub type Runtime = monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
>;

/// Builds a thread's runtime. `blocking_threads` > 0 attaches a pool for
/// `monoio::spawn_blocking` (the control thread resolves names and reads files there).
pub fn build(blocking_threads: usize) -> io::Result<Runtime> {
    let fusion = |tuned: bool| {
        let mut ring = io_uring::IoUring::builder();
        if tuned {
            // One thread submits to each ring, and completions are reaped when the core
            // parks: no inter-processor interrupt or signal-style task work per completion.
            ring.setup_coop_taskrun().setup_single_issuer();
        }
        let builder = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .uring_builder(ring)
            .with_entries(2048)
            .enable_timer();
        with_pool(builder, blocking_threads).build()
    };
    // Older kernels refuse the flags (COOP_TASKRUN 5.19, SINGLE_ISSUER 6.0): plain ring.
    match fusion(true).or_else(|_| fusion(false)) {
        Ok(rt) => Ok(rt),
        Err(e) => {
            tracing::warn!(error = %e, "io_uring runtime failed to start; using epoll");
            let builder = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer();
            Ok(with_pool(builder, blocking_threads).build()?.into())
        }
    }
}

fn with_pool<D>(builder: monoio::RuntimeBuilder<D>, threads: usize) -> monoio::RuntimeBuilder<D> {
    if threads == 0 {
        return builder;
    }
    builder.attach_thread_pool(Box::new(monoio::blocking::DefaultThreadPool::new(threads)))
}

/// Pins the calling thread (pinning from another thread would pin the wrong one).
pub fn pin_current(cpu: Option<usize>, what: &str) {
    if let Some(Err(e)) = cpu.map(|c| monoio::utils::bind_to_cpu_set([c])) {
        tracing::warn!(cpu, thread = what, error = ?e, "cannot pin thread to CPU");
    }
}

/// CPUs this process may run on (its affinity mask), in order.
fn allowed_cpus() -> Vec<usize> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Where each data core and the monitor run: explicit `cpus`, else the last `cores`
/// allowed CPUs for data and the first for the monitor when one is spare.
pub fn placement(config: &Config) -> (Vec<Option<usize>>, Option<usize>) {
    if !config.pin_cores {
        return (vec![None; config.cores], None);
    }
    if !config.cpus.is_empty() {
        return (
            config.cpus.iter().map(|&c| Some(c)).collect(),
            config.monitor_cpu,
        );
    }
    spread(&allowed_cpus(), config.cores, config.monitor_cpu)
}

/// The last `cores` of `allowed` for data (wrapping when there are fewer), and the first
/// for the monitor when one is spare.
fn spread(
    allowed: &[usize],
    cores: usize,
    monitor_cpu: Option<usize>,
) -> (Vec<Option<usize>>, Option<usize>) {
    let n = allowed.len();
    if n == 0 {
        return (vec![None; cores], monitor_cpu);
    }
    if cores < n {
        let data = (0..cores).map(|i| Some(allowed[n - cores + i])).collect();
        (data, monitor_cpu.or(Some(allowed[0])))
    } else {
        let data = (0..cores).map(|i| Some(allowed[i % n])).collect();
        (data, monitor_cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_leaves_the_first_cpu_to_the_monitor() {
        assert_eq!(
            spread(&[0, 1, 2, 3], 3, None),
            (vec![Some(1), Some(2), Some(3)], Some(0))
        );
        assert_eq!(spread(&[4, 5], 2, None), (vec![Some(4), Some(5)], None));
        assert_eq!(
            spread(&[4, 5], 3, Some(9)),
            (vec![Some(4), Some(5), Some(4)], Some(9))
        );
        assert_eq!(spread(&[], 2, None), (vec![None, None], None));
    }
}
