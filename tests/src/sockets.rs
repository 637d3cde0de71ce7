//! Counting a client's connections from outside the client: the TCP sockets of this process that
//! are ESTABLISHED to a server's port, as the kernel lists them (`/proc/net/tcp` and
//! `/proc/net/tcp6`, matched to this process's descriptors in `/proc/self/fd`), and a sampler
//! that keeps the peak of those counts while a test or a benchmark runs.
//!
//! Only sockets this process owns count: the server's own ends, and the server's connections to
//! itself (etcd's JSON gateway dials its own gRPC port), do not. Linux only; elsewhere the
//! count panics with a message saying so.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::AbortHandle;

/// TCP state ESTABLISHED in `/proc/net/tcp`.
const ESTABLISHED: &str = "01";

/// The inodes of this process's sockets.
fn own_socket_inodes() -> HashSet<u64> {
    let dir = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd: counting connections needs Linux's /proc");
    dir.filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// For each port in `ports`: how many of this process's TCP connections to that port (on any
/// address) are ESTABLISHED now.
pub fn established_to_ports(ports: &[u16]) -> HashMap<u16, usize> {
    let own = own_socket_inodes();
    let mut counts: HashMap<u16, usize> = ports.iter().map(|&p| (p, 0)).collect();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // `sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout
        // inode ...`, addresses as `<hex IP>:<hex port>`.
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) =
                (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if *state != ESTABLISHED {
                continue;
            }
            let port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            let inode = inode.parse::<u64>().ok();
            if let (Some(port), Some(inode)) = (port, inode) {
                if own.contains(&inode) {
                    if let Some(count) = counts.get_mut(&port) {
                        *count += 1;
                    }
                }
            }
        }
    }
    counts
}

/// How many of this process's TCP connections to `port` are ESTABLISHED now.
pub fn established_to(port: u16) -> usize {
    established_to_ports(&[port])[&port]
}

/// Samples [`established_to_ports`] every `every` in the background and keeps, per port, the
/// most seen at one sample; stops when dropped. A count between samples can be missed: the peak
/// is a lower bound of the true peak, exact for connections that stay open longer than `every`.
#[derive(Debug)]
pub struct ConnectionSampler {
    peaks: Arc<Mutex<HashMap<u16, usize>>>,
    samples: Arc<Mutex<u64>>,
    task: AbortHandle,
}

impl ConnectionSampler {
    /// Starts sampling the connections to `ports`, one sample every `every`, the first `every`
    /// from now (a connection this process closed just before, an operator's call that was
    /// answered, is gone from the socket table by then).
    pub fn start(ports: &[u16], every: Duration) -> ConnectionSampler {
        let ports = ports.to_vec();
        let peaks: Arc<Mutex<HashMap<u16, usize>>> =
            Arc::new(Mutex::new(ports.iter().map(|&p| (p, 0)).collect()));
        let samples = Arc::new(Mutex::new(0));
        let task = tokio::spawn({
            let (peaks, samples) = (Arc::clone(&peaks), Arc::clone(&samples));
            async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let ports = ports.clone();
                    // Reading /proc is blocking file I/O: off the runtime's worker threads.
                    let Ok(counts) =
                        tokio::task::spawn_blocking(move || established_to_ports(&ports)).await
                    else {
                        return;
                    };
                    let mut peaks = peaks.lock().unwrap();
                    for (port, count) in counts {
                        let peak = peaks.entry(port).or_default();
                        *peak = (*peak).max(count);
                    }
                    *samples.lock().unwrap() += 1;
                }
            }
        })
        .abort_handle();
        ConnectionSampler {
            peaks,
            samples,
            task,
        }
    }

    /// The most connections to `port` seen at one sample so far.
    pub fn peak(&self, port: u16) -> usize {
        self.peaks.lock().unwrap().get(&port).copied().unwrap_or(0)
    }

    /// The most connections to each port seen at one sample so far.
    pub fn peaks(&self) -> HashMap<u16, usize> {
        self.peaks.lock().unwrap().clone()
    }

    /// How many samples were taken so far.
    pub fn samples(&self) -> u64 {
        *self.samples.lock().unwrap()
    }

    /// Takes one last sample now, and stops: a window shorter than `every` has a sample too.
    pub fn stop(&self) {
        self.task.abort();
        let mut peaks = self.peaks.lock().unwrap();
        let ports: Vec<u16> = peaks.keys().copied().collect();
        for (port, count) in established_to_ports(&ports) {
            let peak = peaks.entry(port).or_default();
            *peak = (*peak).max(count);
        }
        *self.samples.lock().unwrap() += 1;
    }

    /// Starts the peaks afresh, from the next sample on.
    pub fn reset(&self) {
        for peak in self.peaks.lock().unwrap().values_mut() {
            *peak = 0;
        }
    }
}

impl Drop for ConnectionSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}
