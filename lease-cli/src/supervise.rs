//! The process between `lease lock` and its command, so the command's process group dies with
//! `lease lock` however `lease lock` dies.
//!
//! `lease lock` stops its command's whole process group when the lease is lost, and before the
//! lease could pass to anyone else. If `lease lock` itself dies without doing that (SIGKILL, the
//! OOM killer, a crash), the command would run on beside the next holder. So on Linux the command
//! runs under a supervisor: `lease` itself, started by `lease lock` as `lease __supervise <pid>
//! -- CMD…`, as the leader of the command's process group. It asks the kernel to signal it when
//! its parent dies (`PR_SET_PDEATHSIG`), and then kills its whole process group with SIGKILL at
//! once: the command and everything it started are gone within milliseconds, long before the
//! lease's TTL could run out.
//!
//! Otherwise it is transparent. Its command inherits its standard streams and environment. The
//! signals `lease lock` forwards to the group reach the command directly (the supervisor only
//! takes note), and the supervisor exits as the command did: with its code, or by the same
//! signal.
//!
//! On other systems there is no parent-death signal; `lease lock` runs the command directly, and
//! a command whose `lease lock` was killed runs on until it ends (see `lease lock --help`).

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};

use nix::sys::prctl;
use nix::sys::signal::{Signal, killpg, raise};
use nix::unistd::{Pid, getpgrp, getppid};
use tokio::signal::unix::{SignalKind, signal};

use crate::exit;

/// The hidden first argument that makes `lease` a supervisor.
pub(crate) const SUBCOMMAND: &str = "__supervise";

/// The signal the kernel sends the supervisor when `lease lock` dies. The same signal forwarded
/// by a living `lease lock` is told apart by the parent's pid.
const PARENT_DIED: Signal = Signal::SIGTERM;

/// The arguments of a supervisor: `lease lock`'s pid, `--`, and the command to run.
pub(crate) fn arguments(guard: u32, command: &[String]) -> Vec<OsString> {
    let mut args = vec![SUBCOMMAND.into(), guard.to_string().into(), "--".into()];
    args.extend(command.iter().map(OsString::from));
    args
}

/// Runs the supervisor on `args` (what follows [`SUBCOMMAND`]).
pub(crate) fn main(args: &[OsString]) -> ExitCode {
    let (guard, command) = match args {
        [guard, separator, command @ ..] if separator == "--" && !command.is_empty() => {
            match guard.to_str().and_then(|g| g.parse::<i32>().ok()) {
                Some(guard) => (Pid::from_raw(guard), command),
                None => return usage(),
            }
        }
        _ => return usage(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(supervise(guard, command)),
        Err(e) => fail(format_args!("cannot start: {e}")),
    }
}

async fn supervise(guard: Pid, command: &[OsString]) -> ExitCode {
    // Handlers, not a blocked mask: a mask would be inherited by the command, handlers are not.
    // Installed before the parent-death signal is asked for, so it never meets the default
    // action (death without killing the group).
    let listen = |kind| signal(kind).map_err(|e| format!("cannot listen for signals: {e}"));
    let (mut terminate, mut interrupt, mut hangup) = match (
        listen(SignalKind::terminate()),
        listen(SignalKind::interrupt()),
        listen(SignalKind::hangup()),
    ) {
        (Ok(t), Ok(i), Ok(h)) => (t, i, h),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return fail(e),
    };
    if let Err(e) = prctl::set_pdeathsig(PARENT_DIED) {
        return fail(format_args!("cannot ask for a parent-death signal: {e}"));
    }
    // `lease lock` may have died before the request above: then no signal will come.
    if getppid() != guard {
        kill_group();
    }
    let mut child = match tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_RUN,
            };
            eprintln!(
                "lease: cannot run {:?}: {e}; check the command's name and that it is executable",
                command[0]
            );
            return ExitCode::from(code);
        }
    };
    loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                return match status {
                    Ok(status) => exit_as(status),
                    Err(e) => fail(format_args!("cannot wait for the command: {e}")),
                };
            }
            // Forwarded by `lease lock` to the whole group, so the command has it too; or the
            // kernel's word that `lease lock` is gone.
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
            _ = hangup.recv() => {}
        }
        if getppid() != guard {
            kill_group();
        }
    }
}

/// SIGKILL to the supervisor's own process group: the command, all it started, and itself.
fn kill_group() -> ! {
    let _ = killpg(getpgrp(), Signal::SIGKILL);
    // Not reached: the group includes this process.
    std::process::exit(i32::from(exit::LOST));
}

/// Ends the supervisor as the command ended: with its exit code, or by its signal (the signals
/// the supervisor handles, and those every Rust program ignores, as a shell's code: 128 + n).
fn exit_as(status: ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1));
    }
    if let Some(signal) = status.signal().and_then(|s| Signal::try_from(s).ok()) {
        let handled = [
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGHUP,
            Signal::SIGPIPE,
        ];
        if !handled.contains(&signal) {
            let _ = raise(signal);
        }
        return ExitCode::from(u8::try_from(128 + signal as i32).unwrap_or(255));
    }
    ExitCode::from(1)
}

fn usage() -> ExitCode {
    fail("usage: lease __supervise <pid of lease lock> -- CMD [ARGS…] (used by `lease lock`)")
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("lease: {message}");
    ExitCode::from(exit::CANNOT_RUN)
}
