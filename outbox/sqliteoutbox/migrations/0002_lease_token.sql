-- Each lease names the claim that made it: a relay marks and gives back only
-- the rows whose lease_token (and lease_until) are still the ones its claim
-- set, so a relay whose lease ran out while another relay took its rows over
-- cannot mark or release that relay's rows.
ALTER TABLE outbox ADD COLUMN lease_token INTEGER;
