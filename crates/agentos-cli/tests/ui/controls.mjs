// The controls of a view, for tokens with and without the flag each control's route takes: one
// the token cannot pass is offered disabled (aria-disabled, still reachable from the keyboard),
// with the flag said beside it and tied to it for a screen reader, and using it sends nothing;
// one it can pass works. Any console error, page error or request answered 400 or more fails
// the run: nothing the page offers is refused. Run by tests/ui.rs, which prepares the master:
// model flow (p-in → move → p-out, one token in p-in), executor e1 holding $JOB, invoked by
// the full agent.
const { URL: BASE, READER_TOKEN, WATCHER_TOKEN, OTHER_TOKEN, FULL_TOKEN, JOB, SCREENSHOTS, PLAYWRIGHT_CORE } = process.env;
const { chromium } = await import(`${PLAYWRIGHT_CORE}/index.mjs`);
const { openPage } = await import('./browser.mjs');
const problems = [];
// Every request that is not a read: a disabled control must send none.
const sent = [];

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const { browser, page } = await openPage(chromium);
page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
page.on('console', (m) => {
  if (m.type() === 'error') problems.push(`console.error: ${m.text()}`);
});
page.on('response', (r) => {
  if (r.status() >= 400) problems.push(`${r.status()} for ${r.request().method()} ${r.url()}`);
});
page.on('request', (r) => {
  if (r.method() !== 'GET') sent.push(`${r.method()} ${r.url()}`);
});

async function signIn(token, drawn) {
  if (await page.locator('#sign-out').isVisible()) {
    await page.click('#sign-out');
  }
  await page.locator('#sign-in').waitFor();
  await page.fill('#token', token);
  await page.click('#sign-in button[type=submit]');
  await page.locator(drawn).waitFor();
}

// `selector` is offered disabled, saying that it takes `flag`: in its title, and in the text its
// aria-describedby names (what a screen reader reads with it). Clicked, or pressed from the
// keyboard, it sends nothing and says nothing in the alert.
async function offeredDisabled(selector, flag) {
  const el = page.locator(selector);
  await el.waitFor();
  check((await el.getAttribute('aria-disabled')) === 'true', `${selector} is offered as a working control`);
  const ids = (await el.getAttribute('aria-describedby')) || '';
  check(ids.trim() !== '', `${selector} has no reason tied to it`);
  const reason = (await Promise.all(ids.trim().split(/\s+/).map((id) => page.locator(`[id="${id}"]`).textContent()))).join(' ');
  check(reason.includes(flag), `${selector}'s reason names ${flag}: ${reason}`);
  check(((await el.getAttribute('title')) || '').includes(flag), `${selector}'s title names ${flag}`);
  const before = sent.length;
  await el.click({ force: true });
  await el.focus();
  check(await el.evaluate((e) => document.activeElement === e), `${selector} cannot be reached from the keyboard`);
  await page.keyboard.press('Enter');
  await page.keyboard.press(' ');
  // A request a click would send is sent before the click returns; read something back to be
  // sure none is on its way.
  await page.evaluate(() => fetch('/healthz'));
  check(sent.length === before, `${selector} sent ${sent.slice(before)}`);
  check(await page.locator('#alert').isHidden(), `${selector}: an alert: ${await page.locator('#alert').textContent()}`);
  return reason;
}

const count = (place, n) => page.locator(`g[data-place=${place}] text.count`, { hasText: new RegExp(`^${n}$`) }).waitFor();

await page.goto(`${BASE}/`);

// `r` alone: the net, its transition's start, stop and fire and its place's put-token disabled.
await signIn(READER_TOKEN, 'h1:text-is("Nets") + table');
await page.goto(`${BASE}/#/nets/flow`);
await page.locator('#live', { hasText: 'live' }).waitFor();
await page.click('g[data-transition=move]');
for (const id of ['#start', '#stop', '#fire']) {
  const why = await offeredDisabled(id, 'x (execute)');
  check(why.includes("reader's token lacks"), `whose token lacks it: ${why}`);
}
await page.screenshot({ path: `${SCREENSHOTS}/controls-read.png`, fullPage: true });
await page.click('g[data-place=p-in]');
await page.locator('#tokens details').first().waitFor();
await offeredDisabled('#put-token', 'w (write)');
check(await page.locator('#token-data').isDisabled(), 'the token data can be typed for a put that cannot be sent');
await count('p-in', 1);
// The executors: the job held is listed, but not as a way to a job `r` alone may not read.
await page.goto(`${BASE}/#/executors`);
const held = page.locator('tr[data-executor=e1]');
await held.waitFor();
check((await held.textContent()).includes(JOB), 'the held job is listed');
check((await held.locator('a').count()) === 0, 'the held job is a link to a refusal');
check(((await held.locator(`[data-held-job="${JOB}"]`).getAttribute('title')) || '').includes('l (logs)'), 'why the held job cannot be opened');

// `r` and `l`, neither `x` nor `t`: it reads the job, and its cancel is disabled (only the
// job's invoker or the operator may cancel it, and it invoked nothing).
await signIn(WATCHER_TOKEN, 'h1:text-is("Nets") + table');
await page.goto(`${BASE}/#/executors`);
await page.click(`tr[data-executor=e1] a[data-held-job="${JOB}"]`);
await page.locator('#job h2', { hasText: JOB }).waitFor();
const whyNot = await offeredDisabled('#cancel-job', 'invoked by another principal');
check(whyNot.includes('only its invoker or the operator'), `the cancel's reason says who may: ${whyNot}`);
check((await page.locator('#cancel-job').textContent()) === 'Cancel the job', 'the disabled cancel asked to confirm');
check((await page.locator('#job dt:text-is("invoked by") + dd').textContent()) === 'another principal', 'who invoked the job is said');
await page.screenshot({ path: `${SCREENSHOTS}/controls-cancel.png`, fullPage: true });

// `r`, `x` and `l`: it may invoke and reads the job, but the job is another's: its cancel is
// disabled too (offered, it was answered 403).
await signIn(OTHER_TOKEN, '#catalog-search');
await page.goto(`${BASE}/#/executors`);
await page.click(`tr[data-executor=e1] a[data-held-job="${JOB}"]`);
await page.locator('#job h2', { hasText: JOB }).waitFor();
await offeredDisabled('#cancel-job', 'invoked by another principal');

// `rwx` (and `s`, to see the script it invoked): every control works, through the page.
await signIn(FULL_TOKEN, '#catalog-search');
await page.goto(`${BASE}/#/nets/flow`);
await page.locator('#live', { hasText: 'live' }).waitFor();
await page.click('g[data-transition=move]');
for (const id of ['#start', '#stop', '#fire']) {
  check((await page.locator(id).getAttribute('aria-disabled')) === null, `${id} is disabled for rwx`);
}
await page.click('#fire');
await page.locator('#alert', { hasText: 'move fired' }).waitFor();
await count('p-out', 1);
await count('p-in', 0);
await page.click('#start');
await page.locator('g.transition.started[data-transition=move]').waitFor();
await page.locator('#alert', { hasText: 'move started' }).waitFor();
await page.click('#stop');
await page.locator('#alert', { hasText: 'move stopped' }).waitFor();
await page.locator('g.transition:not(.started)[data-transition=move]').waitFor();
await page.click('g[data-place=p-in]');
await page.locator('#side h2', { hasText: 'Place p-in' }).waitFor();
check((await page.locator('#put-token').getAttribute('aria-disabled')) === null, 'the put is disabled for rwx');
await page.fill('#token-data', '{"n": 2}');
await page.click('#put-token');
await page.locator('#alert', { hasText: 'token put into p-in' }).waitFor();
await count('p-in', 1);
// Its own job: cancelled from the page (a second click confirms).
await page.goto(`${BASE}/#/executors`);
await page.click(`tr[data-executor=e1] a[data-held-job="${JOB}"]`);
await page.locator('#job h2', { hasText: JOB }).waitFor();
check((await page.locator('#job dt:text-is("invoked by") + dd').textContent()) === 'you', 'the job is said to be its own');
check((await page.locator('#cancel-job').getAttribute('aria-disabled')) === null, 'the cancel of its own job is disabled');
await page.click('#cancel-job');
await page.click('#cancel-job');
await page.locator('#alert', { hasText: `job ${JOB} cancelled` }).waitFor();

await browser.close();
console.log(JSON.stringify({ problems, sent }));
if (problems.length) {
  console.error(problems.join('\n'));
  process.exit(1);
}
