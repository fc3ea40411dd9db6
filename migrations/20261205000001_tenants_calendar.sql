-- A tenant's own calendar for its tenant windows (calendar quotas): `calendar_tz` (an
-- IANA zone; the admin API checks the name) and `billing_anchor_day` (the day its months
-- start on). NULL: the tier's. Existing rows keep their tier's calendar.

ALTER TABLE tenants
    ADD COLUMN billing_anchor_day smallint NULL
        CONSTRAINT tenants_billing_anchor_day_check CHECK (billing_anchor_day BETWEEN 1 AND 28),
    ADD COLUMN calendar_tz text NULL;
