-- Schema 2 as cronlock ran it up to 2a09353, its tables in the search path's first schema; the
-- migration test starts from it (tests/integration/test_stores.py).
CREATE TABLE IF NOT EXISTS cronlock_locks (
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
CREATE TABLE IF NOT EXISTS cronlock_fences (
    namespace text   NOT NULL,
    name      text   NOT NULL,
    value     bigint NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE SEQUENCE IF NOT EXISTS cronlock_versions;
ALTER TABLE cronlock_locks ADD COLUMN IF NOT EXISTS duration integer;
ALTER TABLE cronlock_locks ADD COLUMN IF NOT EXISTS renewed_at timestamptz;
ALTER TABLE cronlock_locks DROP CONSTRAINT IF EXISTS cronlock_duration;
ALTER TABLE cronlock_locks ADD CONSTRAINT cronlock_duration
    CHECK (duration BETWEEN 1 AND 86400);
CREATE OR REPLACE FUNCTION cronlock_keep_rules() RETURNS trigger LANGUAGE plpgsql AS $rules$
DECLARE
    spec jsonb := NEW.document -> 'spec';
    notes jsonb := NEW.document #> '{metadata,annotations}';
    now timestamptz := clock_timestamp();
    holder text := coalesce(spec ->> 'holderIdentity', '');
    renewal timestamptz := now;
    old_holder text := '';
    old_duration integer := 0;
    old_renewed timestamptz := '-infinity';
    old_job text := '';
    fence bigint;
BEGIN
    -- A document with no holder may have no duration (a freeze on a lock never taken).
    IF (holder <> '' OR coalesce(spec ? 'leaseDurationSeconds', false)) AND (
       jsonb_typeof(spec -> 'leaseDurationSeconds') IS DISTINCT FROM 'number'
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
    NEW.resource_version := nextval('cronlock_versions');
    IF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM cronlock_locks l
                    WHERE l.namespace = NEW.namespace AND l.name = NEW.name) THEN
            RETURN NULL;  -- a create where a lock is: no row, and no token spent on it
        END IF;
        INSERT INTO cronlock_fences AS f (namespace, name, value)
        VALUES (NEW.namespace, NEW.name, 1)
        ON CONFLICT (namespace, name) DO UPDATE SET value = f.value + 1
        RETURNING value INTO fence;
        NEW.transitions := fence;
        NEW.renewed_at := renewal;
        RETURN NEW;
    END IF;
    IF (NEW.namespace, NEW.name) IS DISTINCT FROM (OLD.namespace, OLD.name) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE =
            'cronlock store: a lock keeps its namespace and name';
    END IF;
    old_holder := coalesce(OLD.holder, '');
    old_duration := least(greatest(coalesce(OLD.duration, CASE
        WHEN jsonb_typeof(OLD.document #> '{spec,leaseDurationSeconds}') = 'number'
        THEN least((OLD.document #>> '{spec,leaseDurationSeconds}')::numeric, 86400)::integer
        END, 0), 0), 86400);
    old_renewed := coalesce(OLD.renewed_at, OLD.written_at);
    IF old_renewed > now THEN
        old_renewed := '-infinity';  -- a time the database never wrote
    END IF;
    old_job := coalesce(OLD.document #>> '{metadata,annotations,cronlock.io/holder-job}', '');
    IF NOT (old_holder = '' OR holder = old_holder
            OR (holder = '' AND notes ->> 'cronlock.io/last-holder' = old_holder)
            OR now - old_renewed > make_interval(secs => CASE WHEN holder = ''
                THEN old_duration ELSE least(old_duration, NEW.duration) END)
            OR (old_job <> '' AND holder <> '' AND notes ->> 'cronlock.io/holder-job' = old_job
                AND starts_with(holder, left(old_job || '-', 58)))) THEN
        RAISE EXCEPTION USING ERRCODE = 'CLK01', MESSAGE = format(
            'cronlock holder policy: the lock is held by %s, renewed %ss ago on the store''s '
            'clock for %ss; until it expires only its holder (or a later pod of its Job) may '
            'change it', old_holder,
            round(extract(epoch FROM now - old_renewed)::numeric, 3), old_duration);
    END IF;
    IF holder <> '' AND holder <> old_holder THEN
        INSERT INTO cronlock_fences AS f (namespace, name, value)
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
CREATE OR REPLACE FUNCTION cronlock_keep_fences() RETURNS trigger LANGUAGE plpgsql AS $fences$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE =
            'cronlock store: a fence is never deleted (it keeps tokens growing)';
    END IF;
    NEW.value := greatest(NEW.value, OLD.value);
    RETURN NEW;
END
$fences$;
CREATE OR REPLACE TRIGGER cronlock_keep_rules BEFORE INSERT OR UPDATE ON cronlock_locks
    FOR EACH ROW EXECUTE FUNCTION cronlock_keep_rules();
CREATE OR REPLACE TRIGGER cronlock_keep_fences BEFORE UPDATE OR DELETE ON cronlock_fences
    FOR EACH ROW EXECUTE FUNCTION cronlock_keep_fences();
COMMENT ON TABLE cronlock_locks IS 'cronlock locks, schema 2 (docs/STORES.md)';
