//! The process's own figures, read from the operating system at each scrape.

use prometheus_client::metrics::gauge::Gauge;

/// The process as the operating system sees it, read at each scrape: CPU time (user and
/// system, `getrusage`), resident memory (`/proc/self/statm`, Linux), open files
/// (`/proc/self/fd`, Linux), the open-file limit (`RLIMIT_NOFILE`, soft) and threads
/// (`/proc/self/status`, Linux). A figure the system does not give stays 0.
#[derive(Default)]
pub struct ProcessGauges {
    pub(super) cpu_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(super) resident_bytes: Gauge,
    pub(super) open_files: Gauge,
    pub(super) max_open_files: Gauge,
    pub(super) threads: Gauge,
}

impl ProcessGauges {
    pub(super) fn refresh(&self) {
        if let Some(secs) = process_cpu_seconds() {
            self.cpu_seconds.set(secs);
        }
        if let Some(bytes) = process_resident_bytes() {
            self.resident_bytes.set(bytes.min(i64::MAX as u64) as i64);
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            // The directory's own handle, open while it is read, is one of them.
            self.open_files.set(entries.count().saturating_sub(1) as i64);
        }
        if let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::NOFILE) {
            self.max_open_files.set(soft.min(i64::MAX as u64) as i64);
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        if let Some(threads) =
            status.lines().find_map(|l| l.strip_prefix("Threads:")?.trim().parse::<i64>().ok())
        {
            self.threads.set(threads);
        }
    }
}

/// CPU time the process used, user and system (`getrusage`).
pub fn process_cpu_seconds() -> Option<f64> {
    // SAFETY: getrusage writes one rusage into the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(secs(usage.ru_utime) + secs(usage.ru_stime))
}

/// The process's resident memory (`/proc/self/statm`, Linux).
pub fn process_resident_bytes() -> Option<u64> {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    Some(pages * page)
}
