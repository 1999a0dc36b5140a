-- Holds every grant off until the transaction ends (sequence_ahead.sql says why).
LOCK TABLE leases IN SHARE ROW EXCLUSIVE MODE
