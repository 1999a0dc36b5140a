-- A page of replaced recovery records, newest first; a filter bound NULL is not applied (audit/mod.rs plans
-- each call with its values, so a given one reads its index).
SELECT * FROM recoveries
WHERE ($1::text IS NULL OR key = $1) AND ($2::text IS NULL OR reason = $2)
    AND ($3::timestamptz IS NULL OR at >= $3) AND ($4::timestamptz IS NULL OR at < $4)
    AND ($5::bigint IS NULL OR id < $5)
ORDER BY id DESC LIMIT $6
