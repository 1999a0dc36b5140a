-- A fenced write of a bound body alone in its batch: snapshot_put_one() holds the rules of
-- fenced.sql and put.sql, run as a function that takes only its request's branch, which costs a
-- lone request less than the batch statement's whole plan
-- (migrations/20261209000000_lone_requests.sql says why and what holds the two forms together).
written AS (
    SELECT r.i, w.gate, w.prior_fingerprint, w.answer
    FROM req r CROSS JOIN LATERAL snapshot_put_one(r.idem, r.fp, r.principal, r.key_id, r.key,
        r.token, r.has_if_match, r.tags, r.request_id, r.remote_addr, r.operation, r.etag,
        r.size, r.content_type, r.body, r.keep) w)
SELECT i, gate, prior_fingerprint, answer FROM written
