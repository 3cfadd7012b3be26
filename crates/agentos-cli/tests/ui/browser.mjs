// The browser every page script drives: headless Chromium as Debian packages it (installed by
// scripts/ui-env), with one page of the size the screenshots are taken at.
export async function openPage(chromium) {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  return { browser, page: await context.newPage() };
}
