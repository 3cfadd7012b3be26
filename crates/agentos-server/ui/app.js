// The agentos page: every view reads the same API as any client, with the token the person
// signed in with (kept in this tab's sessionStorage only, never in a URL).
'use strict';

const S = { token: sessionStorage.getItem('agentos.token'), me: null, seq: 0, stop: null };

const FLAGS = [
  ['r', 'read', 'read nets, tokens, models and executors'],
  ['w', 'write', 'author nets and put tokens'],
  ['x', 'execute', 'fire transitions and call tools'],
  ['h', 'http', 'see and call HTTP tools'],
  ['l', 'logs', 'read the event log and job output'],
  ['u', 'user', 'answer await-user tokens'],
  ['d', 'docker', 'see and call container tools'],
  ['c', 'coordinate', 'invoke or delegate to other agents'],
  ['t', 'tool nets', 'see and call tool nets'],
  ['s', 'scripts', 'see and run scripts and shell commands'],
  ['m', 'mcp', 'see and call MCP tools'],
];

// Builds an element: attributes (on* are listeners), then children (strings become text).
function h(tag, attrs, ...children) {
  const svg = ['svg', 'g', 'circle', 'rect', 'line', 'text', 'path', 'marker', 'defs', 'title'].includes(tag);
  const el = svg ? document.createElementNS('http://www.w3.org/2000/svg', tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  const kids = children.flat().filter((c) => c !== undefined && c !== null && c !== false);
  for (const c of kids) {
    if (c instanceof Node) el.append(c);
    // Text beside other children is isolated (`bdi`): a name holding a right-to-left override
    // would otherwise reorder what follows it, an id beside it read backwards.
    else if (kids.length > 1 && !svg) el.append(h('bdi', { text: String(c) }));
    else el.append(document.createTextNode(String(c)));
  }
  return el;
}

const main = () => document.getElementById('main');

// Replaces what `el` holds; absent parts (null, false) are left out.
function fill(el, ...nodes) {
  el.replaceChildren(...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false));
}

function show(...nodes) {
  fill(main(), ...nodes);
}

function alertBox(message, kind) {
  const box = document.getElementById('alert');
  if (!message) {
    box.hidden = true;
    return;
  }
  box.className = kind || '';
  box.textContent = message;
  box.hidden = false;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// What an error means for the person looking: a refusal says which flag or grant is missing.
function explain(e) {
  // fetch fails with a TypeError when no answer came at all.
  if (e instanceof TypeError) return `Cannot reach the master at ${location.origin}: is it running? (${e.message})`;
  if (!(e instanceof ApiError)) return String(e.message || e);
  if (e.status === 403) return `Not allowed (403): ${e.message}`;
  if (e.status === 401) return 'The token is not accepted (401): sign in again.';
  if (e.status === 404) return `Not found (404): ${e.message}`;
  return `${e.status} ${e.code || ''}: ${e.message}`;
}

// How many of a place's tokens, and of the catalog's entries, the page shows at once.
const TOKENS_SHOWN = 200;
const CATALOG_SHOWN = 200;

async function api(method, path, body) {
  const token = S.token;
  const headers = { Authorization: `Bearer ${token}` };
  if (S.seq) headers['Agentos-Min-Seq'] = String(S.seq);
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const seq = Number(r.headers.get('Agentos-Seq'));
  if (seq > S.seq) S.seq = seq;
  const text = await r.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!r.ok) {
    const err = (data && data.error) || {};
    if (r.status === 401) expired(token);
    throw new ApiError(r.status, err.code, err.message || `HTTP ${r.status}`);
  }
  return data;
}

// The token is no longer accepted (revoked, or the master's keys changed): it is forgotten, and
// the page asks for another, rather than looking signed in with every request refused.
function expired(token) {
  // A late refusal of a token already replaced (signed out and in again) ends nothing.
  if (!S.token || token !== S.token) return;
  sessionStorage.removeItem('agentos.token');
  S.token = null;
  S.me = null;
  if (S.stop) {
    S.stop();
    S.stop = null;
  }
  signInView('That token is no longer accepted: sign in again.');
}

const get = (path) => api('GET', path);
const q = (params) => {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') u.set(k, v);
  const s = u.toString();
  return s ? `?${s}` : '';
};

function flagsView(flags) {
  return h('span', { class: 'flags', title: 'capability flags' },
    FLAGS.map(([letter, name, what], i) => {
      const on = (flags || '')[i] === letter;
      return h('span', { class: on ? 'on' : 'off', title: `${letter}: ${name}: ${what}${on ? '' : ' (not held)'}` }, on ? letter : '-');
    }));
}

function has(letter) {
  const i = FLAGS.findIndex(([l]) => l === letter);
  return S.me && S.me.flags[i] === letter;
}

// "x (execute)": a flag, in words.
const flagWord = (letter) => `${letter} (${FLAGS.find(([l]) => l === letter)[1]})`;

// Whether the token's flags pass a route that takes `letter` (the operator holds every flag).
const may = (letter) => Boolean(S.me) && (S.me.kind === 'operator' || has(letter));

// Why the token may not use a control whose route takes `letter`, or null when it may:
// "`what` the flag x (execute), which reader's token lacks."
const lacking = (letter, what) => (may(letter) ? null : `${what} the flag ${flagWord(letter)}, which ${S.me.name}'s token lacks.`);

let notes = 0;

// The note saying why controls are disabled, to show beside them: [its id, the note], or
// [null, null] when they are not.
function whyNote(why) {
  if (!why) return [null, null];
  const id = `why-disabled-${++notes}`;
  return [id, h('p', { class: 'muted', id }, why)];
}

// A button for an action whose route the token's flags may not pass (`why` says which flag it
// lacks, `note` is the id of the note saying so) is offered, so that a person finds what the
// view can do, but disabled: `aria-disabled` rather than `disabled`, so that it stays in the
// keyboard's order and a screen reader reads the reason with it (a `disabled` button is skipped,
// and shows no title in some browsers). It gets no action: a click or a key sends nothing. The
// API still decides every request; this only keeps the page from offering a certain refusal.
function actionButton(attrs, label, onclick, why, note) {
  return why
    ? h('button', { ...attrs, type: 'button', 'aria-disabled': 'true', title: why, 'aria-describedby': note }, label)
    : h('button', { type: 'button', ...attrs, onclick }, label);
}

// The page's views, in the order a token lands on the first it may use, with the flags that open
// each: any one of `anyOf`, or the operator. They follow the permissions of the routes each view
// reads (`routes.rs`): the catalog any flag that reveals a kind of tool, the nets `r`, the audit
// `l`, and the executors and jobs `r` (the executors), `l` (the jobs of its models) or `x` or
// `t` (the jobs it invoked). The API still decides; this only keeps the page from landing a
// token on a view that would answer nothing but a refusal.
const VIEWS = [
  { page: 'catalog', name: 'Catalog', anyOf: 'dhtsmxw' },
  { page: 'nets', name: 'Nets', anyOf: 'r' },
  { page: 'audit', name: 'Audit', anyOf: 'l' },
  { page: 'executors', name: 'Executors & jobs', anyOf: 'rlxt' },
  { page: 'agents', name: 'Agents', operator: true },
  { page: 'secrets', name: 'Secrets', operator: true },
];

// "r (read)", or "one of d (docker), h (http), …": what opens `view`, in words.
function needs(view) {
  if (view.operator) return 'the operator\'s token';
  const letters = [...view.anyOf];
  return letters.length === 1 ? `the flag ${flagWord(letters[0])}` : `one of the flags ${letters.map(flagWord).join(', ')}`;
}

function mayUse(view) {
  if (!S.me) return false;
  if (S.me.kind === 'operator') return true;
  return !view.operator && [...view.anyOf].some(has);
}

// The first view the signed-in token may use; `undefined` when it may use none.
const landing = () => VIEWS.find(mayUse);

// What the token holds, in words: "r (read), x (execute)", or that it holds no flag.
function heldFlags() {
  const held = FLAGS.filter(([l]) => has(l)).map(([l, name]) => `${l} (${name})`);
  return held.length ? `holds ${held.join(', ')}` : 'holds no flag';
}

// In place of a view the token may not use: which flag it lacks, and the views it may use.
function closedView(view) {
  const open = VIEWS.filter(mayUse);
  show(h('h1', { text: view.name }),
    h('p', { class: 'last-error', id: 'closed' },
      `${S.me.name}'s token ${heldFlags()}; ${view.name} needs ${needs(view)}, which it lacks.`),
    open.length
      ? h('p', {}, 'It may use: ', open.flatMap((v, i) => [i ? ', ' : null, h('a', { href: `#/${v.page}` }, v.name)]))
      : null);
}

// For a token that may use none of the views: what it holds, and what each view needs.
function noView() {
  show(h('h1', { text: 'Nothing to show' }),
    h('p', { id: 'no-view' },
      `${S.me.name}'s token ${heldFlags()}, and none of this page's views is open to it. Ask the operator for the flag of what it should see:`),
    h('dl', { class: 'kv' }, VIEWS.filter((v) => !v.operator).flatMap((v) => [h('dt', {}, v.name), h('dd', {}, needs(v))])));
}

// ---- sign-in --------------------------------------------------------------------------------

function signInView(message) {
  document.getElementById('nav').hidden = true;
  document.getElementById('sign-out').hidden = true;
  document.getElementById('who').textContent = '';
  const input = h('input', { type: 'password', id: 'token', autocomplete: 'off', placeholder: 'aos_…', 'aria-label': 'token' });
  const form = h('form', { class: 'card signin', id: 'sign-in' },
    h('h1', { text: 'Sign in' }),
    h('p', { class: 'muted', text: 'Paste an agent or operator token. It is kept for this tab only; the page shows what the token may see.' }),
    input,
    h('button', { class: 'primary', type: 'submit' }, 'Sign in'));
  setTimeout(() => input.focus(), 0);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    // Pasted with its scheme, or with what a header cannot carry: said, not sent.
    const token = input.value.trim().replace(/^Bearer(\s+|$)/i, '');
    if (!token) {
      alertBox('Paste a token first.');
      return;
    }
    if (!/^[\x21-\x7e]+$/.test(token)) {
      alertBox('That is not a token: a token is printable ASCII (like aos_…), with no spaces.');
      return;
    }
    S.token = token;
    try {
      await signedIn();
      sessionStorage.setItem('agentos.token', S.token);
      // Where it was going, or the first view its flags open (the catalog is not every token's).
      go(!location.hash || location.hash === '#/' ? `#/${(landing() || { page: '' }).page}` : location.hash);
    } catch (e) {
      S.token = null;
      alertBox(e.status === 401 ? 'That token is not known to this master.' : explain(e));
    }
  });
  show(form);
  if (message) alertBox(message);
}

async function signedIn() {
  S.me = await get('/api/me');
  document.getElementById('nav').hidden = false;
  document.getElementById('sign-out').hidden = false;
  const who = document.getElementById('who');
  who.replaceChildren(`${S.me.name} (${S.me.kind}, home ${S.me.model}) `, flagsView(S.me.flags));
  // Only the views the token may use are offered.
  for (const a of document.querySelectorAll('#nav a')) a.hidden = !mayUse(VIEWS.find((v) => v.page === a.dataset.page));
}

// ---- catalog --------------------------------------------------------------------------------

function hashParams() {
  const i = location.hash.indexOf('?');
  return new URLSearchParams(i < 0 ? '' : location.hash.slice(i + 1));
}

async function catalogView() {
  const p = hashParams();
  const field = (name, placeholder) => h('input', { name, placeholder, value: p.get(name) || '', 'aria-label': placeholder });
  const type = h('select', { name: 'type', 'aria-label': 'type' },
    ['', 'script', 'http', 'docker', 'toolnet', 'host', 'mcp'].map((t) => h('option', { value: t, selected: p.get('type') === t }, t || 'any type')));
  const qInput = field('q', 'search');
  const model = field('model', `model (default ${S.me.model})`);
  const capability = field('capability', 'capability');
  const form = h('form', { class: 'filters', id: 'catalog-search' }, qInput, type, model, capability, h('button', { type: 'submit', class: 'primary' }, 'Search'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    go(`#/catalog${q({ q: qInput.value, type: type.value, model: model.value, capability: capability.value })}`);
  });
  const results = h('div', { id: 'results' }, h('p', { class: 'muted', text: 'Searching…' }));
  show(h('h1', { text: 'Catalog' }), form, results);
  qInput.focus();
  try {
    const filters = { q: p.get('q'), type: p.get('type'), model: p.get('model'), capability: p.get('capability') };
    const offset = Math.max(0, Number(p.get('offset')) || 0);
    const page = await get(`/api/tool-catalog${q({ ...filters, limit: CATALOG_SHOWN, offset })}`);
    const rows = page.items.map((e) => h('tr', { 'data-id': e.id },
      h('td', {}, h('a', { href: `#/tool/${encodeURIComponent(e.id)}${q({ model: p.get('model') })}` }, e.id)),
      h('td', {}, e.name),
      h('td', {}, e.binding.type),
      h('td', {}, badges(e)),
      h('td', { class: 'muted', title: e.description }, short(e.description, 240))));
    // A page at a time, with the way to the others: a catalog may hold thousands of entries.
    const shown = !page.items.length && offset > 0
      ? `${page.total} entries, none from ${offset + 1} on`
      : page.total > page.items.length
        ? `${page.total} entries, ${offset + 1}–${offset + page.items.length} shown`
        : `${page.total} entr${page.total === 1 ? 'y' : 'ies'}`;
    const at = (o) => `#/catalog${q({ ...filters, offset: o || undefined })}`;
    const pager = h('p', { class: 'row', id: 'pager' },
      offset > 0 && !page.items.length ? h('a', { href: at(0), id: 'first' }, '← the first page') : null,
      offset > 0 && page.items.length ? h('a', { href: at(Math.max(0, offset - CATALOG_SHOWN)), id: 'previous' }, '← previous') : null,
      offset + page.items.length < page.total ? h('a', { href: at(offset + CATALOG_SHOWN), id: 'next' }, 'next →') : null);
    fill(results,
      h('p', { class: 'muted', id: 'shown', text: shown }),
      h('table', {}, h('thead', {}, h('tr', {}, ['id', 'name', 'type', 'scope', 'description'].map((c) => h('th', {}, c)))), h('tbody', {}, rows)),
      pager);
  } catch (e) {
    fill(results, h('p', { class: 'muted', text: explain(e) }));
  }
}

// At most `n` characters of `text`, with an ellipsis when cut.
function short(text, n) {
  const chars = Array.from(text || '');
  return chars.length > n ? `${chars.slice(0, n).join('')}…` : text || '';
}

function badges(e) {
  return [
    h('span', { class: `badge ${e.scope}`, title: e.scope === 'local' ? `in model ${e.model}'s own catalog` : 'in the global catalog' }, e.scope),
    e.shadowed ? h('span', { class: 'badge shadowed', title: 'a local entry with the same id hides this global one' }, 'shadowed') : null,
  ];
}

// A button for what cannot be undone: the first click asks, in the button itself, and a second
// one does it. A native confirm() would block the page, and whatever drives it, on a dialog.
// The button is disabled while `action` runs, so that a third click does not do it twice.
function confirmButton(attrs, label, question, action) {
  const button = h('button', { class: 'danger', ...attrs }, label);
  let armed = false;
  let timer = null;
  // Asked for a few seconds, and while the button keeps focus: a second click long after, or
  // elsewhere first, asks again.
  const disarm = () => {
    armed = false;
    clearTimeout(timer);
    button.textContent = label;
  };
  button.addEventListener('blur', disarm);
  button.addEventListener('click', async () => {
    if (!armed) {
      armed = true;
      button.textContent = question;
      timer = setTimeout(disarm, 4000);
      return;
    }
    clearTimeout(timer);
    button.disabled = true;
    try {
      await action();
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

function kv(pairs) {
  return h('dl', { class: 'kv' }, pairs.filter(([, v]) => v !== undefined && v !== null && v !== '').flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

function bindingView(b) {
  const pairs = [['type', b.type]];
  if (b.type === 'script') pairs.push(['runtime', b.runtime], ['sha256', h('code', {}, b.sha256)], ['size', `${b.sizeBytes} bytes`], ['URN', h('code', {}, b.scriptUrn)]);
  if (b.baseUrl) pairs.push(['base URL', h('code', {}, b.baseUrl)]);
  if (b.image) pairs.push(['image', h('code', {}, b.image)]);
  const ops = Array.isArray(b.operations) ? b.operations : [];
  return [kv(pairs),
    ops.length ? h('table', {}, h('tbody', {}, ops.map((o) => h('tr', {}, h('td', {}, h('code', {}, o.method || '')), h('td', {}, h('code', {}, o.path || '')), h('td', {}, o.operationId || o.name || ''))))) : null,
    h('details', {}, h('summary', {}, 'binding as JSON'), h('pre', {}, JSON.stringify(b, null, 2)))];
}

// What changed from one definition to the next, field by field (contract operations by name).
function changes(before, after) {
  const out = [];
  const flat = (v, prefix, acc) => {
    if (v && typeof v === 'object' && !Array.isArray(v)) {
      for (const [k, x] of Object.entries(v)) flat(x, prefix ? `${prefix}.${k}` : k, acc);
    } else acc[prefix] = JSON.stringify(v);
    return acc;
  };
  const a = flat(before || {}, '', {});
  const b = flat(after || {}, '', {});
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    if (a[k] !== b[k]) out.push([k, a[k], b[k]]);
  }
  return out;
}

async function entryView(id) {
  const model = hashParams().get('model') || undefined;
  // `.` and `..` are path steps to a browser, not names: `/api/tool-catalog/..` is `/api/`.
  if (id === '' || id === '.' || id === '..') {
    show(h('h1', {}, 'Catalog'), h('p', { class: 'last-error', text: `${JSON.stringify(id)} is not a tool id.` }));
    return;
  }
  show(h('h1', {}, id), h('p', { class: 'muted', text: 'Loading…' }));
  let entry;
  try {
    entry = await get(`/api/tool-catalog/${encodeURIComponent(id)}${q({ model })}`);
  } catch (e) {
    show(h('h1', {}, id), h('p', { class: 'muted', text: explain(e) }));
    return;
  }
  const [help, history] = await Promise.all([
    get(`/api/tool-catalog/${encodeURIComponent(id)}/help${q({ model })}`).catch(() => null),
    get(`/api/tool-catalog/${encodeURIComponent(id)}/history${q({ model })}`).catch(() => null),
  ]);
  const ops = Object.entries(entry.contract.operations || {});
  const contract = h('div', { class: 'card', id: 'contract' }, h('h2', { text: 'Contract' }),
    ops.length ? ops.map(([name, op]) => h('div', { class: 'operation', 'data-op': name },
      h('h3', {}, h('code', {}, `${help ? help.command : `agentos-${id}`} ${name}`)),
      op.description ? h('p', {}, op.description) : null,
      help && help.operations[name] ? h('pre', { class: 'help' }, help.operations[name]) : h('pre', {}, JSON.stringify(op.input, null, 2))))
      : h('p', { class: 'muted', text: 'No operations.' }));
  let historyCard = null;
  if (history) {
    const defs = history.events.filter((ev) => ev.payload && ev.payload.entry);
    historyCard = h('div', { class: 'card', id: 'history' }, h('h2', { text: `History (${history.events.length})` }),
      history.events.map((ev) => {
        const i = defs.indexOf(ev);
        const diff = i > 0 ? changes(defs[i - 1].payload.entry, ev.payload.entry) : [];
        return h('div', { class: 'row' },
          h('span', { class: 'mono' }, `#${ev.seq}`), h('strong', {}, ev.type), h('span', { class: 'muted' }, `${ev.time} by ${ev.principal}`),
          i === 0 ? h('span', { class: 'muted' }, 'first definition') : null,
          diff.length ? h('div', { class: 'diff' }, diff.map(([k, a, b]) => h('div', {}, `${k}: `, h('span', { class: 'from' }, a ?? '∅'), ' → ', h('span', { class: 'to' }, b ?? '∅')))) : null);
      }));
  }
  show(
    h('p', {}, h('a', { href: '#/catalog' }, '← catalog')),
    h('h1', {}, entry.name, ' ', h('code', { class: 'muted' }, entry.id), badges(entry)),
    h('p', {}, entry.description || h('span', { class: 'muted' }, 'No description.')),
    kv([['version', entry.version], ['model', entry.model], ['revision', entry.revision], ['updated', `${entry.updatedAt} by ${entry.updatedBy}`], ['capabilities', (entry.capabilities || []).join(', ')]]),
    contract,
    h('div', { class: 'card', id: 'binding' }, h('h2', { text: 'Binding' }), bindingView(entry.binding)),
    historyCard);
}

// ---- nets -----------------------------------------------------------------------------------

async function netsView() {
  show(h('h1', { text: 'Nets' }), h('p', { class: 'muted', text: 'Loading…' }));
  try {
    const models = await get('/api/models');
    show(h('h1', { text: 'Nets' }),
      h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'model'), h('th', {}, 'created'), h('th', {}, 'places'))),
        h('tbody', {}, models.map((m) => h('tr', {},
          h('td', {}, h('a', { href: `#/nets/${encodeURIComponent(m.name)}` }, m.name)),
          h('td', { class: 'muted' }, `${m.createdAt} by ${m.createdBy}`),
          h('td', {}, m.places.map((p) => `${p.name} (${p.tokens})`).join(', ')))))));
  } catch (e) {
    show(h('h1', { text: 'Nets' }), h('p', { class: 'muted', text: explain(e) }));
  }
}

// Columns by dependency: a transition right of the places it takes from, a place right of the
// transitions that put into it. Cycles stop growing after a bound.
function layout(net) {
  const places = net.places.map((p) => p.id);
  const ts = net.doc.transitions;
  const col = Object.fromEntries(places.map((p) => [`p:${p}`, 0]));
  for (const t of ts) col[`t:${t.id}`] = 1;
  for (let round = 0; round < places.length + ts.length; round++) {
    let moved = false;
    for (const t of ts) {
      const ins = Object.values(t.presets || {}).map((a) => col[`p:${a.place}`] ?? 0);
      const want = Math.max(0, ...ins) + 1;
      if (want > col[`t:${t.id}`] && want < 2 * (places.length + ts.length)) { col[`t:${t.id}`] = want; moved = true; }
      for (const a of Object.values(t.postsets || {})) {
        const key = `p:${a.place}`;
        const feeds = Object.values(t.presets || {}).some((x) => x.place === a.place);
        if (!feeds && col[key] <= col[`t:${t.id}`] && col[`t:${t.id}`] + 1 < 2 * (places.length + ts.length)) { col[key] = col[`t:${t.id}`] + 1; moved = true; }
      }
    }
    if (!moved) break;
  }
  const byCol = {};
  for (const [k, c] of Object.entries(col)) (byCol[c] ||= []).push(k);
  const pos = {};
  for (const [c, keys] of Object.entries(byCol)) keys.forEach((k, i) => { pos[k] = { x: 70 + Number(c) * 150, y: 60 + i * 100 }; });
  // An empty net still has a size (Math.max of nothing is -Infinity).
  const width = 140 + Math.max(70, ...Object.values(pos).map((p) => p.x));
  const height = 60 + Math.max(60, ...Object.values(pos).map((p) => p.y));
  return { pos, width, height };
}

// A key handler that acts on Enter and Space, as a button does.
const pressed = (act) => (ev) => {
  if (ev.key === 'Enter' || ev.key === ' ') {
    ev.preventDefault();
    act();
  }
};

function drawNet(net, selected, onSelect) {
  const { pos, width, height } = layout(net);
  const state = Object.fromEntries(net.transitions.map((t) => [t.id, t]));
  const svg = h('svg', { class: 'net', viewBox: `0 0 ${width} ${height}`, height: Math.min(height, 640), role: 'group', 'aria-label': `net of model ${net.model}` },
    h('defs', {}, h('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' }, h('path', { d: 'M0,0 L10,5 L0,10 z', fill: '#778' }))));
  // How far from its centre a line along (dx, dy) leaves a place (a circle) or a transition (a box).
  const circle = () => 26;
  const box = (dx, dy, len) => Math.min(dx ? 52 / Math.abs(dx / len) : Infinity, dy ? 24 / Math.abs(dy / len) : Infinity);
  const edge = (from, to, leave, enter) => {
    const dx = to.x - from.x;
    const dy = to.y - from.y;
    const len = Math.hypot(dx, dy) || 1;
    const a = leave(dx, dy, len);
    const b = enter(dx, dy, len);
    svg.append(h('line', { x1: from.x + (dx / len) * a, y1: from.y + (dy / len) * a, x2: to.x - (dx / len) * b, y2: to.y - (dy / len) * b, 'marker-end': 'url(#arrow)' }));
  };
  for (const t of net.doc.transitions) {
    const tp = pos[`t:${t.id}`];
    for (const a of Object.values(t.presets || {})) edge(pos[`p:${a.place}`], tp, circle, box);
    for (const a of Object.values(t.postsets || {})) edge(tp, pos[`p:${a.place}`], box, circle);
  }
  for (const p of net.places) {
    const at = pos[`p:${p.id}`];
    const g = h('g', { class: `place${selected === `p:${p.id}` ? ' selected' : ''}`, 'data-place': p.id, tabindex: 0, role: 'button', 'aria-label': `place ${p.id}, ${p.tokens} token(s)`, onclick: () => onSelect(`p:${p.id}`), onkeydown: pressed(() => onSelect(`p:${p.id}`)) },
      h('title', {}, `place ${p.id}: ${p.tokens} token(s)${p.reserved ? `, ${p.reserved} reserved` : ''}`),
      h('circle', { cx: at.x, cy: at.y, r: 24 }),
      h('text', { x: at.x, y: at.y, class: 'count' }, String(p.tokens)),
      h('text', { x: at.x, y: at.y + 38 }, p.id));
    svg.append(g);
  }
  for (const t of net.doc.transitions) {
    const at = pos[`t:${t.id}`];
    const st = state[t.id] || {};
    const cls = ['transition', st.started ? 'started' : '', st.parked ? 'parked' : '', selected === `t:${t.id}` ? 'selected' : ''].join(' ');
    svg.append(h('g', { class: cls, 'data-transition': t.id, tabindex: 0, role: 'button', 'aria-label': `transition ${t.id}, ${st.started ? 'started' : 'stopped'}`, onclick: () => onSelect(`t:${t.id}`), onkeydown: pressed(() => onSelect(`t:${t.id}`)) },
      h('title', {}, `transition ${t.id} (${t.kind}): ${st.started ? 'started' : 'stopped'}, ${st.fires || 0} fires, ${st.inFlight || 0} in flight, ${st.parked || 0} parked${st.lastError ? `; last error: ${st.lastError}` : ''}`),
      h('rect', { x: at.x - 50, y: at.y - 22, width: 100, height: 44, rx: 4 }),
      h('text', { x: at.x, y: at.y - 7 }, t.id),
      h('text', { x: at.x, y: at.y + 9, class: 'muted' }, `${t.kind} · ${st.started ? 'started' : 'stopped'}${st.parked ? ` · ${st.parked} parked` : ''}`),
      st.lastError ? h('text', { x: at.x + 44, y: at.y - 16, class: 'error-mark' }, '!') : null));
  }
  return svg;
}

function parkedRow(p) {
  return h('div', { class: 'row parked' }, h('strong', {}, p.transition), h('code', {}, (p.token && p.token.id) || ''),
    h('span', { class: 'muted' }, `from ${p.place}, ${p.attempts} attempt(s)`), h('span', { class: 'badge bad' }, p.reason || 'parked'),
    h('details', {}, h('summary', {}, 'data'), h('pre', {}, JSON.stringify(p.token && p.token.data, null, 2))));
}

// Reads the watch stream with fetch (the token goes in a header, never in a URL) and calls
// `onEvent` for each event; ends when `signal` aborts.
async function watch(model, signal, onEvent, onState = () => {}) {
  let wait = 1000;
  while (!signal.aborted) {
    let closed = false;
    const token = S.token;
    try {
      const r = await fetch(`/api/models/${encodeURIComponent(model)}/watch`, { headers: { Authorization: `Bearer ${token}` }, signal });
      if (!r.ok) {
        let err = {};
        try {
          err = (await r.json()).error || {};
        } catch {}
        throw new ApiError(r.status, err.code, err.message || `HTTP ${r.status}`);
      }
      onState('live');
      wait = 1000;
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          closed = true;
          break;
        }
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('\n');
          // The master ends a stream whose watcher may no longer see the model, saying why.
          if (block.split('\n').includes('event: ended')) {
            let why = '';
            try {
              why = JSON.parse(data).reason || '';
            } catch {}
            onState(`not live: the master ended the stream (${why})`);
            return;
          }
          if (data) {
            try {
              onEvent(JSON.parse(data));
            } catch {
              onEvent(null);
            }
          }
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && [401, 403, 404, 400].includes(e.status)) {
        if (e.status === 401) expired(token);
        onState(`not live: ${explain(e)}`);
        return;
      }
      onState(`not live: ${e instanceof ApiError ? explain(e) : 'cannot reach the master'}; trying again`);
    }
    if (closed && !signal.aborted) onState('not live: the stream ended; trying again');
    // Tried again after a second, then less and less often, up to every 15 s.
    await new Promise((res) => setTimeout(res, wait));
    wait = Math.min(wait * 2, 15000);
  }
}

async function netView(model) {
  const ctl = new AbortController();
  S.stop = () => ctl.abort();
  let net = null;
  let selected = null;
  const picture = h('div', { id: 'picture' });
  const side = h('div', { id: 'side', class: 'card' }, h('p', { class: 'muted', text: 'Click a place or a transition.' }));
  const status = h('p', { class: 'muted', id: 'live' }, 'connecting…');
  const extra = h('div', { id: 'extra' });
  show(h('p', {}, h('a', { href: '#/nets' }, '← nets')), h('h1', {}, `Net of model ${model}`), status,
    h('div', { class: 'grid' }, h('div', {}, picture, extra), side));

  // `verdict` reads an answer that is a 200 yet not a success (a fire that failed) into
  // [message, kind]; without one, any 200 is `okText`.
  const act = async (what, path, body, okText, verdict) => {
    try {
      const answer = await api('POST', path, body);
      const [text, kind] = verdict ? verdict(answer) : [okText, 'info'];
      alertBox(text, kind);
      await refresh();
    } catch (e) {
      alertBox(explain(e));
    }
  };
  // A fire answers 200 with its outcome: only `fired` and `started` are a success; a failure,
  // a stop at a limit, or nothing enabled is shown as an error, with the master's reason.
  const fireVerdict = (id) => (o) => {
    const why = (o && o.reason) || 'no reason given';
    switch (o && o.outcome) {
      case 'fired': return [`${id} fired`, 'info'];
      case 'started': return [`${id} started its fire${o.fire ? ` ${o.fire}` : ''}`, 'info'];
      case 'not-enabled': return [`${id} is not enabled: ${why}`, 'error'];
      case 'stopped': return [`${id} stopped at a limit: ${why}`, 'error'];
      default: return [`${id} failed: ${why}`, 'error'];
    }
  };
  const sideFor = async () => {
    if (!net || !selected) return;
    const [kind, id] = [selected.slice(0, 1), selected.slice(2)];
    if (kind === 't') {
      const t = net.doc.transitions.find((x) => x.id === id);
      const st = net.transitions.find((x) => x.id === id) || {};
      const base = `/api/models/${encodeURIComponent(model)}/transitions/${encodeURIComponent(id)}`;
      const parked = (net.parkedList || []).filter((p) => p.transition === id);
      const why = lacking('x', 'Starting, stopping and firing a transition need');
      const [note, said] = whyNote(why);
      fill(side, h('h2', {}, `Transition ${id}`),
        kv([['kind', t.kind], ['state', st.started ? 'started' : 'stopped'], ['fires', st.fires], ['in flight', st.inFlight], ['parked', st.parked],
          ['takes from', Object.values(t.presets || {}).map((a) => a.place).join(', ')], ['puts into', Object.values(t.postsets || {}).map((a) => a.place).join(', ')]]),
        h('div', { class: 'row' },
          actionButton({ id: 'start' }, 'Start', () => act('start', `${base}/start`, {}, `${id} started`), why, note),
          actionButton({ id: 'stop' }, 'Stop', () => act('stop', `${base}/stop`, {}, `${id} stopped`), why, note),
          actionButton({ id: 'fire', class: 'primary' }, 'Fire', () => act('fire', `${base}/fire`, {}, `${id} fired`, fireVerdict(id)), why, note)),
        said,
        st.lastError ? h('p', { class: 'last-error' }, h('span', { class: 'badge bad' }, 'last error'), ' ', st.lastError) : null,
        parked.length ? h('div', {}, h('h3', {}, 'Parked tokens'), parked.map(parkedRow)) : null,
        h('details', {}, h('summary', {}, 'definition'), h('pre', {}, JSON.stringify(t, null, 2))));
    } else {
      const place = net.places.find((x) => x.id === id);
      fill(side, h('h2', {}, `Place ${id}`), h('p', { class: 'muted', text: 'Loading tokens…' }));
      let tokens = [];
      try {
        // A page, not the place: a place may hold a hundred thousand tokens.
        tokens = await get(`/api/models/${encodeURIComponent(model)}/places/${encodeURIComponent(id)}/tokens?limit=${TOKENS_SHOWN}`);
      } catch (e) {
        fill(side, h('h2', {}, `Place ${id}`), h('p', { class: 'last-error', id: 'tokens-error', text: `Its tokens could not be read: ${explain(e)}` }));
        return;
      }
      const why = lacking('w', 'Putting a token needs');
      const [note, said] = whyNote(why);
      const data = h('textarea', { id: 'token-data', 'aria-label': 'token data (JSON)', disabled: Boolean(why), 'aria-describedby': note }, '{}');
      const put = () => {
        let value;
        try {
          value = JSON.parse(data.value);
        } catch (e) {
          alertBox(`The token's data is not JSON: ${e.message}`);
          return;
        }
        act('put', `/api/models/${encodeURIComponent(model)}/places/${encodeURIComponent(id)}/tokens`, { data: value }, `token put into ${id}`);
      };
      fill(side, h('h2', {}, `Place ${id}`), kv([['tokens', place.tokens], ['reserved', place.reserved]]),
        place.tokens > tokens.length ? h('p', { class: 'muted', id: 'tokens-shown', text: `The first ${tokens.length} of ${place.tokens} tokens; GET …/tokens?offset=${tokens.length}&limit=${TOKENS_SHOWN} reads on.` }) : null,
        h('div', { id: 'tokens' }, tokens.map((t) => h('details', { class: 'token' }, h('summary', {}, h('code', {}, t.id), h('span', { class: 'muted' }, ` by ${(t.by || []).join(', ')}`)), h('pre', {}, JSON.stringify(t.data, null, 2))))),
        h('h3', {}, 'Put a token'), data,
        actionButton({ id: 'put-token', class: 'primary' }, 'Put token', put, why, note),
        said);
    }
  };
  const select = (key) => {
    selected = key;
    draw();
    sideFor();
  };
  const draw = () => {
    if (!net) return;
    fill(picture, drawNet(net, selected, select));
    const parked = net.parkedList || [];
    const endpoint = (e) => (e && typeof e === 'object' ? Object.values(e).join('/') : String(e));
    fill(extra,
      parked.length ? h('div', { class: 'card', id: 'parked' }, h('h2', {}, `Parked tokens (${parked.length})`), parked.map(parkedRow)) : null,
      net.links && net.links.length ? h('div', { class: 'card', id: 'links' }, h('h2', {}, 'Links'),
        h('table', {}, h('tbody', {}, net.links.map((l) => h('tr', {}, h('td', {}, h('code', {}, l.id)), h('td', {}, l.relation), h('td', {}, `${endpoint(l.from)} → ${endpoint(l.to)}`), h('td', { class: 'muted' }, `declared in ${l.model}`)))))) : null);
  };
  const refresh = async () => {
    try {
      const [doc, parked, links] = await Promise.all([
        get(`/api/models/${encodeURIComponent(model)}/net`),
        get(`/api/models/${encodeURIComponent(model)}/parked`).catch(() => []),
        get(`/api/models/${encodeURIComponent(model)}/links`).catch(() => []),
      ]);
      net = doc;
      net.parkedList = Array.isArray(parked) ? parked : parked.items || [];
      net.links = Array.isArray(links) ? links : links.links || [];
      draw();
      if (selected && selected.startsWith('p:')) return;
      sideFor();
    } catch (e) {
      fill(picture, h('p', { class: 'muted', text: explain(e) }));
    }
  };
  await refresh();
  let pending = null;
  watch(model, ctl.signal, () => {
    status.textContent = `live: updated ${new Date().toLocaleTimeString()}`;
    if (pending) return;
    pending = setTimeout(async () => {
      pending = null;
      await refresh();
      if (selected && selected.startsWith('p:')) sideFor();
    }, 80);
  }, (state) => {
    status.textContent = state;
    status.classList.toggle('last-error', state !== 'live');
  });
}

// ---- executors and jobs ---------------------------------------------------------------------

// Who invoked a job, as the master tells the reader (`invoker`).
const INVOKED_BY = { you: 'you', another: 'another principal', net: 'a net\'s fire' };

// Fetches a job and shows it in `into`.
async function showJob(id, into) {
  try {
    drawJob(await get(`/api/jobs/${encodeURIComponent(id)}`), into);
  } catch (e) {
    fill(into, h('p', { class: 'muted', text: explain(e) }));
  }
}

function drawJob(job, into) {
  const id = job.jobId;
  const r = job.results[0] || {};
  // The whole of a stream whose result keeps only its start: read by the job's id, which
  // whoever may read the job may read (no r needed, as for the blob itself).
  const whole = async (stream) => {
    try {
      const x = await fetch(`/api/jobs/${encodeURIComponent(id)}/${stream}`, { headers: { Authorization: `Bearer ${S.token}` }, cache: 'no-store' });
      const text = await x.text();
      if (!x.ok) {
        // The master's refusal with its status, not its JSON shown as the output.
        let err = {};
        try {
          err = JSON.parse(text).error || {};
        } catch {}
        throw new ApiError(x.status, err.code, err.message || `HTTP ${x.status}`);
      }
      into.append(h('h3', {}, `Whole ${stream}`), h('pre', {}, text));
      const button = into.querySelector(`#whole-${stream}`);
      if (button) button.remove();
    } catch (e) {
      alertBox(`The whole ${stream} could not be read: ${explain(e)}`);
    }
  };
  // The master answers a cancel with the job as recorded. A refusal (not the invoker, or the
  // job ended meanwhile) leaves the view stale, so the job is read again beside the reason.
  const cancel = async () => {
    try {
      drawJob(await api('POST', `/api/jobs/${encodeURIComponent(id)}/cancel`), into);
      alertBox(`job ${id} cancelled`, 'info');
    } catch (e) {
      alertBox(explain(e));
      await showJob(id, into);
    }
  };
  const open = job.state === 'queued' || job.state === 'running';
  // Only the job's invoker or the operator may cancel it, and a net's step ends with its fire.
  // The job says who invoked it, as the caller sees it (`you`, `another`, `net`).
  const operator = S.me.kind === 'operator';
  let why = null;
  if (job.invoker === 'net') {
    why = `This job is a step of a net in model ${job.model}: it ends with its fire, so it is not cancelled alone; stop the transition instead.`;
  } else if (job.invoker === 'another' && !operator) {
    why = `This job was invoked by another principal: only its invoker or the operator may cancel it, and ${S.me.name} is neither.`;
  }
  const [note, said] = whyNote(why);
  fill(into, h('h2', {}, `Job ${id}`),
    kv([['state', job.state], ['model', job.model], ['invoked by', INVOKED_BY[job.invoker]], ['exit code', r.exitCode], ['duration', r.durationMs !== undefined ? `${r.durationMs} ms` : ''], ['executor', r.executor], ['attempt', r.attempt], ['error', r.error], ['cancelled by', r.cancelledBy]]),
    open ? h('div', {},
      h('p', {}, why ? actionButton({ id: 'cancel-job', class: 'danger' }, 'Cancel the job', null, why, note)
        : confirmButton({ id: 'cancel-job' }, 'Cancel the job', 'Cancel the job: sure?', cancel)),
      said || (operator || job.invoker === 'you' ? null : h('p', { class: 'muted', text: 'Only the job\'s invoker or the operator may cancel it.' }))) : null,
    h('h3', {}, 'stdout'), h('pre', {}, r.stdout || ''), h('h3', {}, 'stderr'), h('pre', {}, r.stderr || ''),
    r.stdoutBlob ? h('button', { id: 'whole-stdout', onclick: () => whole('stdout') }, 'Load the whole stdout') : null,
    r.stderrBlob ? h('button', { id: 'whole-stderr', onclick: () => whole('stderr') }, 'Load the whole stderr') : null);
}

async function executorsView() {
  show(h('h1', { text: 'Executors & jobs' }), h('p', { class: 'muted', text: 'Loading…' }));
  const detail = h('div', { class: 'card', id: 'job' }, h('p', { class: 'muted', text: 'Click a job to see its output.' }));
  // The executors need `r`; without it they are not asked for (a refusal known beforehand), and
  // the page says why in their place. The jobs are any token's: those it may read.
  const listed = has('r') ? get('/api/executors').catch((e) => e)
    : Promise.resolve(new Error(`Listing the executors needs the flag r (read), which ${S.me.name}'s token lacks.`));
  const [executors, jobs] = await Promise.all([listed, get('/api/jobs?limit=100').catch((e) => e)]);
  const table = (head, rows) => h('table', {}, h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, c)))), h('tbody', {}, rows));
  const jobLink = (id, attrs) => h('a', { href: '#', ...attrs, onclick: (ev) => { ev.preventDefault(); showJob(id, detail); } }, id);
  // A job is read with l in its model, or by its invoker: a token with neither l, nor x or t to
  // invoke with, would be refused any job an executor holds, so they are not links for it.
  const readsHeld = may('l') || may('x') || may('t');
  const heldJob = (id) => (readsHeld ? jobLink(id, { 'data-held-job': id })
    : h('code', { 'data-held-job': id, title: `Reading a job takes the flag ${flagWord('l')} in its model, or being its invoker; ${S.me.name}'s token holds neither l, nor x or t to invoke with.` }, id));
  // The jobs an executor holds have not finished: the recent jobs do not list them yet, so
  // this is the way to them (and to cancelling one).
  const held = (e) => [...e.jobs.map(heldJob), e.otherJobs ? `+${e.otherJobs} in other models` : null]
    .filter(Boolean).flatMap((x, i) => (i ? [', ', x] : [x]));
  show(h('h1', { text: 'Executors & jobs' }),
    h('h2', { text: 'Executors' }),
    executors instanceof Error ? h('p', { class: 'muted', text: explain(executors) })
      : executors.length ? table(['name', 'state', 'last seen', 'jobs held'], executors.map((e) => h('tr', { 'data-executor': e.name },
        h('td', {}, e.name), h('td', {}, h('span', { class: `badge ${e.state === 'gone' || e.state === 'silent' ? 'bad' : e.state === 'stopped' ? '' : 'ok'}` }, e.state)), h('td', { class: 'muted' }, e.lastSeen),
        h('td', {}, held(e)))))
        : h('p', { class: 'muted', text: 'No executor has polled this master.' }),
    h('h2', { text: 'Recent jobs' }),
    h('div', { class: 'grid' },
      jobs instanceof Error ? h('p', { class: 'muted', text: explain(jobs) })
        : jobs.length ? table(['job', 'tool', 'model', 'invoked by', 'exit', 'duration', 'finished', 'output'], jobs.map((j) => h('tr', { 'data-job': j.jobId },
          h('td', {}, jobLink(j.jobId)),
          h('td', {}, j.toolId || ''), h('td', {}, j.model), h('td', { 'data-invoker': j.invoker }, INVOKED_BY[j.invoker] || ''),
          h('td', {}, j.error ? h('span', { class: 'badge bad', title: j.error }, 'failed') : h('span', { class: `badge ${j.exitCode === 0 ? 'ok' : 'bad'}` }, j.timedOut ? 'timed out' : String(j.exitCode ?? j.signal))),
          h('td', {}, `${j.durationMs} ms`), h('td', { class: 'muted' }, j.finishedAt),
          h('td', {}, h('code', {}, (j.stdout || j.stderr || '').slice(0, 80))))))
          : h('p', { class: 'muted', text: 'No job finished lately.' }),
      detail));
}

// ---- audit ----------------------------------------------------------------------------------

async function auditView() {
  const p = hashParams();
  const field = (name, placeholder) => h('input', { name, placeholder, value: p.get(name) || '', 'aria-label': placeholder });
  const principal = field('principal', 'principal');
  const model = field('model', 'model');
  const type = field('type', 'type (Net, ToolRegistered, JobFinished…)');
  const after = field('after', 'after seq');
  const form = h('form', { class: 'filters', id: 'audit-filter' }, principal, model, type, after, h('button', { type: 'submit', class: 'primary' }, 'Filter'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    go(`#/audit${q({ principal: principal.value, model: model.value, type: type.value, after: after.value })}`);
  });
  const list = h('div', { id: 'events' }, h('p', { class: 'muted', text: 'Loading…' }));
  show(h('h1', { text: 'Audit' }), form, list);
  try {
    if (!S.seq) await get('/api/me');
    const filters = { principal: p.get('principal'), model: p.get('model'), type: p.get('type') };
    const filtered = Object.values(filters).some((v) => v);
    let events;
    let said;
    if (p.get('after') || !filtered) {
      // From a given event on, or the last 300 events.
      const from = p.get('after') || Math.max(0, S.seq - 300);
      events = await get(`/api/events${q({ ...filters, after: from, limit: 300 })}`);
      said = `${events.length} event(s) after #${from}, newest first`;
    } else {
      // Filtered, the newest 300 that match in the whole log, not in its last 300 events: the
      // master answers matches oldest first, so read on from the start keeping the last 300,
      // for ten pages at most.
      let after = 0;
      let page;
      let pages = 0;
      events = [];
      do {
        page = await get(`/api/events${q({ ...filters, after, limit: 300 })}`);
        events = events.concat(page).slice(-300);
        if (page.length) after = page[page.length - 1].seq;
        pages += 1;
      } while (page.length === 300 && pages < 10);
      said = page.length === 300
        ? `the last ${events.length} of the first ${pages * 300} matching events, newest first; give "after seq" #${after} to read on`
        : `the last ${events.length} matching event(s), newest first`;
    }
    events.reverse();
    fill(list, h('p', { class: 'muted', text: said }),
      h('table', {}, h('thead', {}, h('tr', {}, ['seq', 'time', 'principal', 'model', 'type', 'payload'].map((c) => h('th', {}, c)))),
        h('tbody', {}, events.map((e) => h('tr', { 'data-seq': e.seq },
          h('td', { class: 'mono' }, e.seq), h('td', { class: 'muted' }, e.time), h('td', {}, e.principal), h('td', {}, e.model), h('td', {}, e.type),
          h('td', {}, h('details', {}, h('summary', {}, JSON.stringify(e.payload).slice(0, 90)), h('pre', {}, JSON.stringify(e.payload, null, 2)))))))));
  } catch (e) {
    fill(list, h('p', { class: 'muted', text: explain(e) }));
  }
}

// ---- operator pages -------------------------------------------------------------------------

async function agentsView() {
  show(h('h1', { text: 'Agents' }), h('p', { class: 'muted', text: 'Loading…' }));
  let all;
  try {
    all = await get('/api/agents');
  } catch (e) {
    show(h('h1', { text: 'Agents' }), h('p', { class: 'muted', text: explain(e) }));
    return;
  }
  const revoke = (name) => confirmButton({ 'data-revoke': name }, 'Revoke', `Revoke ${name}: sure?`, async () => {
    try {
      await api('DELETE', `/api/agents/${encodeURIComponent(name)}`);
      alertBox(`${name} revoked: its token no longer works`, 'info');
      agentsView();
    } catch (e) {
      alertBox(explain(e));
    }
  });
  const rows = (kind) => all.filter((p) => p.kind === kind).map((p) => h('tr', { 'data-principal': p.name },
    h('td', {}, p.name), h('td', {}, flagsView(p.flags)), h('td', {}, p.model), h('td', {}, (p.granted || []).join(', ')), h('td', {}, kind === 'operator' ? '' : revoke(p.name))));
  const head = h('thead', {}, h('tr', {}, ['name', 'flags', 'home model', 'granted models', ''].map((c) => h('th', {}, c))));
  show(h('h1', { text: 'Agents' }),
    h('table', { id: 'agents' }, head, h('tbody', {}, rows('operator'), rows('agent'))),
    h('div', { class: 'card' }, h('h2', { text: 'What the flags mean' }),
      h('dl', { class: 'kv' }, FLAGS.flatMap(([l, name, what]) => [h('dt', {}, h('code', {}, l)), h('dd', {}, `${name}: ${what}`)]))),
    h('h2', { text: 'Executor credentials' }),
    h('table', { id: 'executor-credentials' }, h('thead', {}, h('tr', {}, ['name', '', 'home model', '', ''].map((c) => h('th', {}, c)))), h('tbody', {}, rows('executor'))));
}

async function secretsView() {
  show(h('h1', { text: 'Secrets' }), h('p', { class: 'muted', text: 'Loading…' }));
  try {
    const [secrets, grants] = await Promise.all([get('/api/secrets'), get('/api/secret-grants')]);
    show(h('h1', { text: 'Secrets' }), h('p', { class: 'muted', text: 'Names only: values are never shown or sent to the page.' }),
      h('table', { id: 'secrets' }, h('thead', {}, h('tr', {}, h('th', {}, 'name'), h('th', {}, 'updated'))),
        h('tbody', {}, secrets.map((s) => h('tr', {}, h('td', {}, h('code', {}, s.name)), h('td', { class: 'muted' }, s.updatedAt))))),
      h('h2', { text: 'Grants' }),
      h('pre', {}, JSON.stringify(grants, null, 2)));
  } catch (e) {
    show(h('h1', { text: 'Secrets' }), h('p', { class: 'muted', text: explain(e) }));
  }
}

// ---- routing --------------------------------------------------------------------------------

const PAGES = {
  catalog: catalogView,
  tool: (rest) => entryView(decodeURIComponent(rest)),
  nets: (rest) => (rest ? netView(decodeURIComponent(rest)) : netsView()),
  executors: executorsView,
  audit: auditView,
  agents: agentsView,
  secrets: secretsView,
};

// Shows the page for `hash`. Setting a new hash routes once, from its `hashchange`; routing here
// as well would draw the page twice, and the second drawing could replace a form being filled in.
function go(hash) {
  if (location.hash === hash || (hash === '#/' && !location.hash)) route();
  else location.hash = hash;
}

async function route() {
  if (S.stop) {
    S.stop();
    S.stop = null;
  }
  alertBox(null);
  if (!S.token) {
    signInView();
    return;
  }
  if (!S.me) {
    try {
      await signedIn();
    } catch (e) {
      // A 401 has already signed the page out (see `expired`).
      if (e instanceof ApiError && e.status === 401) return;
      // Anything else (the master starting, out of reach) keeps the token: try again.
      show(h('p', { class: 'muted', text: explain(e) }), h('button', { id: 'retry', onclick: route }, 'Try again'));
      return;
    }
  }
  const path = location.hash.replace(/^#\/?/, '').split('?')[0];
  const [page, ...rest] = path.split('/');
  // The view an address belongs to (an entry is the catalog's); no page, or one the page does
  // not know, is the first view the token may use.
  const known = PAGES[page] ? page : null;
  const target = VIEWS.find((v) => v.page === (known === 'tool' ? 'catalog' : known)) || landing();
  // An address the page did not make (`#/tool/%E0`) is said, not half shown.
  try {
    decodeURIComponent(rest.join('/'));
  } catch {
    show(h('p', { class: 'last-error', text: `This address is not one the page makes: ${location.hash} does not decode.` }));
    return;
  }
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.page === (target && target.page));
  // A view the token may not use is not asked for: the page says which flag it lacks instead.
  if (!target) {
    noView();
    return;
  }
  if (!mayUse(target)) {
    closedView(target);
    return;
  }
  try {
    await (known ? PAGES[known](rest.join('/')) : PAGES[target.page](''));
  } catch (e) {
    alertBox(explain(e));
  }
}

document.getElementById('sign-out').addEventListener('click', () => {
  sessionStorage.removeItem('agentos.token');
  S.token = null;
  S.me = null;
  go('#/');
});
window.addEventListener('hashchange', route);
route();
