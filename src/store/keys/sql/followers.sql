-- The backends of the instances that follow the key table (their listening connections carry
-- the application name $1), so that a change can wait for each one's confirmation.
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1
