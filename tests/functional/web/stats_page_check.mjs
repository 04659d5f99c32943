// Drives trainshardd's stats page in headless Chromium (the system's /usr/bin/chromium through
// playwright-core) and checks what a reader gets:
//
//   node stats_page_check.mjs --url URL --screenshots DIR --min-increase N --timeout-s S
//        [--expect live|reconnecting] [--allow-api-errors] [--label NAME]
//        [--chromium PATH]
//
// --expect live (the default): the page shows a shard with its hosts and a train-loss chart,
// and the chart's points (its data-points attribute) grow by at least N while the page polls.
// --expect reconnecting: the page shows the reconnecting state (the API fails).
// Both: no page errors, no console errors, no request to another origin than the page's (the
// browser context also aborts every such request, so the page is checked as it works with the
// network off), Tab reaches main, no sideways page scroll at 360 and 320 px, and an update keeps
// keyboard focus, an opened <details> and the reader's place. Screenshots: desktop 1280x900 and
// phone 390x844, full page, into DIR as <label>-desktop.png and <label>-phone.png.
//
// Console errors: Chromium logs every HTTP error answer to a fetch as a console error of its
// own ("Failed to load resource: ... status of 500"), which the page's code cannot prevent. Such
// lines whose URL is the page's own API are counted apart (api_load_errors); they fail the check
// unless --allow-api-errors is given (the reconnecting case). Any other console error, and
// every uncaught exception or rejection of the page, fails it always.
//
// Prints one JSON line (the summary) on stdout, diagnostics on stderr; exits 0 only if every
// check passed, 1 if one failed, 2 on bad arguments.

import fs from 'node:fs';
import path from 'node:path';
import {chromium} from 'playwright-core';

const kApiPath = '/api/v1/overview';
const kDesktop = {width: 1280, height: 900};
const kPhone = {width: 390, height: 844};
const kNarrowWidths = [360, 320];

function usage(message) {
  process.stderr.write(`stats_page_check: ${message}\n` +
      'usage: node stats_page_check.mjs --url URL --screenshots DIR --min-increase N ' +
      '--timeout-s S [--expect live|reconnecting] [--allow-api-errors] [--label NAME] ' +
      '[--chromium PATH]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const args = {expect: 'live', label: 'stats', allowApiErrors: false,
                chromium: '/usr/bin/chromium', minIncrease: null, timeoutS: null};
  for (let i = 0; i < argv.length; ++i) {
    const flag = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${flag} needs a value`);
      return argv[++i];
    };
    switch (flag) {
      case '--url': args.url = value(); break;
      case '--screenshots': args.screenshots = value(); break;
      case '--min-increase': args.minIncrease = Number(value()); break;
      case '--timeout-s': args.timeoutS = Number(value()); break;
      case '--expect': args.expect = value(); break;
      case '--label': args.label = value(); break;
      case '--chromium': args.chromium = value(); break;
      case '--allow-api-errors': args.allowApiErrors = true; break;
      default: usage(`unknown argument ${flag}`);
    }
  }
  if (!args.url) usage('--url is required');
  if (!args.screenshots) usage('--screenshots is required');
  if (!Number.isInteger(args.minIncrease) || args.minIncrease < 0) {
    usage('--min-increase must be an integer >= 0');
  }
  if (!(args.timeoutS > 0)) usage('--timeout-s must be a positive number');
  if (!['live', 'reconnecting'].includes(args.expect)) usage('--expect is live or reconnecting');
  if (!/^[A-Za-z0-9_-]+$/.test(args.label)) usage('--label: letters, digits, - and _ only');
  try {
    args.origin = new URL(args.url).origin;
  } catch (e) {
    usage(`--url ${args.url} is not a URL`);
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));
const deadline = Date.now() + args.timeoutS * 1000;
const summary = {
  ok: false,
  expect: args.expect,
  url: args.url,
  points_first: null,
  points_last: null,
  shard_id: null,
  shards: 0,
  hosts: 0,
  connection_state: null,
  connection_text: null,
  console_errors: [],
  api_load_errors: 0,
  page_errors: [],
  foreign_requests: [],
  requests: 0,
  keyboard: null,
  update_kept: null,
  page_width: {},
  screenshots: [],
  failures: [],
};

function log(message) {
  process.stderr.write(`stats_page_check: ${message}\n`);
}

function fail(message) {
  summary.failures.push(message);
  log(`FAIL: ${message}`);
}

function remainingMs(floorMs = 1000) {
  return Math.max(floorMs, deadline - Date.now());
}

// A URL the page may load: its own origin, or one that never leaves the browser.
function isLocal(url) {
  if (/^(data|blob|about):/.test(url)) return true;
  try {
    return new URL(url).origin === args.origin;
  } catch (e) {
    return false;
  }
}

function isApiLoadError(message) {
  const location = message.location() || {};
  if (!/^Failed to load resource/.test(message.text())) return false;
  try {
    const u = new URL(location.url || '');
    return u.origin === args.origin && u.pathname === kApiPath;
  } catch (e) {
    return false;
  }
}

function watch(page) {
  page.on('console', (message) => {
    if (message.type() !== 'error') return;
    if (isApiLoadError(message)) {
      ++summary.api_load_errors;
      return;
    }
    const location = message.location() || {};
    summary.console_errors.push(`${message.text()}${location.url ? ` (${location.url})` : ''}`);
  });
  page.on('pageerror', (error) => summary.page_errors.push(String(error && error.stack || error)));
  page.on('request', (request) => {
    ++summary.requests;
    if (!isLocal(request.url())) summary.foreign_requests.push(request.url());
  });
}

// What the page shows, read in the page.
async function readPage(page) {
  return page.evaluate(() => {
    const shards = Array.from(document.querySelectorAll('section.shard[data-shard-id]'));
    const withChart = shards.find((s) => s.querySelector('svg[data-chart="train-loss"]'));
    const conn = document.getElementById('connection');
    const text = document.getElementById('connection-text');
    const chart = withChart ? withChart.querySelector('svg[data-chart="train-loss"]') : null;
    return {
      shards: shards.length,
      shard_id: withChart ? withChart.getAttribute('data-shard-id') : null,
      hosts: withChart
          ? withChart.querySelectorAll('table[data-table="members"] tbody tr').length : 0,
      points: chart ? Number(chart.getAttribute('data-points')) : null,
      chart_label: chart ? chart.getAttribute('aria-label') : null,
      connection_state: conn ? conn.getAttribute('data-state') : null,
      connection_text: text ? text.textContent : null,
      generated: document.getElementById('main')?.getAttribute('data-generated') || null,
    };
  });
}

async function waitFor(page, what, fn, arg) {
  try {
    await page.waitForFunction(fn, arg, {timeout: remainingMs(), polling: 200});
    return true;
  } catch (e) {
    fail(`timed out waiting for ${what}`);
    return false;
  }
}

// Tab from the top of the page until focus is inside main (the skip link and the header's
// links come first); then the skip link, which must move focus into main. Where main holds
// nothing to focus yet (no data: --expect reconnecting), only the skip link must work.
async function checkKeyboard(page) {
  await tabIntoMain(page);
  await page.evaluate(() => {
    if (document.activeElement) document.activeElement.blur();
    window.scrollTo(0, 0);
    // The next Tab starts from the top of the document again.
    document.body.setAttribute('tabindex', '-1');
    document.body.focus();
    document.body.removeAttribute('tabindex');
  });
  await page.keyboard.press('Tab');
  const skip = await page.evaluate(() => {
    const el = document.activeElement;
    return el && el.matches('a.skip-link') ? el.getAttribute('href') : null;
  });
  let works = false;
  if (skip) {
    await page.keyboard.press('Enter');
    await page.waitForTimeout(100);
    works = await page.evaluate(() => !!(document.activeElement &&
                                          document.activeElement.closest('main')));
  }
  summary.keyboard.skip_link = works;
  if (!works) fail('the first Tab does not reach a skip link that moves focus into main');
}

async function tabIntoMain(page) {
  await page.evaluate(() => {
    if (document.activeElement && document.activeElement !== document.body) {
      document.activeElement.blur();
    }
    window.scrollTo(0, 0);
  });
  const steps = [];
  for (let i = 1; i <= 40; ++i) {
    await page.keyboard.press('Tab');
    const at = await page.evaluate(() => {
      const el = document.activeElement;
      if (!el || el === document.body) return null;
      const style = getComputedStyle(el);
      return {
        tag: el.tagName.toLowerCase(),
        text: (el.getAttribute('aria-label') || el.textContent || '').trim().slice(0, 60),
        in_main: !!el.closest('main'),
        outline: style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0,
      };
    });
    if (at) steps.push(at);
    if (at && at.in_main) {
      summary.keyboard = {tabs: i, focused: `${at.tag}: ${at.text}`, focus_visible: at.outline};
      if (!at.outline) fail('the focused element in main shows no focus outline');
      return;
    }
  }
  summary.keyboard = {tabs: null, path: steps.slice(0, 8).map((s) => `${s.tag}: ${s.text}`)};
  if (args.expect === 'live') fail('Tab never moved focus into main');
}

// Focuses and opens the values table of the train-loss chart, scrolls it to the middle of the
// window, waits for the next update, and checks that focus, the open <details> and its place on
// screen stayed.
async function checkUpdateKeepsState(page) {
  const before = await page.evaluate(() => {
    const shard = Array.from(document.querySelectorAll('section.shard'))
        .find((s) => s.querySelector('svg[data-chart="train-loss"]'));
    const figure = shard && shard.querySelector('svg[data-chart="train-loss"]')
        .closest('figure');
    const summaryEl = figure && figure.querySelector('details > summary');
    if (!summaryEl) return null;
    summaryEl.closest('details').open = true;
    summaryEl.focus();
    summaryEl.__statsCheckMark = true;
    const rect = summaryEl.getBoundingClientRect();
    window.scrollBy(0, rect.top - window.innerHeight / 2);
    return {
      generated: document.getElementById('main').getAttribute('data-generated'),
      top: summaryEl.getBoundingClientRect().top,
      scroll_y: window.scrollY,
    };
  });
  if (!before) {
    fail('the train-loss chart has no <details> table of values');
    return;
  }
  const updated = await waitFor(
      page, 'an update after focusing the chart',
      (generated) => document.getElementById('main').getAttribute('data-generated') !== generated,
      before.generated);
  if (!updated) return;
  await page.waitForTimeout(100);
  const after = await page.evaluate(() => {
    const el = document.activeElement;
    const kept = !!(el && el.__statsCheckMark);
    return {
      focus_kept: kept,
      details_open: kept && el.closest('details').open,
      top: kept ? el.getBoundingClientRect().top : null,
      scroll_y: window.scrollY,
    };
  });
  const moved = after.top === null ? null : Math.round(after.top - before.top);
  summary.update_kept = {focus: after.focus_kept, details_open: after.details_open,
                         moved_px: moved, scroll_y: [before.scroll_y, after.scroll_y]};
  if (!after.focus_kept) fail('an update took keyboard focus away from the focused element');
  if (after.focus_kept && !after.details_open) fail('an update closed an opened <details>');
  if (moved !== null && Math.abs(moved) > 2) {
    fail(`an update moved the focused element on screen by ${moved} px`);
  }
}

async function checkWidths(page) {
  for (const width of kNarrowWidths) {
    await page.setViewportSize({width, height: 800});
    await page.waitForTimeout(400);  // the page redraws its charts after a resize
    const m = await page.evaluate(() => ({
      scroll_width: document.documentElement.scrollWidth,
      client_width: document.documentElement.clientWidth,
      wide: Array.from(document.querySelectorAll('body *'))
          .filter((el) => !el.closest('.table-wrap, .site-nav, .scroll-box'))
          .filter((el) => el.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
          .slice(0, 5)
          .map((el) => `${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ''}` +
                       `${el.className && typeof el.className === 'string'
                           ? `.${el.className.split(' ').join('.')}` : ''}`),
    }));
    summary.page_width[width] = m;
    if (m.scroll_width > m.client_width) {
      fail(`at ${width} px the page scrolls sideways (${m.scroll_width} > ${m.client_width}; ` +
           `${m.wide.join(', ') || 'no single element found'})`);
    }
  }
}

async function screenshot(page, viewport, name) {
  await page.setViewportSize(viewport);
  await page.waitForTimeout(400);
  // The page as a reader first sees it: nothing focused, every table of values closed.
  await page.evaluate(() => {
    if (document.activeElement) document.activeElement.blur();
    for (const d of document.querySelectorAll('details[open]')) d.open = false;
    window.scrollTo(0, 0);
  });
  const file = path.join(args.screenshots, `${args.label}-${name}.png`);
  await page.screenshot({path: file, fullPage: true});
  summary.screenshots.push(file);
}

async function run() {
  fs.mkdirSync(args.screenshots, {recursive: true});
  const browser = await chromium.launch({
    executablePath: args.chromium,
    headless: true,
    args: ['--no-first-run', '--no-default-browser-check', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
    timeout: remainingMs(),
  });
  try {
    const context = await browser.newContext({viewport: kDesktop, serviceWorkers: 'block',
                                              reducedMotion: 'reduce'});
    // The network is off: only the page's own origin answers.
    await context.route((url) => !isLocal(url.href),
                        (route) => route.abort('internetdisconnected'));
    const page = await context.newPage();
    watch(page);
    page.setDefaultTimeout(remainingMs());
    await page.goto(args.url, {waitUntil: 'load', timeout: remainingMs()});

    if (args.expect === 'live') {
      const shown = await waitFor(page, 'a shard with its hosts and a train-loss chart', () => {
        const shard = Array.from(document.querySelectorAll('section.shard[data-shard-id]'))
            .find((s) => s.querySelector('svg[data-chart="train-loss"]'));
        if (!shard) return false;
        const chart = shard.querySelector('svg[data-chart="train-loss"]');
        return shard.querySelectorAll('table[data-table="members"] tbody tr').length > 0 &&
               Number(chart.getAttribute('data-points')) > 0;
      });
      if (shown) {
        const first = await readPage(page);
        Object.assign(summary, {shard_id: first.shard_id, points_first: first.points});
        log(`first: shard ${first.shard_id}, ${first.hosts} hosts, ${first.points} points`);
        await checkKeyboard(page);
        await waitFor(page, `the chart's points to grow by ${args.minIncrease}`,
                      ({id, want}) => {
                        const chart = document.querySelector(
                            `section.shard[data-shard-id="${id}"] svg[data-chart="train-loss"]`);
                        return chart && Number(chart.getAttribute('data-points')) >= want;
                      }, {id: first.shard_id, want: first.points + args.minIncrease});
        await checkUpdateKeepsState(page);
      }
    } else {
      await waitFor(page, 'the reconnecting state',
                    () => document.getElementById('connection')
                              ?.getAttribute('data-state') === 'reconnecting');
      await checkKeyboard(page);
    }

    await checkWidths(page);
    await screenshot(page, kDesktop, 'desktop');
    await screenshot(page, kPhone, 'phone');

    const last = await readPage(page);
    Object.assign(summary, {
      shards: last.shards, hosts: last.hosts, points_last: last.points,
      connection_state: last.connection_state, connection_text: last.connection_text,
    });
    if (args.expect === 'live') {
      if (summary.shard_id === null) summary.shard_id = last.shard_id;
      if (last.connection_state !== 'live') {
        fail(`the connection state is ${last.connection_state}, not live`);
      }
      if (last.points !== null && summary.points_first !== null &&
          last.points < summary.points_first + args.minIncrease) {
        fail(`the chart's points grew from ${summary.points_first} to ${last.points} only`);
      }
    } else if (last.connection_state !== 'reconnecting') {
      fail(`the connection state is ${last.connection_state}, not reconnecting`);
    }
    await context.close();
  } finally {
    await browser.close();
  }
}

const watchdog = setTimeout(() => {
  fail(`still running ${args.timeoutS + 30} s after the start`);
  finish(1);
}, (args.timeoutS + 30) * 1000);

function finish(code) {
  clearTimeout(watchdog);
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  process.exit(code);
}

try {
  await run();
} catch (e) {
  fail(`error: ${e && e.message ? e.message.split('\n')[0] : e}`);
}
if (summary.console_errors.length) fail(`${summary.console_errors.length} console errors`);
if (summary.page_errors.length) fail(`${summary.page_errors.length} page errors`);
if (summary.foreign_requests.length) {
  fail(`${summary.foreign_requests.length} requests to other origins`);
}
if (summary.api_load_errors && !args.allowApiErrors) {
  fail(`${summary.api_load_errors} failed loads of ${kApiPath}`);
}
summary.ok = summary.failures.length === 0;
finish(summary.ok ? 0 : 1);
