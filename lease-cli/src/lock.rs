//! `lease lock`: acquire, run the command with its fencing token, and stop it on loss.
//!
//! The order of events is the point of the tool:
//!
//! 1. acquire (printing who holds the lease while waiting); a signal while waiting gives up;
//! 2. start the command in its own process group, with `LEASE_SEQUENCER`, `LEASE_KEY`,
//!    `LEASE_HOLDER` and the backend a flag gave (so `lease check` inside it reaches it);
//! 3. race its exit against the lease's loss and against signals to `lease` (forwarded);
//! 4. on loss, SIGTERM the group and SIGKILL it after the grace. The spec's fence lead is the
//!    grace, so the loss is declared (at the latest) a grace before the server could free the
//!    lease: the group is gone before anyone else can hold it;
//!    A forwarded SIGINT or SIGTERM gives the command the grace too: its group is killed
//!    (SIGKILL) if it still runs a grace later;
//! 5. on exit, stop what is left of its group (a background child), release at once (no
//!    lock-delay for the next holder) and exit with its code.

use std::cell::RefCell;
use std::convert::Infallible;
use std::time::Duration;

use lease_consul::Consul;
use lease_core::{Backend, Error, LeaseSpec, Target, Wait};
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::backend::Chosen;
use crate::child::{self, Spawn};
use crate::cli::LockArgs;
use crate::exit::{self, Failure};

/// How often the holders of a Consul semaphore are read again while waiting for a slot.
const SEMAPHORE_REREAD: Duration = Duration::from_secs(1);

/// How long an acquire may take before `lease` says on stderr whom it is waiting for.
const QUIET_WAIT: Duration = Duration::from_millis(500);

pub(crate) async fn run(args: LockArgs) -> Result<u8, Failure> {
    if args.command.is_empty() {
        return Err(Failure::usage(
            "no command after `--`: lease lock [OPTIONS] KEY -- CMD [ARGS…]",
        ));
    }
    let grace = args.grace();
    let chosen = Chosen::from_args(&args.backend, grace)?;
    let spec = spec(&args, &chosen)?;
    let mut signals = Signals::new()?;
    let backend = chosen.backend();

    // 1. Acquire, saying whom we wait for if it takes a while.
    let holder = RefCell::new(None);
    let acquired = {
        // Boxed, so it is `Unpin`: dropping it cancels the acquire (cancel safe).
        let mut acquire = backend.acquire(&spec);
        let report = async {
            tokio::time::sleep(QUIET_WAIT).await;
            let consul = match &chosen {
                Chosen::Consul(consul) => Some(consul),
                Chosen::Amqp(_) | Chosen::Etcd(_) | Chosen::Postgres(_) | Chosen::Redis(_) => None,
            };
            report_waiting(&*backend, consul, &spec, &holder).await
        };
        tokio::select! {
            biased;
            result = &mut acquire => result,
            signal = signals.recv() => {
                drop(acquire);
                backend.shutdown().await;
                eprintln!("lease: {signal} while waiting for {}; the command was not started", spec.key());
                return Ok(128 + signal as u8);
            }
            never = report => match never {},
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(error) => {
            backend.shutdown().await;
            let mut failure = Failure::from_error(&error);
            if let (Error::Busy { waited, .. }, Some(holder)) = (&error, holder.borrow().as_ref()) {
                failure.message = format!(
                    "{}: {holder}; gave up after {waited:?} (-try); the command was not started",
                    spec.key()
                );
            } else if failure.code == exit::BACKEND {
                failure.message.push_str("; the command was not started");
            }
            return Err(failure);
        }
    };

    // 2. Start the command.
    let sequencer = lease.sequencer().clone();
    let mut env = vec![
        ("LEASE_SEQUENCER", sequencer.to_string()),
        ("LEASE_KEY", spec.key().to_owned()),
        ("LEASE_HOLDER", sequencer.holder().to_owned()),
    ];
    env.extend(crate::backend::child_env(&args.backend, &chosen));
    let started = Spawn {
        command: &args.command,
        shell: args.shell,
        pass_stdin: args.pass_stdin,
        env,
    }
    .start();
    let mut guarded = match started {
        Ok(guarded) => guarded,
        Err(failure) => {
            let _ = lease.release().await;
            backend.shutdown().await;
            return Err(failure);
        }
    };

    // 3. Wait for its exit, the loss of the lease, or a signal to forward.
    let lost = lease.lost();
    tokio::pin!(lost);
    // A forwarded SIGINT or SIGTERM asks the command to stop: it has the grace to do so.
    let mut kill_at: Option<Instant> = None;
    let exited = loop {
        let grace_over = async {
            match kill_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            status = guarded.wait() => break Ok(status),
            reason = &mut lost => break Err(reason),
            signal = signals.recv() => {
                guarded.signal(signal);
                if asks_to_stop(signal) && kill_at.is_none() {
                    kill_at = Some(Instant::now() + grace);
                }
            }
            () = grace_over => {
                eprintln!(
                    "lease: the command's group still runs {grace:?} (--grace) after the \
                     forwarded signal; killing it (SIGKILL)"
                );
                guarded.signal(Signal::SIGKILL);
                kill_at = None;
            }
        }
    };
    match exited {
        // 5. Release at once, then pass the command's code on.
        Ok(status) => {
            let status = status.map_err(|e| {
                Failure::new(
                    exit::BACKEND,
                    format_args!("cannot wait for the command: {e}"),
                )
            })?;
            // Nothing the command started may outlive the lease: a background child left in
            // its group is stopped before the release lets the next holder in.
            if guarded.clear_rest(grace).await {
                eprintln!(
                    "lease: the command exited and left processes running in its group; they \
                     were stopped (SIGTERM, SIGKILL after {grace:?}) before the release"
                );
            }
            match lease.release().await {
                Ok(()) => {}
                Err(Error::Lost(reason)) => eprintln!(
                    "lease: the lease on {} was lost ({reason}) as the command exited",
                    spec.key()
                ),
                Err(error) => eprintln!(
                    "lease: releasing {}: {}",
                    spec.key(),
                    crate::exit::in_cli_terms(&error.to_string())
                ),
            }
            leave_nothing_behind(&chosen, &spec).await;
            backend.shutdown().await;
            Ok(child::exit_code(status))
        }
        // 4. Stop the command before anyone else can hold the lease.
        Err(reason) => {
            eprintln!(
                "lease: lost {}: {reason}; stopping the command (SIGTERM, SIGKILL after {:?})",
                spec.key(),
                grace
            );
            let status = guarded.stop(grace).await;
            drop(lease);
            backend.shutdown().await;
            let how = match status {
                Ok(status) => format!("{status}"),
                Err(e) => format!("not known ({e})"),
            };
            Err(Failure::new(
                exit::LOST,
                format_args!(
                    "the command was stopped after the lease was lost; it ended with {how}"
                ),
            ))
        }
    }
}

/// Removes a released semaphore's `.lock` if nobody else holds it, as `consul lock -n` does after
/// its child exits; a `.lock` someone holds or waits on is left alone, and failing to remove it
/// is harmless (it holds nothing).
///
/// A leader lock's key stays, unlike `consul lock`'s: Consul's LockIndex rises only while the key
/// lives (a deleted and re-created key starts again at 1), and a database fence
/// (`lease-postgres`) that has seen this run's index would refuse every later run's smaller
/// one. The released key is empty of holders and costs one KV entry. On etcd the release removed
/// the contender key: nothing is left.
async fn leave_nothing_behind(chosen: &Chosen, spec: &LeaseSpec) {
    let Chosen::Consul(consul) = chosen else {
        return;
    };
    if let Target::Semaphore { prefix, .. } = spec.target() {
        let _ = consul.destroy_semaphore(prefix).await;
    }
}

/// The spec the flags describe, validated (bad values are bad usage: nothing is started).
fn spec(args: &LockArgs, chosen: &Chosen) -> Result<LeaseSpec, Failure> {
    let wait = match args.try_for.or(args.timeout) {
        None => Wait::Forever,
        Some(Duration::ZERO) => Wait::Never,
        Some(wait) => Wait::UpTo(wait),
    };
    let name = args.name.clone().unwrap_or_else(|| {
        let mut name = format!("lease lock {}: {}", args.key, args.command.join(" "));
        if let Some((cut, _)) = name.char_indices().nth(120) {
            name.truncate(cut);
        }
        name
    });
    let spec = chosen
        .spec(&args.key, args.limit)?
        .wait(wait)
        .ttl(args.ttl)
        .lock_delay(args.lock_delay)
        .value(args.value.clone().unwrap_or_else(default_value))
        .session_name(name)
        .fence_lead(args.grace());
    match spec.validate() {
        Ok(()) => Ok(spec),
        Err(Error::InvalidFenceLead { lead, ttl }) => Err(Failure::usage(format_args!(
            "--grace {lead:?} is too long for --ttl {ttl:?}: the lease would be given up between \
             two healthy renewals; use a --ttl of at least 2.5 times the grace"
        ))),
        Err(Error::InvalidTtl { ttl }) => Err(Failure::usage(format_args!(
            "--ttl {ttl:?}: use whole seconds from 10s to 24h"
        ))),
        Err(Error::InvalidLockDelay { lock_delay }) => Err(Failure::usage(format_args!(
            "--lock-delay {lock_delay:?}: use at most 60s"
        ))),
        Err(error) => Err(Failure::from_error(&error)),
    }
}

/// `<host> pid <pid>`: whom those waiting are told holds the lease.
fn default_value() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host} pid {}", std::process::id())
}

/// Prints one line on stderr naming the current holder, and another whenever it changes.
/// Remembers the last description in `last`, for the busy message. Never completes (its output
/// type says so, for the `select!` that races it with the acquire).
async fn report_waiting(
    backend: &dyn Backend,
    consul: Option<&Consul>,
    spec: &LeaseSpec,
    last: &RefCell<Option<String>>,
) -> Infallible {
    let key = spec.key();
    let ours = spec.advertised_value();
    let say = |description: String| {
        if last.borrow().as_ref() != Some(&description) {
            eprintln!("lease: waiting for {key}: {description}");
            *last.borrow_mut() = Some(description);
        }
    };
    match spec.target() {
        Target::Leader { .. } => match backend.observe_leader(key).await {
            Ok(mut observer) => loop {
                match observer.leader() {
                    // On etcd our own contender key leads the queue for a moment while we settle
                    // after a holder left: not someone to wait for.
                    Some(leader) if leader.value.as_slice() == ours => {}
                    Some(leader) => {
                        let (index, holder) =
                            crate::status::holder_terms(leader.sequencer.backend());
                        say(format!(
                            "held by {} ({} {}, {} {})",
                            leader
                                .value_str()
                                .filter(|v| !v.is_empty())
                                .unwrap_or("an unnamed holder"),
                            holder.1,
                            leader.sequencer.holder(),
                            index.1,
                            leader.sequencer.index()
                        ));
                    }
                    None => say("free (its last holder has just left)".to_owned()),
                }
                if observer.changed().await.is_err() {
                    break;
                }
            },
            // RabbitMQ does not name holders.
            Err(error) if error.kind() == lease_core::ErrorKind::Unsupported => {
                say("held elsewhere".to_owned());
            }
            // The backend cannot be read (unreachable, say): the acquire reports that itself.
            Err(_) => {}
        },
        Target::Semaphore { limit, .. } => match consul {
            // The holders are read again whenever the wait goes on: a semaphore has no single
            // key to watch, and a line per change is all an operator needs.
            Some(consul) => loop {
                match consul.semaphore_state(key).await {
                    Ok(state) => {
                        let holders: Vec<String> = state
                            .holders
                            .iter()
                            .map(|h| {
                                let value = String::from_utf8_lossy(&h.value);
                                if value.is_empty() {
                                    format!("session {}", h.session)
                                } else {
                                    format!("{value} (session {})", h.session)
                                }
                            })
                            .collect();
                        say(format!(
                            "{} of {limit} slots held, by {}",
                            holders.len(),
                            holders.join(", ")
                        ));
                    }
                    Err(_) => say(format!("all {limit} slots are held")),
                }
                tokio::time::sleep(SEMAPHORE_REREAD).await;
            },
            None => say(format!("all {limit} slots are held elsewhere")),
        },
        _ => say("held elsewhere".to_owned()),
    }
    std::future::pending().await
}

/// Whether a forwarded `signal` asks the command to stop, so that its group is killed if it
/// still runs a grace later. SIGHUP is only passed on: many programs read it as "reload".
fn asks_to_stop(signal: Signal) -> bool {
    matches!(signal, Signal::SIGINT | Signal::SIGTERM)
}

/// SIGINT, SIGTERM and SIGHUP to `lease`: given up on while waiting, forwarded to the command
/// once it runs.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, Failure> {
        let listen = |kind| {
            signal(kind).map_err(|e| {
                Failure::new(
                    exit::BACKEND,
                    format_args!("cannot listen for signals: {e}"),
                )
            })
        };
        Ok(Signals {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
            hangup: listen(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            biased;
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
        }
    }
}
