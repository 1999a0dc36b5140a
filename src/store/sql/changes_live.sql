-- Every lease whose expiry is still to be reported, for a relay that takes the role: it keeps
-- their expiry times from then on. Reads the whole table once per change of relay.
SELECT key, token, expires_at FROM leases WHERE end_reason IS NULL AND NOT expiry_reported
