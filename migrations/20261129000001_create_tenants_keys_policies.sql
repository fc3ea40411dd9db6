-- Tenants, hashed API keys, the tiers of gateway.toml (written through at start) and
-- per-key overrides. Keys are never stored in clear: only their SHA-256 and a short
-- prefix for humans.

CREATE TABLE tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    tier        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per tier of gateway.toml, kept in sync by every gateway at start, so SQL can
-- join events and keys to tier names and their configured windows.
CREATE TABLE rate_limit_policies (
    id          serial PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    limits      jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (id),
    key_sha256  text NOT NULL UNIQUE CHECK (key_sha256 ~ '^[0-9a-f]{64}$'),
    prefix      text NOT NULL,
    tier        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_tenant_id_idx ON api_keys (tenant_id);

-- Per-key limits: another policy (tier) for the key, and/or windows overriding the
-- tier's key windows field by field, e.g. {"per_minute": 1000, "per_hour": 20000}.
CREATE TABLE api_key_rate_limits (
    api_key_id       text PRIMARY KEY REFERENCES api_keys (id) ON DELETE CASCADE,
    policy_id        integer REFERENCES rate_limit_policies (id),
    custom_override  jsonb
);
