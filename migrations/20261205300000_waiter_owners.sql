-- Who waits (issue 33): the operator page and `GET /v1/leases/{key}/waiters` show a key's queue
-- by the owners that asked, in grant order, and that name was not kept.
--
-- In a table of its own rather than a column of lease_waiters: every acquire probes
-- lease_waiters (src/store/leases/sql/acquire.sql, `decision`) with a generic plan made once per
-- connection, and a wider row made PostgreSQL's estimate for the never-analysed table of a new
-- database choose a sequential scan of it over the (key, id) index (tests/api/plans.rs). A
-- waiter's owner row goes with its place (ON DELETE CASCADE), by whichever path the place is
-- taken out. A place queued by an instance that predates this table has no owner row (`null`
-- in the queue until it leaves, within its wait of at most 300 s).
CREATE TABLE lease_waiter_owners (
    id     bigint PRIMARY KEY REFERENCES lease_waiters (id) ON DELETE CASCADE,
    owner  text   NOT NULL
);
