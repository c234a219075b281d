// Drives kurz's Shlink-compatible API with Shlink's own JS SDK, as
// shlink-web-client does, and prints what each call answered (ok) or the
// error the SDK raised (error, with the SDK's ErrorType name) as one JSON
// object. Run by TestShlinkSDK (../../clients_test.go), twice: `node
// shlink.mjs make` makes, reads, lists and edits a link, and lists the
// domains; `node shlink.mjs
// remove`, once the test has read it through kurz's own API, deletes it.
//
// env: KURZ_URL (the gateway), KURZ_KEY (an API key), KURZ_SLUG (a fresh
// custom slug), KURZ_LONG (a fresh long URL), KURZ_ADAPTER (fetch or node:
// the SDK's two HTTP clients).
import { ShlinkApiClient } from '@shlinkio/shlink-js-sdk';
import { ErrorType } from '@shlinkio/shlink-js-sdk/api-contract';
import { FetchHttpClient } from '@shlinkio/shlink-js-sdk/fetch';
import { NodeHttpClient } from '@shlinkio/shlink-js-sdk/node';

const { KURZ_URL, KURZ_KEY, KURZ_SLUG, KURZ_LONG, KURZ_ADAPTER } = process.env;
const http = KURZ_ADAPTER === 'node' ? new NodeHttpClient() : new FetchHttpClient();
const api = new ShlinkApiClient(http, { baseUrl: KURZ_URL, apiKey: KURZ_KEY });
const stranger = new ShlinkApiClient(http, { baseUrl: KURZ_URL, apiKey: 'kurz_not-a-key' });

const out = {};
const step = async (name, call) => {
  try {
    out[name] = { ok: (await call()) ?? null };
  } catch (e) {
    // The SDK throws Shlink's problem details as they came; anything else
    // (a TypeError of a body that is not JSON) is a failure of its own.
    out[name] = e instanceof Error
      ? { thrown: String(e) }
      : { error: { ...e, errorType: Object.keys(ErrorType).find((k) => ErrorType[k] === e.type) ?? null } };
  }
};

const code = { shortCode: KURZ_SLUG };
if (process.argv[2] === 'remove') {
  await step('delete', () => api.deleteShortUrl(code));
  await step('missing', () => api.getShortUrl(code));
  await step('badKey', () => stranger.listShortUrls());
} else {
  await step('health', () => api.health());
  await step('create', () => api.createShortUrl({
    longUrl: KURZ_LONG, customSlug: KURZ_SLUG, tags: ['sdk', 'shlink'], title: 'Made by the SDK',
  }));
  await step('createOther', () => api.createShortUrl({ longUrl: `${KURZ_LONG}/other`, tags: ['sdk'] }));
  await step('get', () => api.getShortUrl(code));
  await step('page1', () => api.listShortUrls({ page: '1', itemsPerPage: 1, tags: ['sdk'] }));
  await step('page2', () => api.listShortUrls({ page: '2', itemsPerPage: 1, tags: ['sdk'], tagsMode: 'any' }));
  await step('ordered', () => api.listShortUrls({ orderBy: { field: 'dateCreated', dir: 'DESC' } }));
  await step('search', () => api.listShortUrls({ searchTerm: 'sdk' }));
  await step('edit', () => api.updateShortUrl(code, {
    longUrl: `${KURZ_LONG}/edited`, tags: ['edited'], title: 'Edited by the SDK',
  }));
  await step('visits', () => api.getShortUrlVisits(code));
  await step('tags', () => api.listTags());
  await step('domains', () => api.listDomains());
  await step('taken', () => api.createShortUrl({ longUrl: `${KURZ_LONG}/taken`, customSlug: KURZ_SLUG }));
}
console.log(JSON.stringify(out));
