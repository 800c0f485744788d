-- Schema 3 as cronlock ran it up to 77cdcec, its trigger of `cronlock rules 3` (tick and
-- success records, no permits); the upgrade test starts from it
-- (tests/integration/test_store_permits.py).
DO $move$
DECLARE
    on_path name[] := pg_catalog.current_schemas(false);
    old_schema name;
    moved text := 'cronlock locks moved to cronlock.locks (schema 3, docs/UPGRADING.md)';
BEGIN
    -- From here to the transaction's end, names resolve in pg_catalog alone (then pg_temp).
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    IF to_regnamespace('cronlock') IS NULL THEN
        CREATE SCHEMA cronlock;
    END IF;
    -- Tables of schema 1 or 2 on the caller's search path move here with their rows,
    -- fences and sequence. A view takes their place, and one is here too (for a role
    -- named cronlock, whose "$user" is this schema), so a sidecar of schema 2 fails
    -- (its ALTER TABLE of a view) rather than create new tables beside the moved ones.
    SELECT p.nspname INTO old_schema
      FROM unnest(on_path) WITH ORDINALITY AS p(nspname, i)
      JOIN pg_class c ON c.relnamespace = to_regnamespace(quote_ident(p.nspname))
     WHERE c.relname = 'cronlock_locks' AND c.relkind = 'r'
     ORDER BY p.i LIMIT 1;
    IF old_schema IS NULL AND to_regclass('cronlock.locks') IS NULL THEN
        SELECT n.nspname INTO old_schema
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relname = 'cronlock_locks' AND c.relkind = 'r'
         ORDER BY n.nspname LIMIT 1;
        IF old_schema IS NOT NULL THEN  -- new tables would start the tokens again at 1
            RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state', MESSAGE =
                format('cronlock store: the locks of an earlier schema are in the schema %I, '
                       'not on this search path: run the schema with search_path = %I to '
                       'move them (docs/UPGRADING.md)', old_schema, old_schema);
        END IF;
    END IF;
    IF old_schema IS NOT NULL AND to_regclass('cronlock.locks') IS NULL THEN
        IF old_schema <> 'cronlock' THEN
            EXECUTE format('ALTER TABLE %I.cronlock_locks SET SCHEMA cronlock', old_schema);
            EXECUTE format('ALTER TABLE IF EXISTS %I.cronlock_fences SET SCHEMA cronlock',
                           old_schema);
            EXECUTE format('ALTER SEQUENCE IF EXISTS %I.cronlock_versions SET SCHEMA cronlock',
                           old_schema);
            EXECUTE format('CREATE VIEW %I.cronlock_locks AS SELECT NULL::text AS moved '
                           'WHERE false', old_schema);
            EXECUTE format('COMMENT ON VIEW %I.cronlock_locks IS %L', old_schema, moved);
        END IF;
        ALTER TABLE cronlock.cronlock_locks RENAME TO locks;
        ALTER TABLE IF EXISTS cronlock.cronlock_fences RENAME TO fences;
        ALTER SEQUENCE IF EXISTS cronlock.cronlock_versions RENAME TO versions;
        DROP TRIGGER IF EXISTS cronlock_keep_rules ON cronlock.locks;
        IF to_regclass('cronlock.fences') IS NOT NULL THEN
            DROP TRIGGER IF EXISTS cronlock_keep_fences ON cronlock.fences;
        END IF;
        EXECUTE format('DROP FUNCTION IF EXISTS %1$I.cronlock_keep_rules(), '
                       '%1$I.cronlock_keep_fences()', old_schema);
    END IF;
    IF to_regclass('cronlock.cronlock_locks') IS NULL THEN
        CREATE VIEW cronlock.cronlock_locks AS SELECT NULL::text AS moved WHERE false;
        EXECUTE format('COMMENT ON VIEW cronlock.cronlock_locks IS %L', moved);
    END IF;
END
$move$;
CREATE TABLE IF NOT EXISTS cronlock.locks (
    namespace        text        NOT NULL,
    name             text        NOT NULL,
    holder           text        NOT NULL DEFAULT '',
    transitions      bigint      NOT NULL,
    resource_version bigint      NOT NULL,
    document         jsonb       NOT NULL,
    writer_time      timestamptz NOT NULL,
    written_at       timestamptz NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE TABLE IF NOT EXISTS cronlock.fences (
    namespace text   NOT NULL,
    name      text   NOT NULL,
    value     bigint NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE SEQUENCE IF NOT EXISTS cronlock.versions;
ALTER TABLE cronlock.locks ADD COLUMN IF NOT EXISTS duration integer;
ALTER TABLE cronlock.locks ADD COLUMN IF NOT EXISTS renewed_at timestamptz;
ALTER TABLE cronlock.locks DROP CONSTRAINT IF EXISTS cronlock_duration;
ALTER TABLE cronlock.locks ADD CONSTRAINT cronlock_duration
    CHECK (duration BETWEEN 1 AND 86400);
-- A record `<tick> <job|-> <run> <holder> <cluster|->` (lock/ticks.py reads the same): its
-- tick, run and holder; all NULL for anything else (not a string, no such date).
CREATE OR REPLACE FUNCTION cronlock.tick_record(value jsonb, OUT at timestamptz,
    OUT run text, OUT holder text) LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp AS $record$
DECLARE
    fields text[];
    parts text[];
BEGIN
    IF pg_catalog.jsonb_typeof(value) IS DISTINCT FROM 'string' THEN
        RETURN;
    END IF;
    fields := pg_catalog.regexp_match(value #>> '{}',
        '^([!-~]{1,253}) ([!-~]{1,253}) ([!-~]{1,253}) ([!-~]{1,253}) ([!-~]{1,253})$');
    parts := pg_catalog.regexp_match(fields[1],
        '^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})Z$');
    BEGIN
        IF parts[4]::integer <= 23 AND parts[5]::integer <= 59 AND parts[6]::integer <= 59 THEN
            at := pg_catalog.make_timestamptz(parts[1]::integer, parts[2]::integer,
                parts[3]::integer, parts[4]::integer, parts[5]::integer,
                parts[6]::double precision, 'UTC');
            run := fields[3];
            holder := fields[4];
        END IF;
    EXCEPTION WHEN others THEN
        at := NULL;  -- no such date: not a record
    END;
END
$record$;
CREATE OR REPLACE FUNCTION cronlock.keep_rules() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $rules$
DECLARE
    spec jsonb := NEW.document -> 'spec';
    notes jsonb := NEW.document #> '{metadata,annotations}';
    now timestamptz := pg_catalog.clock_timestamp();
    holder text := coalesce(spec ->> 'holderIdentity', '');
    renewal timestamptz := now;
    old_holder text := '';
    old_duration integer := 0;
    old_renewed timestamptz := '-infinity';
    old_job text := '';
    fence bigint;
    -- Tick records (docs/STORES.md, "Tick records in a store"): how far ahead one may be.
    tick_ahead CONSTANT interval := '60 seconds';
    old_notes jsonb := '{}';
    claim boolean := holder <> '';
    tick_key text;
    claim_key text;
    mine record;
    theirs record;
BEGIN
    -- A document with no holder may have no duration (a freeze on a lock never taken).
    IF (holder <> '' OR coalesce(spec ? 'leaseDurationSeconds', false)) AND (
       pg_catalog.jsonb_typeof(spec -> 'leaseDurationSeconds') IS DISTINCT FROM 'number'
       OR (spec ->> 'leaseDurationSeconds')::numeric NOT BETWEEN 1 AND 86400
       OR (spec ->> 'leaseDurationSeconds')::numeric % 1 <> 0) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE =
            'cronlock store: leaseDurationSeconds must be a whole number from 1 to 86400';
    END IF;
    BEGIN  -- the write's renewal, dated by its distance from the writer's clock: never later
        renewal := now - greatest(NEW.writer_time - (spec ->> 'renewTime')::timestamptz,
                                  interval '0');
    EXCEPTION WHEN others THEN
        renewal := now;
    END;
    NEW.duration := (spec ->> 'leaseDurationSeconds')::numeric::integer;
    NEW.holder := holder;
    NEW.written_at := now;
    NEW.resource_version := pg_catalog.nextval('cronlock.versions'::regclass);
    IF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM cronlock.locks l
                    WHERE l.namespace = NEW.namespace AND l.name = NEW.name) THEN
            RETURN NULL;  -- a create where a lock is: no row, and no token spent on it
        END IF;
    ELSIF (NEW.namespace, NEW.name) IS DISTINCT FROM (OLD.namespace, OLD.name) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE =
            'cronlock store: a lock keeps its namespace and name';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        old_holder := coalesce(OLD.holder, '');
        old_duration := least(greatest(coalesce(OLD.duration, CASE
            WHEN pg_catalog.jsonb_typeof(OLD.document #> '{spec,leaseDurationSeconds}') = 'number'
            THEN least((OLD.document #>> '{spec,leaseDurationSeconds}')::numeric, 86400)::integer
            END, 0), 0), 86400);
        old_renewed := coalesce(OLD.renewed_at, OLD.written_at);
        IF old_renewed > now THEN
            old_renewed := '-infinity';  -- a time the database never wrote
        END IF;
        old_job := coalesce(OLD.document #>> '{metadata,annotations,cronlock.io/holder-job}', '');
        IF NOT (old_holder = '' OR holder = old_holder
                OR (holder = '' AND notes ->> 'cronlock.io/last-holder' = old_holder)
                OR now - old_renewed > pg_catalog.make_interval(secs => (CASE WHEN holder = ''
                    THEN old_duration ELSE least(old_duration, NEW.duration) END)::double precision)
                OR (old_job <> '' AND holder <> '' AND notes ->> 'cronlock.io/holder-job' = old_job
                    AND pg_catalog.starts_with(holder,
                                               pg_catalog."left"(old_job || '-', 58)))) THEN
            RAISE EXCEPTION USING ERRCODE = 'CLK01', MESSAGE = pg_catalog.format(
                'cronlock holder policy: the lock is held by %s, renewed %ss ago on the store''s '
                'clock for %ss; until it expires only its holder (or a later pod of its Job) may '
                'change it', old_holder,
                pg_catalog.round(extract(epoch FROM now - old_renewed)::numeric, 3), old_duration);
        END IF;
        -- A claim: a new holder, or a holder taking its own expired hold again.
        claim := holder <> '' AND (holder <> old_holder
                 OR now - old_renewed > pg_catalog.make_interval(
                     secs => least(old_duration, NEW.duration)::double precision));
        old_notes := OLD.document #> '{metadata,annotations}';
    END IF;
    -- Tick records: only a claim adds or changes one, naming its own holder, never ahead
    -- of this clock + tick_ahead, never back to an older tick or to the same tick of
    -- another run (unless the recorded one is ahead: nobody's); no write drops one.
    IF pg_catalog.jsonb_typeof(notes) IS DISTINCT FROM 'object' THEN
        notes := '{}';
    END IF;
    IF pg_catalog.jsonb_typeof(old_notes) IS DISTINCT FROM 'object' THEN
        old_notes := '{}';
    END IF;
    FOR tick_key IN SELECT pg_catalog.jsonb_object_keys(old_notes) LOOP
        IF pg_catalog.starts_with(tick_key, 'cronlock.io/tick.')
           AND pg_catalog.jsonb_typeof(old_notes -> tick_key) = 'string'
           AND pg_catalog.jsonb_typeof(notes -> tick_key) IS DISTINCT FROM 'string' THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: tick record %s: every write carries it (a claim may replace '
                'it, none drops it)', tick_key);
        END IF;
    END LOOP;
    FOR tick_key IN SELECT pg_catalog.jsonb_object_keys(notes) LOOP
        CONTINUE WHEN NOT pg_catalog.starts_with(tick_key, 'cronlock.io/tick.')
            OR pg_catalog.jsonb_typeof(notes -> tick_key) <> 'string'
            OR (notes -> tick_key) = (old_notes -> tick_key);
        IF NOT claim THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: tick record %s: only a claim (a new holder) writes one; a '
                'renewal or a release carries each unchanged', tick_key);
        END IF;
        SELECT * INTO mine FROM cronlock.tick_record(notes -> tick_key);  -- the written one
        SELECT * INTO theirs FROM cronlock.tick_record(old_notes -> tick_key);  -- recorded
        IF mine.at IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: tick record %s: not <tick> <job|-> <run> <holder> <cluster|->, '
                'the tick in RFC 3339 whole seconds (2026-12-06T12:00:00Z)', tick_key);
        END IF;
        IF mine.holder <> holder THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: tick record %s: it names holder %s, not the claim''s %s',
                tick_key, mine.holder, holder);
        END IF;
        IF mine.at > now + tick_ahead THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: tick record %s: its tick is more than 60 s ahead of the '
                'store''s clock', tick_key);
        END IF;
        IF theirs.at <= now + tick_ahead AND mine.at < theirs.at THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: tick record %s: its tick is older than the recorded one',
                tick_key);
        END IF;
        IF theirs.at <= now + tick_ahead AND mine.at = theirs.at AND mine.run <> theirs.run THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: tick record %s: its tick was claimed by another run (%s)',
                tick_key, theirs.run);
        END IF;
    END LOOP;
    -- Success records: only the holder's release (no holder now, last-holder the one
    -- before) adds or changes one, equal to that holder's own claim record of the same
    -- CronJob, never back to an older tick (unless the recorded one is ahead: nobody's);
    -- no write drops one.
    FOR tick_key IN SELECT pg_catalog.jsonb_object_keys(old_notes) LOOP
        IF pg_catalog.starts_with(tick_key, 'cronlock.io/succeeded.')
           AND pg_catalog.jsonb_typeof(old_notes -> tick_key) = 'string'
           AND pg_catalog.jsonb_typeof(notes -> tick_key) IS DISTINCT FROM 'string' THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: success record %s: every write carries it (the holder''s '
                'release may move it, none drops it)', tick_key);
        END IF;
    END LOOP;
    FOR tick_key IN SELECT pg_catalog.jsonb_object_keys(notes) LOOP
        CONTINUE WHEN NOT pg_catalog.starts_with(tick_key, 'cronlock.io/succeeded.')
            OR pg_catalog.jsonb_typeof(notes -> tick_key) <> 'string'
            OR (notes -> tick_key) = (old_notes -> tick_key);
        IF old_holder = '' OR holder <> ''
           OR coalesce(notes ->> 'cronlock.io/last-holder', '') <> old_holder THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: success record %s: only the holder''s release writes one',
                tick_key);
        END IF;
        claim_key := 'cronlock.io/tick.' || pg_catalog.substr(tick_key, 23);
        SELECT * INTO mine FROM cronlock.tick_record(old_notes -> claim_key);  -- the claim's
        SELECT * INTO theirs FROM cronlock.tick_record(old_notes -> tick_key);  -- recorded
        IF mine.at IS NULL OR mine.holder <> old_holder
           OR (notes -> tick_key) <> (old_notes -> claim_key) THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: success record %s: it is not the releasing holder''s own '
                'claim record (its tick and run)', tick_key);
        END IF;
        IF theirs.at <= now + tick_ahead AND mine.at < theirs.at THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: success record %s: its tick is older than the recorded '
                'success', tick_key);
        END IF;
    END LOOP;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO cronlock.fences AS f (namespace, name, value)
        VALUES (NEW.namespace, NEW.name, 1)
        ON CONFLICT (namespace, name) DO UPDATE SET value = f.value + 1
        RETURNING value INTO fence;
        NEW.transitions := fence;
        NEW.renewed_at := renewal;
        RETURN NEW;
    END IF;
    IF holder <> '' AND holder <> old_holder THEN
        INSERT INTO cronlock.fences AS f (namespace, name, value)
        VALUES (NEW.namespace, NEW.name, OLD.transitions + 1)
        ON CONFLICT (namespace, name) DO UPDATE SET value = greatest(f.value, OLD.transitions) + 1
        RETURNING value INTO fence;
        NEW.transitions := fence;
        NEW.renewed_at := renewal;
    ELSE
        NEW.transitions := OLD.transitions;
        NEW.renewed_at := CASE WHEN holder = '' THEN old_renewed
                               ELSE greatest(old_renewed, renewal) END;
    END IF;
    RETURN NEW;
END
$rules$;
CREATE OR REPLACE FUNCTION cronlock.keep_fences() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $fences$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE =
            'cronlock store: a fence is never deleted (it keeps tokens growing)';
    END IF;
    NEW.value := greatest(NEW.value, OLD.value);
    RETURN NEW;
END
$fences$;
CREATE OR REPLACE TRIGGER keep_rules BEFORE INSERT OR UPDATE ON cronlock.locks
    FOR EACH ROW EXECUTE FUNCTION cronlock.keep_rules();
CREATE OR REPLACE TRIGGER keep_fences BEFORE UPDATE OR DELETE ON cronlock.fences
    FOR EACH ROW EXECUTE FUNCTION cronlock.keep_fences();
COMMENT ON TABLE cronlock.locks IS 'cronlock locks, schema 3 (docs/STORES.md)';
COMMENT ON FUNCTION cronlock.keep_rules() IS
    'cronlock rules 3: tick and success records (docs/STORES.md)';
