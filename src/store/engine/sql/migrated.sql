-- The newest migration applied, or NULL on a never-migrated database (to_regclass).
SELECT CASE WHEN to_regclass('_sqlx_migrations') IS NOT NULL
    THEN (SELECT max(version) FROM _sqlx_migrations WHERE success) END
