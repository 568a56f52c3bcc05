#!/bin/sh
# Development stack only (compose mounts this as
# /docker-entrypoint-initdb.d/20-jetinbox.sh). The postgres image runs it
# once, as the postgres user, when it initialises an empty data directory,
# after 10-roles.sql. Written to work whether the image sources it or runs it.

# Our settings (postgresql.conf.snippet) and the TLS-only pg_hba.conf take
# effect at the server start that follows the init phase.
echo "include '/etc/postgresql/jetinbox.conf'" >>"$PGDATA/postgresql.conf"
cp /etc/postgresql/pg_hba.conf "$PGDATA/pg_hba.conf"

# Login passwords from the secret files (written by `go run ./cmd/devsecrets`;
# compose's entrypoint copied them where the postgres user may read them).
for role in jetinbox_migrator jetinbox_consumer jetinbox_relay jetinbox_verifier jetinbox_maintainer; do
	psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
		-v role="$role" -v pw="$(cat "/etc/postgresql/secrets/${role}_password")" <<'SQL' || return 1 2>/dev/null || exit 1
ALTER ROLE :"role" PASSWORD :'pw';
SQL
done
