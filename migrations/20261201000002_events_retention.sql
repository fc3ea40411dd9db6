-- Violation-log retention: drops the monthly partitions of rate_limit_events whose month is
-- more than `keep_months` months before the current one (so at least `keep_months` whole
-- months of history stay). Called by every gateway with `[database] events_retention_months`
-- at start and every hour; answers how many partitions it dropped.
CREATE FUNCTION throttle_drop_event_partitions(keep_months integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    cutoff  date := (date_trunc('month', now()) - make_interval(months => keep_months))::date;
    part    record;
    dropped integer := 0;
BEGIN
    FOR part IN
        SELECT c.relname::text AS name
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE p.relname = 'rate_limit_events'
          AND c.relname ~ '^rate_limit_events_[0-9]{4}_[0-9]{2}$'
    LOOP
        IF to_date(substr(part.name, 19), 'YYYY_MM') < cutoff THEN
            EXECUTE format('DROP TABLE IF EXISTS %I', part.name);
            dropped := dropped + 1;
        END IF;
    END LOOP;
    RETURN dropped;
END
$$;
