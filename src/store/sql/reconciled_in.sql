-- The requests of a batch of confirmations (v1.2, `POST /v1/leases/{key}/reconciled`; gate.sql
-- follows, then reconciled.sql): gate.sql's $1 to $4, then $5 keys, $6 tokens, $7 request ids,
-- $8 remote addresses (for the audit row of the record that moves to the log).
WITH req AS (
    SELECT * FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[],
        $6::bigint[], $7::text[], $8::text[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, token, request_id, remote_addr, i)),
