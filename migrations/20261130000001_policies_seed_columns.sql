-- rate_limit_policies gets the seed's columns and becomes live: one row per tier, the
-- truth for that tier's key windows, burst and algorithm. Converted in place, keeping the
-- data: the id becomes the tier name, the key windows of the old `limits` JSONB become
-- columns, and api_key_rate_limits.policy_id follows the id (integer -> tier name).
--
--   id TEXT PRIMARY KEY       the tier name (what api_keys.tier and tenants.tier name)
--   name TEXT NOT NULL        a label for humans
--   req_per_second .. req_per_month INT   0 or NULL: no such window
--   burst_multiplier FLOAT    token-bucket capacity = limit x burst (NULL: 1.0)
--   algorithm TEXT NULL       for every window; NULL: each window's default
--   created_at, updated_at    timestamptz

-- 1. api_key_rate_limits.policy_id: the tier name instead of the serial id.
ALTER TABLE api_key_rate_limits ADD COLUMN policy_name text;
UPDATE api_key_rate_limits o SET policy_name = p.name
    FROM rate_limit_policies p WHERE p.id = o.policy_id;
ALTER TABLE api_key_rate_limits DROP COLUMN policy_id;  -- and its foreign key
ALTER TABLE api_key_rate_limits RENAME COLUMN policy_name TO policy_id;

-- 2. The seed's columns, filled from the key windows of `limits`.
ALTER TABLE rate_limit_policies
    ADD COLUMN req_per_second   integer,
    ADD COLUMN req_per_minute   integer,
    ADD COLUMN req_per_hour     integer,
    ADD COLUMN req_per_day      integer,
    ADD COLUMN req_per_month    integer,
    ADD COLUMN burst_multiplier double precision DEFAULT 1.0,
    ADD COLUMN algorithm        text,
    ADD COLUMN created_at       timestamptz NOT NULL DEFAULT now();

UPDATE rate_limit_policies p SET
    req_per_second = (p.limits -> 'key' -> 'per_second' ->> 'limit')::integer,
    req_per_minute = (p.limits -> 'key' -> 'per_minute' ->> 'limit')::integer,
    req_per_hour   = (p.limits -> 'key' -> 'per_hour'   ->> 'limit')::integer,
    req_per_day    = (p.limits -> 'key' -> 'per_day'    ->> 'limit')::integer,
    req_per_month  = (p.limits -> 'key' -> 'per_month'  ->> 'limit')::integer,
    -- capacity / limit of a token-bucket window, else no burst.
    burst_multiplier = COALESCE((
        SELECT (w.value ->> 'capacity')::float8 / NULLIF((w.value ->> 'limit')::float8, 0)
        FROM jsonb_each(CASE WHEN jsonb_typeof(p.limits -> 'key') = 'object'
                             THEN p.limits -> 'key' ELSE '{}'::jsonb END) w
        WHERE w.value ->> 'algorithm' = 'token_bucket' AND w.value ->> 'capacity' IS NOT NULL
        ORDER BY w.key LIMIT 1), 1.0),
    -- One algorithm for every window, when it is not just each window's default.
    algorithm = (
        SELECT CASE WHEN count(DISTINCT w.value ->> 'algorithm') = 1
                         AND bool_or(w.value ->> 'algorithm' IS DISTINCT FROM
                                     CASE w.key WHEN 'per_second' THEN 'token_bucket'
                                                WHEN 'per_minute' THEN 'token_bucket'
                                                WHEN 'per_hour'   THEN 'sliding_window'
                                                WHEN 'per_day'    THEN 'sliding_window'
                                                ELSE 'fixed_window' END)
                    THEN min(w.value ->> 'algorithm') END
        FROM jsonb_each(CASE WHEN jsonb_typeof(p.limits -> 'key') = 'object'
                             THEN p.limits -> 'key' ELSE '{}'::jsonb END) w);

ALTER TABLE rate_limit_policies DROP COLUMN limits;

-- 3. The id: the tier name. `name` stays (NOT NULL, a label; no longer unique).
ALTER TABLE rate_limit_policies DROP CONSTRAINT rate_limit_policies_name_key;
ALTER TABLE rate_limit_policies DROP COLUMN id;  -- and its primary key and sequence
ALTER TABLE rate_limit_policies ADD COLUMN id text;
UPDATE rate_limit_policies SET id = name;
ALTER TABLE rate_limit_policies ALTER COLUMN id SET NOT NULL;
ALTER TABLE rate_limit_policies ADD PRIMARY KEY (id);

ALTER TABLE api_key_rate_limits ADD CONSTRAINT api_key_rate_limits_policy_id_fkey
    FOREIGN KEY (policy_id) REFERENCES rate_limit_policies (id) ON UPDATE CASCADE;

-- 4. updated_at follows changes (unless the UPDATE sets it), and every gateway reloads.
CREATE FUNCTION throttle_touch_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER rate_limit_policies_touch BEFORE UPDATE ON rate_limit_policies
    FOR EACH ROW EXECUTE FUNCTION throttle_touch_updated_at();
CREATE TRIGGER rate_limit_policies_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limit_policies
    FOR EACH STATEMENT EXECUTE FUNCTION throttle_notify_change();
