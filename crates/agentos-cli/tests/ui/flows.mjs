// The page in headless Chromium, driven by Playwright: sign in, search, open an entry, see
// shadowing, watch a token move live, fire from the page, the fire offered disabled to an agent
// without the flag, saying which it takes, a place with more tokens than are shown, a job's whole
// stdout loaded (by an agent without r too) and a damaged one's read refused, a running job
// cancelled (and a cancel refused because another came first); no JavaScript error and no
// console error on any page but the refusals provoked on purpose. Screenshots go to
// $SCREENSHOTS. Run by tests/ui.rs, which prepares the master.
const { URL: BASE, OPERATOR_TOKEN, VIEWER_TOKEN, TEMP_TOKEN, CALLER_TOKEN, LOUD_JOB, BROKEN_JOB, SLEEP_JOB, RACED_JOB, SCREENSHOTS, PLAYWRIGHT_CORE } = process.env;
// Installed by scripts/ui-env under target/tools/ui, named by its path.
const { chromium } = await import(`${PLAYWRIGHT_CORE}/index.mjs`);
const { openPage } = await import('./browser.mjs');
const problems = [];
const expected = [];

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

async function api(method, path, body) {
  const r = await fetch(`${BASE}${path}`, {
    method,
    headers: { Authorization: `Bearer ${OPERATOR_TOKEN}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

const { browser, page } = await openPage(chromium);
page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
page.on('console', (m) => {
  if (m.type() !== 'error') return;
  const text = m.text();
  // A refusal the test provokes on purpose is logged by Chromium as a failed resource: each
  // provoked one excuses one such line.
  const status = Number((/status of (\d{3})/.exec(text) || [])[1]);
  const i = expected.indexOf(status);
  if (i >= 0) {
    expected.splice(i, 1);
    return;
  }
  problems.push(`console.error: ${text}`);
});
const shot = (name) => page.screenshot({ path: `${SCREENSHOTS}/${name}.png`, fullPage: true });
const figures = {};

// First view: what it transfers and when it paints.
const response = await page.goto(BASE, { waitUntil: 'load' });
check(response.headers()['content-security-policy'].includes("script-src 'self'"), 'the page has its CSP');
await page.locator('#sign-in').waitFor();
figures.firstViewBytes = await page.evaluate(() => {
  const nav = performance.getEntriesByType('navigation')[0];
  return nav.transferSize + performance.getEntriesByType('resource').reduce((n, r) => n + r.transferSize, 0);
});
figures.firstPaintMs = await page.evaluate(() => {
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  return fcp ? Math.round(fcp.startTime) : -1;
});
await shot('sign-in');

// A wrong token is refused with the reason, and nothing is kept.
await page.fill('#token', 'aos_not-a-token');
expected.push(401);
await page.click('#sign-in button[type=submit]');
await page.locator('#alert', { hasText: 'not known' }).waitFor();
check((await page.evaluate(() => sessionStorage.getItem('agentos.token'))) === null, 'a refused token is not kept');

// Sign in as the operator: the catalog.
await page.fill('#token', OPERATOR_TOKEN);
await page.click('#sign-in button[type=submit]');
await page.locator('#catalog-search').waitFor();
check(!(await page.url()).includes(OPERATOR_TOKEN), 'the token is not in the URL');

// Search, with the model whose local entry shadows the global one.
await page.fill('#catalog-search input[name=q]', 'greet');
await page.fill('#catalog-search input[name=model]', 'team');
await page.click('#catalog-search button[type=submit]');
// Team's own greet first, and the global greet it hides, marked shadowed.
await page.locator('tr[data-id=greet] .badge.local').waitFor();
await page.locator('tr[data-id=greet] .badge.shadowed').waitFor();
check((await page.locator('tr[data-id=greet]').count()) === 2, 'both greets are listed');
await shot('catalog');
// Searched from the global side, nothing is shadowed.
await page.fill('#catalog-search input[name=model]', 'default');
await page.click('#catalog-search button[type=submit]');
await page.locator('#results', { hasText: '1 entry' }).waitFor();
check((await page.locator('tr[data-id=greet] .badge.shadowed').count()) === 0, 'nothing shadowed from the global side');

// A catalog larger than a page: the first 200, the count, and the way to the rest.
await page.goto(`${BASE}/#/catalog?q=bulk`);
await page.locator('#shown', { hasText: '300 entries, 1–200 shown' }).waitFor();
check((await page.locator('tr[data-id^=bulk-]').count()) === 200, 'a page of 200 entries');
check((await page.locator('#previous').count()) === 0, 'no previous page on the first');
await page.click('#next');
await page.locator('#shown', { hasText: '201–300 shown' }).waitFor();
check((await page.locator('tr[data-id=bulk-299]').count()) === 1, 'the last entry is on the second page');
await page.locator('#previous').waitFor();

// Open the local entry: its contract as the shell takes it, binding and history.
await page.goto(`${BASE}/#/tool/greet?model=team`);
await page.locator('#contract pre.help').waitFor();
const help = await page.locator('#contract pre.help').first().textContent();
check(help.includes('Usage: agentos-greet run --name <string>'), `the contract shows the --help text: ${help}`);
const binding = await page.locator('#binding').textContent();
check(/[0-9a-f]{64}/.test(binding) && binding.includes('urn:agentos:blob:'), `the binding shows its sha256 and URN: ${binding}`);
await page.locator('#history', { hasText: 'binding.sha256' }).waitFor();
// The name beside the id is isolated: text in one cannot reorder the other on screen.
check((await page.locator('h1 bdi').count()) >= 1, 'the entry heading isolates its name');
await shot('entry');
// `..` is not a tool: the page says so rather than asking for /api/.
await page.goto(`${BASE}/#/tool/..`);
await page.locator('main p.last-error', { hasText: 'is not a tool id' }).waitFor();
// An address the page never makes is said, not half shown.
await page.goto(`${BASE}/#/tool/%E0`);
await page.locator('main p.last-error', { hasText: 'does not decode' }).waitFor();

// Nets: the net applied through the API, a token watched moving live.
await page.goto(`${BASE}/#/nets/flow`);
await page.locator('g[data-place=p-in]').waitFor();
await page.locator('#live', { hasText: 'live' }).waitFor();
await api('POST', '/api/models/flow/places/p-in/tokens', { data: { n: 1 } });
await page.locator('g[data-place=p-in] text.count', { hasText: /^1$/ }).waitFor();
// Fired from the page: the token moves to p-out.
await page.click('g[data-transition=move]');
await page.click('#fire');
await page.locator('g[data-place=p-out] text.count', { hasText: /^1$/ }).waitFor();
await page.locator('g[data-place=p-in] text.count', { hasText: /^0$/ }).waitFor();
// Started through the API: the next token goes through on its own, seen live.
await api('POST', '/api/models/flow/transitions/move/start', {});
await api('POST', '/api/models/flow/places/p-in/tokens', { data: { n: 2 } });
await page.locator('g[data-place=p-out] text.count', { hasText: /^2$/ }).waitFor();
await page.locator('g.transition.started[data-transition=move]').waitFor();
// A token put from the page, and its data on click.
await page.click('g[data-place=p-out]');
await page.locator('#tokens details').first().waitFor();
await page.locator('#tokens details summary').first().click();
await page.locator('#tokens pre', { hasText: '"n"' }).first().waitFor();
await shot('net');
// From the keyboard: a place takes focus, and Enter opens it.
await page.focus('g[data-place=p-in]');
await page.keyboard.press('Enter');
await page.locator('#side h2', { hasText: 'Place p-in' }).waitFor();
// On a phone's width the drawing keeps its width, the panel below it.
await page.setViewportSize({ width: 375, height: 800 });
const pictureWidth = await page.locator('#picture').evaluate((el) => el.getBoundingClientRect().width);
check(pictureWidth > 300, `the drawing on a narrow window is ${pictureWidth} px wide`);
await shot('net-narrow');
await page.setViewportSize({ width: 1280, height: 860 });
// A model with no net: the watch is refused, and the page says it is not live.
expected.push(404, 404, 404, 404);
await page.goto(`${BASE}/#/nets/no-such-model`);
await page.locator('#live', { hasText: 'not live' }).waitFor();

// A place with more tokens than the page shows (205, 200 shown): the first 200, and how to read on.
await page.goto(`${BASE}/#/nets/many`);
await page.locator('g[data-place=p-many] text.count', { hasText: /^205$/ }).waitFor();
await page.click('g[data-place=p-many]');
const shownTokens = page.locator('#tokens-shown');
await shownTokens.waitFor();
check((await page.locator('#tokens details.token').count()) === 200, 'the place shows 200 of its tokens');
const readOn = await shownTokens.textContent();
check(readOn.includes('The first 200 of 205 tokens') && readOn.includes('offset=200&limit=200'), `how to read on: ${readOn}`);
await shot('tokens');

// A transition that parked a token shows it, with the reason.
// A net with nothing in it is drawn with a size of its own, not an infinite one.
await page.goto(`${BASE}/#/nets/empty`);
await page.locator('svg.net').waitFor();
const box = await page.locator('svg.net').getAttribute('viewBox');
check(/^0 0 \d+ \d+$/.test(box), `the empty net's viewBox: ${box}`);

await page.goto(`${BASE}/#/nets/park`);
await page.locator('g.transition.parked[data-transition=sort]').waitFor();
await page.locator('#parked', { hasText: 'Parked tokens (1)' }).waitFor();
await page.click('g[data-transition=sort]');
await page.locator('#side .parked').waitFor();
await shot('parked');

// Executors and jobs: the executor, and the job the test ran, with its output.
await page.goto(`${BASE}/#/executors`);
await page.locator('tr[data-executor=e1]').waitFor();
// Whose each job is, as the operator reads the list: its own, and the caller's.
check((await page.locator('tr[data-job]', { hasText: 'hello from the job' }).locator('td[data-invoker]').textContent()) === 'you', 'the operator\'s own job says you');
check((await page.locator(`tr[data-job="${LOUD_JOB}"] td[data-invoker]`).textContent()) === 'another principal', 'the caller\'s job says another principal');
await page.locator('tr[data-job]', { hasText: 'hello from the job' }).locator('a').click();
await page.locator('#job pre', { hasText: 'hello from the job' }).waitFor();
// Which hand-out ran it: the first.
check((await page.locator('#job dt', { hasText: 'attempt' }).locator('xpath=following-sibling::dd[1]').textContent()) === '1', 'the job shows its attempt');
await shot('executors');
// A stdout past what is kept inline: its first 2,000 characters, and the whole from its blob.
await page.click(`tr[data-job="${LOUD_JOB}"] a`);
const loadWhole = page.locator('#job button', { hasText: 'Load the whole stdout' });
await loadWhole.waitFor();
check((await page.locator('#job pre').first().textContent()) === 'a'.repeat(2000), 'the stdout shown is its first 2,000 characters');
await loadWhole.click();
await page.locator('#job h3', { hasText: 'Whole stdout' }).waitFor();
const whole = await page.locator('#job pre').last().textContent();
check(whole.length === 150000 && whole.endsWith('az'), `the whole stdout: ${whole.length} characters ending ${whole.slice(-5)}`);
check((await loadWhole.count()) === 0, 'the whole stdout can be loaded again beside itself');
check(await page.locator('#alert').isHidden(), `an alert beside the whole stdout: ${await page.locator('#alert').textContent()}`);
await shot('whole-output');

// Running jobs, reached from the executor that holds them. One cancelled from the page (a
// second click confirms): shown finished, with who cancelled it, and no longer cancellable.
const jobFields = () => page.locator('#job dl.kv').evaluate((dl) => {
  const out = {};
  for (const dt of dl.querySelectorAll('dt')) out[dt.textContent] = dt.nextElementSibling.textContent;
  return out;
});
await page.goto(`${BASE}/#/executors`);
await page.click(`tr[data-executor=e1] a[data-held-job="${SLEEP_JOB}"]`);
await page.locator('#job h2', { hasText: SLEEP_JOB }).waitFor();
const running = await jobFields();
check(running.state === 'running', `the held job's state: ${JSON.stringify(running)}`);
const cancelJob = page.locator('#job button#cancel-job');
check((await cancelJob.textContent()) === 'Cancel the job', `the cancel button: ${await cancelJob.textContent()}`);
await cancelJob.click();
check((await cancelJob.textContent()) === 'Cancel the job: sure?', 'the first click asks');
check((await api('GET', `/api/jobs/${SLEEP_JOB}`)).state === 'running', 'the first click cancelled the job');
await cancelJob.click();
await page.locator('#alert', { hasText: `job ${SLEEP_JOB} cancelled` }).waitFor();
const cancelled = await jobFields();
check(cancelled.state === 'finished' && cancelled['cancelled by'] === 'operator'
  && cancelled.error === 'cancelled by operator before it finished', `the cancelled job: ${JSON.stringify(cancelled)}`);
check((await page.locator('#job button#cancel-job').count()) === 0, 'a finished job offers to cancel it');
const recorded = await api('GET', `/api/jobs/${SLEEP_JOB}`);
check(recorded.state === 'finished' && recorded.results[0].cancelledBy === 'operator', `the job as recorded: ${JSON.stringify(recorded)}`);
await shot('cancelled');
// The other, cancelled through the API while the page asks for confirmation: the page's cancel
// is refused (409), the reason shown, and the job shown as it is now.
await page.click(`tr[data-executor=e1] a[data-held-job="${RACED_JOB}"]`);
await page.locator('#job h2', { hasText: RACED_JOB }).waitFor();
await page.click('#job button#cancel-job');
await api('POST', `/api/jobs/${RACED_JOB}/cancel`, {});
expected.push(409);
await page.click('#job button#cancel-job');
const raced = page.locator('#alert', { hasText: '409 job_finished' });
await raced.waitFor();
const racedWhy = await raced.textContent();
check(racedWhy.includes('cancelled by operator'), `the refused cancel is explained: ${racedWhy}`);
await page.locator('#job button#cancel-job').waitFor({ state: 'detached' });
const now = await jobFields();
check(now.state === 'finished' && now['cancelled by'] === 'operator', `the job shown after the refusal: ${JSON.stringify(now)}`);

// Audit, filtered by type.
await page.goto(`${BASE}/#/audit?type=Net`);
await page.locator('#events tr[data-seq]').first().waitFor();
const types = await page.locator('#events tbody tr td:nth-child(5)').allTextContents();
check(types.length > 0 && types.every((t) => t === 'Net'), `only Net events: ${types}`);
await shot('audit');
// Filtered, the whole log is searched, not only its last 300 events: the viewer's creation is
// further back than that.
await page.goto(`${BASE}/#/audit?type=PrincipalCreated`);
await page.locator('#events tr[data-seq]', { hasText: 'viewer' }).first().waitFor();
// More matches than a page: the newest are shown (the last bulk registration), not the oldest.
await page.goto(`${BASE}/#/audit?type=ToolRegistered`);
await page.locator('#events tr[data-seq]', { hasText: 'bulk-299' }).first().waitFor();

// Operator pages: agents with their flags, secrets by name only.
await page.goto(`${BASE}/#/agents`);
await page.locator('tr[data-principal=viewer]').waitFor();
await page.locator('#executor-credentials tr[data-principal=e1]').waitFor();
await shot('agents');
// Revoked from the page (a second click confirms): the row goes, and so does the token.
await page.click('button[data-revoke=temp]');
await page.click('button[data-revoke=temp]');
await page.locator('#alert', { hasText: 'temp revoked' }).waitFor();
await page.locator('tr[data-principal=temp]').waitFor({ state: 'detached' });
const gone = await fetch(`${BASE}/api/me`, { headers: { Authorization: `Bearer ${TEMP_TOKEN}` } });
check(gone.status === 401, `the revoked token still works: ${gone.status}`);
await page.goto(`${BASE}/#/secrets`);
await page.locator('#secrets', { hasText: 'API_KEY' }).waitFor();
check(!(await page.content()).includes('secret-value-0123456789'), 'a secret value reached the page');
await shot('secrets');

// An agent without x: the fire is offered disabled, saying which flag it takes, and sends nothing.
await page.click('#sign-out');
await page.locator('#sign-in').waitFor();
// The form is drawn once: a second drawing after the hash change would empty a token being typed.
const form = await page.$('#sign-in');
await page.waitForTimeout(300);
check(await form.evaluate((f) => f.isConnected), 'the sign-in form was drawn again after signing out');
await page.fill('#token', VIEWER_TOKEN);
await page.click('#sign-in button[type=submit]');
await page.locator('#catalog-search').waitFor();
check(await page.locator('a[data-page=agents]').isHidden(), 'an agent is not offered the operator pages');
await page.goto(`${BASE}/#/nets/flow`);
await page.click('g[data-transition=move]');
const fire = page.locator('#fire');
await fire.waitFor();
check((await fire.getAttribute('aria-disabled')) === 'true', 'the fire is offered to an agent without x');
const why = await page.locator(`[id="${await fire.getAttribute('aria-describedby')}"]`).textContent();
check(why.includes('x (execute)') && why.includes("viewer's token lacks"), `the fire says which flag it takes: ${why}`);
await fire.click({ force: true });
check(await page.locator('#alert').isHidden(), `the disabled fire was sent: ${await page.locator('#alert').textContent()}`);
await shot('refused');

// An agent that may run scripts but not read (no r) sees its own job and loads its whole
// stdout, read by the job's id. A damaged stored output is refused: the page says so, with the
// status and the reason, and shows nothing as the output.
await page.click('#sign-out');
await page.locator('#sign-in').waitFor();
await page.fill('#token', CALLER_TOKEN);
await page.click('#sign-in button[type=submit]');
await page.locator('#catalog-search').waitFor();
// The executors are not for it (they need r): the page says so in their place, without asking.
await page.goto(`${BASE}/#/executors`);
await page.locator('main p', { hasText: 'Listing the executors needs the flag r (read)' }).waitFor();
await page.click(`tr[data-job="${LOUD_JOB}"] a`);
const loadOwn = page.locator('#job button', { hasText: 'Load the whole stdout' });
await loadOwn.waitFor();
await loadOwn.click();
await page.locator('#job h3', { hasText: 'Whole stdout' }).waitFor();
const own = await page.locator('#job pre').last().textContent();
check(own.length === 150000 && own.endsWith('az'), `its own whole stdout: ${own.length} characters`);
check(await page.locator('#alert').isHidden(), `an alert beside its whole stdout: ${await page.locator('#alert').textContent()}`);
await shot('own-output');
await page.click(`tr[data-job="${BROKEN_JOB}"] a`);
const loadBroken = page.locator('#job button', { hasText: 'Load the whole stdout' });
await loadBroken.waitFor();
expected.push(500);
await loadBroken.click();
const outputRefused = page.locator('#alert', { hasText: 'The whole stdout could not be read' });
await outputRefused.waitFor();
const brokenWhy = await outputRefused.textContent();
check(brokenWhy.includes('500') && brokenWhy.includes('is corrupt'), `the refused read is explained: ${brokenWhy}`);
check((await page.locator('#job h3', { hasText: 'Whole stdout' }).count()) === 0, 'a refusal is not shown as the output');
await shot('output-refused');

// Its token revoked while the page is open: the next request signs the page out, and the
// token is forgotten, rather than every view saying 401 under its name.
await api('DELETE', '/api/agents/caller');
expected.push(401);
await page.goto(`${BASE}/#/catalog`);
await page.locator('#sign-in').waitFor();
await page.locator('#alert', { hasText: 'no longer accepted' }).waitFor();
check(!(await page.evaluate(() => sessionStorage.getItem('agentos.token'))), 'the revoked token is kept');
check(await page.locator('#who').evaluate((el) => el.textContent === ''), 'the header still names the revoked agent');
// What is not a token is said before anything is sent.
await page.fill('#token', 'Bearer ');
await page.click('#sign-in button[type=submit]');
await page.locator('#alert', { hasText: 'Paste a token first' }).waitFor();
await page.fill('#token', 'aos_€uro');
await page.click('#sign-in button[type=submit]');
await page.locator('#alert', { hasText: 'not a token' }).waitFor();

await browser.close();
console.log(JSON.stringify({ figures, problems }));
if (problems.length) {
  console.error(problems.join('\n'));
  process.exit(1);
}
