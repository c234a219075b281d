// kurz console: a single-page app over the gateway's JSON API. The API key
// lives in sessionStorage (this tab only) and goes out as a Bearer token.
// Every string from the API is rendered with textContent or setAttribute,
// never parsed as HTML.
'use strict';

const KEY = 'kurz.apiKey';
// SIGNED_OUT carries a sign-out's message across the reload that follows it.
const SIGNED_OUT = 'kurz.signedOut';
// SESSION names the sign-in: a random id kept with the key, and carried by
// every history entry shown while signed in (history.state.session).
const SESSION = 'kurz.session';
const PAGE_SIZE = 20;
const SVG_NS = 'http://www.w3.org/2000/svg';
// The chart's series, stacked bottom to top: field, label, colour.
const SERIES = [['human', 'Human', '#2f6fdf'], ['bot', 'Bot', '#9aa3ad'], ['flood', 'Flood', '#e0662b']];
// Stats ranges: hours back from now, bucket width.
const RANGES = { '24h': [24, 'hour'], '7d': [24 * 7, 'hour'], '30d': [24 * 30, 'day'] };

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;
const num = (x) => Number(x || 0); // proto JSON sends int64 as strings

const state = { tokens: [''], page: 0, tag: '', qrURL: '', statsCode: null, webhook: '', deliveryTokens: [''], deliveryPage: 0 };

class APIError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function apiKey() { return sessionStorage.getItem(KEY) || ''; }

// api calls the gateway and returns the decoded JSON (or a Blob for images,
// null for 204); failures throw an APIError carrying the API's own message.
async function api(method, path, body, key = apiKey()) {
  return (await apiCall(method, path, body, key)).body;
}

// apiCall is api that also returns the answer's status: { status, body }.
async function apiCall(method, path, body, key = apiKey()) {
  const init = { method, headers: { Authorization: 'Bearer ' + key }, cache: 'no-store' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new APIError(0, 'The gateway did not answer (' + e.message + ')');
  }
  const type = resp.headers.get('Content-Type') || '';
  if (!resp.ok) {
    let msg = 'The gateway answered ' + resp.status + ' ' + resp.statusText;
    if (type.startsWith('application/problem+json')) {
      const b = await resp.json().catch(() => null);
      if (b && typeof b.detail === 'string') msg = b.detail;
    }
    if (resp.status === 401 && key && key === apiKey()) signOut(msg);
    throw new APIError(resp.status, msg);
  }
  if (resp.status === 204) return { status: 204, body: null };
  return { status: resp.status, body: await (type.startsWith('application/json') ? resp.json() : resp.blob()) };
}

// el builds an element; "text" sets textContent, "class" the class, other
// keys are attributes.
function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'text') e.textContent = v;
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v);
  }
  e.append(...children);
  return e;
}

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function button(text, cls, onclick) {
  const b = el('button', { type: 'button', class: cls, text });
  b.addEventListener('click', onclick);
  return b;
}

// oneAtATime wraps a form's submit handler (a form on a page; the dialogs
// have submitDialog): a submit while the last one is in flight is dropped
// (two clicks on a slow Add would create the webhook twice, the second
// one's secret never shown), and the form's submit button is disabled
// meanwhile.
function oneAtATime(handler) {
  let busy = false;
  return async (ev) => {
    ev.preventDefault();
    const submit = ev.currentTarget.querySelector('[type=submit]');
    if (busy) return;
    busy = true;
    submit.disabled = true;
    try {
      await handler(ev);
    } finally {
      busy = false;
      submit.disabled = false;
    }
  };
}

// --- dialogs that send ---------------------------------------------------

// Each opening of a dialog that sends something (the link form, the
// confirmations) is a token, { id, saving, ... }: an answer acts only on the
// opening it was sent from, never on a later one (a late answer must not
// close, or write into, the form opened after it), and an opening's save
// never blocks a later opening.
//
// While a save is in flight the dialog says so, its buttons are disabled
// and Escape does not close it: Cancel waits for the answer rather than
// pretend to cancel a request that was sent and will be carried out, and
// hide its outcome (the link made, or the error to fix). The wait is
// bounded: the gateway answers every call within its call timeout. (Chrome
// closes a dialog on a second Escape whatever its cancel handler says: the
// token covers that case.)
const openings = {};

function openDialog(id, props = {}) {
  const o = { id, saving: false, ...props };
  openings[id] = o;
  showSaving(o, false);
  $(id).showModal();
  return o;
}

// isOpen reports whether o is its dialog's current opening, still open.
function isOpen(o) { return openings[o.id] === o && $(o.id).open; }

function showSaving(o, on) {
  const d = $(o.id);
  for (const b of d.querySelectorAll('button')) b.disabled = on;
  d.querySelector('.saving').hidden = !on;
}

for (const id of ['link-dialog', 'confirm-dialog', 'webhook-confirm-dialog', 'domain-confirm-dialog']) {
  $(id).addEventListener('cancel', (ev) => { if (openings[id] && openings[id].saving) ev.preventDefault(); });
}

// submitDialog sends the opening o's request, once at a time (a second
// click on a slow Create would make the link twice), and acts on its
// answer: an error goes to errorId, a success closes the dialog and calls
// done with the answer. An opening closed meanwhile only gets reload(): the
// list shows what the request did.
async function submitDialog(o, errorId, request, done, reload) {
  if (o.saving) return;
  o.saving = true;
  showSaving(o, true);
  $(errorId).textContent = '';
  let value, error;
  try {
    value = await request();
  } catch (e) {
    error = e;
  } finally {
    o.saving = false;
    if (openings[o.id] === o) showSaving(o, false);
  }
  if (!isOpen(o)) {
    reload();
    return;
  }
  if (error) {
    $(errorId).textContent = error.message;
    return;
  }
  $(o.id).close();
  done(value);
}

// safeHref lets only http(s) URLs become links.
function safeHref(u) { return /^https?:\/\//i.test(u || '') ? u : '#'; }

// newLoad starts a load of a view and returns whether it is still the
// latest one started: an answer that arrives after a newer load began must
// not draw over it (a list fetched before a save would hide what was saved).
const latestLoad = {};
function newLoad(view) {
  const n = (latestLoad[view] || 0) + 1;
  latestLoad[view] = n;
  return () => latestLoad[view] === n;
}

// countRender counts a view's finished loads (data-renders), so a test can
// wait for a load to land.
function countRender(id) {
  const v = $(id);
  v.dataset.renders = String(num(v.dataset.renders) + 1);
}

// --- navigation ---------------------------------------------------------

function show(view) {
  for (const v of ['signin', 'links', 'domains', 'stats', 'webhooks']) $('view-' + v).hidden = v !== view;
}

// linkPath is a link's API path: /v1/links/<code>, with ?domain= (or, for
// PATCH, a "domain" in the body) for a link on a custom domain.
function linkPath(l, suffix = '') {
  return '/v1/links/' + enc(l.code) + suffix + (l.domain ? (suffix.includes('?') ? '&' : '?') + 'domain=' + enc(l.domain) : '');
}

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

// fromEarlierSignIn reports a history entry shown under an earlier
// sign-in (reached with Back after signing out): what it showed was the
// last key's, not this one's.
function fromEarlierSignIn() {
  const st = history.state;
  return !!st && typeof st.session === 'string' && st.session !== (sessionStorage.getItem(SESSION) || '');
}

function route() {
  const key = apiKey();
  $('nav').hidden = !key;
  if (!key) {
    show('signin');
    $('signin-key').focus();
    return;
  }
  // History entries cannot be removed from the tab: one of an earlier
  // sign-in becomes this one's links view, and a new one (a hash
  // navigation) becomes this sign-in's.
  if (fromEarlierSignIn()) history.replaceState({ session: sessionStorage.getItem(SESSION) || '' }, '', location.pathname + location.search + '#/links');
  else if (!history.state) history.replaceState({ session: sessionStorage.getItem(SESSION) || '' }, '');
  $('nav-key').textContent = 'Key ' + key.split('_').slice(0, 2).join('_');
  // #/stats/<code> on the default domain, #/stats/<domain>/<code> on a custom one.
  const m = location.hash.match(/^#\/stats\/(?:([a-z0-9.-]+)\/)?([A-Za-z0-9_-]+)$/);
  if (m) {
    show('stats');
    loadStats({ code: m[2], domain: m[1] || '' });
  } else if (location.hash === '#/domains') {
    show('domains');
    loadDomains();
  } else if (location.hash === '#/webhooks') {
    show('webhooks');
    $('webhook-secret-notice').hidden = true;
    loadWebhooks();
  } else {
    show('links');
    loadLinks();
  }
}

// signOut forgets the key and starts the page afresh at the links view:
// nothing the key showed (lists, stats, notices, open dialogs, the tag
// filter, the address of a link's stats) may greet the next key signed in
// in this tab, nor be reached with Back (route turns the history entries
// of this sign-in into the next one's links view). msg is shown on the
// sign-in form.
function signOut(msg) {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(SESSION);
  if (msg) sessionStorage.setItem(SIGNED_OUT, msg);
  history.replaceState(null, '', location.pathname + location.search);
  location.reload();
}

// --- sign-in ------------------------------------------------------------

$('signin-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const key = $('signin-key').value.trim();
  $('signin-error').textContent = '';
  try {
    await api('GET', '/v1/links?page_size=1', undefined, key);
  } catch (e) {
    $('signin-error').textContent = e.message;
    return;
  }
  // A link's stats opened before signing in are shown after it, unless
  // the address is one an earlier sign-in showed (Back after signing out).
  const deepLink = location.hash.startsWith('#/stats/') && !history.state;
  sessionStorage.setItem(KEY, key);
  sessionStorage.setItem(SESSION, Array.from(crypto.getRandomValues(new Uint32Array(4)), (x) => x.toString(36)).join(''));
  $('signin-key').value = '';
  go(deepLink ? location.hash : '#/links');
});
$('signout').addEventListener('click', () => signOut(''));

// --- links --------------------------------------------------------------

async function loadLinks() {
  const latest = newLoad('links');
  $('links-error').textContent = '';
  const q = new URLSearchParams({ page_size: PAGE_SIZE });
  if (state.tokens[state.page]) q.set('page_token', state.tokens[state.page]);
  if (state.tag) q.set('tag', state.tag);
  try {
    const page = await api('GET', '/v1/links?' + q);
    if (!latest()) return;
    state.tokens.length = state.page + 1;
    if (page.nextPageToken) state.tokens.push(page.nextPageToken);
    renderLinks(page.links || []);
    loadClicks(page.links || [], latest);
  } catch (e) {
    if (latest()) $('links-error').textContent = e.message;
  } finally {
    countRender('view-links');
  }
}

// LIFETIME_MS is the longest range analytics counts (400 days), less an
// hour for its rounding: a link's clicks are those of its life up to it.
const LIFETIME_MS = (400 * 24 - 1) * 3600 * 1000;

// loadClicks fills the page's Clicks column from one POST
// /v1/links:clickCounts, over the range from the oldest link's creation
// (codes are never reused, so a younger link has no clicks before its
// own). The list is already shown and works without it: a failure leaves
// "–" in the column, not an error over the list. latest is the list's
// load: a later load's rows are not filled with this one's counts.
// data-clicks on the table counts the fills that landed, for tests.
async function loadClicks(links, latest) {
  if (links.length === 0) return;
  const now = Date.now();
  const oldest = Math.min(now - 3600 * 1000, ...links.map((l) => new Date(l.createTime).getTime() || now));
  const start = new Date(Math.max(oldest, now - LIFETIME_MS));
  let counts = null;
  try {
    const resp = await api('POST', '/v1/links:clickCounts', {
      links: links.map((l) => (l.domain ? { code: l.code, domain: l.domain } : { code: l.code })),
      startTime: start.toISOString(),
    });
    counts = new Map((resp.links || []).map((lc) => [(lc.domain || '') + '/' + lc.code, lc.counts || {}]));
  } catch (e) {
    // The column says "–"; the list and its error line stay as they are.
  }
  if (!latest()) return;
  for (const row of $('links-body').children) {
    const c = counts && counts.get(row.dataset.domain + '/' + row.dataset.code);
    const cell = row.querySelector('td.clicks');
    cell.textContent = c ? String(num(c.total)) : '–';
    cell.title = c ? 'human ' + num(c.human) + ', bot ' + num(c.bot) + ', flood ' + num(c.flood) : 'click counts are not available';
  }
  const t = $('links-table');
  t.dataset.clicks = String(num(t.dataset.clicks) + 1);
}

function renderLinks(links) {
  $('links-body').replaceChildren(...links.map(linkRow));
  $('links-empty').hidden = links.length > 0;
  $('page-prev').disabled = state.page === 0;
  $('page-next').disabled = state.tokens.length <= state.page + 1;
  $('page-label').textContent = 'Page ' + (state.page + 1);
}

function linkStatus(l) {
  if (l.disabled) return 'disabled';
  if (l.expireTime && new Date(l.expireTime) < new Date()) return 'expired';
  return 'active';
}

// targetCell shows the link's title, when it has one, above its long URL.
function targetCell(l) {
  const td = el('td', {});
  if (l.title) td.append(el('span', { class: 'link-title', title: l.title, text: l.title }), el('br'));
  td.append(el('span', { class: 'target', title: l.longUrl, text: l.longUrl }));
  return td;
}

function linkRow(l) {
  const status = linkStatus(l);
  const first = el('td', {}, el('a', { href: safeHref(l.shortUrl), class: 'short', target: '_blank', rel: 'noopener noreferrer', text: l.shortUrl }));
  if (l.passwordProtected) first.append(' ', el('span', { class: 'tag', text: 'password' }));
  return el('tr', { 'data-code': l.code, 'data-domain': l.domain || '' },
    first,
    targetCell(l),
    el('td', {}, ...(l.tags || []).map((t) => el('span', { class: 'tag', text: t }))),
    el('td', { class: 'clicks', text: '…' }),
    el('td', { text: num(l.maxVisits) ? 'max ' + num(l.maxVisits) : '—' }),
    el('td', { text: l.expireTime ? new Date(l.expireTime).toLocaleDateString() : 'never' }),
    el('td', { class: 'status ' + status, text: status }),
    el('td', { class: 'actions' },
      el('a', { href: '#/stats/' + (l.domain ? enc(l.domain) + '/' : '') + enc(l.code), class: 'button stats', text: 'Stats' }),
      button('QR', 'qr', () => showQR(l)),
      button('Edit', 'edit', () => openForm(l)),
      button('Revoke', 'revoke danger', () => confirmRevoke(l))));
}

$('filter-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  state.tag = $('filter-tag').value.trim();
  state.tokens = [''];
  state.page = 0;
  loadLinks();
});
$('page-prev').addEventListener('click', () => { state.page = Math.max(0, state.page - 1); loadLinks(); });
$('page-next').addEventListener('click', () => { state.page++; loadLinks(); });

// --- create and edit ----------------------------------------------------

// dateInput is an RFC 3339 time as a local yyyy-mm-dd for <input type=date>.
function dateInput(iso) {
  const d = new Date(iso);
  return [d.getFullYear(), d.getMonth() + 1, d.getDate()].map((x, i) => String(x).padStart(i ? 2 : 4, '0')).join('-');
}

const TARGETS = [['iosUrl', 'f-ios'], ['androidUrl', 'f-android'], ['desktopUrl', 'f-desktop']];

// fillDomains offers the verified domains in the form's selector (the
// link's own when editing); a failed load leaves the default domain only,
// and an answer for an earlier opening of the form is dropped.
async function fillDomains(o) {
  const link = o.link;
  const sel = $('f-domain');
  sel.replaceChildren(el('option', { value: '', text: 'default domain' }));
  sel.disabled = !!link;
  if (link) {
    if (link.domain) sel.append(el('option', { value: link.domain, text: link.domain }));
    sel.value = link.domain || '';
    return;
  }
  try {
    const resp = await api('GET', '/v1/domains');
    if (openings['link-dialog'] !== o) return;
    for (const d of resp.domains || []) if (d.verified) sel.append(el('option', { value: d.name, text: d.name }));
  } catch (e) {
    // The default domain still works.
  }
  if (openings['link-dialog'] === o) sel.dataset.loaded = '1';
}

function openForm(link) {
  $('f-domain').dataset.loaded = '';
  const t = (link && link.deviceTargets) || {};
  $('link-form-title').textContent = link ? 'Edit ' + link.code : 'New link';
  $('link-save').textContent = link ? 'Save' : 'Create';
  $('f-long-url').value = link ? link.longUrl : '';
  $('f-alias').value = link ? link.code : '';
  $('f-alias').disabled = !!link;
  $('f-from-url').checked = false;
  $('f-from-url-label').hidden = !!link;
  $('f-tags').value = link ? (link.tags || []).join(', ') : '';
  $('f-title').value = link ? link.title || '' : '';
  $('f-expire').value = link && link.expireTime ? dateInput(link.expireTime) : '';
  $('f-max-visits').value = link && num(link.maxVisits) ? num(link.maxVisits) : '';
  $('f-password').value = '';
  $('f-password').placeholder = link && link.passwordProtected ? 'unchanged' : 'none';
  $('f-clear-password').checked = false;
  $('f-clear-password-label').hidden = !(link && link.passwordProtected);
  for (const [k, id] of TARGETS) $(id).value = t[k] || '';
  $('f-rules').value = rulesText(link && link.rules);
  $('f-variants').value = variantsText(link && link.variants);
  $('f-disabled').checked = !!(link && link.disabled);
  $('f-disabled-label').hidden = !link;
  $('link-form-error').textContent = '';
  fillDomains(openDialog('link-dialog', { link }));
}

// rulesText shows rules as the API's JSON; variantsText shows variants one
// per line: name, weight, URL.
// (The API writes every list of a condition, the empty ones too: they are
// left out here.)
function rulesText(rules) {
  return rules && rules.length ? JSON.stringify(rules, (k, v) => (Array.isArray(v) && !v.length ? undefined : v), 1) : '';
}
function variantsText(vs) { return (vs || []).map((v) => [v.name, v.weight, v.url].join(' ')).join('\n'); }

// readRules parses the rules box: empty is none; anything else must be a
// JSON list (the API checks each rule and names the one at fault).
function readRules(s) {
  if (!s.trim()) return [];
  let v;
  try { v = JSON.parse(s); } catch (e) { throw new Error('Rules: not JSON (' + e.message + ')'); }
  if (!Array.isArray(v)) throw new Error('Rules: a JSON list [...] of rules');
  return v;
}

// readVariants parses the variants box, one "name weight URL" per line.
function readVariants(s) {
  return s.split('\n').map((l) => l.trim()).filter(Boolean).map((l, i) => {
    const [name, weight, url, ...rest] = l.split(/\s+/);
    if (!url || rest.length || !/^\d+$/.test(weight)) {
      throw new Error('Variants, line ' + (i + 1) + ': write name, weight and URL, e.g. "a 50 https://example.com/a"');
    }
    return { name, weight: Number(weight), url };
  });
}

function readForm() {
  const expire = $('f-expire').value;
  const targets = {};
  for (const [k, id] of TARGETS) targets[k] = $(id).value.trim();
  return {
    longUrl: $('f-long-url').value.trim(),
    alias: $('f-alias').value.trim(),
    fromUrl: $('f-from-url').checked,
    domain: $('f-domain').value,
    tags: $('f-tags').value.split(',').map((s) => s.trim()).filter(Boolean),
    // As typed: the API keeps a title as sent, and says what is wrong.
    title: $('f-title').value,
    expire,
    // The end of the chosen day, local time.
    expireTime: expire ? new Date(expire + 'T23:59:59').toISOString() : null,
    maxVisits: num($('f-max-visits').value),
    password: $('f-password').value,
    clearPassword: $('f-clear-password').checked,
    targets,
    rulesText: $('f-rules').value,
    variantsText: $('f-variants').value,
    rules: readRules($('f-rules').value),
    variants: readVariants($('f-variants').value),
    disabled: $('f-disabled').checked,
  };
}

// createBody is the POST /v1/links body: only the fields given.
function createBody(f) {
  const b = { longUrl: f.longUrl };
  if (f.fromUrl) b.mode = 'CODE_MODE_FROM_URL';
  else if (f.alias) Object.assign(b, { mode: 'CODE_MODE_CUSTOM', customAlias: f.alias });
  if (f.domain) b.domain = f.domain;
  if (f.tags.length) b.tags = f.tags;
  if (f.title) b.title = f.title;
  if (f.expireTime) b.expireTime = f.expireTime;
  if (f.maxVisits) b.maxVisits = f.maxVisits;
  if (f.password) b.password = f.password;
  if (Object.values(f.targets).some(Boolean)) b.deviceTargets = f.targets;
  if (f.rules.length) b.rules = f.rules;
  if (f.variants.length) b.variants = f.variants;
  return b;
}

// patchBody is the PATCH body: only the fields that changed ("expireTime":
// null clears the expiry, "password": "" removes the password, "title": ""
// the title).
function patchBody(l, f) {
  const b = {};
  const t = l.deviceTargets || {};
  if (f.longUrl !== l.longUrl) b.longUrl = f.longUrl;
  if (f.tags.join(',') !== (l.tags || []).join(',')) b.tags = f.tags;
  if (f.title !== (l.title || '')) b.title = f.title;
  if (f.expire !== (l.expireTime ? dateInput(l.expireTime) : '')) b.expireTime = f.expireTime;
  if (f.maxVisits !== num(l.maxVisits)) b.maxVisits = f.maxVisits;
  if (f.password) b.password = f.password;
  else if (f.clearPassword) b.password = '';
  if (TARGETS.some(([k]) => f.targets[k] !== (t[k] || ''))) b.deviceTargets = f.targets;
  if (f.rulesText !== rulesText(l.rules)) b.rules = f.rules;
  if (f.variantsText !== variantsText(l.variants)) b.variants = f.variants;
  if (f.disabled !== !!l.disabled) b.disabled = f.disabled;
  return b;
}

$('new-link').addEventListener('click', () => openForm(null));
// A code from the URL and a custom alias exclude each other.
$('f-from-url').addEventListener('change', () => { $('f-alias').disabled = $('f-from-url').checked; });
$('link-cancel').addEventListener('click', () => $('link-dialog').close());
$('link-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const o = openings['link-dialog'];
  const l = o.link;
  if (o.saving) return;
  $('link-form-error').textContent = '';
  let f;
  try {
    f = readForm();
  } catch (e) {
    $('link-form-error').textContent = e.message;
    return;
  }
  const request = l ? async () => {
    const b = patchBody(l, f);
    if (Object.keys(b).length) {
      if (l.domain) b.domain = l.domain; // names the link
      // Only the link as the form showed it: a change saved meanwhile by
      // someone else is not overwritten with what the form was opened on.
      if (l.etag) b.etag = l.etag;
      try {
        await api('PATCH', '/v1/links/' + enc(l.code), b);
      } catch (e) {
        if (e.status !== 412) throw e;
        loadLinks();
        throw new APIError(412, 'This link was changed elsewhere since the form was opened, and nothing was saved: cancel, open it again to see the change, then make yours.');
      }
    }
  } : () => apiCall('POST', '/v1/links', createBody(f));
  submitDialog(o, 'link-form-error', request, (created) => {
    if (created) {
      // 200 rather than 201: the tenant's link of this URL existed (code
      // from the URL), returned unchanged.
      $('created-what').textContent = created.status === 200 ? 'Exists already' : 'Created';
      $('created-short-url').textContent = created.body.shortUrl;
      $('created-short-url').href = safeHref(created.body.shortUrl);
      $('created').hidden = false;
      state.tokens = [''];
      state.page = 0;
    }
    loadLinks();
  }, loadLinks);
});

// --- revoke -------------------------------------------------------------

function confirmRevoke(l) {
  $('confirm-code').textContent = l.domain ? l.domain + '/' + l.code : l.code;
  $('confirm-error').textContent = '';
  openDialog('confirm-dialog', { link: l });
}

$('confirm-cancel').addEventListener('click', () => $('confirm-dialog').close());
$('confirm-ok').addEventListener('click', () => {
  const o = openings['confirm-dialog'];
  submitDialog(o, 'confirm-error', () => api('DELETE', linkPath(o.link)), loadLinks, loadLinks);
});

// --- QR code ------------------------------------------------------------

// dropQR empties the QR dialog, and makes any QR answer still on its way
// stale: closing the dialog (or opening it for another link) must not let
// the last link's image, or its error, land under the next one's heading.
function dropQR() {
  newLoad('qr');
  if (state.qrURL) URL.revokeObjectURL(state.qrURL);
  state.qrURL = '';
  $('qr-img').removeAttribute('src');
}

async function showQR(l) {
  dropQR();
  const latest = newLoad('qr');
  $('qr-code').textContent = l.domain ? l.domain + '/' + l.code : l.code;
  $('qr-error').textContent = '';
  $('qr-dialog').showModal();
  try {
    const blob = await api('GET', linkPath(l, '/qr?size=256'));
    // A stale answer makes no blob: URL, so there is none to revoke.
    if (!latest()) return;
    state.qrURL = URL.createObjectURL(blob);
    $('qr-img').src = state.qrURL;
  } catch (e) {
    if (latest()) $('qr-error').textContent = e.message;
  } finally {
    countRender('qr-dialog');
  }
}

$('qr-close').addEventListener('click', () => $('qr-dialog').close());
// The close event comes a task after the dialog closed: a click on
// another link's QR button may have opened it again meanwhile, and that
// link's load is not to be dropped.
$('qr-dialog').addEventListener('close', () => { if (!$('qr-dialog').open) dropQR(); });

// --- statistics ---------------------------------------------------------

async function loadStats(l) {
  const code = l.code;
  const same = state.statsCode && state.statsCode.code === l.code && state.statsCode.domain === l.domain;
  if (!same) clearStats(); // nothing of the last link under this one's heading
  state.statsCode = l;
  $('stats-code').textContent = l.domain ? l.domain + '/' + code : code;
  $('stats-error').textContent = '';
  const [hours, interval] = RANGES[$('stats-range').value];
  const start = new Date(Date.now() - hours * 3600e3).toISOString().replace(/\.\d+Z$/, 'Z');
  const q = new URLSearchParams({ start_time: start, interval });
  const latest = newLoad('stats');
  try {
    const [link, stats] = await Promise.all([
      api('GET', linkPath(l)),
      api('GET', linkPath(l, '/stats?' + q)),
    ]);
    if (latest()) {
      $('stats-title').textContent = link.title || '';
      $('stats-target').textContent = link.shortUrl + ' → ' + link.longUrl;
      renderStats(stats);
    }
  } catch (e) {
    if (latest()) {
      $('stats-error').textContent = e.message;
      clearStats();
    }
  } finally {
    countRender('view-stats');
  }
}

// clearStats empties what the stats view drew.
function clearStats() {
  $('stats-title').textContent = '';
  $('stats-target').textContent = '';
  $('chart').replaceChildren();
  for (const t of document.querySelectorAll('#view-stats table')) t.tBodies[0].replaceChildren();
}

$('stats-refresh').addEventListener('click', () => loadStats(state.statsCode));
$('stats-range').addEventListener('change', () => loadStats(state.statsCode));

function pct(x) { return (100 * Number(x || 0)).toFixed(1) + ' %'; }

// fillTable writes [label, value, field?] rows; field names the value cell
// (data-field) for tests and styles. The tables it leaves empty are the
// breakdowns, which count human clicks only: a range of bot clicks only
// has none to show, and says so.
function fillTable(id, rows) {
  const body = $(id).tBodies[0];
  if (!rows.length) {
    body.replaceChildren(el('tr', {}, el('td', { class: 'muted', text: 'No human clicks in this range' })));
    return;
  }
  body.replaceChildren(...rows.map(([label, value, field]) =>
    el('tr', {}, el('th', { text: label }), el('td', field ? { 'data-field': field, text: String(value) } : { text: String(value) }))));
}

function renderStats(s) {
  const c = s.counts || {};
  const top = (list) => (list || []).map((k) => [k.key || '(none)', num(k.count)]);
  $('chart').replaceChildren(chart(s.series || [], s.interval));
  fillTable('stats-totals', [
    ['Total', num(c.total), 'total'], ['Human', num(c.human), 'human'], ['Bot', num(c.bot), 'bot'],
    ['Flood', num(c.flood), 'flood'], ['Unique visitors', num(c.uniqueVisitors), 'unique-visitors'],
    ['Bot share', pct(s.botShare), 'bot-share'], ['Flood share', pct(s.floodShare), 'flood-share'],
  ]);
  fillTable('stats-referrers', (s.topReferrers || []).map((k) => [k.key || '(direct)', num(k.count)]));
  fillTable('stats-browsers', top(s.topBrowsers));
  fillTable('stats-devices', top(s.topDevices));
  fillTable('stats-os', top(s.topOperatingSystems));
  fillTable('stats-rules', top(s.rules));
  fillTable('stats-variants', top(s.variants));
  // A click without a country came from an address the redirect's GeoIP
  // database does not place, or from a redirect without one: which, the
  // stats do not say, so neither does the table.
  fillTable('stats-countries', (s.topCountries || []).map((k) => [k.key ? countryName(k.key) : '(unknown)', num(k.count)]));
}

// countryName shows an ISO 3166-1 alpha-2 code with its English name when
// the browser knows it: "Germany (DE)".
const regions = typeof Intl.DisplayNames === 'function' ? new Intl.DisplayNames(['en'], { type: 'region' }) : null;
function countryName(code) {
  try {
    const name = regions && regions.of(code);
    return name && name !== code ? `${name} (${code})` : code;
  } catch {
    return code;
  }
}

// niceMax rounds the tallest bar up to an even 2, 4, 6, 8 or 10 × 10^k, so
// the three gridlines (0, half, top) are whole numbers.
function niceMax(m) {
  const p = 10 ** Math.floor(Math.log10(Math.max(m, 1)));
  for (const f of [2, 4, 6, 8, 10]) if (f * p >= m) return f * p;
  return 10 * p;
}

// chart draws the series as stacked bars (human, bot, flood) in SVG. The
// numbers drawn are on the elements: data-human/bot/flood on the <svg>
// (sums) and on each bucket's <g> (with data-start).
function chart(series, interval) {
  const W = 760, H = 260, L = 48, R = 12, T = 32, B = 36;
  const pw = W - L - R, ph = H - T - B;
  const rows = series.map((b) => {
    const c = b.counts || {};
    return { start: new Date(b.startTime), human: num(c.human), bot: num(c.bot), flood: num(c.flood) };
  });
  const sums = { human: 0, bot: 0, flood: 0 };
  for (const r of rows) for (const [k] of SERIES) sums[k] += r[k];
  const top = niceMax(Math.max(1, ...rows.map((r) => r.human + r.bot + r.flood)));
  const root = svg('svg', {
    viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': 'Clicks over time',
    'data-human': sums.human, 'data-bot': sums.bot, 'data-flood': sums.flood, 'data-buckets': rows.length,
  });
  const yOf = (v) => T + ph - (v / top) * ph;
  for (const v of [0, top / 2, top]) {
    root.append(svg('line', { x1: L, x2: W - R, y1: yOf(v), y2: yOf(v), class: v ? 'grid' : 'axis-line' }),
      svg('text', { x: L - 6, y: yOf(v) + 4, 'text-anchor': 'end', class: 'axis' }, String(v)));
  }
  root.append(svg('text', { x: 14, y: T + ph / 2, transform: `rotate(-90 14 ${T + ph / 2})`, 'text-anchor': 'middle', class: 'axis' }, 'Clicks'));
  const bw = pw / Math.max(rows.length, 1);
  const every = Math.ceil(rows.length / 8) || 1;
  // Day buckets are UTC days (the analytics service cuts them at 00:00
  // UTC): they are labelled with their UTC date, or west of UTC each day's
  // clicks would show under the day before. Hours are hours everywhere:
  // local time.
  const utc = interval === 'INTERVAL_DAY';
  const label = utc ? { month: 'short', day: 'numeric', timeZone: 'UTC' }
    : rows.length > 48 ? { month: 'short', day: 'numeric', hour: '2-digit' } : { hour: '2-digit', minute: '2-digit' };
  const when = (d) => (utc ? d.toLocaleDateString([], { timeZone: 'UTC' }) + ' (UTC)' : d.toLocaleString());
  rows.forEach((r, i) => {
    const x = L + i * bw;
    const g = svg('g', { class: 'bucket', 'data-start': r.start.toISOString(), 'data-human': r.human, 'data-bot': r.bot, 'data-flood': r.flood });
    let y = T + ph;
    for (const [k, name, colour] of SERIES) {
      if (!r[k]) continue;
      const h = (r[k] / top) * ph;
      y -= h;
      const bar = svg('rect', { x: x + bw * 0.1, y, width: Math.max(bw * 0.8, 1), height: h, fill: colour, class: k });
      bar.append(svg('title', {}, `${when(r.start)}: ${r[k]} ${name.toLowerCase()}`));
      g.append(bar);
    }
    root.append(g);
    if (i % every === 0) {
      root.append(svg('text', { x: x + bw / 2, y: H - B + 16, 'text-anchor': 'middle', class: 'axis' }, r.start.toLocaleString([], label)));
    }
  });
  root.append(svg('text', { x: L + pw / 2, y: H - 4, 'text-anchor': 'middle', class: 'axis' }, utc ? 'Day (UTC)' : 'Time (local)'));
  const legend = svg('g', { class: 'legend' });
  SERIES.forEach(([k, name, colour], i) => {
    const x = L + i * 140;
    legend.append(svg('rect', { x, y: 8, width: 12, height: 12, fill: colour }), svg('text', { x: x + 18, y: 18 }, `${name} (${sums[k]})`));
  });
  root.append(legend);
  return root;
}

// --- webhooks -----------------------------------------------------------

// Delivery statuses as the API names them, and as the console shows them.
const DELIVERY_STATUS = {
  WEBHOOK_DELIVERY_STATUS_PENDING: 'pending', WEBHOOK_DELIVERY_STATUS_SUCCEEDED: 'succeeded', WEBHOOK_DELIVERY_STATUS_DEAD: 'dead',
};

async function loadWebhooks() {
  const latest = newLoad('webhooks');
  $('webhooks-error').textContent = '';
  try {
    const r = await api('GET', '/v1/webhooks');
    if (!latest()) return;
    const list = r.webhooks || [];
    $('webhooks-body').replaceChildren(...list.map(webhookRow));
    $('webhooks-empty').hidden = list.length > 0;
    if (state.webhook && !list.some((w) => w.id === state.webhook)) {
      state.webhook = '';
      $('deliveries').hidden = true;
    }
  } catch (e) {
    if (latest()) $('webhooks-error').textContent = e.message;
  } finally {
    countRender('view-webhooks');
  }
}

function webhookRow(w) {
  return el('tr', { 'data-id': w.id },
    el('td', {}, el('span', { class: 'target', title: w.url, text: w.url })),
    el('td', {}, ...(w.events || []).map((e) => el('span', { class: 'tag', text: e }))),
    el('td', { text: w.description || '—' }),
    el('td', { text: w.createTime ? new Date(w.createTime).toLocaleString() : '' }),
    el('td', { class: 'actions' },
      button('Deliveries', 'deliveries', () => openDeliveries(w.id)),
      button('Delete', 'delete danger', () => confirmDeleteWebhook(w))));
}

$('webhook-form').addEventListener('submit', oneAtATime(async () => {
  const events = [...document.querySelectorAll('#w-events input:checked')].map((i) => i.value);
  $('webhook-form-error').textContent = '';
  try {
    const r = await api('POST', '/v1/webhooks', { url: $('w-url').value.trim(), events, description: $('w-description').value.trim() });
    $('webhook-secret-id').textContent = r.webhook.id;
    $('webhook-secret').textContent = r.secret;
    $('webhook-secret-notice').hidden = false;
    $('w-url').value = '';
    $('w-description').value = '';
  } catch (e) {
    $('webhook-form-error').textContent = e.message;
    return;
  }
  loadWebhooks();
}));

// openDeliveries shows a webhook's deliveries from the newest.
function openDeliveries(id) {
  if (state.webhook !== id) $('deliveries-body').replaceChildren(); // nothing of the last webhook under this one's heading
  state.webhook = id;
  firstDeliveries();
}

// firstDeliveries goes back to the first page (the newest deliveries).
function firstDeliveries() {
  state.deliveryTokens = [''];
  state.deliveryPage = 0;
  loadDeliveries();
}

// loadDeliveries loads the open webhook's page of deliveries: all, or the
// dead ones only (which an older page may hold: the list is newest first).
async function loadDeliveries() {
  const id = state.webhook;
  $('deliveries').hidden = false;
  $('deliveries-webhook').textContent = id;
  $('deliveries-error').textContent = '';
  const dead = $('deliveries-dead').checked;
  const q = new URLSearchParams({ page_size: PAGE_SIZE });
  if (state.deliveryTokens[state.deliveryPage]) q.set('page_token', state.deliveryTokens[state.deliveryPage]);
  if (dead) q.set('status', 'WEBHOOK_DELIVERY_STATUS_DEAD');
  // The pager waits for the page: its next token comes with it.
  $('deliveries-prev').disabled = $('deliveries-next').disabled = true;
  const latest = newLoad('deliveries');
  try {
    const r = await api('GET', '/v1/webhooks/' + enc(id) + '/deliveries?' + q);
    if (latest()) {
      const list = r.deliveries || [];
      state.deliveryTokens.length = state.deliveryPage + 1;
      if (r.nextPageToken) state.deliveryTokens.push(r.nextPageToken);
      $('deliveries-body').replaceChildren(...list.map(deliveryRow));
      $('deliveries-empty').textContent = dead ? 'No dead deliveries.' : 'No deliveries yet.';
      $('deliveries-empty').hidden = list.length > 0;
      $('deliveries-prev').disabled = state.deliveryPage === 0;
      $('deliveries-next').disabled = state.deliveryTokens.length <= state.deliveryPage + 1;
      $('deliveries-page').textContent = 'Page ' + (state.deliveryPage + 1);
    }
  } catch (e) {
    if (latest()) {
      $('deliveries-error').textContent = e.message;
      $('deliveries-body').replaceChildren();
      $('deliveries-prev').disabled = state.deliveryPage === 0;
    }
  } finally {
    countRender('deliveries');
  }
}

function deliveryRow(d) {
  const status = DELIVERY_STATUS[d.status] || 'unknown';
  return el('tr', { 'data-id': d.id, 'data-status': status },
    el('td', {}, el('code', { text: d.id })),
    el('td', { text: d.eventType }),
    el('td', { class: 'status ' + status, text: status }),
    el('td', { text: String(d.attempts || 0) }),
    el('td', {}, el('span', { class: 'target', title: d.lastError || '', text: d.lastError || '—' })),
    el('td', { text: d.createTime ? new Date(d.createTime).toLocaleString() : '' }),
    el('td', { class: 'actions' }, ...(status === 'dead' ? [button('Redeliver', 'redeliver', () => redeliver(d.id))] : [])));
}

async function redeliver(id) {
  $('deliveries-error').textContent = '';
  try {
    await api('POST', '/v1/webhooks/' + enc(state.webhook) + '/deliveries/' + enc(id) + '/redeliver');
  } catch (e) {
    $('deliveries-error').textContent = e.message;
    return;
  }
  loadDeliveries();
}

$('deliveries-refresh').addEventListener('click', () => loadDeliveries());
$('deliveries-dead').addEventListener('change', firstDeliveries);
$('deliveries-prev').addEventListener('click', () => { state.deliveryPage = Math.max(0, state.deliveryPage - 1); loadDeliveries(); });
$('deliveries-next').addEventListener('click', () => { state.deliveryPage++; loadDeliveries(); });

function confirmDeleteWebhook(w) {
  $('webhook-confirm-url').textContent = w.url;
  $('webhook-confirm-error').textContent = '';
  openDialog('webhook-confirm-dialog', { webhook: w.id });
}

$('webhook-confirm-cancel').addEventListener('click', () => $('webhook-confirm-dialog').close());
$('webhook-confirm-ok').addEventListener('click', () => {
  const o = openings['webhook-confirm-dialog'];
  submitDialog(o, 'webhook-confirm-error', () => api('DELETE', '/v1/webhooks/' + enc(o.webhook)), loadWebhooks, loadWebhooks);
});

// --- custom domains -----------------------------------------------------

async function loadDomains() {
  const latest = newLoad('domains');
  $('domains-error').textContent = '';
  try {
    const resp = await api('GET', '/v1/domains');
    if (!latest()) return;
    const ds = resp.domains || [];
    $('domains-body').replaceChildren(...ds.map(domainRow));
    $('domains-empty').hidden = ds.length > 0;
  } catch (e) {
    if (latest()) $('domains-error').textContent = e.message;
  } finally {
    countRender('view-domains');
  }
}

function domainRow(d) {
  const actions = el('td', { class: 'actions' });
  if (!d.verified) actions.append(button('Verify', 'verify', () => domainAction('POST', d, '/verify')));
  actions.append(button('Delete', 'delete danger', () => confirmDeleteDomain(d)));
  return el('tr', { 'data-domain': d.name },
    el('td', { class: 'name', text: d.name }),
    el('td', { class: 'status ' + (d.verified ? 'active' : 'pending'), text: d.verified ? 'verified' : 'not verified' }),
    el('td', {}, el('code', { text: d.verified ? '—' : d.verificationRecord })),
    el('td', {}, el('code', { class: 'token', text: d.verified ? '—' : d.verificationToken })),
    actions);
}

async function domainAction(method, d, suffix) {
  $('domains-error').textContent = '';
  try {
    await api(method, '/v1/domains/' + enc(d.name) + suffix);
  } catch (e) {
    $('domains-error').textContent = e.message;
    countRender('view-domains');
    return;
  }
  loadDomains();
}

// confirmDeleteDomain asks first: a domain deleted and added again has
// lost its verification (a new TXT value, DNS again).
function confirmDeleteDomain(d) {
  $('domain-confirm-name').textContent = d.name;
  $('domain-confirm-error').textContent = '';
  openDialog('domain-confirm-dialog', { domain: d.name });
}

$('domain-confirm-cancel').addEventListener('click', () => $('domain-confirm-dialog').close());
$('domain-confirm-ok').addEventListener('click', () => {
  const o = openings['domain-confirm-dialog'];
  submitDialog(o, 'domain-confirm-error', () => api('DELETE', '/v1/domains/' + enc(o.domain)), loadDomains, loadDomains);
});

$('domain-form').addEventListener('submit', oneAtATime(async () => {
  $('domains-error').textContent = '';
  try {
    await api('POST', '/v1/domains', { name: $('domain-name').value.trim() });
  } catch (e) {
    $('domains-error').textContent = e.message;
    countRender('view-domains');
    return;
  }
  $('domain-name').value = '';
  loadDomains();
}));

window.addEventListener('hashchange', route);
$('signin-error').textContent = sessionStorage.getItem(SIGNED_OUT) || '';
sessionStorage.removeItem(SIGNED_OUT);
route();
