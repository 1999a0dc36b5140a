-- Who waits (issue 33): the operator page and `GET /v1/leases/{key}/waiters` show a key's queue
-- by the owners that asked, in grant order, and that name was not kept. Nullable: a row queued by
-- an instance that predates this column has none (it shows `null` until it leaves, within its
-- wait of at most 300 s).
ALTER TABLE lease_waiters ADD COLUMN owner text;
