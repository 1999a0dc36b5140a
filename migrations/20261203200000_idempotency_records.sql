-- Idempotency-Key (contract v1.1): the first completed answer of a changing call that carried an
-- Idempotency-Key, kept per principal (the API key's name; '' without authentication) so that
-- the same call sent again is answered the same way and changes nothing. Written by the very
-- statement that makes the change (or writes the refusal's audit row), so a record exists
-- exactly when its change committed. `answer` is that statement's own result, as JSON, which
-- the service renders again on a replay; `fingerprint` is the SHA-256 of what makes a request
-- the same request (method, route, key, token, preconditions, body), so that a key reused for
-- another request is told apart. Rows go after the retention window (24 h by default).
CREATE TABLE idempotency_records (
    principal   text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    fingerprint bytea       NOT NULL,
    answer      json        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (principal, key)
);
-- Retention deletes the oldest first.
CREATE INDEX idempotency_records_at ON idempotency_records (at);
