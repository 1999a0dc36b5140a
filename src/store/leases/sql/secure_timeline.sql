-- The new position of the token sequence if this WAL timeline is new to it (timeline.rs).
SELECT secure_token_timeline()
