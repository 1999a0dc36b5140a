-- Every change to api_keys is notified on `snapfence_api_keys`, at commit, so that each
-- instance's copy of the live keys (store::keys::KeyCache) reloads: a revocation or a new key
-- reaches every instance within the delivery of one notification.
CREATE FUNCTION notify_api_keys_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('snapfence_api_keys', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION notify_api_keys_changed();
