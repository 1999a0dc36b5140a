-- Where the history stands: the highest change id given (or the horizon, when every change
-- has been pruned) and the horizon (the highest id pruned).
SELECT coalesce((SELECT max(id) FROM changes), h.pruned_through) AS top, h.pruned_through
FROM change_horizon h
