-- The one write's body, copied into the connection's upload table (engine/conns.rs), read where
-- it is stored rather than carried through the statement.
upload AS NOT MATERIALIZED (SELECT body FROM pg_temp.snapfence_upload),
