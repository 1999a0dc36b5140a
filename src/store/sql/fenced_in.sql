-- The requests of a batch of fenced statements (gate.sql follows, then fenced.sql and put.sql,
-- delete_head.sql or precheck.sql): gate.sql's $1 to $4, then $5 keys, $6 presented tokens, $7
-- whether If-Match was sent, $8 its strong tags as a JSON array (NULL for `*`); for the audit row
-- of a refusal, $9 request ids, $10 remote addresses and $11 the operations (`put` or `delete`);
-- for a write (NULL otherwise), $12 ETags, $13 sizes, $14 content types, $15 bodies.
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.token, r.has_if_match,
        CASE WHEN r.tags IS NOT NULL THEN ARRAY(SELECT json_array_elements_text(r.tags::json)) END
            AS tags,
        r.request_id, r.remote_addr, r.operation, r.etag, r.size, r.content_type, r.body, r.i
    FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[], $6::bigint[],
        $7::boolean[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],
        $13::bigint[], $14::text[], $15::bytea[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, token, has_if_match, tags,
        request_id, remote_addr, operation, etag, size, content_type, body, i)),
