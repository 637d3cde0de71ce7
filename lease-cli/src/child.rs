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
        // The leader has gone; the rest of its group gets what is left of the grace.
        while self.group_alive() {
            if Instant::now() >= deadline {
                self.signal(Signal::SIGKILL);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(status)
    }

    fn group_alive(&self) -> bool {
        killpg(self.group, None).is_ok()
    }
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
