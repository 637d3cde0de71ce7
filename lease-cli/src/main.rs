//! `lease`: distributed leases for shell commands.
//!
//! `lease lock KEY -- CMD` runs CMD while holding a lease on Consul (interoperating with
//! `consul lock`), etcd (interoperating with `etcdctl lock`), RabbitMQ or PostgreSQL, and stops it
//! before the lease could be given away; `lease status` and `lease check` inspect leases and
//! sequencers; `lease amqp …` administers RabbitMQ semaphores; `lease gc` removes the Consul
//! leader keys nobody holds. `lease --help` documents the
//! flags, examples and exit codes.

mod amqp;
mod backend;
mod child;
mod cli;
mod duration;
mod exit;
mod gc;
mod lock;
mod status;
#[cfg(target_os = "linux")]
mod supervise;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};
use exit::Failure;

fn main() -> ExitCode {
    #[cfg(target_os = "linux")]
    {
        let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
        if raw.get(1).is_some_and(|a| a == supervise::SUBCOMMAND) {
            return supervise::main(&raw[2..]);
        }
    }
    let args = cli::normalise(std::env::args_os());
    if let Some(failure) = missing_separator(&args) {
        return report(failure);
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            // Help and version go to stdout and succeed; anything else is bad usage.
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            return report(Failure::new(
                exit::BACKEND,
                format_args!("cannot start: {e}"),
            ));
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Lock(args) => lock::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Check(args) => status::check(args).await,
            Command::Amqp(command) => amqp::run(command).await,
            Command::Gc(args) => gc::run(args).await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => report(failure),
    }
}

fn report(failure: Failure) -> ExitCode {
    eprintln!("lease: {}", failure.message);
    ExitCode::from(failure.code)
}

/// `lease lock KEY CMD` without `--` would read CMD's flags as ours: refused before parsing,
/// with the fix in the message (help requests pass).
fn missing_separator(args: &[std::ffi::OsString]) -> Option<Failure> {
    let words: Vec<&str> = args.iter().skip(1).filter_map(|a| a.to_str()).collect();
    let lock = words.iter().position(|w| *w == "lock")?;
    // `lock` must be the subcommand, not a value of an earlier flag.
    if words[..lock].iter().any(|w| !w.starts_with('-')) {
        return None;
    }
    let rest = &words[lock + 1..];
    let asks_help = rest.iter().any(|w| matches!(*w, "-h" | "--help"));
    (!rest.contains(&"--") && !asks_help).then(|| {
        Failure::usage(
            "put `--` between KEY and the command: lease lock [OPTIONS] KEY -- CMD [ARGS…] \
             (see lease lock --help)",
        )
    })
}
