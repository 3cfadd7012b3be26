// Where the page lands a token after sign-in, for an agent holding each flag alone: on the first
// view its flag opens, offering only the views it may use, or, when it may use none, on a page
// saying what it holds and what each view needs. A view it may not use, opened by its address,
// says which flag it lacks. No request is refused on the way: any console error (a 403 logged as
// a failed resource) fails the run. Run by tests/ui.rs, which prepares the master; $AGENTS is
// {letter: token}.
const { URL: BASE, AGENTS, SCREENSHOTS, PLAYWRIGHT_CORE } = process.env;
const { chromium } = await import(`${PLAYWRIGHT_CORE}/index.mjs`);
const { openPage } = await import('./browser.mjs');
const agents = JSON.parse(AGENTS);
const problems = [];

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const { browser, page } = await openPage(chromium);
page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
page.on('console', (m) => {
  if (m.type() === 'error') problems.push(`console.error: ${m.text()}`);
});
page.on('response', (r) => {
  if (r.status() >= 400) problems.push(`${r.status()} for ${r.url()}`);
});

// What each view shows once drawn, and the nav links each flag alone opens.
const DRAWN = { catalog: '#catalog-search', nets: 'h1:text-is("Nets") + table', audit: '#audit-filter' };
const LANDS = { r: 'nets', w: 'catalog', x: 'catalog', h: 'catalog', l: 'audit', u: null, d: 'catalog', c: null, t: 'catalog', s: 'catalog', m: 'catalog' };
const OFFERED = {
  r: ['nets', 'executors'],
  l: ['executors', 'audit'],
  x: ['catalog', 'executors'],
  t: ['catalog', 'executors'],
  u: [],
  c: [],
};

await page.goto(`${BASE}/`);
for (const [letter, lands] of Object.entries(LANDS)) {
  await page.locator('#sign-in').waitFor();
  await page.fill('#token', agents[letter]);
  await page.click('#sign-in button[type=submit]');
  if (lands) {
    await page.locator(DRAWN[lands]).waitFor();
    check(page.url().endsWith(`#/${lands}`), `${letter} lands on ${lands}: ${page.url()}`);
  } else {
    const said = page.locator('#no-view');
    await said.waitFor();
    const text = await said.textContent();
    check(text.includes(`holds ${letter} (`) && text.includes('none of this page\'s views'), `${letter}: ${text}`);
    const needs = await page.locator('main dl').textContent();
    check(needs.includes('the flag r (read)') && needs.includes('the flag l (logs)'), `${letter}: what each view needs: ${needs}`);
    await page.screenshot({ path: `${SCREENSHOTS}/no-view.png`, fullPage: true });
  }
  const offered = await page.locator('#nav a:visible').evaluateAll((as) => as.map((a) => a.dataset.page));
  const expected = OFFERED[letter] || ['catalog'];
  check(JSON.stringify(offered) === JSON.stringify(expected), `${letter} is offered ${offered}, not ${expected}`);
  check(await page.locator('#alert').isHidden(), `${letter}: an alert: ${await page.locator('#alert').textContent()}`);
  if (letter === 'r') await page.screenshot({ path: `${SCREENSHOTS}/landed-read.png`, fullPage: true });
  await page.click('#sign-out');
  await page.locator('#sign-in').waitFor();
}

// A view the token may not use, by its address: said, with the flag it lacks, not asked for.
await page.fill('#token', agents.r);
await page.click('#sign-in button[type=submit]');
await page.locator(DRAWN.nets).waitFor();
check((await page.locator('main table').textContent()).includes('flow'), 'the reader sees the model it was granted');
await page.goto(`${BASE}/#/catalog`);
const closed = page.locator('#closed');
await closed.waitFor();
const why = await closed.textContent();
check(why.includes('holds r (read)') && why.includes('one of the flags d (docker)') && why.includes('which it lacks'), `the catalog closed: ${why}`);
check((await page.locator('main a[href="#/nets"]').count()) === 1, 'the views it may use are linked');
await page.screenshot({ path: `${SCREENSHOTS}/closed.png`, fullPage: true });
// Executors and jobs for `x` alone: the jobs, and why the executors are not listed.
await page.click('#sign-out');
await page.locator('#sign-in').waitFor();
await page.fill('#token', agents.x);
await page.click('#sign-in button[type=submit]');
await page.locator('#catalog-search').waitFor();
await page.goto(`${BASE}/#/executors`);
await page.locator('main p', { hasText: 'Listing the executors needs the flag r (read)' }).waitFor();

await browser.close();
console.log(JSON.stringify({ problems }));
if (problems.length) {
  console.error(problems.join('\n'));
  process.exit(1);
}
