-- lease-postgres: the fence, fencing tokens that PostgreSQL itself enforces.
--
-- Installs the schema lease_fence with
--   - the table lease_fence.fences: per lease key, the highest sequencer index whose transaction
--     passed the fence, its holder, when it was first recorded and when it last passed;
--   - the function lease_fence.fence(key text, generation bigint, index bigint, holder text),
--     to be called inside the transaction that writes the data the lease protects, before that
--     transaction reads or writes it. It records (generation, index), or raises SQLSTATE LF001
--     (stale) or LF002 (the index reused by another holder), which rolls the caller's whole
--     transaction back. lease_fence.fence(key, index, holder) is the same with generation 0
--     (the earlier form, kept for its callers);
--   - the function lease_fence.advance(key text, generation bigint, index bigint, holder text),
--     to be called by a new holder as soon as it has acquired the lease, in a transaction of its
--     own: the fence then refuses every older holder's fenced transaction from that moment on,
--     not only from the new holder's first write. It waits for an older holder's fenced
--     transaction that is open, and raises LF001 or LF002 as fence() does.
--
-- Generation and index
--   A sequencer is ordered by (generation, index), compared as a pair. The generation is 0 for
--   every backend but Consul, whose leader sequencers carry the key's CreateIndex (a raft index,
--   higher every time the key is deleted and re-created, while its LockIndex restarts at 1).
--
-- Running this file
--   Run it once per database, as a role that may create a schema there. It is idempotent: running
--   it again changes nothing but the function's definition (replaced by this version's). It holds
--   no BEGIN or COMMIT, so a migration tool may run it inside its own transaction (sqlx, refinery
--   and diesel migrations do). Run as one transaction (a migration tool, lease-postgres's
--   install(), `psql --single-transaction -f fence.sql`), it is atomic, and concurrent runs are
--   serialised by the transaction-scoped advisory lock taken first (key 7810756276993877605,
--   'lease_fe' in ASCII); a run that finds everything in place leaves it as it was. Run statement
--   by statement (plain `psql -f`), each statement commits alone: still idempotent, but two such
--   runs at the very same moment may fail with a unique violation in the catalog; run it again.
--
-- Privileges
--   The function runs with its caller's privileges (SECURITY INVOKER). A role that fences needs
--     GRANT USAGE ON SCHEMA lease_fence TO app;
--     GRANT SELECT, INSERT, UPDATE ON lease_fence.fences TO app;
--   (EXECUTE on the function is granted to PUBLIC, as for every new function.)
--
-- What lease_fence.fence(key, index, holder) guarantees
--   Call a transaction "fenced on key" once its call lease_fence.fence(key, ...) has returned.
--   1. Fenced transactions on one key run one at a time, from the fence call to their commit or
--      rollback: the call locks the key's row (FOR NO KEY UPDATE, then an UPDATE of it) and the
--      lock is held until the transaction ends. A second call for the key waits for it.
--   2. The index is compared with the latest committed record, never with an uncommitted one: a
--      call that waited re-reads the row once the lock is free (READ COMMITTED), or fails with
--      SQLSTATE 40001, serialization_failure, if the row changed after its snapshot was taken
--      (REPEATABLE READ, SERIALIZABLE). A rolled-back transaction leaves no trace in the record.
--   3. index > recorded: recorded (index, holder, recorded_at). index = recorded and the same
--      holder: passes (the same acquisition's next transaction); fenced_at is updated, so two
--      transactions of one holder are serialised too. index = recorded and another holder:
--      raises LF002 (two acquisitions claim one index, so neither can be told the newer; the
--      recorded holder keeps the key). index < recorded: raises LF001 (stale).
--   4. The first call for a key inserts its row; two first calls at once: one inserts, the other
--      waits on the unique index and then judges the committed row as in 2 (or inserts, if the
--      first rolled back).
--   Together: among committed transactions fenced on one key, commit order follows index order,
--   and once a transaction with index n has committed, no transaction with an index below n
--   that calls the fence afterwards can commit.
--
--   With holders Old (index m) and New (index n > m) of one lease key:
--   - New committed a fenced transaction, then Old calls the fence (Old was paused between its
--     lease check and its write): Old's call raises LF001 and Old's transaction rolls back.
--   - New has called the fence, not yet committed, when Old calls it: Old waits. New commits:
--     Old raises LF001 (READ COMMITTED) or 40001 (REPEATABLE READ, SERIALIZABLE; a retry then
--     raises LF001). New rolls back: Old passes; nothing of New's is in the database.
--   - Old has called the fence, not yet committed, when New calls it: New waits until Old's
--     transaction ends. Old may commit: it is then ordered before New, whose call passes once
--     Old is done (READ COMMITTED) or fails with 40001 and is retried (REPEATABLE READ,
--     SERIALIZABLE). So the case "New commits after Old called the fence, and then Old commits"
--     cannot occur: the fence orders writes by index; it does not bound their time. A holder
--     frozen after its fence call holds New back as long as its transaction lives: set
--     idle_in_transaction_session_timeout (and statement_timeout) below the lease TTL for the
--     sessions that fence, and the server ends such a transaction, rolling it back.
--
-- What it does not do
--   - It protects only writes made in transactions fenced on the key. A statement run outside
--     (autocommit, another transaction) is not fenced; a fence call in a transaction of its own
--     protects nothing.
--   - It trusts (generation, index) to rise with every acquisition of the key. Consul's does
--     when the key is re-created (its CreateIndex rises), except for holders built before sequencers
--     had a generation (generation 0). A new etcd cluster restarts its revisions; a new
--     memory store its indexes; `consul lock` (Consul's own) has no sequencer. Every new holder
--     is then refused with LF001 until an operator, once no holder of the old indexes can still
--     write, deletes the key's record:
--       DELETE FROM lease_fence.fences WHERE lease_key = '...';

DO $install$
BEGIN
    -- Serialises concurrent installs that each run as one transaction (see above).
    PERFORM pg_catalog.pg_advisory_xact_lock(7810756276993877605);
END
$install$;

CREATE SCHEMA IF NOT EXISTS lease_fence;

COMMENT ON SCHEMA lease_fence IS
    'lease-postgres: fencing tokens enforced by PostgreSQL (lease_fence.fence)';

CREATE TABLE IF NOT EXISTS lease_fence.fences (
    lease_key   text        PRIMARY KEY,
    lease_index bigint      NOT NULL CHECK (lease_index >= 0),
    holder      text        NOT NULL,
    recorded_at timestamptz NOT NULL,
    fenced_at   timestamptz NOT NULL
);

-- Added with the generation: the fences of an earlier install have generation 0, as their sequencers had.
ALTER TABLE lease_fence.fences
    ADD COLUMN IF NOT EXISTS lease_generation bigint NOT NULL DEFAULT 0
        CHECK (lease_generation >= 0);

COMMENT ON TABLE lease_fence.fences IS
    'Per lease key, the highest sequencer index whose transaction passed lease_fence.fence';
COMMENT ON COLUMN lease_fence.fences.lease_index IS
    'The highest index recorded for the key (the sequencer''s index: Consul''s LockIndex, etcd''s create revision)';
COMMENT ON COLUMN lease_fence.fences.holder IS
    'The holder of that index (Consul session, etcd lease)';
COMMENT ON COLUMN lease_fence.fences.lease_generation IS
    'The generation recorded with the index (Consul: the key''s CreateIndex; 0 for other backends): (generation, index) orders the holders';
COMMENT ON COLUMN lease_fence.fences.recorded_at IS
    'When the index was first recorded: the holder''s advance at acquisition, or its first fenced transaction';
COMMENT ON COLUMN lease_fence.fences.fenced_at IS
    'When a transaction of this holder last passed the fence';

CREATE OR REPLACE FUNCTION lease_fence.fence(key text, generation bigint, index bigint, holder text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fence$
DECLARE
    recorded lease_fence.fences%ROWTYPE;
    stamp timestamptz;
BEGIN
    IF fence.key IS NULL OR fence.generation IS NULL OR fence.index IS NULL OR fence.holder IS NULL THEN
        RAISE EXCEPTION 'lease_fence.fence: key, generation, index and holder must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF fence.key = '' OR fence.holder = '' OR fence.index < 0 OR fence.generation < 0 THEN
        RAISE EXCEPTION 'lease_fence.fence: the key and the holder must not be empty, and the generation and index must not be negative'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    LOOP
        -- The row lock serialises the fenced transactions of this key until each ends. After a
        -- wait, READ COMMITTED reads the row's latest committed version; REPEATABLE READ and
        -- SERIALIZABLE raise 40001 if it changed after this transaction's snapshot.
        SELECT f.* INTO recorded
        FROM lease_fence.fences AS f
        WHERE f.lease_key = fence.key
        FOR NO KEY UPDATE;
        EXIT WHEN FOUND;

        -- The key's first call. A concurrent first call that inserted the key makes this one
        -- wait for it: committed, nothing is inserted here and the loop locks and judges its
        -- row (REPEATABLE READ and SERIALIZABLE raise 40001 instead); rolled back, this one
        -- inserts.
        stamp := clock_timestamp();
        INSERT INTO lease_fence.fences AS f
            (lease_key, lease_generation, lease_index, holder, recorded_at, fenced_at)
        VALUES (fence.key, fence.generation, fence.index, fence.holder, stamp, stamp)
        ON CONFLICT (lease_key) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;

    -- When this transaction passed the fence: after any wait for the lock.
    stamp := clock_timestamp();
    IF (fence.generation, fence.index) > (recorded.lease_generation, recorded.lease_index) THEN
        UPDATE lease_fence.fences AS f
        SET lease_generation = fence.generation,
            lease_index = fence.index,
            holder = fence.holder,
            recorded_at = stamp,
            fenced_at = stamp
        WHERE f.lease_key = fence.key;
    ELSIF (fence.generation, fence.index) = (recorded.lease_generation, recorded.lease_index)
            AND fence.holder = recorded.holder THEN
        -- Written even though the index is unchanged, so that a concurrent REPEATABLE READ or
        -- SERIALIZABLE transaction of this key cannot pass on a snapshot taken before this one
        -- committed (a lock alone would not make it fail).
        UPDATE lease_fence.fences AS f
        SET fenced_at = stamp
        WHERE f.lease_key = fence.key;
    ELSIF (fence.generation, fence.index) = (recorded.lease_generation, recorded.lease_index) THEN
        RAISE EXCEPTION 'lease fence: index % of lease key % is already recorded for another holder',
                fence.index, pg_catalog.quote_literal(fence.key)
            USING ERRCODE = 'LF002',
                DETAIL = pg_catalog.format(
                    'recorded index %s, holder %L, recorded at %s, generation %s; refused holder %L',
                    recorded.lease_index, recorded.holder, recorded.recorded_at,
                    recorded.lease_generation, fence.holder),
                HINT = 'Two acquisitions claim the same index, so neither can be told the newer; '
                    'the recorded holder keeps the key. Roll back and stop this work. Was the '
                    'lease key deleted and re-created, restarting its index?',
                SCHEMA = 'lease_fence',
                TABLE = 'fences';
    ELSE
        RAISE EXCEPTION 'lease fence: stale holder of lease key %: index %.% is below the recorded index %.%',
                pg_catalog.quote_literal(fence.key), fence.generation, fence.index,
                recorded.lease_generation, recorded.lease_index
            USING ERRCODE = 'LF001',
                DETAIL = pg_catalog.format(
                    'recorded index %s, holder %L, recorded at %s, generation %s; refused holder %L',
                    recorded.lease_index, recorded.holder, recorded.recorded_at,
                    recorded.lease_generation, fence.holder),
                HINT = 'A newer holder of this lease has acquired it or written: this holder lost the lease. '
                    'Roll back and stop this work; do not retry it under this lease.',
                SCHEMA = 'lease_fence',
                TABLE = 'fences';
    END IF;
END
$fence$;

COMMENT ON FUNCTION lease_fence.fence(text, bigint, bigint, text) IS
    'Call inside the transaction that writes the protected data: records the sequencer''s '
    '(generation, index) for the lease key, or raises LF001 (stale: a newer one is recorded) or '
    'LF002 (this one is recorded for another holder), rolling the transaction back';

-- The earlier form, from before sequencers had a generation.
CREATE OR REPLACE FUNCTION lease_fence.fence(key text, index bigint, holder text)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fence3$
    SELECT lease_fence.fence(key, 0::bigint, index, holder);
$fence3$;

COMMENT ON FUNCTION lease_fence.fence(text, bigint, text) IS
    'lease_fence.fence(key, 0, index, holder): the earlier form';

-- Registers a new holder with the fence at its acquisition. Call it alone, in a transaction of
-- its own, as soon as the lease is acquired (before anything else of the new holder runs): once
-- it has returned (and committed), every fenced transaction of an older holder of the key is
-- refused (LF001), whether or not the new holder ever writes. It waits for an older holder's
-- fenced transaction that is open on the key (so that one may still commit, ordered before the
-- acquisition). It raises LF001 if a newer holder has already advanced, LF002 if another holder
-- claims the same (generation, index).
CREATE OR REPLACE FUNCTION lease_fence.advance(key text, generation bigint, index bigint, holder text)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $advance$
    SELECT lease_fence.fence(key, generation, index, holder);
$advance$;

COMMENT ON FUNCTION lease_fence.advance(text, bigint, bigint, text) IS
    'Call when the lease is acquired, in a transaction of its own: records the new holder''s '
    '(generation, index), so that every older holder''s fenced transaction is refused from then on';
