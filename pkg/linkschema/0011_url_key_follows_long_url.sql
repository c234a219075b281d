-- A link's url_key (0008) names the URL it was made from; it must go when
-- its long_url changes, whoever changes it. The shortener's UPDATE clears
-- it, but a writer that does not (a shortener from before 0008 still
-- running during a rollout, an operator's SQL) left it in place, and
-- CODE_MODE_FROM_URL then handed the link out for the old URL while it
-- redirected to the new one. The database clears it itself now.
CREATE FUNCTION links_url_key_follows_long_url() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.long_url IS DISTINCT FROM OLD.long_url THEN
        NEW.url_key := NULL;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER links_url_key_follows_long_url
    BEFORE UPDATE OF long_url ON links
    FOR EACH ROW EXECUTE FUNCTION links_url_key_follows_long_url();
