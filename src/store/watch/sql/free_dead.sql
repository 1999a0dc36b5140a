-- Ends the relay role's term when its holder ($1 never: an instance does not free its own) is
-- dead, its liveness lock free (see waiter_instance_alive), so a claim takes it at once instead of
-- after the term. Changes nothing while the holder lives.
UPDATE change_relay SET expires_at = now()
WHERE expires_at > now() AND holder <> $1
    AND CASE WHEN holder ~ '^[0-9]+$' THEN NOT waiter_instance_alive(holder::integer) ELSE false END
