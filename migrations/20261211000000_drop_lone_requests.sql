-- A request alone in its batch runs the batch statement again: the functions that repeated its
-- rules in PL/pgSQL (20261209000000_lone_requests.sql) go, so each rule has one home, the
-- feature's SQL (src/store/<feature>/sql/).
DROP FUNCTION snapshot_put_one(text, bytea, text, bigint, text, bigint, boolean, text[], text,
    text, text, text, bigint, text, bytea, bigint);
DROP FUNCTION lease_acquire_one(text, bytea, text, bigint, text, text, bigint, text, boolean,
    boolean, text, text, boolean, bigint, boolean);
DROP FUNCTION change_gate(text, text, bigint);
