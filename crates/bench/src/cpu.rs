//! CPU time of processes from `/proc/PID/stat` (user + system), to report the CPU each backend
//! spends per lock pair beside its throughput.

use std::collections::BTreeMap;

/// Clock ticks per second of `/proc` times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the running system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// User + system CPU time of one process in µs; `None` if it is gone or unreadable.
pub fn process_cpu_us(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15 (1-based).
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_second() * 1e6)
}

/// CPU time summed over `pids`; `None` if any is unreadable.
pub fn total_cpu_us(pids: &[String]) -> Option<f64> {
    pids.iter().map(|p| process_cpu_us(p)).sum()
}

/// Parse `--pids NAME=PID,PID,...` arguments.
pub fn parse_pids(args: &[String]) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let mut out = BTreeMap::new();
    for a in args {
        let (name, pids) = a
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--pids {a:?}: expected NAME=PID,PID,..."))?;
        let pids: Vec<String> = pids
            .split(',')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect();
        if pids.iter().any(|p| p.parse::<u32>().is_err()) {
            anyhow::bail!("--pids {a:?}: process ids must be numbers");
        }
        out.insert(name.to_owned(), pids);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_is_readable_and_grows() {
        let me = std::process::id().to_string();
        let before = process_cpu_us(&me).expect("own /proc stat");
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = process_cpu_us(&me).expect("own /proc stat");
        assert!(after > before, "{before} -> {after}");
        assert!(process_cpu_us("999999999").is_none());
    }

    #[test]
    fn pids_are_parsed_and_checked() {
        let m = parse_pids(&["fenced=1,2,3".into(), "redis=9".into()]).expect("valid");
        assert_eq!(m["fenced"], vec!["1", "2", "3"]);
        assert!(parse_pids(&["fenced".into()]).is_err());
        assert!(parse_pids(&["fenced=a".into()]).is_err());
    }
}
