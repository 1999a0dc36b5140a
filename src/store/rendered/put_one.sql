-- src/store/rendered/put_one.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The requests of the batch (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal, $4
-- key_id, $5 key, $6 token, $7 has_if_match, $8 tags, $9 request_id, $10 remote_addr, $11
-- operation, $12 etag, $13 size, $14 content_type, $15 body, $16 keep
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.token, r.has_if_match, CASE WHEN r.tags IS
        NOT NULL THEN ARRAY(SELECT json_array_elements_text(r.tags::json)) END AS tags,
        r.request_id, r.remote_addr, r.operation, r.etag, r.size, r.content_type, r.body, r.keep,
        r.i
    FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[], $6::bigint[],
        $7::boolean[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::bigint[],
        $14::text[], $15::bytea[], $16::bigint[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, token, has_if_match, tags, request_id,
        remote_addr, operation, etag, size, content_type, body, keep, i)),
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
