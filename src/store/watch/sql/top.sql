-- Where the history stands: the highest change id given (the newest epoch's last) and the
-- horizon (the highest id pruned).
SELECT (SELECT max(last_id) FROM change_epochs) AS top, h.pruned_through
FROM change_horizon h
