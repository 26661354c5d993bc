-- Member standing: a suspended Agent keeps its credentials but is no longer eligible, so its
-- declaration lock answers 403 not_authorized (spec/000, "HTTP response status codes").
ALTER TABLE members ADD COLUMN status TEXT NOT NULL DEFAULT 'active';
