// Drive the live view in Debian's Chromium (headless, playwright-core, no
// browser download) for the tests: one page kept open across commands, so a
// test can stop Prometheus under it and watch the panels come back without a
// reload.
//
//   node web/test/drive.mjs '{"base": URL, "user": U, "password": P}'
//
// Reads one JSON command per line on stdin, answers one JSON line on stdout:
//   {"cmd": "open", "path": "/d/cpu?refresh=5s"}   load a page (counts its queries from here)
//   {"cmd": "settle", "want": "drawn"|"data"|"error", "timeoutMs": N, "stableMs": M, "allowNoData": [TITLE]}
//        wait until every panel is drawn (no longer loading) and, for "data" or
//        "error", every panel is in that state (for "data", the panels titled in
//        allowNoData may say "No data"), the states unchanged for M ms
//        (default 3000); answers the panels either way (title, state, legend
//        entries, widths of chart, its box and panel, text), whether it held, and the time until it first held
//        (the time to draw every panel), from the settle and from the last open,
//        whether it held at all, and the panels whose state changed once drawn
//        (by place and title: their last 12 states in order); the page's console
//        errors since the open, and the requests that got no answer (Chromium's reason)
//   {"cmd": "screenshot", "path": FILE, "fullPage": true|false, "timeoutMs": N}   (default the whole page, 90 s)
//   {"cmd": "viewport", "width": W, "height": H}   the window's new size
//   {"cmd": "click", "selector": CSS}               click what it finds; answers the page's path and search after
//   {"cmd": "text", "selector": CSS}                the text of what it finds, once it is there
//   {"cmd": "queries"}                             Prometheus API requests (either store) since "open" or the last "queries"
//   {"cmd": "heap"}                                the page's JS heap (bytes used)
//   {"cmd": "quit"}
// A panel's state: "loading" (its first answer not in: a skeleton), "error"
// (Perses's error alert or its header's error icon), "nodata" ("No data", or
// a chart without a series, whose "No data" is drawn in its canvas), "empty"
// (nothing drawn at all), "data" (series in the legend, table rows, a stat's
// value).
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const config = JSON.parse(process.argv[2] || '{}');
const profile = mkdtempSync(join(tmpdir(), 'longhaul-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: config.chromium || '/usr/bin/chromium',
  headless: true,
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
  ],
  // Tall enough for every panel of our dashboards at once: Perses draws (and
  // queries) a panel only once it is in view.
  viewport: { width: config.width || 1600, height: config.height || 4000 },
  // The tests check the certificate with the testbed's CA themselves (Python's
  // ssl); Chromium has no way to be given one CA file without a profile NSS db.
  ignoreHTTPSErrors: true,
  httpCredentials: config.user ? { username: config.user, password: config.password } : undefined,
});
const page = context.pages()[0] || (await context.newPage());
// A request Chromium cancelled because the host's network changed (another test
// creating or removing an interface, namespace or container on this machine:
// Chromium watches the host's addresses) says nothing about the page; the panel it
// fed is judged by its state. Counted, not taken as the page's error; nor is the
// page's own report of it, fetch's "TypeError: Failed to fetch" (a fetch that got
// no answer at all), when the network changed since the last "open" (CI OO: two
// lab pages failed on it while the integration lane started a compose stack).
let networkChanges = 0;
// What the page met since the last "open" (made anew by it): its console errors,
// its failed fetches, whether the network changed, and every request that got no
// answer with Chromium's reason (at most 20: a failed check names them).
const sinceOpen = () => ({ consoleErrors: [], fetchFailures: [], networkChanged: false, requestFailures: [] });
let met = sinceOpen();
page.on('requestfailed', (request) => {
  const reason = request.failure()?.errorText ?? 'no reason given';
  if (met.requestFailures.length < 20) met.requestFailures.push(`${reason} ${request.method()} ${new URL(request.url()).pathname}`);
  if (reason.includes('ERR_NETWORK_CHANGED')) {
    networkChanges += 1;
    met.networkChanged = true;
  }
});
page.on('console', (message) => {
  if (message.type() !== 'error') return;
  const text = message.text();
  // Chromium's own line for such a request ("Failed to load resource: net::ERR_NETWORK_CHANGED")
  if (text.includes('net::ERR_NETWORK_CHANGED')) met.networkChanged = true;
  else (text.startsWith('TypeError: Failed to fetch') ? met.fetchFailures : met.consoleErrors).push(text.slice(0, 300));
});
page.on('pageerror', (error) => met.consoleErrors.push(`pageerror: ${error.message}`.slice(0, 300)));
let queries = [];
page.on('request', (request) => {
  const url = new URL(request.url());
  // Both stores' APIs: the site's Prometheus (/prometheus/) and the central store (/central/api/).
  if (url.pathname.startsWith('/prometheus/') || url.pathname.startsWith('/central/api/')) {
    queries.push({ path: url.pathname, body: request.postData() || url.search });
  }
});
const client = await context.newCDPSession(page);

function panels() {
  return page.evaluate(() =>
    [...document.querySelectorAll('section[data-testid="panel"]')].map((panel) => {
      const title = panel.querySelector('[id$="-header-title"]');
      const figure = panel.querySelector('figure') || panel;
      const text = figure.innerText.trim();
      // Loading: the first answer not in yet (a refetch keeps the old drawing and
      // only spins in the header, which is not waited for).
      const loading = figure.querySelector('.MuiSkeleton-root') !== null;
      const error =
        figure.querySelector('.MuiAlert-root, [role="alert"]') !== null ||
        panel.querySelector('header [aria-label="panel errors"]') !== null;
      // Legend entries: a table legend's name cell, a list legend's items.
      const list = figure.querySelector('[data-testid="virtuoso-item-list"]');
      const legend = list
        ? [...list.children]
            .map((row) => (row.tagName === 'TR' && row.cells.length > 1 ? row.cells[1] : row).innerText.trim())
            .filter((entry) => entry.length > 0)
        : [];
      // The legend is a virtual list: only the rows in view exist. Its whole
      // height over one row's is how many entries it has.
      let legendCount = legend.length;
      const scroller = figure.querySelector('[data-testid="virtuoso-scroller"]');
      const row = list && list.firstElementChild;
      if (scroller && row && row.offsetHeight > 0) {
        const head = scroller.querySelector('thead');
        legendCount = Math.max(legend.length, Math.round((scroller.scrollHeight - (head ? head.offsetHeight : 0)) / row.offsetHeight));
      }
      let state = 'data';
      if (loading) state = 'loading';
      else if (error) state = 'error';
      // A time series chart with no series writes its "No data" into its canvas.
      else if (/^No data$/m.test(text) || (list && legend.length === 0)) state = 'nodata';
      else if (!list && text.length === 0 && figure.querySelector('canvas') === null) state = 'empty';
      // The chart's drawing width (its widest canvas, 0 without one) and the
      // width of the box it is drawn into (ECharts's container: the canvas's
      // grandparent), which a chart fills once it is resized to it.
      const canvases = [...figure.querySelectorAll('canvas')];
      const chartWidth = Math.max(0, ...canvases.map((canvas) => canvas.getBoundingClientRect().width));
      const boxWidth = Math.max(0, ...canvases.map((canvas) => canvas.parentElement.parentElement.getBoundingClientRect().width));
      const panelWidth = panel.getBoundingClientRect().width;
      return { title: title ? title.textContent.trim() : '(untitled)', state, legend, legendCount, chartWidth, boxWidth, panelWidth, text: text.slice(0, 400) };
    })
  );
}

// Settled: every panel drawn (and in the wanted state) and the panels' states
// unchanged for stableMs, so a first drawing of a partial answer does not count.
let openedAt = Date.now();
async function settle(want, timeoutMs, stableMs, allowNoData) {
  const started = Date.now();
  let seen = [];
  let since = null;
  let last = '';
  let firstHeld = null;
  // Each panel's states in the order seen (its changes only, the last 12), by its
  // place and title (two panels may share a title): what kept the page from
  // holding still, when it did not.
  const changes = {};
  for (;;) {
    seen = await panels();
    seen.forEach((panel, place) => {
      const states = (changes[`${place + 1}. ${panel.title}`] ??= []);
      if (states[states.length - 1] !== panel.state) states.push(panel.state);
      if (states.length > 12) states.shift();
    });
    const drawn = seen.length > 0 && seen.every((panel) => panel.state !== 'loading' && panel.state !== 'empty');
    const wanted = (panel) => panel.state === want || (want === 'data' && panel.state === 'nodata' && allowNoData.includes(panel.title));
    const held = drawn && (want === 'drawn' || seen.every(wanted));
    const key = JSON.stringify(seen.map((panel) => [panel.title, panel.state]));
    if (!held || key !== last) since = held ? Date.now() : null;
    last = key;
    if (held && firstHeld === null) firstHeld = Date.now() - started;
    if ((held && Date.now() - since >= stableMs) || Date.now() - started > timeoutMs) {
      const stable = held && Date.now() - since >= stableMs;
      return {
        held: stable,
        everHeld: firstHeld !== null,
        ms: firstHeld ?? Date.now() - started,
        // from the start of the last "open" (the page's download and start included)
        sinceOpenMs: (firstHeld === null ? Date.now() - started : firstHeld) + (started - openedAt),
        panels: seen,
        // a panel's first drawing (loading, then drawn) is no change
        changes: Object.fromEntries(
          Object.entries(changes)
            .map(([panel, states]) => [panel, states.slice(states.findIndex((state) => state !== 'loading' && state !== 'empty'))])
            .filter(([, states]) => states.length > 1),
        ),
      };
    }
    await page.waitForTimeout(250);
  }
}

const commands = createInterface({ input: process.stdin });
for await (const line of commands) {
  if (!line.trim()) continue;
  const command = JSON.parse(line);
  let answer;
  try {
    switch (command.cmd) {
      case 'open':
        met = sinceOpen();
        openedAt = Date.now();
        await page.goto(config.base + command.path, { waitUntil: 'commit' });
        // What the old page asked up to its end (a health check's timer) is not
        // this page's: counted from the new document on.
        queries = [];
        await page.waitForLoadState('load');
        answer = { ok: true, url: page.url() };
        break;
      case 'settle':
        answer = {
          ok: true,
          ...(await settle(command.want || 'drawn', command.timeoutMs || 30000, command.stableMs ?? 3000, command.allowNoData || [])),
        };
        answer.title = await page.evaluate(() => {
          const title = document.querySelector('[data-testid="dashboard-title"]');
          return title ? title.textContent : null;
        });
        // a failed fetch is the page's error unless the network changed since the open
        answer.consoleErrors = [...met.consoleErrors, ...(met.networkChanged ? [] : met.fetchFailures)].slice(0, 20);
        answer.networkChanges = networkChanges;
        answer.fetchFailuresOnNetworkChange = met.networkChanged ? met.fetchFailures.length : 0;
        answer.requestFailures = [...met.requestFailures];
        break;
      case 'click': {
        // a link or button of the page (a CSS selector, Playwright's :has-text too); the page's path after it
        await page.locator(command.selector).first().click({ timeout: command.timeoutMs || 30000 });
        await page.waitForLoadState('load');
        const url = new URL(page.url());
        answer = { ok: true, path: url.pathname, search: url.search };
        break;
      }
      case 'text':
        // the text of the first element a selector finds, once it is there
        await page.locator(command.selector).first().waitFor({ timeout: command.timeoutMs || 30000 });
        answer = { ok: true, text: await page.locator(command.selector).first().innerText() };
        break;
      case 'viewport':
        await page.setViewportSize({ width: command.width, height: command.height });
        answer = { ok: true };
        break;
      case 'screenshot':
        // Up to 90 s (Playwright's default is 30): the screenshot waits for a
        // frame, and a page redrawing its panels on a loaded machine (the
        // lab's campaign beside Molecule in CI) can hold its frames longer
        // (cold CI on e6ddbc9: 30 s passed with the panels already drawn).
        await page.screenshot({
          path: command.path,
          fullPage: command.fullPage ?? true,
          timeout: command.timeoutMs || 90000,
        });
        answer = { ok: true };
        break;
      case 'queries':
        answer = { ok: true, queries };
        queries = [];
        break;
      case 'heap': {
        const { usedSize } = await client.send('Runtime.getHeapUsage');
        answer = { ok: true, bytes: usedSize };
        break;
      }
      case 'quit':
        answer = { ok: true };
        break;
      default:
        answer = { ok: false, error: `unknown command ${command.cmd}` };
    }
  } catch (error) {
    answer = { ok: false, error: String(error && error.message ? error.message : error) };
  }
  process.stdout.write(JSON.stringify(answer) + '\n');
  if (command.cmd === 'quit') break;
}
await context.close();
rmSync(profile, { recursive: true, force: true });
