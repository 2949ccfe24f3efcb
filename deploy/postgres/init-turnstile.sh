#!/bin/sh
# Runs once, when the PostgreSQL data volume is first initialised
# (/docker-entrypoint-initdb.d). Temporal's databases (temporal,
# temporal_visibility) are created by the temporal-schema service; this adds
# Turnstile's own database and roles, separate from Temporal's:
#
# - TURNSTILE_DB_USER (default turnstile): the application. It owns the
#   database and its tables (the worker migrates them) and has no CREATEROLE.
# - TURNSTILE_READER_USER (default turnstile_reader): the read-only login of the
#   sales query tool (DATABASE_READONLY_URL). It may connect; SELECT on the
#   sales tables (and nothing else) is granted by the application's migrations,
#   and row-level security shows it the last 90 days only.
# - turnstile_followup, turnstile_email, turnstile_sender: the NOLOGIN roles of
#   the other sales tools (createFollowUpTask; createEmailTask, INSERT only; the
#   e-mail sender). The application may not create roles, so they are made
#   here and granted to it: it takes them with SET LOCAL ROLE inside a tool's
#   transaction. Their table privileges come from the migrations. Role names
#   are cluster-wide, so they are made only if missing.
set -eu

: "${TURNSTILE_DB_USER:=turnstile}"
: "${TURNSTILE_DB_PASSWORD:=turnstile}"
: "${TURNSTILE_DB_NAME:=turnstile}"
: "${TURNSTILE_READER_USER:=turnstile_reader}"
: "${TURNSTILE_READER_PASSWORD:=turnstile_reader}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  --set=user="$TURNSTILE_DB_USER" --set=password="$TURNSTILE_DB_PASSWORD" \
  --set=db="$TURNSTILE_DB_NAME" \
  --set=reader="$TURNSTILE_READER_USER" --set=reader_password="$TURNSTILE_READER_PASSWORD" <<'SQL'
CREATE ROLE :"user" LOGIN NOCREATEROLE NOCREATEDB PASSWORD :'password';
CREATE ROLE :"reader" LOGIN NOCREATEROLE NOCREATEDB PASSWORD :'reader_password';
CREATE DATABASE :"db" OWNER :"user";
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE :"db" TO :"user";
GRANT CONNECT ON DATABASE :"db" TO :"reader";
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['turnstile_followup', 'turnstile_email', 'turnstile_sender'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN NULL;
            END;
        END IF;
    END LOOP;
END
$$;
GRANT turnstile_followup, turnstile_email, turnstile_sender TO :"user";
SQL
