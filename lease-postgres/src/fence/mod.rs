//! Fencing tokens that PostgreSQL enforces, inside the transaction that writes the protected data.
//!
//! # How to use it
//!
//! 1. Install the fence once per database: [`FENCE_SQL`] (the file `sql/fence.sql` of this
//!    package) as a migration of yours, or `install` from `fence::tokio_postgres` or
//!    `fence::sqlx`. It creates the schema `lease_fence`: the table `lease_fence.fences` and the
//!    functions `lease_fence.fence(key, generation, index, holder)` and
//!    `lease_fence.advance(key, generation, index, holder)`.
//! 2. Register every new holder with the fence **when it acquires the lease**: acquire through
//!    [`AdvanceOnAcquire`] (`fence::tokio_postgres::advance_on_acquire(backend, client)`,
//!    `fence::sqlx::advance_on_acquire(backend, pool)`), which runs [`ADVANCE_CALL`] before
//!    `acquire` returns, for campaigns, guards and macros alike; or call `advance` yourself
//!    right after acquiring. Leases on PostgreSQL itself (`Postgres`, feature `backend`) do it
//!    in the acquiring transaction with `PostgresBuilder::advance_fence(true)`.
//! 3. In every transaction that writes data the lease protects, call the fence first, with the
//!    lease's [`Sequencer`]: `fence::tokio_postgres::fence(&tx, lease.sequencer())`,
//!    `fence::sqlx::fence(&mut tx, lease.sequencer())`, or from any other client
//!    [`FENCE_CALL`] with the parameters of a [`Token`].
//! 4. A holder whose lease has been taken over, and whose successor has acquired it through the
//!    fence (step 2) or committed a fenced transaction, gets [`Error::Stale`]: its transaction is
//!    aborted, so nothing it wrote in it is committed. Roll back and stop the work; retrying
//!    under the same lease fails the same way.
//!
//! # What each variant refuses, and from when
//!
//! | variant | an older holder's fenced transaction is refused from |
//! | --- | --- |
//! | `fence` alone (no advance) | the newer holder's first committed fenced transaction: between the newer holder's acquisition and its first write, the older one still commits |
//! | `fence` + [`AdvanceOnAcquire`] / `advance` | the newer holder's acquisition (`acquire` returns after the advance has committed): nothing older commits after it |
//! | `fence` + `PostgresBuilder::advance_fence(true)` (leases on the same database) | the commit that inserted the newer holder's row: acquisition and advance are one transaction |
//! | `fence_held` (leases on the same database) | the moment the holder's row is no longer live (expired by the database's clock, released, deleted), whatever the next holder does; and while the call's transaction is open, no one else can acquire |
//!
//! An advance waits for an older holder's fenced transaction that is already open on the key
//! (that one may still commit, ordered before the acquisition), exactly as a newer holder's
//! fence call does; the time such a transaction may stay open is bounded by
//! `idle_in_transaction_session_timeout` (below).
//!
//! Call the fence before the transaction reads the protected data, not only before it writes:
//! from the moment the call returns, every earlier holder's fenced transaction on the key has
//! ended, so what the transaction reads after it includes their writes (under READ COMMITTED for
//! each later statement; under REPEATABLE READ and SERIALIZABLE the call fails with SQLSTATE
//! 40001 if its snapshot predates one of them, and the transaction is retried as usual).
//!
//! # What the fence guarantees
//!
//! Call a transaction *fenced on a key* once its call `lease_fence.fence(key, …)` has returned.
//!
//! - Fenced transactions on one key run one at a time, from the fence call until they commit or
//!   roll back: the call takes the key's row lock, held until the transaction ends.
//! - The index is compared with the latest *committed* record: a call that waited for the lock
//!   re-reads the row (READ COMMITTED) or fails with 40001 if the row changed after its snapshot
//!   (REPEATABLE READ, SERIALIZABLE). A rolled-back transaction leaves no trace.
//! - Holders are ordered by `(generation, index)` ([`Sequencer::order`]; the generation is
//!   Consul's key `CreateIndex`, 0 elsewhere). A higher one is recorded; the same one from the
//!   same holder passes (its next transaction); the same one from another holder is refused
//!   ([`INDEX_REUSED_SQLSTATE`]: two acquisitions claim one index, so neither can be told the
//!   newer, and the recorded holder keeps the key); a lower one is refused ([`STALE_SQLSTATE`]).
//!   A Consul sequencer written before sequencers had a generation has generation 0, so it orders below every
//!   sequencer with one: during an upgrade, upgrade every holder before a new one records.
//! - Two first calls for a key at once: one inserts the key's row, the other waits on the unique
//!   index and then judges the committed row (or inserts, if the first rolled back).
//!
//! Together: among the committed transactions fenced on one key, commit order follows index
//! order, and once a transaction with index *n* has committed, no transaction with an index below
//! *n* that calls the fence afterwards can commit. With an older holder Old and a newer one New:
//!
//! | interleaving | outcome |
//! | --- | --- |
//! | New committed a fenced transaction, then Old calls the fence (Old was paused between its lease check and its write) | Old: [`Error::Stale`], rolled back |
//! | New called the fence and has not committed when Old calls it | Old waits. New commits: Old gets [`Error::Stale`] (READ COMMITTED) or 40001, whose retry gets [`Error::Stale`] (REPEATABLE READ, SERIALIZABLE). New rolls back: Old passes |
//! | Old called the fence and has not committed when New calls it | New waits until Old's transaction ends; Old may commit, ordered before New, and New then passes (or gets 40001 and is retried) |
//!
//! The last row is why "New commits after Old called the fence, and then Old commits" cannot
//! happen: New's call waits for Old. The fence orders writes by index; it does not bound their
//! time. A holder frozen *after* its fence call holds New back for as long as its transaction
//! lives, so set `idle_in_transaction_session_timeout` (and `statement_timeout`) below the lease
//! TTL on the sessions that fence: the server then ends a frozen holder's transaction, rolling it
//! back, and New goes on. New may set `lock_timeout` to give up waiting instead.
//!
//! # What it does not do
//!
//! - It fences only transactions that call it, on the same key (the sequencer's key). A write
//!   outside them is not protected, and a fence call in a transaction of its own protects
//!   nothing: the helpers take a transaction for that reason.
//! - It needs an index that rises with every acquisition of the key: [`Token::new`] refuses
//!   RabbitMQ's slot numbers and semaphores' sequencers (each holder of a semaphore has a key of
//!   its own, so its holders never meet at one fence).
//! - It trusts `(generation, index)` not to restart. Consul's LockIndex restarts at 1 when the
//!   key is deleted and re-created, but its CreateIndex (the generation) rises, so the new
//!   holders pass and the old ones are refused. A new etcd cluster restarts its revisions; a new
//!   memory store its indexes. Every new holder is then refused as stale until an operator, once
//!   no holder of the old indexes can still write, deletes the key's record:
//!   `DELETE FROM lease_fence.fences WHERE lease_key = '…'`.
//!
//! # Privileges and installing
//!
//! The function runs with its caller's privileges. A role that fences needs `USAGE` on the schema
//! `lease_fence` and `SELECT, INSERT, UPDATE` on `lease_fence.fences`; installing needs `CREATE`
//! on the database. [`FENCE_SQL`] is idempotent and has no `BEGIN`/`COMMIT` of its own, so a
//! migration tool can run it in its transaction; run as one transaction (as `install` and
//! migration tools do, or `psql --single-transaction`), it is atomic and concurrent installs are
//! serialised by an advisory lock. Its header comment says the same in SQL terms.

use lease_core::{BackendKind, BoxError, Sequencer};

mod on_acquire;
#[cfg(feature = "sqlx")]
pub mod sqlx;
#[cfg(feature = "tokio-postgres")]
pub mod tokio_postgres;

/// The migration that installs the fence: the schema `lease_fence`, its table `fences` and its
/// function `fence(key text, index bigint, holder text)`. Plain SQL, idempotent, without
/// `BEGIN`/`COMMIT`; the file `sql/fence.sql` of this package.
pub const FENCE_SQL: &str = include_str!("../../sql/fence.sql");

pub use on_acquire::AdvanceOnAcquire;

/// The statement that fences the current transaction, for clients without a helper here: bind
/// [`Token::key`] (text), [`Token::generation`] (bigint), [`Token::index`] (bigint) and
/// [`Token::holder`] (text).
pub const FENCE_CALL: &str = "SELECT lease_fence.fence($1, $2, $3, $4)";

/// The statement a new holder runs as soon as it has acquired the lease, alone in a transaction
/// of its own (autocommit), so that the fence refuses every older holder from then on: bind the
/// same parameters as [`FENCE_CALL`]. [`AdvanceOnAcquire`] runs it for you.
pub const ADVANCE_CALL: &str = "SELECT lease_fence.advance($1, $2, $3, $4)";

/// The statement that fences the current transaction with a PostgreSQL lease's row
/// (`fence_held` in `fence::tokio_postgres` and `fence::sqlx`), for leases of the backend
/// `Postgres` in the schema `lease` of the same database: bind [`Token::holder`] (text) and
/// [`Token::index`] (bigint) of [`Token::held`]. For another schema, write its name in place of
/// `lease`. Raises [`STALE_SQLSTATE`] unless the holder's row is live, and locks it against
/// removal until the transaction ends.
pub const FENCE_HELD_CALL: &str = "SELECT lease.fence_held($1, $2)";

/// The SQLSTATE of a stale holder: an index below the recorded one ([`Error::Stale`]).
pub const STALE_SQLSTATE: &str = "LF001";

/// The SQLSTATE of an index already recorded for another holder ([`Error::IndexReused`]).
pub const INDEX_REUSED_SQLSTATE: &str = "LF002";

/// SQLSTATEs of a call to a fence that is not there: the schema (`invalid_schema_name`), the
/// function with this signature (`undefined_function`) or the table (`undefined_table`).
const NOT_INSTALLED_SQLSTATES: [&str; 3] = ["3F000", "42883", "42P01"];

/// The parameters of a fence call, taken from a [`Sequencer`] whose index rises with every
/// acquisition of its key.
///
/// # Examples
///
/// ```
/// use lease_core::{BackendKind, Sequencer};
/// use lease_postgres::fence::Token;
///
/// let seq = Sequencer::new(BackendKind::Consul, "jobs/billing", 12, "4ca8e74b-6350-7587-addf-a18084928f3c");
/// let token = Token::new(&seq)?;
/// assert_eq!((token.key(), token.index()), ("jobs/billing", 12));
///
/// // RabbitMQ's index is a slot number: it does not rise, so it cannot fence.
/// let slot = Sequencer::new(BackendKind::Amqp, "jobs", 0, "jobs.holder.0#1f");
/// assert!(Token::new(&slot).is_err());
/// # Ok::<(), lease_postgres::fence::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Token<'a> {
    key: &'a str,
    generation: i64,
    index: i64,
    holder: &'a str,
}

impl<'a> Token<'a> {
    /// The fencing parameters of `sequencer`, or [`Error::Unsupported`] for a sequencer whose
    /// index does not order the holders of its key:
    ///
    /// - accepted: Consul (the key's CreateIndex as the generation, then its LockIndex), etcd
    ///   (the holder key's create revision, which rises across the cluster), PostgreSQL (the
    ///   database's lease sequence, drawn for every acquisition), Redis (the name's fencing
    ///   token, drawn by the acquire script above the name's last one) and memory (the key's
    ///   LockIndex in its store) leader leases;
    /// - refused: RabbitMQ (the index is a slot number, reused by every holder of the slot),
    ///   semaphores of any backend (the key is the holder's own contender key, `<prefix>/<holder>`,
    ///   so no two holders share a fence), a backend this version does not know, and an index
    ///   above `i64::MAX` (PostgreSQL's `bigint`).
    pub fn new(sequencer: &'a Sequencer) -> Result<Token<'a>, Error> {
        let refuse = |reason| {
            Err(Error::Unsupported {
                sequencer: sequencer.clone(),
                reason,
            })
        };
        match sequencer.backend() {
            BackendKind::Consul
            | BackendKind::Etcd
            | BackendKind::Memory
            | BackendKind::Postgres
            | BackendKind::Redis => {}
            BackendKind::Amqp => {
                return refuse(
                    "RabbitMQ's index is the slot number, which every holder of the slot reuses, \
                     so it cannot tell an older holder from a newer one; fence with a Consul, \
                     etcd or memory lease",
                );
            }
            _ => {
                return refuse(
                    "this version of lease-postgres does not know whether this backend's index \
                     rises with every acquisition of a key",
                );
            }
        }
        if is_semaphore_holder(sequencer) {
            return refuse(
                "a semaphore holder's key is its own contender key (<prefix>/<holder>), so the \
                 holders of one semaphore never meet at one fence; fence with a leader lease",
            );
        }
        let (Ok(generation), Ok(index)) = (
            i64::try_from(sequencer.generation()),
            i64::try_from(sequencer.index()),
        ) else {
            return refuse("the index or generation is above PostgreSQL's bigint range (i64::MAX)");
        };
        Ok(Token {
            key: sequencer.key(),
            generation,
            index,
            holder: sequencer.holder(),
        })
    }

    /// The parameters of [`FENCE_HELD_CALL`] for `sequencer`: any PostgreSQL lease (a leader or
    /// a semaphore holder, whose row is found by its holder ID), or [`Error::Unsupported`] for a
    /// sequencer of another backend.
    pub fn held(sequencer: &'a Sequencer) -> Result<Token<'a>, Error> {
        let refuse = |reason| {
            Err(Error::Unsupported {
                sequencer: sequencer.clone(),
                reason,
            })
        };
        if sequencer.backend() != BackendKind::Postgres {
            return refuse(
                "only a PostgreSQL lease (lease_postgres::Postgres) has a row to check; fence                  with fence() and advance() instead",
            );
        }
        let Ok(index) = i64::try_from(sequencer.index()) else {
            return refuse("the index is above PostgreSQL's bigint range (i64::MAX)");
        };
        Ok(Token {
            key: sequencer.key(),
            generation: 0,
            index,
            holder: sequencer.holder(),
        })
    }

    /// The lease key: the fence's key (`$1` of [`FENCE_CALL`]).
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The sequencer's [generation](Sequencer::generation) as PostgreSQL's `bigint` (`$2`):
    /// Consul's key `CreateIndex`, 0 for other backends. The fence orders holders by
    /// `(generation, index)`.
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// The sequencer's index as PostgreSQL's `bigint` (`$3`).
    pub fn index(&self) -> i64 {
        self.index
    }

    /// The holder that acquired the lease: Consul's session, etcd's lease (`$4`).
    pub fn holder(&self) -> &'a str {
        self.holder
    }
}

impl<'a> TryFrom<&'a Sequencer> for Token<'a> {
    type Error = Error;

    fn try_from(sequencer: &'a Sequencer) -> Result<Self, Self::Error> {
        Token::new(sequencer)
    }
}

/// Whether `sequencer` is a semaphore holder's: its key is `<prefix>/<holder>`, as every backend
/// here names a semaphore's contender keys (and as lease-core tells them apart from leader keys).
fn is_semaphore_holder(sequencer: &Sequencer) -> bool {
    sequencer
        .key()
        .strip_suffix(sequencer.holder())
        .is_some_and(|prefix| prefix.ends_with('/'))
}

/// Why fencing a transaction, or installing the fence, failed. Each variant says what to do.
///
/// The database client's error is the [`source`](std::error::Error::source): downcast it to
/// `tokio_postgres::Error` or `sqlx::Error` for its details. [`Error::sqlstate`] gives the
/// SQLSTATE, for instance to retry a transaction that failed with 40001
/// (`serialization_failure`) under REPEATABLE READ or SERIALIZABLE.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The sequencer's index does not order the holders of its key (see [`Token::new`]); no
    /// database was asked.
    #[error("cannot fence with sequencer {sequencer}: {reason}")]
    Unsupported {
        /// The sequencer refused.
        sequencer: Sequencer,
        /// Why.
        reason: &'static str,
    },

    /// The fence refused a stale holder: a newer holder of the lease has committed a fenced
    /// transaction. This transaction is aborted and nothing it wrote will be committed; roll back
    /// and stop the work, whose lease is gone.
    #[error(
        "the fence refused a stale holder of {key:?}: its index {index} is below the recorded \
         index {}; a newer holder has written, so this one lost the lease: roll back and stop the \
         work, do not retry it under this lease",
        recorded_text(.recorded)
    )]
    Stale {
        /// The lease key.
        key: String,
        /// This holder's index.
        index: u64,
        /// The index the fence had recorded, as the database's error detail gave it.
        recorded: Option<u64>,
        /// The database's error.
        #[source]
        source: BoxError,
    },

    /// The fence already recorded this index for another holder: two acquisitions claim one
    /// index, which happens when the lease key was deleted and re-created (Consul's LockIndex
    /// restarts). This transaction is aborted; roll back and stop the work.
    #[error(
        "the fence refused holder {holder:?} of {key:?}: index {index} is recorded for another \
         holder, so neither can be told the newer (was the lease key deleted and re-created, \
         restarting its index?): roll back and stop the work"
    )]
    IndexReused {
        /// The lease key.
        key: String,
        /// The index both claim.
        index: u64,
        /// This (refused) holder.
        holder: String,
        /// The database's error.
        #[source]
        source: BoxError,
    },

    /// The fence is not installed in this database (or not this version of it).
    #[error(
        "the lease fence is not installed in this database: run lease_postgres's install() once, \
         or apply lease-postgres's sql/fence.sql (fence::FENCE_SQL) as a migration"
    )]
    NotInstalled {
        /// The SQLSTATE the database answered.
        sqlstate: String,
        /// The database's error.
        #[source]
        source: BoxError,
    },

    /// Installing the fence failed.
    #[error(
        "installing the lease fence failed: the role needs CREATE on the database (for the schema \
         lease_fence), or an owner can run lease-postgres's sql/fence.sql once"
    )]
    Install {
        /// The SQLSTATE the database answered, if it answered.
        sqlstate: Option<String>,
        /// The database's error.
        #[source]
        source: BoxError,
    },

    /// The fence call failed for another reason: the connection, the transaction (already
    /// aborted, or a serialization failure to retry: SQLSTATE 40001), or privileges (the role
    /// needs USAGE on schema lease_fence and SELECT, INSERT, UPDATE on lease_fence.fences).
    #[error("the fence call for {key:?} failed; the transaction cannot commit")]
    Database {
        /// The lease key.
        key: String,
        /// The SQLSTATE the database answered, if it answered.
        sqlstate: Option<String>,
        /// The database's error.
        #[source]
        source: BoxError,
    },
}

fn recorded_text(recorded: &Option<u64>) -> String {
    match recorded {
        Some(index) => index.to_string(),
        None => "(not given)".to_owned(),
    }
}

impl Error {
    /// The SQLSTATE of the database's answer, if the database answered: [`STALE_SQLSTATE`],
    /// [`INDEX_REUSED_SQLSTATE`], `40001` (retry the transaction), `42501` (privileges)...
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Unsupported { .. } => None,
            Error::Stale { .. } => Some(STALE_SQLSTATE),
            Error::IndexReused { .. } => Some(INDEX_REUSED_SQLSTATE),
            Error::NotInstalled { sqlstate, .. } => Some(sqlstate),
            Error::Install { sqlstate, .. } | Error::Database { sqlstate, .. } => {
                sqlstate.as_deref()
            }
        }
    }

    /// Whether this holder was refused by the fence ([`Error::Stale`] or
    /// [`Error::IndexReused`]): its lease is gone, and retrying under it fails the same way.
    pub fn is_refused(&self) -> bool {
        matches!(self, Error::Stale { .. } | Error::IndexReused { .. })
    }

    /// The error for a failed fence call of `token`, from what the database answered: its
    /// SQLSTATE and its error's detail (DETAIL), where it answered. The helpers here use it; a
    /// client without one (diesel, postgres, …) can too, to report its failed [`FENCE_CALL`] as
    /// they do.
    ///
    /// ```
    /// use lease_core::{BackendKind, Sequencer};
    /// use lease_postgres::fence::{Error, Token};
    ///
    /// let seq = Sequencer::new(BackendKind::Consul, "jobs/billing", 5, "4ca8e74b");
    /// let token = Token::new(&seq)?;
    /// // What the database answered to `SELECT lease_fence.fence($1, $2, $3)`:
    /// let detail = "recorded index 7, holder 'f1e2', recorded at 2026-01-01 00:00:00+00";
    /// let err = Error::from_fence_call(token, Some("LF001"), Some(detail), "the client's error".into());
    /// assert!(matches!(err, Error::Stale { index: 5, recorded: Some(7), .. }));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn from_fence_call(
        token: Token<'_>,
        sqlstate: Option<&str>,
        detail: Option<&str>,
        source: BoxError,
    ) -> Error {
        let key = token.key.to_owned();
        // `Token` holds an index from a `u64`, so it is never negative.
        let index = u64::try_from(token.index).unwrap_or_default();
        match sqlstate {
            Some(STALE_SQLSTATE) => Error::Stale {
                key,
                index,
                recorded: detail.and_then(recorded_index),
                source,
            },
            Some(INDEX_REUSED_SQLSTATE) => Error::IndexReused {
                key,
                index,
                holder: token.holder.to_owned(),
                source,
            },
            Some(code) if NOT_INSTALLED_SQLSTATES.contains(&code) => Error::NotInstalled {
                sqlstate: code.to_owned(),
                source,
            },
            _ => Error::Database {
                key,
                sqlstate: sqlstate.map(str::to_owned),
                source,
            },
        }
    }

    /// The error for a failed install.
    #[cfg(any(feature = "tokio-postgres", feature = "sqlx"))]
    pub(crate) fn from_install(sqlstate: Option<&str>, source: BoxError) -> Error {
        Error::Install {
            sqlstate: sqlstate.map(str::to_owned),
            source,
        }
    }
}

/// The recorded index from the detail the fence raises with: `recorded index <n>, holder …`.
fn recorded_index(detail: &str) -> Option<u64> {
    let rest = detail.strip_prefix("recorded index ")?;
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_leader_sequencers_of_rising_indexes() {
        for backend in [
            BackendKind::Consul,
            BackendKind::Etcd,
            BackendKind::Postgres,
            BackendKind::Redis,
            BackendKind::Memory,
        ] {
            let seq = Sequencer::new(backend, "jobs/billing", 7, "s-1");
            let token = Token::new(&seq).unwrap();
            assert_eq!(
                (token.key(), token.index(), token.holder()),
                ("jobs/billing", 7, "s-1")
            );
        }
    }

    #[test]
    fn refuses_what_cannot_order_holders() {
        let refused = [
            Sequencer::new(BackendKind::Amqp, "jobs", 0, "jobs.holder.0#00ff"),
            // A semaphore's contender key, on every backend that has semaphores.
            Sequencer::new(
                BackendKind::Consul,
                "semaphores/reports/sess-1",
                3,
                "sess-1",
            ),
            Sequencer::new(BackendKind::Etcd, "semaphores/reports/694d7", 90, "694d7"),
            Sequencer::new(BackendKind::Memory, "semaphores/reports/s-2", 1, "s-2"),
            Sequencer::new(BackendKind::Postgres, "semaphores/reports/9f3a", 12, "9f3a"),
            Sequencer::new(BackendKind::Redis, "semaphores/reports/9f3a", 12, "9f3a"),
            Sequencer::new(BackendKind::Consul, "jobs/billing", u64::MAX, "sess-1"),
        ];
        for seq in refused {
            match Token::new(&seq) {
                Err(err @ Error::Unsupported { .. }) => {
                    assert!(err.to_string().contains(&seq.to_string()), "{err}");
                    assert_eq!(err.sqlstate(), None);
                }
                other => panic!("{seq} gave {other:?}"),
            }
        }
        let amqp = Sequencer::new(BackendKind::Amqp, "jobs", 0, "jobs.holder.0#00ff");
        assert!(
            Token::new(&amqp)
                .unwrap_err()
                .to_string()
                .contains("slot number")
        );
        // A key that merely ends like its holder, without a '/' before it, is a leader key.
        let leader = Sequencer::new(BackendKind::Consul, "jobs-s1", 1, "s1");
        assert!(Token::new(&leader).is_ok());
    }

    #[test]
    fn reads_the_recorded_index_from_the_detail() {
        assert_eq!(
            recorded_index("recorded index 12, holder 'b', recorded at 2026-01-01"),
            Some(12)
        );
        assert_eq!(recorded_index("recorded index x"), None);
        assert_eq!(recorded_index("something else"), None);
        assert_eq!(
            recorded_index("recorded index 99999999999999999999999"),
            None
        );
    }

    #[test]
    fn classifies_database_answers() {
        let seq = Sequencer::new(BackendKind::Consul, "k", 3, "h");
        let token = Token::new(&seq).unwrap();
        let source = || -> BoxError { "db error".into() };
        let stale = Error::from_fence_call(
            token,
            Some("LF001"),
            Some("recorded index 9, holder 'x'"),
            source(),
        );
        assert!(
            matches!(
                stale,
                Error::Stale {
                    index: 3,
                    recorded: Some(9),
                    ..
                }
            ),
            "{stale:?}"
        );
        assert!(stale.is_refused());
        assert!(stale.to_string().contains("recorded index 9"), "{stale}");
        let reused = Error::from_fence_call(token, Some("LF002"), None, source());
        assert!(matches!(reused, Error::IndexReused { index: 3, .. }));
        for code in ["3F000", "42883", "42P01"] {
            let err = Error::from_fence_call(token, Some(code), None, source());
            assert!(matches!(err, Error::NotInstalled { .. }), "{code}: {err:?}");
            assert_eq!(err.sqlstate(), Some(code));
        }
        let other = Error::from_fence_call(token, Some("40001"), None, source());
        assert!(matches!(other, Error::Database { .. }));
        assert_eq!(other.sqlstate(), Some("40001"));
        assert!(!other.is_refused());
        let closed = Error::from_fence_call(token, None, None, source());
        assert_eq!(closed.sqlstate(), None);
    }
}
