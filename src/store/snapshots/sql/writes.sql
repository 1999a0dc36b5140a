-- The writes of a batch of fenced requests (`w`, which fenced.sql checks): one per request, each
-- decided by its own gate row (`gi`) and named in the audit log by its key (`subject`).
w AS (
    SELECT r.*, r.i AS gi, r.key AS subject, false AS over_limit,
        false AS in_txn
    FROM req r),
