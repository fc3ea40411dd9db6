-- Blocks (address or CIDR, key id, tenant) with expiry, and the violation log.

CREATE TABLE rate_limit_blocks (
    id          bigserial PRIMARY KEY,
    scope       text NOT NULL CHECK (scope IN ('ip', 'key', 'tenant')),
    value       text NOT NULL,
    reason      text,
    blocked_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    UNIQUE (scope, value)
);
-- The UNIQUE constraint indexes (scope, value) lookups; this one serves expiry sweeps
-- and "active blocks" queries.
CREATE INDEX rate_limit_blocks_expires_at_idx ON rate_limit_blocks (expires_at);

-- Every rejection, written in batches by the gateways; partitioned by month.
CREATE TABLE rate_limit_events (
    id           bigserial,
    tenant_id    text,
    api_key_id   text,
    ip           inet,
    scope        text NOT NULL,
    limit_key    text NOT NULL,
    limit_value  bigint NOT NULL,
    count        bigint NOT NULL,
    "window"     interval NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX rate_limit_events_created_at_idx ON rate_limit_events (created_at);
CREATE INDEX rate_limit_events_tenant_idx ON rate_limit_events (tenant_id, created_at);

-- Creates the partition of the month starting at `month_start` if it is missing.
CREATE FUNCTION throttle_ensure_event_partition(month_start date) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    first date := date_trunc('month', month_start)::date;
    name  text := 'rate_limit_events_' || to_char(first, 'YYYY_MM');
BEGIN
    EXECUTE format(
        'CREATE TABLE IF NOT EXISTS %I PARTITION OF rate_limit_events FOR VALUES FROM (%L) TO (%L)',
        name, first, (first + interval '1 month')::date);
END
$$;
