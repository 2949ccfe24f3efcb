#!/bin/sh
# One-shot (temporalio/admin-tools): create Temporal's two PostgreSQL databases
# and bring their schemas to the version this admin-tools image ships.
# Safe to re-run and the way to upgrade: use the admin-tools tag that matches
# the new server tag, then `docker compose up`.
set -eu

: "${POSTGRES_SEEDS:=postgresql}"
: "${DB_PORT:=5432}"
: "${POSTGRES_USER:=temporal}"
export SQL_PASSWORD="${POSTGRES_PWD:-temporal}"
SCHEMA=/etc/temporal/schema/postgresql/v12

sql() {
  temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -p "$DB_PORT" \
    -u "$POSTGRES_USER" "$@"
}

for db in temporal temporal_visibility; do
  case "$db" in
    temporal) dir="$SCHEMA/temporal/versioned" ;;
    *) dir="$SCHEMA/visibility/versioned" ;;
  esac
  echo "schema of $db"
  # Both fail harmlessly when the database / base schema already exist; the
  # update-schema below fails loudly on any real problem (it is the step that
  # must succeed).
  sql --db "$db" create-database 2>/dev/null || echo "  database $db exists"
  sql --db "$db" setup-schema -v 0.0 2>/dev/null || echo "  base schema of $db exists"
  sql --db "$db" update-schema -d "$dir"
done
echo "Temporal schema ready"
