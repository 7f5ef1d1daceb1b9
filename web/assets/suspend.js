// The suspend page: one sandbox, suspended (checkpointed, every process gone) and resumed
// under the same id; a suspended one is offered again when the page is opened later.
'use strict';

const KEY = 'chalk-suspend-sandbox';
const $ = (id) => document.getElementById(id);
const buttons = { launch: $('launch'), counter: $('counter'), suspend: $('suspend'), resume: $('resume'), close: $('close') };
const pane = new Pane($('term'), {
  onState: (s) => show(s),
  onStatus: (m) => { $('status').textContent = m; },
});
window.chalk = { pane };
let current = null;
let poll = null;

function show(s) {
  current = s;
  $('sandbox-id').textContent = `sandbox ${s.id}`;
  let state = s.busy || s.state;
  if (s.state === 'exited') state = `exited${s.exit_code === null ? '' : ` (code ${s.exit_code})`}`;
  $('sandbox-state').textContent = state;
  $('sandbox-state').dataset.state = s.state;
  $('sandbox-procs').textContent = `${s.processes} runsc process${s.processes === 1 ? '' : 'es'}`;
  $('sandbox-procs').dataset.count = String(s.processes);
  $('sandbox-snapshot').textContent = s.suspend ? `snapshot ${megabytes(s.suspend.bytes)}` : '';
  const times = [];
  if (s.suspend) times.push(`suspended in ${seconds(s.suspend.ms)}`);
  if (s.resume) times.push(`resumed in ${seconds(s.resume.ms)}`);
  $('sandbox-times').textContent = times.join(', ');
  const idle = !s.busy;
  buttons.counter.disabled = !(idle && s.state === 'running');
  buttons.suspend.disabled = !(idle && s.state === 'running');
  buttons.resume.disabled = !(idle && s.state === 'suspended');
  buttons.close.disabled = !idle || s.state === 'exited';
  buttons.launch.disabled = s.state === 'running' || s.state === 'suspended' || !idle;
  pane.detached = s.state !== 'running';
  $('detached').hidden = s.state !== 'suspended';
  if (s.state === 'exited') localStorage.removeItem(KEY);
}

async function refresh() {
  if (!current) return;
  try { show(await api('GET', `/api/sandboxes/${current.id}`)); } catch (_) { /* shown on the next action */ }
}

// While suspended the processes count is read again: the page shows it reach zero.
function watchWhileSuspended() {
  clearInterval(poll);
  poll = setInterval(() => { if (current && current.state === 'suspended') refresh(); }, 1000);
}

async function act(what, f) {
  showError('');
  for (const b of Object.values(buttons)) b.disabled = true;
  try {
    const s = await f();
    if (s) show(s);
  } catch (e) {
    showError(`${what} failed: ${e.message}`);
    await refresh();
    if (!current) buttons.launch.disabled = false;
  }
}

buttons.launch.onclick = () => act('Launch', async () => {
  if (pane.id) pane.detach();
  const s = await api('POST', '/api/sandboxes', pane.size());
  localStorage.setItem(KEY, s.id);
  pane.attach(s.id);
  pane.term.focus();
  return s;
});
buttons.counter.onclick = () => {
  pane.type(`${$('counter-cmd').textContent}\r`);
  pane.term.focus();
};
buttons.suspend.onclick = () => act('Suspend', async () => {
  const s = await api('POST', `/api/sandboxes/${current.id}/suspend`);
  watchWhileSuspended();
  return s;
});
buttons.resume.onclick = () => resume();
// After a close or discard: no sandbox, ready to launch another.
function reset() {
  current = null;
  clearInterval(poll);
  localStorage.removeItem(KEY);
  pane.detach();
  $('sandbox-id').textContent = 'no sandbox yet';
  for (const f of ['sandbox-state', 'sandbox-procs', 'sandbox-snapshot', 'sandbox-times']) $(f).textContent = '';
  $('detached').hidden = true;
  $('offer').hidden = true;
  for (const b of Object.values(buttons)) b.disabled = true;
  buttons.launch.disabled = false;
}

async function discard() {
  try {
    await api('DELETE', `/api/sandboxes/${current.id}`);
  } catch (e) {
    if (!/no sandbox/.test(e.message)) throw e;
  }
  reset();
}

buttons.close.onclick = () => act('Close', discard);

function resume() {
  return act('Resume', async () => {
    $('offer').hidden = true;
    if (!pane.id) pane.attach(current.id);
    const s = await api('POST', `/api/sandboxes/${current.id}/resume`, pane.size());
    pane.term.focus();
    return s;
  });
}

// Coming back: the sandbox this browser left suspended is offered; a running one reattached.
async function comeBack() {
  const id = localStorage.getItem(KEY);
  if (!id) return;
  let s;
  try {
    s = await api('GET', `/api/sandboxes/${id}`);
  } catch (_) {
    localStorage.removeItem(KEY);
    return;
  }
  show(s);
  if (s.state === 'suspended') {
    $('offer-id').textContent = s.id;
    $('offer').hidden = false;
    watchWhileSuspended();
  } else if (s.state === 'running') {
    pane.attach(s.id);
  }
}

$('offer-resume').onclick = () => resume();
$('offer-discard').onclick = () => act('Discard', discard);
comeBack();
