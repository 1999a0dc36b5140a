-- The requests of a batch of renewals (gate.sql follows, then renew.sql): gate.sql's $1 to $4,
-- then $5 keys, $6 tokens, $7 the new TTLs in ms, or NULL to keep the lease's.
WITH req AS (
    SELECT * FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[],
        $6::bigint[], $7::bigint[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, token, ttl_ms, i)),
