//! Runs schedules of the simulation: one, to replay a failure exactly, or a sweep of many.
//!
//! ```text
//! cargo run -p lease-sim --release -- run consul --seed 42 [--history]
//! cargo run -p lease-sim --release -- sweep etcd [--from 0] [--count 100000] [--jobs 2]
//! ```
//!
//! A sweep prints each failing seed with its replay command, then one `RESULT` line; it exits 1
//! if any schedule failed or any seed run twice gave two histories.
//!
//! `LEASE_SIM_LOG` (a `tracing` filter, e.g. `lease_etcd=debug`) makes `run` print the library's
//! own logs to stderr, each timed in seconds of simulated time, as the history is.

use std::process::ExitCode;

use lease_sim::run;
use lease_sim::schedule::Schedule;
use lease_sim::sweep;

fn usage() -> ExitCode {
    eprintln!(
        "usage: lease-sim run <consul|etcd> --seed N [--history]\n       \
         lease-sim sweep <consul|etcd> [--from N] [--count N] [--jobs N] [--twice-every N]"
    );
    ExitCode::from(64)
}

fn flag(args: &[String], name: &str) -> Option<u64> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

/// Times each log line in simulated seconds since the process began (the runtime's clock is
/// paused and advanced by the simulation; `tokio::time::Instant` reads it).
struct Simulated(tokio::time::Instant);

impl tracing_subscriber::fmt::time::FormatTime for Simulated {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let at = tokio::time::Instant::now().saturating_duration_since(self.0);
        write!(w, "{:.6}", at.as_secs_f64())
    }
}

fn log_where_asked() {
    if let Some(filter) = std::env::var_os("LEASE_SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter.to_string_lossy()))
            .with_timer(Simulated(tokio::time::Instant::now()))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
}

fn main() -> ExitCode {
    log_where_asked();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(command), Some(backend)) = (args.first(), args.get(1)) else {
        return usage();
    };
    let Some(model) = lease_sim::model_for(backend) else {
        eprintln!("no model of {backend:?}: the backends are consul and etcd");
        return usage();
    };
    match command.as_str() {
        "run" => {
            let Some(seed) = flag(&args, "--seed") else {
                return usage();
            };
            let schedule = Schedule::draw(seed);
            println!("{schedule}");
            let outcome = run::run(&schedule, &model);
            if args.iter().any(|a| a == "--history") {
                print!("{}", outcome.history);
            }
            println!(
                "simulated {:.1} s, {} lines, {} segments, history hash {:016x}, recovered after {:?}",
                outcome.simulated.as_secs_f64(),
                outcome.lines,
                outcome.segments,
                outcome.hash,
                outcome.recovered_after
            );
            for violation in &outcome.violations {
                println!("VIOLATION {violation}");
            }
            if outcome.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        "sweep" => {
            let from = flag(&args, "--from").unwrap_or(0);
            let count = flag(&args, "--count").unwrap_or(1000);
            let jobs = flag(&args, "--jobs").map_or_else(
                || std::thread::available_parallelism().map_or(1, usize::from),
                |j| j as usize,
            );
            let twice_every = flag(&args, "--twice-every").unwrap_or(100);
            let report = sweep::sweep(model, from, count, jobs, twice_every);
            print!("{}", report.problems(backend));
            println!("{}", report.result_line(backend));
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        _ => usage(),
    }
}
