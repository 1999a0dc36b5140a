-- Lease metadata is stored as `json` (the text as sent), not `jsonb`: the contract takes any JSON
-- object of at most 4 KiB, and jsonb cannot hold a string with U+0000 in it. Nothing queries
-- inside metadata, so jsonb's indexing and operators were never used.
ALTER TABLE leases ALTER COLUMN metadata TYPE json USING metadata::json;
ALTER TABLE recoveries ALTER COLUMN record_metadata TYPE json USING record_metadata::json;
