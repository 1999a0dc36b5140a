-- Every change to api_keys is notified on `snapfence_api_keys` at commit, with the id of the
-- transaction that made it, so that each instance's copy of the live keys
-- (store::keys::KeyCache) reloads and then confirms that id on `snapfence_api_keys_applied`;
-- `snapfence keys create|revoke` wait for those confirmations before they return.
CREATE FUNCTION notify_api_keys_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('snapfence_api_keys', txid_current()::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION notify_api_keys_changed();
