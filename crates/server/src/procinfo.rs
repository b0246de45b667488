//! The process's own resources as `INFO` shows them (`memory`, `cpu`, `server`'s `os`):
//! read from `/proc` and `getrusage`. Anything unreadable is 0 or empty, never an error: a
//! monitoring command must answer.

/// Resident set size now and at its peak, in bytes.
pub fn rss() -> (u64, u64) {
    let page = page_size();
    let now = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| parse_statm_rss(&s))
        .map_or(0, |pages| pages * page);
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_kib_field(&s, "VmHWM:"))
        .map_or(now, |k| (k * 1024).max(now));
    (now, peak)
}

/// Physical memory of the machine, in bytes (0 if unknown).
pub fn total_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| parse_kib_field(&s, "MemTotal:"))
        .map_or(0, |k| k * 1024)
}

/// CPU time the process used: (system, user), in seconds.
pub fn cpu() -> (f64, f64) {
    // SAFETY: getrusage writes into the zeroed struct we pass and reads nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_stime), secs(ru.ru_utime))
}

/// `Linux 6.1.0-18-amd64 x86_64`, like Redis's `os` field (uname's sysname, release and
/// machine).
pub fn os() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let name = match read("/proc/sys/kernel/ostype") {
        s if s.is_empty() => std::env::consts::OS.to_string(),
        s => s,
    };
    format!(
        "{name} {} {}",
        read("/proc/sys/kernel/osrelease"),
        std::env::consts::ARCH
    )
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// The second field of `/proc/self/statm`: resident pages.
fn parse_statm_rss(s: &str) -> Option<u64> {
    s.split_whitespace().nth(1)?.parse().ok()
}

/// `VmHWM:   1234 kB` → 1234.
fn parse_kib_field(s: &str, field: &str) -> Option<u64> {
    s.lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        assert_eq!(parse_statm_rss("1000 250 30 1 0 200 0\n"), Some(250));
        assert_eq!(parse_statm_rss(""), None);
        let status = "Name:\tfenced\nVmPeak:\t  9 kB\nVmHWM:\t   5120 kB\nVmRSS:\t 4096 kB\n";
        assert_eq!(parse_kib_field(status, "VmHWM:"), Some(5120));
        assert_eq!(parse_kib_field(status, "Nope:"), None);
    }

    #[test]
    fn reads_this_process() {
        let (now, peak) = rss();
        assert!(now > 0 && peak >= now, "{now} {peak}");
        assert!(total_memory() > now);
        let (sys, user) = cpu();
        assert!(sys >= 0.0 && user >= 0.0);
        assert!(os().contains(std::env::consts::ARCH));
    }
}
