-- link.updated only for a change a subscriber can see: an update that
-- changes nothing but url_key (a CODE_MODE_FROM_URL link giving its URL
-- up to a new link, or once its visits are spent) queued one, under a
-- new event id, for an unchanged link. 0007's function stays; the update
-- trigger now fires only when the row changed beyond url_key.
DROP TRIGGER links_webhooks ON links;
CREATE TRIGGER links_webhooks AFTER INSERT ON links
    FOR EACH ROW EXECUTE FUNCTION webhook_enqueue_link_event();
CREATE TRIGGER links_webhooks_update AFTER UPDATE ON links
    FOR EACH ROW WHEN ((to_jsonb(OLD) - 'url_key') IS DISTINCT FROM (to_jsonb(NEW) - 'url_key'))
    EXECUTE FUNCTION webhook_enqueue_link_event();
