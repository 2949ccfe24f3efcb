#!/bin/sh
# Runs once, when the PostgreSQL data volume is first initialised
# (/docker-entrypoint-initdb.d). Temporal's databases (temporal,
# temporal_visibility) are created by the temporal-schema service; this adds
# Turnstile's own database and role, separate from Temporal's.
set -eu

: "${TURNSTILE_DB_USER:=turnstile}"
: "${TURNSTILE_DB_PASSWORD:=turnstile}"
: "${TURNSTILE_DB_NAME:=turnstile}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  --set=user="$TURNSTILE_DB_USER" --set=password="$TURNSTILE_DB_PASSWORD" \
  --set=db="$TURNSTILE_DB_NAME" <<'SQL'
CREATE ROLE :"user" LOGIN PASSWORD :'password';
CREATE DATABASE :"db" OWNER :"user";
SQL
