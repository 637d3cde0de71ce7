-- lease-postgres: the lease backend's tables and functions (lease_postgres::Postgres).
--
-- Installs the schema "lease" (Postgres::builder().schema(..) installs the same text with every
-- "lease." prefix renamed) with
--   - the sequence lease.lease_index: one value per acquisition, the sequencer's index, rising
--     across every key of the database;
--   - the table lease.leases: one row per held lease (a leader key's holder, or one holder of a
--     semaphore), live while expires_at is ahead of the database's clock (now()); an expired row
--     is free, and the next contender for its key deletes it;
--   - the table lease.bars: a key (or a semaphore slot) that nobody may take until "until",
--     written when a live row is deleted without a release (an operator's DELETE), so that its
--     holder, which learns of it a few milliseconds later, stops before anyone else starts;
--   - lease.try_acquire(..), lease.try_acquire_many(..), lease.release(key, holder),
--     lease.release_many(holders): one statement each; acquisitions are serialised per key by a
--     transaction-scoped advisory lock;
--   - lease.fence_held(holder, index): a fence for data in the same database, called first in
--     a transaction that writes data a lease protects: raises LF001 unless the holder's row is
--     live by the database's clock, and locks the row (FOR KEY SHARE) against removal until the
--     transaction ends, so nobody else acquires the key meanwhile;
--   - the trigger lease.announce on lease.leases, which NOTIFYs the channel "lease_leases"
--     (schema name + "_leases") on every insert and delete, with the payload
--     "<op>:<holder>:<key>": op a (acquired), r (released by its holder), x (expired, removed by
--     a contender), d (deleted by anyone else: its holder has lost it).
--
-- Running this file
--   Idempotent, with no BEGIN or COMMIT: a migration tool may run it in its own transaction.
--   Run as one transaction (Postgres does so on first use unless told not to install;
--   `psql --single-transaction -f lease.sql`), it is atomic, and concurrent runs are serialised
--   by the advisory lock taken first (key 7810756276994188147, 'lease_ls' in ASCII). Needs
--   PostgreSQL 11 or later.
--
-- Privileges
--   A role that takes leases needs USAGE on the schema, SELECT, INSERT, UPDATE, DELETE on both
--   tables and USAGE on the sequence; installing needs CREATE on the database.

SELECT pg_advisory_xact_lock(7810756276994188147);

CREATE SCHEMA IF NOT EXISTS lease;

CREATE SEQUENCE IF NOT EXISTS lease.lease_index AS bigint;

CREATE TABLE IF NOT EXISTS lease.leases (
    lease_key   text        NOT NULL,
    holder      text        NOT NULL,
    lease_index bigint      NOT NULL,
    semaphore   boolean     NOT NULL,
    lease_limit integer     NOT NULL CHECK (lease_limit >= 1),
    ttl         interval    NOT NULL,
    expires_at  timestamptz NOT NULL,
    -- How long the key (or slot) stays barred after the row is deleted under its holder.
    settle      interval    NOT NULL,
    value       bytea       NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    -- The session that acquired it, for operators (pg_stat_activity.pid).
    backend_pid integer,
    PRIMARY KEY (lease_key, holder)
);

-- Renewal finds its rows by holder alone.
CREATE UNIQUE INDEX IF NOT EXISTS leases_holder ON lease.leases (holder);

CREATE TABLE IF NOT EXISTS lease.bars (
    lease_key text        NOT NULL,
    holder    text        NOT NULL,
    until     timestamptz NOT NULL,
    PRIMARY KEY (lease_key, holder)
);

CREATE OR REPLACE FUNCTION lease.announce() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    op text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_leases', 'a:' || NEW.holder || ':' || NEW.lease_key);
        RETURN NULL;
    END IF;
    IF current_setting('lease_postgres.releasing', true) IN (OLD.holder, '*') THEN
        op := 'r';
    ELSIF OLD.expires_at <= now() THEN
        op := 'x';
    ELSE
        op := 'd';
        -- From the deletion, not from the start of a transaction that may have begun long before.
        INSERT INTO lease.bars (lease_key, holder, until)
        VALUES (OLD.lease_key, OLD.holder, clock_timestamp() + OLD.settle)
        ON CONFLICT (lease_key, holder) DO UPDATE SET until = EXCLUDED.until;
    END IF;
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_leases', op || ':' || OLD.holder || ':' || OLD.lease_key);
    RETURN NULL;
END
$$;

-- Created once: replacing it on every run would lock the table each time a process starts.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'announce' AND tgrelid = 'lease.leases'::regclass) THEN
        CREATE TRIGGER announce AFTER INSERT OR DELETE ON lease.leases
            FOR EACH ROW EXECUTE FUNCTION lease.announce();
    END IF;
END
$$;

-- One attempt to acquire p_key for p_holder: a leader (p_semaphore false, p_limit 1) or one of
-- p_limit holders of a semaphore. outcome is
--   acquired (lease_index set; in_use the holders now, this one included),
--   busy (in_use the slots taken, live rows and bars; wait_seconds how long until the first of them
--   expires, by the database's clock),
--   leader_in_the_way / semaphore_in_the_way (the other kind of lock holds the key),
--   limit_mismatch (in_use is the limit the holders agreed on).
-- A retry with the same holder after a lost answer finds its own row: acquired, its expiry
-- counted from the retry.
CREATE OR REPLACE FUNCTION lease.try_acquire(
    p_key text, p_holder text, p_semaphore boolean, p_limit integer, p_ttl interval,
    p_settle interval, p_value bytea,
    OUT outcome text, OUT lease_index bigint, OUT in_use integer, OUT wait_seconds double precision)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := now();
    v_kind boolean;
    v_until timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(1818584421, hashtext(p_key));
    -- A retry after a lost answer: the row was inserted then; its expiry counts from this
    -- attempt, which the holder's fence counts from.
    UPDATE lease.leases l SET expires_at = v_now + p_ttl
        WHERE l.lease_key = p_key AND l.holder = p_holder AND l.expires_at > v_now
        RETURNING l.lease_index INTO lease_index;
    IF FOUND THEN
        outcome := 'acquired';
        RETURN;
    END IF;
    DELETE FROM lease.leases l WHERE l.lease_key = p_key AND l.expires_at <= v_now;
    DELETE FROM lease.bars b WHERE b.lease_key = p_key AND b.until <= v_now;
    SELECT l.semaphore INTO v_kind
        FROM lease.leases l WHERE l.lease_key = p_key AND l.semaphore <> p_semaphore LIMIT 1;
    IF FOUND THEN
        outcome := CASE WHEN p_semaphore THEN 'leader_in_the_way' ELSE 'semaphore_in_the_way' END;
        RETURN;
    END IF;
    IF p_semaphore THEN
        SELECT l.lease_limit INTO in_use
            FROM lease.leases l WHERE l.lease_key = p_key AND l.lease_limit <> p_limit LIMIT 1;
        IF FOUND THEN
            outcome := 'limit_mismatch';
            RETURN;
        END IF;
    END IF;
    SELECT count(*), min(t.until) INTO in_use, v_until FROM (
        SELECT l.expires_at AS until FROM lease.leases l WHERE l.lease_key = p_key
        UNION ALL
        SELECT b.until FROM lease.bars b WHERE b.lease_key = p_key
    ) t;
    IF in_use < p_limit THEN
        INSERT INTO lease.leases AS l (lease_key, holder, lease_index, semaphore, lease_limit,
                                       ttl, expires_at, settle, value, backend_pid)
        VALUES (p_key, p_holder, nextval('lease.lease_index'), p_semaphore, p_limit, p_ttl,
                v_now + p_ttl, p_settle, p_value, pg_backend_pid())
        RETURNING l.lease_index INTO lease_index;
        -- PostgresBuilder::advance_fence(true): the new leader is registered with the fence
        -- (sql/fence.sql, installed in this database) in the transaction that acquires, so
        -- from its commit every older holder's fenced transaction on the key is refused.
        IF NOT p_semaphore
           AND current_setting('lease_postgres.advance_fence', true) = 'on' THEN
            PERFORM lease_fence.advance(p_key, 0::bigint, lease_index, p_holder);
        END IF;
        outcome := 'acquired';
        in_use := in_use + 1;
        RETURN;
    END IF;
    outcome := 'busy';
    wait_seconds := greatest(extract(epoch FROM v_until - clock_timestamp()), 0);
END
$$;

-- Several attempts in one statement (and one commit), as lease.try_acquire for each: the
-- attempts of one process at one moment. Keys are locked in one order (hashtext, then the key),
-- so two batches never wait for each other in a cycle; the locks are held to the end of the
-- batch.
CREATE OR REPLACE FUNCTION lease.try_acquire_many(
    p_keys text[], p_holders text[], p_semaphores boolean[], p_limits integer[],
    p_ttls double precision[], p_settles double precision[], p_values bytea[])
RETURNS TABLE (holder text, outcome text, lease_index bigint, in_use integer,
               wait_seconds double precision)
LANGUAGE plpgsql AS $$
DECLARE
    i bigint;
    r record;
BEGIN
    FOR i IN
        SELECT o.n FROM unnest(p_keys) WITH ORDINALITY AS o(k, n) ORDER BY hashtext(o.k), o.k, o.n
    LOOP
        SELECT * INTO r FROM lease.try_acquire(
            p_keys[i], p_holders[i], p_semaphores[i], p_limits[i],
            make_interval(secs => p_ttls[i]), make_interval(secs => p_settles[i]), p_values[i]);
        holder := p_holders[i];
        outcome := r.outcome;
        lease_index := r.lease_index;
        in_use := r.in_use;
        wait_seconds := r.wait_seconds;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Gives a lease back: deletes its row, announced as a release (op r), so that waiters take it
-- at once. True if the row was there.
CREATE OR REPLACE FUNCTION lease.release(p_key text, p_holder text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lease_postgres.releasing', p_holder, true);
    DELETE FROM lease.leases l WHERE l.lease_key = p_key AND l.holder = p_holder;
    RETURN FOUND;
END
$$;

-- Gives many leases back in one statement (and one commit): lease.release for each of p_holders.
-- Returns the holders whose rows were there.
CREATE OR REPLACE FUNCTION lease.release_many(p_holders text[]) RETURNS SETOF text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lease_postgres.releasing', '*', true);
    RETURN QUERY DELETE FROM lease.leases l WHERE l.holder = ANY(p_holders) RETURNING l.holder;
END
$$;

-- A fence for data in this database: call it first in a transaction that writes data the lease
-- of (p_holder, p_index) protects. Raises LF001 unless the holder's row is live now (by the
-- database's clock: clock_timestamp(), not the transaction's start), and locks the row FOR KEY
-- SHARE: renewals go on, but nothing removes the row (a contender taking over an expired row, a
-- release, an operator's DELETE) until this transaction ends. So a holder whose lease has run
-- out is refused whatever the next holder has done, and no one acquires the key while this
-- transaction is open.
CREATE OR REPLACE FUNCTION lease.fence_held(p_holder text, p_index bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_key     text;
    v_expires timestamptz;
BEGIN
    SELECT l.lease_key, l.expires_at INTO v_key, v_expires
        FROM lease.leases l WHERE l.holder = p_holder AND l.lease_index = p_index
        FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease fence: holder % (index %) holds no lease: released, taken over or deleted',
                pg_catalog.quote_literal(p_holder), p_index
            USING ERRCODE = 'LF001',
                HINT = 'This holder lost the lease. Roll back and stop this work; do not retry it under this lease.';
    END IF;
    IF v_expires <= clock_timestamp() THEN
        RAISE EXCEPTION 'lease fence: the lease % of holder % (index %) expired at %',
                pg_catalog.quote_literal(v_key), pg_catalog.quote_literal(p_holder), p_index, v_expires
            USING ERRCODE = 'LF001',
                HINT = 'This holder lost the lease. Roll back and stop this work; do not retry it under this lease.';
    END IF;
END
$$;
