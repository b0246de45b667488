//! The test environment: hosts (network namespaces on a private bridge, or plain loopback
//! addresses when not root) and the processes running on them.
//!
//! Namespaces mode (root): one *hub* namespace holds a bridge; every host is a namespace with a
//! veth pair into the hub and its own address in 10.213.0.0/24. Nothing is configured in the
//! machine's own namespace, so all test traffic stays inside namespaces this run created.
//! Partitions are `iptables -A INPUT -s <peer> -j DROP` inside the receiving host's namespace.
//!
//! Loopback mode (not root, or `--net loopback`): every host is an address in 127.0.X.0/24;
//! partitions are not available (kill, pause, clock and restart nemeses are).
//!
//! [`Env`] owns everything it started: dropping it (also when unwinding from a panic) stops
//! every process (SIGCONT, then SIGKILL, then reap) and deletes every namespace. Children get
//! `PR_SET_PDEATHSIG` = SIGKILL, so they die with the harness even if it is SIGKILLed itself.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("`{cmd}` failed: {msg}")]
    Command { cmd: String, msg: String },
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}")]
    Unsupported(String),
    #[error("no host or process named {0:?}")]
    Unknown(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetMode {
    Namespaces,
    Loopback,
}

#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    pub ip: String,
    /// Network namespace (namespaces mode).
    pub ns: Option<String>,
}

/// How to (re)start a process.
#[derive(Clone, Debug)]
pub struct Spec {
    pub host: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

struct Proc {
    spec: Spec,
    child: Option<Child>,
    log: PathBuf,
    starts: u32,
    paused: bool,
}

pub struct Env {
    pub mode: NetMode,
    pub prefix: String,
    hub: Option<String>,
    hosts: BTreeMap<String, Host>,
    procs: BTreeMap<String, Proc>,
    log_dir: PathBuf,
    /// Hosts with partition rules in place.
    grudged: Vec<String>,
    subnet: u8,
}

fn run(cmd: &mut Command) -> Result<String, EnvError> {
    let text = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| EnvError::Command {
            cmd: text.clone(),
            msg: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(EnvError::Command {
            cmd: text,
            msg: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String, EnvError> {
    run(Command::new("ip").args(args))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Send `sig` to `pid`. Errors (already gone) are ignored.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we spawned; at worst it fails with ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Namespaces whose name starts with `prefix-`.
pub fn namespaces_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(out) = ip(&["netns", "list"]) else {
        return vec![];
    };
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_owned)
        .collect()
}

/// Kill every process inside `ns` (by pid, from `ip netns pids`) and delete the namespace.
pub fn destroy_namespace(ns: &str) {
    for _ in 0..3 {
        let pids = ip(&["netns", "pids", ns]).unwrap_or_default();
        let pids: Vec<u32> = pids.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            signal(pid, libc::SIGCONT);
            signal(pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = ip(&["netns", "del", ns]);
}

/// Remove everything a run with this prefix left behind (after a crash of the harness).
pub fn cleanup_prefix(prefix: &str) -> usize {
    let list = namespaces_with_prefix(prefix);
    // Hosts first, hub last.
    let (hubs, hosts): (Vec<_>, Vec<_>) = list.iter().partition(|n| n.ends_with("-hub"));
    for ns in hosts.iter().chain(hubs.iter()) {
        destroy_namespace(ns);
    }
    list.len()
}

impl Env {
    /// `subnet`: the third octet for loopback mode (127.0.`subnet`.x).
    pub fn new(mode: NetMode, prefix: &str, log_dir: &Path, subnet: u8) -> Result<Env, EnvError> {
        std::fs::create_dir_all(log_dir)
            .map_err(|e| EnvError::Io(log_dir.display().to_string(), e))?;
        let mut env = Env {
            mode,
            prefix: prefix.to_owned(),
            hub: None,
            hosts: BTreeMap::new(),
            procs: BTreeMap::new(),
            log_dir: log_dir.to_owned(),
            grudged: vec![],
            subnet,
        };
        if mode == NetMode::Namespaces {
            if !is_root() {
                return Err(EnvError::Unsupported(
                    "network namespaces need root; use --net loopback".into(),
                ));
            }
            // Leftovers of an earlier run with the same prefix.
            cleanup_prefix(prefix);
            let hub = format!("{prefix}-hub");
            ip(&["netns", "add", &hub])?;
            env.hub = Some(hub.clone());
            ip(&["-n", &hub, "link", "set", "lo", "up"])?;
            ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
            ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        }
        Ok(env)
    }

    /// Add host `name` with host number `n` (1..=250): namespace + veth + address, or a
    /// loopback address.
    pub fn add_host(&mut self, name: &str, n: u8) -> Result<Host, EnvError> {
        let host = match self.mode {
            NetMode::Loopback => Host {
                name: name.to_owned(),
                ip: format!("127.0.{}.{n}", self.subnet),
                ns: None,
            },
            NetMode::Namespaces => {
                let hub = self
                    .hub
                    .clone()
                    .ok_or_else(|| EnvError::Unknown("hub".into()))?;
                let ns = format!("{}-{name}", self.prefix);
                let addr = format!("10.213.0.{n}");
                let veth = format!("v{n}");
                ip(&["netns", "add", &ns])?;
                // Register at once so that a failure below still deletes it.
                self.hosts.insert(
                    name.to_owned(),
                    Host {
                        name: name.to_owned(),
                        ip: addr.clone(),
                        ns: Some(ns.clone()),
                    },
                );
                ip(&["-n", &ns, "link", "set", "lo", "up"])?;
                ip(&[
                    "-n", &hub, "link", "add", &veth, "type", "veth", "peer", "name", "eth0",
                    "netns", &ns,
                ])?;
                ip(&["-n", &hub, "link", "set", &veth, "master", "br0"])?;
                ip(&["-n", &hub, "link", "set", &veth, "up"])?;
                ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    "eth0",
                ])?;
                ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
                Host {
                    name: name.to_owned(),
                    ip: addr,
                    ns: Some(ns),
                }
            }
        };
        self.hosts.insert(name.to_owned(), host.clone());
        Ok(host)
    }

    pub fn host(&self, name: &str) -> Result<&Host, EnvError> {
        self.hosts
            .get(name)
            .ok_or_else(|| EnvError::Unknown(name.to_owned()))
    }

    /// A command that runs `program` on host `host`.
    pub fn command(&self, host: &str, program: &Path) -> Result<Command, EnvError> {
        let h = self.host(host)?;
        Ok(match &h.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => Command::new(program),
        })
    }

    /// Register and start a process named `name`.
    pub fn spawn(&mut self, name: &str, spec: Spec) -> Result<u32, EnvError> {
        let log = self.log_dir.join(format!("{name}.log"));
        self.procs.insert(
            name.to_owned(),
            Proc {
                spec,
                child: None,
                log,
                starts: 0,
                paused: false,
            },
        );
        self.start(name)
    }

    /// (Re)start a registered process that is not running.
    pub fn start(&mut self, name: &str) -> Result<u32, EnvError> {
        let p = self
            .procs
            .get(name)
            .ok_or_else(|| EnvError::Unknown(name.to_owned()))?;
        if p.child.is_some() {
            return Err(EnvError::Unsupported(format!("{name} is already running")));
        }
        let spec = p.spec.clone();
        let log_path = p.log.clone();
        let starts = p.starts + 1;
        let mut log: File = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| EnvError::Io(log_path.display().to_string(), e))?;
        let _ = writeln!(log, "===== jepsen: start #{starts} of {name} =====");
        let err = log
            .try_clone()
            .map_err(|e| EnvError::Io(log_path.display().to_string(), e))?;
        let mut cmd = self.command(&spec.host, &spec.program)?;
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| EnvError::Command {
            cmd: format!("{cmd:?}"),
            msg: e.to_string(),
        })?;
        let pid = child.id();
        let p = self
            .procs
            .get_mut(name)
            .ok_or_else(|| EnvError::Unknown(name.to_owned()))?;
        p.child = Some(child);
        p.starts = starts;
        p.paused = false;
        Ok(pid)
    }

    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs.get(name)?.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self, name: &str) -> Result<(), EnvError> {
        let p = self
            .procs
            .get_mut(name)
            .ok_or_else(|| EnvError::Unknown(name.to_owned()))?;
        if let Some(mut c) = p.child.take() {
            signal(c.id(), libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
        p.paused = false;
        Ok(())
    }

    pub fn pause(&mut self, name: &str) -> Result<(), EnvError> {
        let p = self
            .procs
            .get_mut(name)
            .ok_or_else(|| EnvError::Unknown(name.to_owned()))?;
        if let Some(c) = &p.child {
            signal(c.id(), libc::SIGSTOP);
            p.paused = true;
        }
        Ok(())
    }

    pub fn resume(&mut self, name: &str) -> Result<(), EnvError> {
        let p = self
            .procs
            .get_mut(name)
            .ok_or_else(|| EnvError::Unknown(name.to_owned()))?;
        if let Some(c) = &p.child {
            signal(c.id(), libc::SIGCONT);
        }
        p.paused = false;
        Ok(())
    }

    /// Whether `name` has exited (reaping it if so).
    pub fn exited(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        let p = self.procs.get_mut(name)?;
        let c = p.child.as_mut()?;
        match c.try_wait() {
            Ok(Some(st)) => {
                p.child = None;
                Some(st)
            }
            _ => None,
        }
    }

    /// Wait up to `limit` for `name` to exit by itself; then kill it. Returns whether it
    /// exited by itself.
    pub fn wait_or_kill(&mut self, name: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            match self.procs.get(name) {
                Some(p) if p.child.is_some() => {}
                _ => return true,
            }
            if self.exited(name).is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.kill(name);
        false
    }

    /// Names of registered processes.
    pub fn process_names(&self) -> Vec<String> {
        self.procs.keys().cloned().collect()
    }

    /// Install partition rules: `victim` drops everything from each host in `from`.
    pub fn drop_from(&mut self, victim: &str, from: &[String]) -> Result<(), EnvError> {
        let h = self.host(victim)?.clone();
        let Some(ns) = h.ns else {
            return Err(EnvError::Unsupported(
                "partitions need network namespaces (run as root with --net netns)".into(),
            ));
        };
        for f in from {
            let src = self.host(f)?.ip.clone();
            run(Command::new("ip").args([
                "netns", "exec", &ns, "iptables", "-w", "-A", "INPUT", "-s", &src, "-j", "DROP",
            ]))?;
        }
        if !self.grudged.contains(&victim.to_owned()) {
            self.grudged.push(victim.to_owned());
        }
        Ok(())
    }

    /// Remove every partition rule.
    pub fn heal(&mut self) -> Result<(), EnvError> {
        let mut first_err = None;
        for victim in std::mem::take(&mut self.grudged) {
            let Some(ns) = self.hosts.get(&victim).and_then(|h| h.ns.clone()) else {
                continue;
            };
            if let Err(e) =
                run(Command::new("ip")
                    .args(["netns", "exec", &ns, "iptables", "-w", "-F", "INPUT"]))
            {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Stop everything and delete the namespaces. Idempotent.
    pub fn teardown(&mut self) {
        for p in self.procs.values_mut() {
            if let Some(mut c) = p.child.take() {
                signal(c.id(), libc::SIGCONT);
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let hosts: Vec<String> = self.hosts.values().filter_map(|h| h.ns.clone()).collect();
        self.hosts.clear();
        for ns in hosts {
            destroy_namespace(&ns);
        }
        if let Some(hub) = self.hub.take() {
            destroy_namespace(&hub);
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.teardown();
    }
}
