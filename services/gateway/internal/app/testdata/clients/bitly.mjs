// Drives kurz's Bitly-compatible API with the bitly Node SDK and prints
// what each call answered (ok) or the error it raised (error: Bitly's
// error body, as the SDK throws it) as one JSON object. Run by
// TestBitlySDK (../../clients_test.go), twice: `node bitly.mjs make`
// shortens a URL and reads, updates and counts its bitlink; `node
// bitly.mjs remove`, once the test has read it through kurz's own API,
// deletes it.
//
// env: KURZ_HOST (the host the SDK's apiUrl names), KURZ_PORT (its TLS
// port), KURZ_KEY (an API key), KURZ_LONG (a fresh long URL),
// KURZ_BITLINK (remove: the bitlink to delete).
//
// The SDK sends every call to https://<apiUrl>/v4/…: the host is an
// option, the port is not (a host:port comes out as [host:port]). A
// gateway on 443 needs nothing more; here a request interceptor of the
// axios it calls (the SDK has no hook of its own) adds the test's port
// and changes nothing else.
import axios from 'axios';
import bitly from 'bitly';

const { KURZ_HOST, KURZ_PORT, KURZ_KEY, KURZ_LONG, KURZ_BITLINK } = process.env;
axios.interceptors.request.use((config) => {
  const u = new URL(config.url);
  if (u.hostname === KURZ_HOST) u.port = KURZ_PORT;
  return { ...config, url: u.href };
});

const client = new bitly.BitlyClient(KURZ_KEY, { apiUrl: KURZ_HOST });
const stranger = new bitly.BitlyClient('kurz_not-a-key', { apiUrl: KURZ_HOST });

const out = {};
const step = async (name, call) => {
  try {
    out[name] = { ok: await call() };
  } catch (e) {
    // The SDK throws Bitly's error body (isBitlyErrResponse tells it);
    // a failure of its own is an Error.
    out[name] = e instanceof Error
      ? { thrown: String(e) }
      : { error: e, isBitlyErrResponse: bitly.isBitlyErrResponse(e) };
  }
};

if (process.argv[2] === 'remove') {
  await step('delete', () => client.bitlyRequest(`bitlinks/${KURZ_BITLINK}`, {}, 'DELETE'));
  await step('missing', () => client.info(KURZ_BITLINK));
  await step('badToken', () => stranger.shorten(`${KURZ_LONG}/stranger`));
} else {
  await step('shorten', () => client.shorten(KURZ_LONG));
  await step('again', () => client.shorten(KURZ_LONG));
  const id = out.shorten.ok?.id ?? 'bit.ly/missing';
  await step('info', () => client.info(id));
  await step('getByLink', () => client.getBitlink(out.shorten.ok?.link ?? id));
  await step('expand', () => client.expand(id));
  await step('update', () => client.bitlyRequest(`bitlinks/${id}`, {
    long_url: `${KURZ_LONG}/updated`, title: 'Updated by the SDK', tags: ['sdk'],
  }, 'PATCH'));
  await step('clicks', () => client.clicks(id));
  await step('clicksByDay', () => client.clicksByDay(id));
  await step('summary', () => client.bitlyRequest(`bitlinks/${id}/clicks/summary`, { unit: 'day', units: 7 }, 'GET'));
  await step('user', () => client.bitlyRequest('user', {}, 'GET'));
  await step('groups', () => client.bitlyRequest('groups', {}, 'GET'));
}
console.log(JSON.stringify(out));
