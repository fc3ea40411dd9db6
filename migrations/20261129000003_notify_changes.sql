-- Gateways LISTEN on throttle_changes and refresh their in-memory snapshot of keys,
-- tenants, overrides and blocks when any of them changes (SQL edits included).

CREATE FUNCTION throttle_notify_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('throttle_changes', TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE TRIGGER tenants_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION throttle_notify_change();
CREATE TRIGGER api_keys_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION throttle_notify_change();
CREATE TRIGGER api_key_rate_limits_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON api_key_rate_limits
    FOR EACH STATEMENT EXECUTE FUNCTION throttle_notify_change();
CREATE TRIGGER rate_limit_blocks_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limit_blocks
    FOR EACH STATEMENT EXECUTE FUNCTION throttle_notify_change();
