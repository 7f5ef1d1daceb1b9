// The two demo pages in a real browser (Debian's chromium through puppeteer-core), against a
// chalk-web serving real sandboxes: CHALK_WEB_URL is the server, CHALK_WEB_ARTIFACTS where
// the screenshots of each step and the times a user saw (timings.json) are written.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import puppeteer from 'puppeteer-core';

const BASE = process.env.CHALK_WEB_URL;
const ART = process.env.CHALK_WEB_ARTIFACTS || path.resolve('web-artifacts');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const timings = {};
let browser;
let shots = 0;

before(async () => {
  assert.ok(BASE, 'set CHALK_WEB_URL to a running chalk-web (integration/tests/web.rs does)');
  fs.mkdirSync(ART, { recursive: true });
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--window-size=1400,900'],
    defaultViewport: { width: 1400, height: 900 },
  });
});

after(async () => {
  fs.writeFileSync(path.join(ART, 'timings.json'), JSON.stringify(timings, null, 2));
  if (browser) await browser.close();
});

async function shot(page, name) {
  shots += 1;
  await page.screenshot({ path: path.join(ART, `${String(shots).padStart(2, '0')}-${name}.png`) });
}

async function open(where) {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.errors = errors;
  await page.goto(`${BASE.replace(/\/$/, '')}${where}`, { waitUntil: 'load' });
  return page;
}

// Polls `f` (run in the page) until `ok` holds for its result; the last result otherwise.
async function until(page, what, f, ok, arg, timeout = 30000) {
  const end = Date.now() + timeout;
  let last;
  for (;;) {
    last = await page.evaluate(f, arg);
    if (ok(last)) return last;
    if (Date.now() > end) {
      const err = await page.$eval('#error', (e) => e.textContent).catch(() => '');
      assert.fail(`${what}: not seen within ${timeout} ms; last: ${String(JSON.stringify(last)).slice(-1500)}; page error: ${err}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

const paneText = (id) => window.chalk.panes.get(id).pane.text();
const count = (text, re) => (text.match(re) || []).length;

async function paneIds(page) {
  return page.$$eval('section.pane', (els) => els.map((e) => e.dataset.id || ''));
}

async function typeIn(page, id, keys) {
  await page.click(`section.pane[data-id="${id}"] .term`);
  await page.keyboard.type(keys);
}

async function seeIn(page, id, re, what, timeout) {
  return until(page, what || `${re} in ${id}`, paneText, (t) => re.test(t), id, timeout);
}

async function apiFrom(page, method, p) {
  return page.evaluate(async (m, u) => {
    const r = await fetch(u, { method: m });
    return { status: r.status, body: r.status === 204 ? null : await r.json() };
  }, method, p);
}

// runsc processes on this host naming sandbox `id` (the page says the same from the server).
function runscProcesses(id) {
  let n = 0;
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    let args;
    try { args = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean); } catch (_) { continue; }
    if (args.length && args[0].includes('runsc') && args.includes(id)) n += 1;
  }
  return n;
}

async function split(page, source) {
  const before = await paneIds(page);
  const t0 = Date.now();
  await page.click(`section.pane[data-id="${source}"] button.split`);
  const ids = await until(page, `a new pane split from ${source}`,
    () => [...document.querySelectorAll('section.pane')].map((e) => e.dataset.id || ''),
    (ids) => ids.length === before.length + 1 && ids.every(Boolean), undefined, 60000);
  const fork = ids.find((i) => !before.includes(i));
  await until(page, `${fork} running`, (id) => document.querySelector(`section.pane[data-id="${id}"]`).dataset.state,
    (s) => s === 'running', fork);
  const seen = Date.now() - t0;
  const head = await page.$eval(`section.pane[data-id="${fork}"] .pane-head`, (e) => e.textContent);
  assert.match(head, new RegExp(`forked from ${source}`));
  assert.match(head, /split in [\d.]+ s \(snapshot [\d.]+ s, restore [\d.]+ s/);
  const view = (await apiFrom(page, 'GET', `/api/sandboxes/${fork}`)).body;
  if (process.env.CHALK_STORE_REFS) {
    assert.deepEqual(fs.readdirSync(process.env.CHALK_STORE_REFS), [], 'the split\'s snapshot was left in the store');
  }
  return { fork, seen, view };
}

test('split a live terminal into forks', async () => {
  const page = await open('/split');
  await page.click('#launch');
  const [root] = await until(page, 'a launched pane', () => [...document.querySelectorAll('section.pane')].map((e) => e.dataset.id || ''),
    (ids) => ids.length === 1 && ids[0], undefined, 60000);
  await seeIn(page, root, /# $/m, 'the shell prompt');
  await typeIn(page, root, 'echo one > /root/file1; mkdir -p /tmp/t; echo tmp-a > /tmp/t/a; export MARK=alpha\n');
  await typeIn(page, root, 'echo "v=$MARK"\n');
  await seeIn(page, root, /^v=alpha$/m);
  await typeIn(page, root, 'echo hist-$((40+2))\n');
  await seeIn(page, root, /^hist-42$/m);
  await shot(page, 'split-launched');

  // First split: the fork has the files, /tmp, the variable and the history.
  const first = await split(page, root);
  const a = first.fork;
  await seeIn(page, a, /hist-42/, 'the source screen in the fork');
  const before = count(await page.evaluate(paneText, a), /^hist-42$/gm);
  await page.click(`section.pane[data-id="${a}"] .term`);
  await page.keyboard.press('ArrowUp');
  await page.keyboard.press('Enter');
  await until(page, 'the up arrow running the source\'s last command in the fork', paneText,
    (t) => count(t, /^hist-42$/gm) === before + 1, a);
  await typeIn(page, a, 'cat /root/file1 /tmp/t/a; echo "w=$MARK"\n');
  await seeIn(page, a, /^one\ntmp-a\nw=alpha$/m, 'the files and variable in the fork');
  // From now on the two diverge.
  await typeIn(page, a, 'echo fork-only > /tmp/t/b; export MARK=beta; echo "x=$MARK"\n');
  await seeIn(page, a, /^x=beta$/m);
  await typeIn(page, root, 'ls /tmp/t; echo "y=$MARK"\n');
  const rootText = await seeIn(page, root, /^y=alpha$/m);
  assert.doesNotMatch(rootText, /^b$/m, 'a file made in the fork showed in its source');
  assert.match(rootText, /^a$/m);
  await shot(page, 'split-two-panes');

  // Second split, of the fork: a fork of a fork, with the fork's own state and history.
  const second = await split(page, a);
  const b = second.fork;
  await page.click(`section.pane[data-id="${b}"] .term`);
  await page.keyboard.press('ArrowUp');
  await page.keyboard.press('Enter');
  await seeIn(page, b, /^x=beta\n(.*\n)*x=beta$/m, 'the fork\'s last command run again from its fork\'s history');
  await typeIn(page, b, 'cat /tmp/t/b; echo "z=$MARK"\n');
  await seeIn(page, b, /^fork-only\nz=beta$/m, 'the fork\'s files and variable in the fork of it');

  // Ctrl-C reaches a command in a restored sandbox; the window size is the pane's.
  await typeIn(page, b, 'sleep 1000\n');
  await new Promise((r) => setTimeout(r, 1000));
  await page.keyboard.down('Control');
  await page.keyboard.press('c');
  await page.keyboard.up('Control');
  await typeIn(page, b, 'echo after-int-$((1+1))\n');
  await seeIn(page, b, /^after-int-2$/m, 'the shell back after Ctrl-C of sleep', 10000);
  const { cols, rows } = await page.evaluate((id) => {
    const t = window.chalk.panes.get(id).pane.term;
    return { cols: t.cols, rows: t.rows };
  }, b);
  await typeIn(page, b, 'stty size\n');
  await seeIn(page, b, new RegExp(`^${rows} ${cols}$`, 'm'), `stty size ${rows} ${cols} in ${b}`);

  // A dropped websocket reconnects and the screen is repainted from the server's replay.
  await page.evaluate((id) => window.chalk.panes.get(id).pane.ws.close(), b);
  await until(page, 'the pane reconnected', (id) => window.chalk.panes.get(id).pane.ws.readyState, (s) => s === 1, b);
  await seeIn(page, b, /^after-int-2$/m, 'the repainted screen');
  await typeIn(page, b, 'echo still-$((2+3))\n');
  await seeIn(page, b, /^still-5$/m, 'typing after the reconnect');
  // Copy and paste: Ctrl+Shift+V pastes the clipboard into the shell, Ctrl+Shift+C copies
  // the selection.
  await browser.defaultBrowserContext().overridePermissions(new URL(BASE).origin,
    ['clipboard-read', 'clipboard-write', 'clipboard-sanitized-write']);
  await page.bringToFront();
  await page.evaluate(() => navigator.clipboard.writeText('echo pasted-$((6*7))'));
  await page.click(`section.pane[data-id="${b}"] .term`);
  const chord = async (key) => {
    await page.keyboard.down('Control');
    await page.keyboard.down('Shift');
    await page.keyboard.press(key);
    await page.keyboard.up('Shift');
    await page.keyboard.up('Control');
  };
  await chord('KeyV');
  await seeIn(page, b, /# echo pasted-\$\(\(6\*7\)\)$/m, 'the pasted command line');
  await page.keyboard.press('Enter');
  await seeIn(page, b, /^pasted-42$/m, 'the pasted command run');
  await page.evaluate((id) => window.chalk.panes.get(id).pane.term.selectAll(), b);
  await chord('KeyC');
  const copied = await until(page, 'the selection copied', () => navigator.clipboard.readText(), (t) => /pasted-42/.test(t));
  assert.match(copied, /still-5/);
  await shot(page, 'split-three-panes');
  fs.copyFileSync(path.join(ART, `${String(shots).padStart(2, '0')}-split-three-panes.png`), path.join(ART, 'split.png'));

  // The intermediate snapshots are gone once the forks run.
  const info = await apiFrom(page, 'GET', '/api/sandboxes');
  assert.equal(info.body.sandboxes.length, 3);
  timings.split = [first, second].map((s) => ({
    snapshot_ms: s.view.split.snapshot_ms,
    restore_ms: s.view.split.restore_ms,
    click_to_running_ms: s.seen,
  }));
  for (const id of [b, a, root]) {
    await page.click(`section.pane[data-id="${id}"] button.close`);
    await until(page, `${id} closed`, (i) => !document.querySelector(`section.pane[data-id="${i}"]`), (gone) => gone, id);
  }
  assert.equal((await apiFrom(page, 'GET', '/api/sandboxes')).body.sandboxes.length, 0);
  assert.deepEqual(page.errors, []);
  await page.close();
});

const counts = (text) => [...text.matchAll(/^count (\d+)$/gm)].map((m) => Number(m[1]));

function assertCounting(list, what) {
  assert.ok(list.length > 0, `${what}: no count printed`);
  for (let i = 1; i < list.length; i++) {
    assert.equal(list[i], list[i - 1] + 1, `${what}: the count went ${list[i - 1]} -> ${list[i]}: ${list.join(' ')}`);
  }
}

async function suspendNow(page, id) {
  const t0 = Date.now();
  await page.click('#suspend');
  await until(page, 'suspended', () => document.querySelector('#sandbox-state').dataset.state, (s) => s === 'suspended');
  const seen = Date.now() - t0;
  await until(page, 'no runsc process left, as the page shows', () => document.querySelector('#sandbox-procs').dataset.count, (n) => n === '0');
  assert.equal(runscProcesses(id), 0, `runsc processes of ${id} left after suspend`);
  assert.match(await page.$eval('#sandbox-snapshot', (e) => e.textContent), /snapshot [\d.]+ MB/);
  assert.equal(await page.$eval('#detached', (e) => e.hidden), false);
  return seen;
}

async function waitRunning(page) {
  await until(page, 'running', () => document.querySelector('#sandbox-state').dataset.state, (s) => s === 'running', undefined, 60000);
}

test('suspend and resume a sandbox from the browser', async () => {
  let page = await open('/suspend');
  await page.click('#launch');
  await waitRunning(page);
  const id = await page.evaluate(() => window.chalk.pane.id);
  await until(page, 'the prompt', () => window.chalk.pane.text(), (t) => /# $/m.test(t));
  await page.click('#counter');
  await until(page, 'count 3', () => window.chalk.pane.text(), (t) => /^count 3$/m.test(t));
  await shot(page, 'suspend-counting');

  const suspendSeen = await suspendNow(page, id);
  const stopped = counts(await page.evaluate(() => window.chalk.pane.text()));
  await new Promise((r) => setTimeout(r, 3000));
  assert.deepEqual(counts(await page.evaluate(() => window.chalk.pane.text())), stopped, 'the count moved while suspended');
  await shot(page, 'suspend-suspended');
  fs.copyFileSync(path.join(ART, `${String(shots).padStart(2, '0')}-suspend-suspended.png`), path.join(ART, 'suspend.png'));

  let t0 = Date.now();
  await page.click('#resume');
  await waitRunning(page);
  const resumeSeen = Date.now() - t0;
  const last = stopped[stopped.length - 1];
  await until(page, `count ${last + 2} after resume`, () => window.chalk.pane.text(), (t) => new RegExp(`^count ${last + 2}$`, 'm').test(t));
  assertCounting(counts(await page.evaluate(() => window.chalk.pane.text())), 'after resume');
  assert.equal((await apiFrom(page, 'GET', `/api/sandboxes/${id}`)).body.id, id, 'the same sandbox id came back');
  const first = (await apiFrom(page, 'GET', `/api/sandboxes/${id}`)).body;
  await shot(page, 'suspend-resumed');

  // Suspended again, the tab closed; a new one offers to resume it, and the count goes on.
  await suspendNow(page, id);
  const before = counts(await page.evaluate(() => window.chalk.pane.text()));
  await page.close();
  page = await open('/suspend');
  await until(page, 'the offer to resume', () => !document.querySelector('#offer').hidden, (v) => v);
  assert.equal(await page.$eval('#offer-id', (e) => e.textContent), id);
  await shot(page, 'suspend-offer');
  t0 = Date.now();
  await page.click('#offer-resume');
  await waitRunning(page);
  const reopenSeen = Date.now() - t0;
  const stop = before[before.length - 1];
  await until(page, `count ${stop + 2} after the offer`, () => window.chalk.pane.text(), (t) => new RegExp(`^count ${stop + 2}$`, 'm').test(t));
  const after = counts(await page.evaluate(() => window.chalk.pane.text()));
  assertCounting(after, 'after reopening');
  assert.ok(after.includes(stop) && after.includes(stop + 1), `the count did not carry on from ${stop}: ${after.join(' ')}`);
  const second = (await apiFrom(page, 'GET', `/api/sandboxes/${id}`)).body;
  await shot(page, 'suspend-reopened');

  timings.suspend = [first, second].map((s) => ({ suspend_ms: s.suspend.ms, resume_ms: s.resume.ms, snapshot_bytes: s.suspend.bytes }));
  timings.suspend_seen_ms = suspendSeen;
  timings.resume_seen_ms = [resumeSeen, reopenSeen];

  // Ctrl-C stops the counter; Close removes the sandbox.
  await page.click('#term');
  await page.keyboard.down('Control');
  await page.keyboard.press('c');
  await page.keyboard.up('Control');
  await page.keyboard.type('echo stopped-$((3*3))\n');
  await until(page, 'the counter stopped by Ctrl-C', () => window.chalk.pane.text(), (t) => /^stopped-9$/m.test(t), undefined, 10000);
  await page.click('#close');
  await until(page, 'the sandbox closed', () => document.querySelector('#sandbox-id').textContent, (t) => t === 'no sandbox yet');
  assert.equal((await apiFrom(page, 'GET', '/api/sandboxes')).body.sandboxes.length, 0);
  assert.equal(runscProcesses(id), 0);
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('errors show on the page in words', async () => {
  const page = await open('/split');
  const limit = Number(process.env.CHALK_WEB_PER_CLIENT || 3);
  for (let i = 1; i <= limit; i++) {
    await page.click('#launch');
    await until(page, `${i} panes running`, () => [...document.querySelectorAll('section.pane')].filter((e) => e.dataset.state === 'running').length,
      (n) => n === i, undefined, 60000);
  }
  await page.click('#launch');
  const shown = await until(page, 'the limit refused in words', () => document.querySelector('#error').textContent,
    (t) => t.length > 0);
  assert.match(shown, new RegExp(`Launch failed: you have ${limit} sandboxes, the most one client may have`));
  assert.equal((await paneIds(page)).length, limit, 'the refused pane was left on the page');
  await shot(page, 'split-limit-error');
  const r = await apiFrom(page, 'POST', '/api/sandboxes/web-nothere/split');
  assert.equal(r.status, 404);
  assert.match(r.body.error, /no sandbox web-nothere/);
  for (const id of await paneIds(page)) await page.click(`section.pane[data-id="${id}"] button.close`);
  await until(page, 'all closed', () => document.querySelectorAll('section.pane').length, (n) => n === 0);
  assert.equal((await apiFrom(page, 'GET', '/api/sandboxes')).body.sandboxes.length, 0);
  await page.close();
});
