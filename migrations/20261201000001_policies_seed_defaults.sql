-- rate_limit_policies takes the seed's defaults: an INSERT naming only (id, name) gives the
-- seed's limited tier (10/s, 500/min, 10000/h, 100000/day, 1000000/month, burst 1.5), not
-- an unlimited one. 0 still means "no such window"; the NULLs written so far (which meant
-- the same) become 0, and NULL is no longer accepted.
UPDATE rate_limit_policies SET
    req_per_second   = COALESCE(req_per_second, 0),
    req_per_minute   = COALESCE(req_per_minute, 0),
    req_per_hour     = COALESCE(req_per_hour, 0),
    req_per_day      = COALESCE(req_per_day, 0),
    req_per_month    = COALESCE(req_per_month, 0),
    burst_multiplier = COALESCE(burst_multiplier, 1.0)
WHERE req_per_second IS NULL OR req_per_minute IS NULL OR req_per_hour IS NULL
   OR req_per_day IS NULL OR req_per_month IS NULL OR burst_multiplier IS NULL;

ALTER TABLE rate_limit_policies
    ALTER COLUMN req_per_second   SET DEFAULT 10,
    ALTER COLUMN req_per_second   SET NOT NULL,
    ALTER COLUMN req_per_minute   SET DEFAULT 500,
    ALTER COLUMN req_per_minute   SET NOT NULL,
    ALTER COLUMN req_per_hour     SET DEFAULT 10000,
    ALTER COLUMN req_per_hour     SET NOT NULL,
    ALTER COLUMN req_per_day      SET DEFAULT 100000,
    ALTER COLUMN req_per_day      SET NOT NULL,
    ALTER COLUMN req_per_month    SET DEFAULT 1000000,
    ALTER COLUMN req_per_month    SET NOT NULL,
    ALTER COLUMN burst_multiplier SET DEFAULT 1.5,
    ALTER COLUMN burst_multiplier SET NOT NULL;
