-- The requests of a batch of endings (gate.sql follows, then end.sql): gate.sql's $1 to $4, then
-- $5 keys, $6 tokens, $7 the endings ('released', 'abandoned' or 'recovery_required').
WITH req AS (
    SELECT * FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[],
        $6::bigint[], $7::text[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, token, ending, i)),
