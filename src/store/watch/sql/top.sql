-- The highest change id given, and the highest pruned.
SELECT (SELECT max(last_id) FROM change_epochs) AS top, h.pruned_through
FROM change_horizon h
