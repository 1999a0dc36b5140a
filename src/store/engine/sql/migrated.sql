-- The newest migration applied, or NULL: to_regclass makes a database that was never migrated
-- (no migrations table) "not ready", not an error. A catalogue read.
SELECT CASE WHEN to_regclass('_sqlx_migrations') IS NOT NULL
    THEN (SELECT max(version) FROM _sqlx_migrations WHERE success) END
