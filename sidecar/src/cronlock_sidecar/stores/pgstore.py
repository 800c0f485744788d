"""The lock in PostgreSQL: a row per lock in `cronlock.locks`, written by conditional statements.

A create is an INSERT that does nothing where a row exists; a renew, a takeover and a
release are UPDATEs of the version the writer read (`resource_version`), so each is the
one its reader judged and a stale holder's write matches no row. The lock's rules are the
database's own, a trigger on every write (a raw UPDATE too): the holder changes only on a
free, expired (on the database's clock) or same-Job hold, the duration is 1..86400 s,
and the trigger alone sets the fencing token (`transitions`: one more than any handed out
on a new holder, `cronlock.fences` keeping the highest, so a row deleted by hand is
created again with a higher one), the version and the times. Ages are judged on the
database's clock alone (`clock_timestamp()`, `stores.frames`). The same trigger keeps
the tick records (`cronlock.io/tick.<cronjob>`, lock/ticks.py; docs/STORES.md, "Tick
records in a store"): only a claim adds or changes one, naming its own holder, never ahead of the
database's clock + TICK_AHEAD_SECONDS, never back to an older tick or to the same tick of
another run; and the success records (`cronlock.io/succeeded.<cronjob>`): only the
holder's release writes one, equal to its own claim record, never back to an older tick;
no write drops either. Permits (lock/permits.py; docs/STORES.md, "Permits in a store"):
the trigger reads N as the sidecar does, changes it only while no permit is held, judges
each permit entry's holder as the spec's, lets no holder hold two permits or a write
claim two, and keeps per permit its own fencing token (`cronlock.fences`, `<name>#K`) and
last renewal (the column `permits`), which readers get in place of the entries'. The
schema `cronlock` is created, or tables of schema 1 or 2 moved into it, where it is not
schema 3 with the rules of version 4 (docs/STORES.md has it, for the admin role where a
namespace's role may not).

No name another role chose is ever resolved: the trigger functions pin their search path
to pg_catalog then pg_temp and qualify every table, sequence and function, and this
module's session pins its own the same way, once it has read where the URL's search path
would find tables of an earlier schema. So a function, operator or `pg_temp` table that a
role with CREATE on `public` (PostgreSQL 14's default) or any role in its own session
makes is never what the trigger or the sidecar calls or writes.

Every call has a deadline, also when the server stopped answering but its kernel still
holds the connection open (a paused server): a timer shuts the socket down, the call fails
as Unavailable, and the next call connects again.

A reader who did not write the URL (`cronlock status` and `freeze` on an admin's machine)
connects `isolated`: libpq gets nothing of that machine's but what the URL says, no
PG* environment (PGPASSWORD, PGUSER, PGSSLCERT, PGSERVICE, ...), no password file, no
client certificate, no Kerberos ticket.

psycopg is imported here only, and only when a CronJob or `run --store` chooses PostgreSQL.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import Any, Final

import psycopg
from psycopg import errors
from psycopg.conninfo import make_conninfo

from cronlock_sidecar.stores.documents import (
    STORE_REFUSAL,
    TICK_AHEAD_SECONDS,
    stamped,
    unversioned,
    version_read,
)
from cronlock_sidecar.stores.frames import to_reader
from cronlock_sidecar.stores.url import ISOLATING_LIBPQ as ISOLATING_LIBPQ
from cronlock_sidecar.stores.url import StoreUrl
from cronlock_sidecar.transport.seam import (
    ApiError,
    Conflict,
    Forbidden,
    Lease,
    LeaseRef,
    NotFound,
    Unavailable,
)

# Schema 3: the schema `cronlock` (tables of schema 1 or 2 on the caller's search path
# moved into it, renamed, with a view left in their place), its tables created where
# missing, the columns and constraints added where missing, and the trigger that keeps
# the lock's rules on every write, whoever writes and however (a raw UPDATE too; only the
# tables' owner can drop a trigger, so a role that is not the owner cannot step around
# it). Idempotent: run again, it changes nothing. docs/STORES.md shows this text (a test
# compares them). The tables are schema 3's; the trigger function's comment says which
# rules it keeps (`cronlock rules 3`: the tick records, then the success records;
# `cronlock rules 4`: permits), so a database of schema 3 whose trigger predates them is
# run again (`_SCHEMA_PRESENT`), while a sidecar of a release before, which reads the
# table's comment alone (before rules 3) or also the function's comment's start
# (`cronlock rules 3: `, kept first for it), still finds what it needs and never puts its
# own trigger back, nor is refused running it (a namespace's role may not).
SCHEMA = """
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
-- The store's own record of each permit K (1..N-1): {"K": {"token": T, "renewed_at": R}}.
ALTER TABLE cronlock.locks ADD COLUMN IF NOT EXISTS permits jsonb NOT NULL DEFAULT '{}';
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
-- Permits (lock/permits.py reads the same): N is `cronlock.io/permits`, 1..16 in digits
-- alone, else 1.
CREATE OR REPLACE FUNCTION cronlock.permit_count(notes jsonb) RETURNS integer
    LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $count$
DECLARE
    written text := notes ->> 'cronlock.io/permits';
BEGIN
    IF pg_catalog.jsonb_typeof(notes -> 'cronlock.io/permits') IS DISTINCT FROM 'string'
       OR written !~ '^[1-9][0-9]{0,2}$' THEN
        RETURN 1;
    END IF;
    RETURN CASE WHEN written::integer <= 16 THEN written::integer ELSE 1 END;
END
$count$;
-- Permit K's entry `<holder> <acquire> <renew> <duration s> <transitions> <job>`: its
-- holder and Job ('' for `-`), duration and renew time as written; holder '' (free) for
-- anything else.
CREATE OR REPLACE FUNCTION cronlock.permit_entry(value jsonb, OUT holder text, OUT job text,
    OUT duration text, OUT renewed text) LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp AS $entry$
DECLARE
    fields text[];
BEGIN
    holder := '';
    job := '';
    IF pg_catalog.jsonb_typeof(value) IS DISTINCT FROM 'string' THEN
        RETURN;
    END IF;
    fields := pg_catalog.regexp_match(value #>> '{}',
        '^([!-~]{1,253}) ([!-~]{1,253}) ([!-~]{1,253}) ([!-~]{1,253}) ([!-~]{1,253}) '
        '([!-~]{1,253})$');
    IF fields IS NULL OR fields[1] = '-' THEN
        RETURN;
    END IF;
    holder := fields[1];
    job := CASE WHEN fields[6] = '-' THEN '' ELSE fields[6] END;
    duration := fields[4];
    renewed := fields[3];
END
$entry$;
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
    tick_ahead CONSTANT interval := '__AHEAD__ seconds';
    old_notes jsonb := '{}';
    claim boolean := holder <> '';
    tick_key text;
    claim_key text;
    mine record;
    theirs record;
    -- Permits (docs/STORES.md, "Permits in a store"): permit 0 is the spec, permit K the
    -- entry `cronlock.io/permit.K`, each judged as the spec is, on every write.
    old_count integer := 1;
    new_count integer := 1;
    permit integer;
    entry_key text;
    was record;
    written record;
    kept jsonb;
    was_duration integer;
    was_renewed timestamptz;
    was_token bigint;
    written_duration integer;
    written_renewal timestamptz;
    records jsonb := '{}';
    held text[] := '{}';
    held_permits integer[] := '{}';
    claim_holder text := '';
    claim_permit integer;
    releasing text := '';
    releases integer := 0;
BEGIN
    IF pg_catalog.jsonb_typeof(notes) IS DISTINCT FROM 'object' THEN
        notes := '{}';
    END IF;
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
                OR old_renewed < now - pg_catalog.make_interval(secs => (CASE WHEN holder = ''
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
        -- A claim: a new holder, or a holder taking its own expired hold again (its write
        -- makes it live; a write of another permit carries it as it was).
        claim := holder <> '' AND (holder <> old_holder
                 OR (old_renewed < now - pg_catalog.make_interval(
                         secs => least(old_duration, NEW.duration)::double precision)
                     AND renewal >= now - pg_catalog.make_interval(
                         secs => NEW.duration::double precision)));
        old_notes := OLD.document #> '{metadata,annotations}';
        IF pg_catalog.jsonb_typeof(old_notes) IS DISTINCT FROM 'object' THEN
            old_notes := '{}';
        END IF;
        old_count := cronlock.permit_count(old_notes);
    END IF;
    -- Permits: N changes only while no permit below the old N is held and unexpired; each
    -- permit's holder changes only as the spec's does; no two permits name one holder; a
    -- write claims at most one; the token and last renewal of each are the store's.
    IF pg_catalog.jsonb_typeof(notes -> 'cronlock.io/permits') = 'string'
       AND (notes ->> 'cronlock.io/permits') !~ '^[1-9][0-9]{0,2}$'
       AND (notes ->> 'cronlock.io/permits') ~ '[0-9]' THEN  -- a reader could take it for N
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
            'cronlock store: cronlock.io/permits %s: N is written in digits alone, 1 to 16',
            notes ->> 'cronlock.io/permits');
    END IF;
    new_count := cronlock.permit_count(notes);
    IF new_count <> old_count AND old_holder <> ''
       AND old_renewed >= now - pg_catalog.make_interval(
           secs => old_duration::double precision) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
            'cronlock store: cronlock.io/permits: N changes from %s to %s only while no permit '
            'is held; permit 0 is held by %s', old_count, new_count, old_holder);
    END IF;
    IF holder <> '' THEN
        held := pg_catalog.array_append(held, holder);
        held_permits := pg_catalog.array_append(held_permits, 0);
    END IF;
    IF claim THEN
        claim_holder := holder;
        claim_permit := 0;
    END IF;
    IF old_holder <> '' AND holder = '' AND notes ->> 'cronlock.io/last-holder' = old_holder THEN
        releasing := old_holder;
        releases := 1;
    END IF;
    FOR permit IN 1 .. greatest(old_count, new_count) - 1 LOOP
        entry_key := 'cronlock.io/permit.' || permit;
        -- As it was: its entry and the store's record of it (token, last renewal).
        kept := NULL;
        was_duration := 0;
        was_renewed := '-infinity';
        was_token := 0;
        IF TG_OP = 'UPDATE' AND permit < old_count THEN
            SELECT * INTO was FROM cronlock.permit_entry(old_notes -> entry_key);
            kept := OLD.permits -> (permit::text);
            was_duration := CASE WHEN was.duration ~ '^[0-9]{1,6}$'
                                 THEN least(was.duration::integer, 86400) ELSE 0 END;
            IF pg_catalog.jsonb_typeof(kept -> 'renewed_at') = 'string'
               AND (kept ->> 'renewed_at')::timestamptz <= now THEN
                was_renewed := (kept ->> 'renewed_at')::timestamptz;
            END IF;
            IF pg_catalog.jsonb_typeof(kept -> 'token') = 'number' THEN
                was_token := (kept ->> 'token')::bigint;
            END IF;
            IF new_count <> old_count AND was.holder <> ''
               AND was_renewed >= now - pg_catalog.make_interval(
                   secs => was_duration::double precision) THEN
                RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                    'cronlock store: cronlock.io/permits: N changes from %s to %s only while no '
                    'permit is held; permit %s is held by %s', old_count, new_count, permit,
                    was.holder);
            END IF;
        ELSE
            SELECT * INTO was FROM cronlock.permit_entry(NULL);
        END IF;
        CONTINUE WHEN permit >= new_count;  -- nobody's: ignored, its record forgotten
        -- As written: one line, and a held entry's duration 1..86400 s.
        IF pg_catalog.jsonb_typeof(notes -> entry_key) = 'string'
           AND pg_catalog.strpos(notes ->> entry_key, pg_catalog.chr(10)) > 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: permit %s: its entry is one line, <holder> <acquire> <renew> '
                '<duration s> <transitions> <job>', permit);
        END IF;
        SELECT * INTO written FROM cronlock.permit_entry(notes -> entry_key);
        written_duration := 0;
        written_renewal := now;
        IF written.holder <> '' THEN
            IF (CASE WHEN written.duration ~ '^[0-9]{1,6}$'
                     THEN written.duration::integer NOT BETWEEN 1 AND 86400 ELSE true END) THEN
                RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                    'cronlock store: permit %s: its duration must be a whole number from 1 to '
                    '86400', permit);
            END IF;
            written_duration := written.duration::integer;
            BEGIN  -- dated as the spec's renewal is
                written_renewal := now - greatest(
                    NEW.writer_time - written.renewed::timestamptz, interval '0');
            EXCEPTION WHEN others THEN
                written_renewal := now;
            END;
        END IF;
        IF NOT (was.holder = '' OR written.holder = was.holder
                OR (written.holder = '' AND notes ->> 'cronlock.io/last-holder' = was.holder)
                OR was_renewed < now - pg_catalog.make_interval(secs => (CASE
                    WHEN written.holder = '' THEN was_duration
                    ELSE least(was_duration, written_duration) END)::double precision)
                OR (was.job <> '' AND written.holder <> '' AND written.job = was.job
                    AND pg_catalog.starts_with(written.holder,
                                               pg_catalog."left"(was.job || '-', 58)))) THEN
            RAISE EXCEPTION USING ERRCODE = 'CLK01', MESSAGE = pg_catalog.format(
                'cronlock holder policy: permit %s of the lock is held by %s, renewed %ss ago on '
                'the store''s clock for %ss; until it expires only its holder (or a later pod of '
                'its Job) may change it', permit, was.holder,
                pg_catalog.round(extract(epoch FROM now - was_renewed)::numeric, 3), was_duration);
        END IF;
        IF written.holder <> '' THEN
            IF pg_catalog.array_position(held, written.holder) IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'CLK01', MESSAGE = pg_catalog.format(
                    'cronlock holder policy: %s would hold permit %s and permit %s of the lock; '
                    'a holder holds one permit', written.holder,
                    held_permits[pg_catalog.array_position(held, written.holder)], permit);
            END IF;
            held := pg_catalog.array_append(held, written.holder);
            held_permits := pg_catalog.array_append(held_permits, permit);
        END IF;
        IF written.holder <> '' AND (written.holder <> was.holder
           OR (was_renewed < now - pg_catalog.make_interval(
                   secs => least(was_duration, written_duration)::double precision)
               AND written_renewal >= now - pg_catalog.make_interval(
                   secs => written_duration::double precision))) THEN
            IF claim_permit IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'CLK01', MESSAGE = pg_catalog.format(
                    'cronlock holder policy: a write claims one permit, this one permit %s '
                    '(%s) and permit %s (%s)', claim_permit, claim_holder, permit,
                    written.holder);
            END IF;
            claim_holder := written.holder;
            claim_permit := permit;
        END IF;
        IF was.holder <> '' AND written.holder = ''
           AND notes ->> 'cronlock.io/last-holder' = was.holder THEN
            releasing := was.holder;
            releases := releases + 1;
        END IF;
        -- The store's record: a new holder's token is one more than any handed out for
        -- this permit (`<name>#K` in cronlock.fences); a renewal is dated as the spec's; a
        -- free permit keeps its token and last renewal.
        IF written.holder <> '' AND written.holder <> was.holder THEN
            INSERT INTO cronlock.fences AS f (namespace, name, value)
            VALUES (NEW.namespace, NEW.name || '#' || permit, was_token + 1)
            ON CONFLICT (namespace, name) DO UPDATE SET value = greatest(f.value, was_token) + 1
            RETURNING value INTO fence;
            records := records || pg_catalog.jsonb_build_object(permit::text,
                pg_catalog.jsonb_build_object('token', fence, 'renewed_at', written_renewal));
        ELSIF written.holder <> '' THEN
            records := records || pg_catalog.jsonb_build_object(permit::text,
                pg_catalog.jsonb_build_object('token', was_token,
                    'renewed_at', greatest(was_renewed, written_renewal)));
        ELSIF kept IS NOT NULL THEN
            records := records || pg_catalog.jsonb_build_object(permit::text, kept);
        END IF;
    END LOOP;
    NEW.permits := records;
    claim := claim_holder <> '';
    IF releases <> 1 THEN
        releasing := '';  -- no release, or more than one: no releasing holder
    END IF;
    -- Tick records: only a claim adds or changes one, naming the claimed permit's holder,
    -- never ahead of this clock + tick_ahead, never back to an older tick or to the same
    -- tick of another run (unless the recorded one is ahead: nobody's); no write drops one.
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
        IF mine.holder <> claim_holder THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: tick record %s: it names holder %s, not the claim''s %s',
                tick_key, mine.holder, claim_holder);
        END IF;
        IF mine.at > now + tick_ahead THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: tick record %s: its tick is more than __AHEAD__ s ahead of the '
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
    -- Success records: only a holder's release (the one permit it held now free,
    -- last-holder naming it) adds or changes one, equal to that holder's own claim record
    -- of the same CronJob, never back to an older tick (unless the recorded one is ahead:
    -- nobody's); no write drops one.
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
        IF releasing = '' THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = pg_catalog.format(
                'cronlock store: success record %s: only the holder''s release writes one',
                tick_key);
        END IF;
        claim_key := 'cronlock.io/tick.' || pg_catalog.substr(tick_key, 23);
        SELECT * INTO mine FROM cronlock.tick_record(old_notes -> claim_key);  -- the claim's
        SELECT * INTO theirs FROM cronlock.tick_record(old_notes -> tick_key);  -- recorded
        IF mine.at IS NULL OR mine.holder <> releasing
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
    'cronlock rules 3: tick and success records; cronlock rules 4: permits (docs/STORES.md)';
""".replace("__AHEAD__", str(TICK_AHEAD_SECONDS))
_SCHEMA_PRESENT = """
SELECT coalesce(pg_catalog.obj_description(pg_catalog.to_regclass('cronlock.locks'), 'pg_class'),
                '') LIKE 'cronlock locks, schema 3 %'
   AND coalesce(pg_catalog.obj_description(
           pg_catalog.to_regprocedure('cronlock.keep_rules()'), 'pg_proc'), '')
       LIKE 'cronlock rules 3: %; cronlock rules 4: %'
"""
# The session's own statements resolve names in pg_catalog alone (pg_temp last): no
# function or operator a tenant planted in a schema on the URL's search path is ever a
# candidate, and every relation is named with its schema.
_SEARCH_PATH = "SELECT pg_catalog.current_setting('search_path')"
_PINNED_PATH = "SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)"
_GET = """
SELECT document, resource_version, transitions, writer_time, written_at,
       coalesce(renewed_at, written_at), pg_catalog.clock_timestamp(), permits
  FROM cronlock.locks WHERE namespace = %(namespace)s AND name = %(name)s
"""
# The trigger sets the token, the version, the times and the holder's columns; the
# statements only say where (a create only where no row is, a replace of the version read).
_CREATE = """
INSERT INTO cronlock.locks AS l
    (namespace, name, holder, transitions, resource_version, document, writer_time, written_at)
VALUES (%(namespace)s, %(name)s, '', 0, 0, %(document)s::jsonb, %(writer_time)s,
        pg_catalog.now())
ON CONFLICT (namespace, name) DO NOTHING
RETURNING transitions, resource_version, permits
"""
_REPLACE = """
UPDATE cronlock.locks AS l
   SET document = %(document)s::jsonb, writer_time = %(writer_time)s
 WHERE l.namespace = %(namespace)s AND l.name = %(name)s
   AND l.resource_version = %(version)s
RETURNING l.transitions, l.resource_version, l.permits
"""
_EXISTS = "SELECT 1 FROM cronlock.locks WHERE namespace = %(namespace)s AND name = %(name)s"
# What an isolated connection overrides, whatever the URL says: libpq's defaults would
# offer ~/.pgpass, the client certificate in ~/.postgresql (or one the URL names) and a
# Kerberos ticket (GSSAPI, SSPI) to whichever host the URL names; OAuth is not offered
# either. Only the URL's own password (or none) is ever sent. sslcertmode and require_auth
# need libpq 16 (ISOLATING_LIBPQ, in stores/url.py); the caller checks before
# connecting.
ISOLATED: Final = {
    # A path no file can ever be at (/dev/null is no directory): libpq reads nothing and,
    # unlike with /dev/null itself, adds no "not a plain file" warning to its errors.
    "passfile": os.path.join(os.devnull, "pgpass"),
    "sslcertmode": "disable",
    "gssencmode": "disable",
    "require_auth": "scram-sha-256,md5,password,none",
}
# libpq reads these when a parameter is not given (its PG* variables) and always some
# (PGSERVICEFILE, PGSYSCONFDIR, PGTZ, PGDATESTYLE, ...): all are hidden from an isolated
# connection while it connects, one connection at a time (the environment is the process').
_ENVIRONMENT_PREFIX: Final = "PG"
_environment = threading.Lock()

# SQLSTATE classes that mean "you may not": 28 (authorization), 42501 (privilege), and
# the schema's trigger's refusals: CLK01 (a change of holder the rules do not allow),
# 23514 with its "cronlock store:" message (a duration out of bounds).
_REFUSED = ("28", "42501", "CLK01")


class PostgresLeaseStore:
    """LeaseTransport on PostgreSQL; `now` is the sidecar's wall clock (what it writes on)."""

    def __init__(
        self,
        url: StoreUrl,
        now: Callable[[], datetime],
        timeout: float = 5.0,
        *,
        create_tables: bool = True,
        isolated: bool = False,
    ) -> None:
        """`create_tables=False`: a reader (`cronlock status`) that never creates them;
        `isolated`: connect with the URL alone (module docstring), for a caller who did
        not write it."""
        self.url = url
        self.now = now
        self.timeout = timeout
        self.create_tables = create_tables
        self.isolated = isolated
        self._connection: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease:
        row = self._one("get", lease, _GET, _keys(lease), timeout)
        reader_now = self.now()
        if row is None:
            raise NotFound("get", lease, f"no lock in {self.url}")
        document, version, token, writer_time, written_at, renewed_at, store_now, kept = row
        tokens, renewals = _permit_records(kept)
        body = to_reader(
            document,
            writer_time=writer_time,
            written_at=written_at,
            store_now=store_now,
            reader_now=reader_now,
            renewed_at=renewed_at,
            permit_renewals=renewals,
        )
        return stamped(body, version, token, tokens)

    def create(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        document, parameters = self._parameters(lease, body)
        row = self._one("create", lease, _CREATE, parameters, timeout)
        if row is None:
            raise Conflict("create", lease, "created by someone else meanwhile")
        token, version, kept = row
        return stamped(document, version, token, _permit_records(kept)[0])

    def replace(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        version = version_read(body)
        if not version.isdigit():
            raise Conflict("update", lease, "no version read to compare with")
        document, parameters = self._parameters(lease, body)
        parameters["version"] = int(version)
        row = self._one("update", lease, _REPLACE, parameters, timeout)
        if row is None:
            if self._one("update", lease, _EXISTS, _keys(lease), timeout) is None:
                raise NotFound("update", lease, f"no lock in {self.url}")
            raise Conflict("update", lease, "written by someone else since it was read")
        token, version, kept = row
        return stamped(document, version, token, _permit_records(kept)[0])

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> PostgresLeaseStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- statements -----------------------------------------------------------------
    def _parameters(self, lease: LeaseRef, body: Lease) -> tuple[dict[str, Any], dict[str, Any]]:
        document = unversioned(body)
        parameters = {
            **_keys(lease),
            "document": json.dumps(document, separators=(",", ":")),
            "writer_time": self.now(),
        }
        return document, parameters

    def _one(
        self,
        verb: str,
        lease: LeaseRef,
        statement: str,
        parameters: dict[str, Any],
        timeout: float | None,
    ) -> tuple[Any, ...] | None:
        seconds = self.timeout if timeout is None else max(0.1, min(timeout, self.timeout))
        with self._lock:
            try:
                connection = self._connect(verb, lease, seconds)
                with _deadline(connection, seconds), connection.cursor() as cursor:
                    cursor.execute(statement, parameters)
                    return cursor.fetchone()
            except psycopg.Error as error:
                self._drop()
                raise _translated(verb, lease, self.url, error) from None

    def _connect(self, verb: str, lease: LeaseRef, seconds: float) -> psycopg.Connection[Any]:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        overrides = ISOLATED if self.isolated else {}
        try:
            with without_libpq_environment() if self.isolated else nullcontext():
                connection = psycopg.connect(
                    make_conninfo(self.url.secret, **overrides),
                    autocommit=True,
                    connect_timeout=max(2, round(seconds)),
                    application_name="cronlock-sidecar",
                )
        except psycopg.Error as error:
            raise _translated(verb, lease, self.url, error) from None
        try:
            with _deadline(connection, seconds):
                path = connection.execute(_SEARCH_PATH).fetchone()
                connection.execute(_PINNED_PATH)
                if self.create_tables:
                    _ensure_schema(connection, str(path[0] if path else ""))
        except psycopg.Error as error:
            connection.close()
            raise _translated(verb, lease, self.url, error, schema=True) from None
        self._connection = connection
        return connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


@contextmanager
def without_libpq_environment() -> Iterator[None]:
    """Every PG* variable hidden from libpq (and psycopg, which reads some too) meanwhile."""
    with _environment:
        hidden = {name: os.environ.pop(name) for name in list(os.environ) if _libpq(name)}
        try:
            yield
        finally:
            os.environ.update(hidden)


def _libpq(name: str) -> bool:
    return name.startswith(_ENVIRONMENT_PREFIX)


def _ensure_schema(connection: psycopg.Connection[Any], path: str) -> None:
    """Create the tables where missing, once across all the contenders (an advisory lock);
    `path`, the URL's own search path, is where SCHEMA looks for tables of schema 1 or 2."""
    row = connection.execute(_SCHEMA_PRESENT).fetchone()
    if row is not None and row[0]:
        return
    with connection.transaction():
        connection.execute(
            "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('cronlock.locks'))"
        )
        connection.execute("SELECT pg_catalog.set_config('search_path', %s, true)", (path,))
        connection.execute(SCHEMA)


@contextmanager
def _deadline(connection: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Shut the connection's socket down if the call is still waiting after `seconds`."""
    timer = threading.Timer(seconds, _cut, args=(connection,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _cut(connection: psycopg.Connection[Any]) -> None:
    try:
        duplicate = socket.socket(fileno=socket.dup(connection.fileno()))
    except (OSError, psycopg.Error):
        return
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        duplicate.close()


def _translated(
    verb: str, lease: LeaseRef, url: StoreUrl, error: psycopg.Error, *, schema: bool = False
) -> ApiError:
    state = error.sqlstate or ""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    refused = state.startswith(_REFUSED) or isinstance(error, errors.InsufficientPrivilege)
    if not state and "password authentication failed" in text:
        refused = True
    if isinstance(error, errors.CheckViolation) and STORE_REFUSAL in text:
        refused = True
    if refused:
        hint = (
            ' (the admin role runs the schema in docs/STORES.md, "PostgreSQL: tables", once;'
            " a namespace's role may not)"
            if schema
            else ""
        )
        return Forbidden(verb, lease, f"{url}: {text}{hint}")
    if isinstance(error, errors.UndefinedTable):
        # Only a reader that does not create them meets this: no lock of schema 3 here
        # (a store of an earlier schema is read once its schema was run: docs/UPGRADING.md).
        return NotFound(verb, lease, f"{url}: {text}")
    if isinstance(error, errors.UndefinedColumn):
        # Only a reader that does not migrate them meets this: a `cronlock.locks` made by
        # hand without the schema's columns.
        return Unavailable(verb, lease, f"{url}: {text} (run docs/STORES.md's schema)")
    return Unavailable(verb, lease, f"{url}: {text}")


def _permit_records(kept: object) -> tuple[dict[int, int], dict[int, datetime]]:
    """The trigger's record of each permit K ≥ 1 (the column `permits`): its fencing
    token, and its holder's last renewal on the database's clock."""
    tokens: dict[int, int] = {}
    renewals: dict[int, datetime] = {}
    for key, record in (kept if isinstance(kept, dict) else {}).items():
        if not str(key).isdigit() or not isinstance(record, dict):
            continue
        if isinstance(record.get("token"), int):
            tokens[int(key)] = record["token"]
        try:
            renewals[int(key)] = datetime.fromisoformat(str(record.get("renewed_at")))
        except ValueError:
            continue  # no renewal the trigger wrote: the entry reads as long ago
    return tokens, renewals


def _keys(lease: LeaseRef) -> dict[str, Any]:
    return {"namespace": lease.namespace, "name": lease.name}
