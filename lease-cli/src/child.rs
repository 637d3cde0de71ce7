//! The guarded command: started as the leader of its own process group, so that stopping it
//! reaches everything it started (a shell's pipeline, a script's children), and stopped with
//! SIGTERM, then SIGKILL after the grace. On Linux the group's leader is a supervisor that kills
//! the group if `lease` dies (the `supervise` module).

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::exit::{self, Failure};

/// What to run, and how.
#[derive(Debug)]
pub(crate) struct Spawn<'a> {
    pub(crate) command: &'a [String],
    pub(crate) shell: bool,
    pub(crate) pass_stdin: bool,
    pub(crate) env: Vec<(&'static str, String)>,
}

/// A running command and its process group.
#[derive(Debug)]
pub(crate) struct Guarded {
    child: Child,
    group: Pid,
}

impl Spawn<'_> {
    pub(crate) fn start(self) -> Result<Guarded, Failure> {
        let argv: Vec<String> = if self.shell {
            let shell = std::env::var("SHELL")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "/bin/sh".to_owned());
            vec![shell, "-c".to_owned(), self.command.join(" ")]
        } else {
            self.command.to_vec()
        };
        let mut command = supervised(&argv);
        command
            .envs(self.env)
            .stdin(if self.pass_stdin {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .process_group(0);
        let child = command.spawn().map_err(|e| {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_RUN,
            };
            Failure::new(
                code,
                format_args!(
                    "cannot run {:?}: {e}; check the command's name and that it is executable{}",
                    self.command[0],
                    if self.shell { "" } else { " (or use --shell)" }
                ),
            )
        })?;
        let pid = child.id().ok_or_else(|| {
            Failure::new(
                exit::CANNOT_RUN,
                "the command exited before it could be watched",
            )
        })?;
        let group = Pid::from_raw(i32::try_from(pid).map_err(|_| {
            Failure::new(
                exit::CANNOT_RUN,
                format_args!("process id {pid} out of range"),
            )
        })?);
        Ok(Guarded { child, group })
    }
}

/// The command that runs `argv`: under a supervisor that takes the whole group down if `lease`
/// dies (see the `supervise` module), where the system offers a parent-death signal.
#[cfg(target_os = "linux")]
fn supervised(argv: &[String]) -> Command {
    match std::env::current_exe() {
        Ok(lease) => {
            let mut command = Command::new(lease);
            command.args(crate::supervise::arguments(std::process::id(), argv));
            command
        }
        Err(e) => {
            eprintln!(
                "lease: cannot find its own executable ({e}): the command runs unsupervised, and \
                 would outlive a `lease` that is killed"
            );
            unsupervised(argv)
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn supervised(argv: &[String]) -> Command {
    unsupervised(argv)
}

fn unsupervised(argv: &[String]) -> Command {
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    command
}

impl Guarded {
    /// Completes when the command (the group's leader) exits.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Sends `signal` to the command's process group.
    pub(crate) fn signal(&self, signal: Signal) {
        // ESRCH: the group is gone already, which is what a stop wants.
        match killpg(self.group, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => eprintln!(
                "lease: cannot send {signal} to process group {}: {e}",
                self.group
            ),
        }
    }

    /// SIGTERM to the group, then SIGKILL to whatever of it is left after `grace`; returns the
    /// leader's status once it has exited. Processes of the group that outlive the leader are
    /// given the rest of the grace too, then killed.
    pub(crate) async fn stop(&mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        let deadline = Instant::now() + grace;
        self.signal(Signal::SIGTERM);
        let status = match tokio::time::timeout_at(deadline, self.child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                self.signal(Signal::SIGKILL);
                return self.child.wait().await;
            }
        };
        self.clear_until(deadline).await;
        Ok(status)
    }

    /// After the leader has exited: stops what is left of its group (a command's background
    /// child, say) with SIGTERM, then SIGKILL after `grace`, so nothing it started runs on once
    /// the lease is released. Returns whether anything was left.
    pub(crate) async fn clear_rest(&self, grace: Duration) -> bool {
        if !self.group_runs() {
            return false;
        }
        self.signal(Signal::SIGTERM);
        self.clear_until(Instant::now() + grace).await;
        true
    }

    /// Waits (polling) until no process of the group runs; SIGKILLs the group at `deadline`,
    /// then waits a little more for the kernel to finish the kill.
    async fn clear_until(&self, deadline: Instant) {
        let mut killed = false;
        while self.group_runs() {
            let now = Instant::now();
            if now >= deadline && !killed {
                self.signal(Signal::SIGKILL);
                killed = true;
            } else if killed && now >= deadline + KILL_TAKES {
                eprintln!(
                    "lease: process group {} still runs {KILL_TAKES:?} after SIGKILL",
                    self.group
                );
                return;
            }
            tokio::time::sleep(GROUP_POLL).await;
        }
    }

    /// Whether a process of the group still runs. A killed or exited member whose parent has
    /// gone is a zombie until init reaps it, which the init of some containers never does: it
    /// counts as gone. Where `/proc` cannot be read, any member counts.
    fn group_runs(&self) -> bool {
        #[cfg(target_os = "linux")]
        if let Some(runs) = group_runs_by_proc(self.group.as_raw()) {
            return runs;
        }
        killpg(self.group, None).is_ok()
    }
}

/// How often a stopping group is looked at.
const GROUP_POLL: Duration = Duration::from_millis(10);

/// How long a SIGKILLed group may take to be gone before `lease` stops waiting for it.
const KILL_TAKES: Duration = Duration::from_secs(1);

/// Whether `/proc` lists a process of group `group` that is not a zombie; `None` if `/proc`
/// cannot be read.
#[cfg(target_os = "linux")]
fn group_runs_by_proc(group: i32) -> Option<bool> {
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        // A process that exits between the listing and the read is gone: skipped.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (Some(state), Some(_ppid), Some(pgrp)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if pgrp.parse() == Ok(group) && state != "Z" && state != "X" {
            return Some(true);
        }
    }
    Some(false)
}

/// `lease`'s exit code for a command that ended with `status`: its code, or 128 + the signal
/// that killed it, as a shell reports it.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(255),
        (None, None) => 1,
    }
}
