-- The backends following the key table (application name $1), whose confirmation a change waits
-- for.
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1
