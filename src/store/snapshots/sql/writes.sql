-- A batch's fenced writes: one per request, decided by its own gate row.
w AS (
    SELECT r.*, r.i AS gi, r.key AS subject, false AS over_limit FROM gate r),
