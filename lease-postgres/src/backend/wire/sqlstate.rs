//! Which of the server's errors a retry can cure: the backend's table of SQLSTATE codes.
//!
//! A campaign retries exactly the transient errors (`Error::is_transient`), so a code judged
//! permanent here ends every campaign that meets it. Only what no retry can cure belongs there:
//! a permission, SQL the server does not understand, a state only an operator's change ends.
//! What a restart, a failover, an operator's `pg_terminate_backend` or
//! `ALTER DATABASE … ALLOW_CONNECTIONS false`, or a full server answers is transient: the
//! SQLSTATE classes 08 (connection), 40 (rollbacks), 53 (too many connections, disk full), 57
//! (`pg_terminate_backend`, shutdown, "starting up", "in recovery"), and 55P03, 25006 (a
//! standby, as in a failover), 58000/58030 (I/O); and 55000 when connecting
//! (`ALLOW_CONNECTIONS false`). Everything else (permissions, a missing database or schema) is
//! permanent and ends a campaign. The unit test is the table.
//!
//! Answered while connecting, a transient code means the database cannot be used now (starting
//! up, shutting down, closed to connections, out of connection slots): that answer counts as
//! unreachable, as a refused TCP connection does, so `reachability()` and readiness say that
//! this node cannot lead. (The database once refused connections for minutes while every node
//! reported itself reachable and ready, and every campaign had ended on SQLSTATE 55000.) So
//! readiness turns 503 while the campaign keeps retrying
//! (`postgres_lease::a_campaign_rides_out_a_database_that_refuses_connections`; with processes,
//! `process_edges::a_database_that_refused_connections_has_a_leader_again_…`).

/// When the server answered with a code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Opening a connection (the startup exchange): the database was not used yet.
    Connecting,
    /// A statement on an open connection.
    Statement,
}

/// What a code means for the request it answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No retry can cure it.
    Permanent,
    /// A retry may succeed; the server is there and answering statements.
    Transient,
    /// A retry may succeed, and until then the database cannot be used: unreachable.
    Unusable,
}

/// The verdict on SQLSTATE `code`, answered at `stage`.
///
/// Transient: connection exceptions (class 08), transaction rollbacks (40: serialization
/// failures, deadlocks), insufficient resources (53: too many connections 53300, disk full,
/// out of memory), operator intervention (57: `pg_terminate_backend` and shutdowns 57P01,
/// crashes of another backend 57P02, "the database system is starting up / shutting down / in
/// recovery" 57P03, a cancelled statement 57014), a lock not available (55P03), a read-only
/// transaction (25006: a standby, as while a failover is under way), a failed I/O of the
/// server (58000, 58030), and, while connecting, 55000 ("database … is not currently accepting
/// connections"). Everything else is permanent.
pub(crate) fn judge(code: &str, stage: Stage) -> Verdict {
    let class = code.get(..2).unwrap_or(code);
    let transient = matches!(class, "08" | "40" | "53" | "57")
        || matches!(code, "55P03" | "25006" | "58000" | "58030")
        || (stage == Stage::Connecting && code == "55000");
    match (transient, stage) {
        (false, _) => Verdict::Permanent,
        (true, Stage::Connecting) => Verdict::Unusable,
        (true, Stage::Statement) => Verdict::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes a server restart, a failover, an operator or a full server answers, what else
    /// a client meets, and their verdicts at each stage.
    #[test]
    fn every_code_a_retry_can_cure_is_transient_and_unusable_while_connecting() {
        use Verdict::{Permanent, Transient, Unusable};
        // (code, what answers it, verdict while connecting, verdict of a statement)
        let table = [
            ("55000", "ALLOW_CONNECTIONS false", Unusable, Permanent),
            (
                "57P01",
                "pg_terminate_backend, fast shutdown",
                Unusable,
                Transient,
            ),
            ("57P02", "another backend crashed", Unusable, Transient),
            (
                "57P03",
                "starting up / shutting down / in recovery",
                Unusable,
                Transient,
            ),
            ("57P05", "idle session timeout", Unusable, Transient),
            ("57014", "statement cancelled", Unusable, Transient),
            ("53300", "too many connections", Unusable, Transient),
            ("53100", "disk full", Unusable, Transient),
            ("53200", "out of memory", Unusable, Transient),
            ("08006", "connection failure", Unusable, Transient),
            (
                "08001",
                "cannot establish a connection",
                Unusable,
                Transient,
            ),
            ("08004", "connection rejected", Unusable, Transient),
            ("40001", "serialization failure", Unusable, Transient),
            ("40P01", "deadlock", Unusable, Transient),
            ("55P03", "lock not available", Unusable, Transient),
            (
                "25006",
                "read-only transaction on a standby",
                Unusable,
                Transient,
            ),
            ("58030", "I/O error", Unusable, Transient),
            ("28P01", "wrong password", Permanent, Permanent),
            ("28000", "no pg_hba.conf entry", Permanent, Permanent),
            ("42501", "insufficient privilege", Permanent, Permanent),
            ("3D000", "no such database", Permanent, Permanent),
            (
                "42P01",
                "no such table (the schema is not installed)",
                Permanent,
                Permanent,
            ),
            ("42883", "no such function", Permanent, Permanent),
            ("22023", "invalid parameter value", Permanent, Permanent),
            ("55006", "object in use", Permanent, Permanent),
            ("XX000", "internal error", Permanent, Permanent),
            ("", "no code", Permanent, Permanent),
        ];
        for (code, what, connecting, statement) in table {
            assert_eq!(
                judge(code, Stage::Connecting),
                connecting,
                "{code} ({what}) while connecting"
            );
            assert_eq!(
                judge(code, Stage::Statement),
                statement,
                "{code} ({what}) in a statement"
            );
        }
    }
}
