// The split page: panes of sandboxes, each split forks its sandbox into a new pane.
'use strict';

const MAX_PANES = 4;
const panes = new Map(); // sandbox id -> { pane, el }
window.chalk = { panes };
const grid = document.getElementById('panes');
const launchButton = document.getElementById('launch');

function layout() {
  grid.dataset.count = String(grid.children.length);
  for (const { pane } of panes.values()) pane.fit();
  const full = grid.children.length >= MAX_PANES;
  for (const b of grid.querySelectorAll('button.split')) b.disabled = full || b.dataset.busy === '1';
}

function describe(el, s) {
  el.querySelector('.sid').textContent = s.id;
  el.querySelector('.parent').textContent = s.parent ? `forked from ${s.parent}` : 'launched';
  const t = s.split;
  el.querySelector('.timing').textContent = t
    ? `split in ${seconds(t.snapshot_ms + t.restore_ms)} (snapshot ${seconds(t.snapshot_ms)}, restore ${seconds(t.restore_ms)}, ${megabytes(t.bytes)})`
    : '';
  let state = s.busy || s.state;
  if (s.state === 'exited') state = `exited${s.exit_code === null ? '' : ` (code ${s.exit_code})`}`;
  el.querySelector('.state').textContent = state;
  el.dataset.state = s.state;
  if (s.state === 'exited') el.querySelector('button.split').disabled = true;
}

// A pane box in the grid, its terminal sized to it, before its sandbox exists.
function newPane() {
  const el = document.createElement('section');
  el.className = 'pane';
  el.innerHTML = `<div class="pane-head"><b class="sid">starting…</b> <span class="parent"></span>
    <span class="timing"></span> <span class="state"></span>
    <span class="grow"></span><button class="split">Split</button>
    <button class="close">Close</button></div><div class="term"></div><div class="status"></div>`;
  grid.appendChild(el);
  layout();
  const pane = new Pane(el.querySelector('.term'), {
    onState: (s) => describe(el, s),
    onStatus: (m) => { el.querySelector('.status').textContent = m; },
  });
  return { el, pane };
}

function discard(box) {
  box.pane.dispose();
  box.el.remove();
  layout();
}

function wire(box, sandbox) {
  const { el, pane } = box;
  el.dataset.id = sandbox.id;
  panes.set(sandbox.id, box);
  describe(el, sandbox);
  pane.attach(sandbox.id);
  pane.term.focus();
  el.querySelector('button.split').onclick = () => split(box);
  el.querySelector('button.close').onclick = () => close(box);
  layout();
}

async function launch() {
  showError('');
  launchButton.disabled = true;
  const box = newPane();
  try {
    wire(box, await api('POST', '/api/sandboxes', box.pane.size()));
  } catch (e) {
    discard(box);
    showError(`Launch failed: ${e.message}`);
  } finally {
    launchButton.disabled = false;
  }
}

async function split(source) {
  showError('');
  if (grid.children.length >= MAX_PANES) {
    showError(`At most ${MAX_PANES} panes: close one to split again.`);
    return;
  }
  const button = source.el.querySelector('button.split');
  button.dataset.busy = '1';
  button.disabled = true;
  const box = newPane();
  box.el.querySelector('.parent').textContent = `splitting ${source.pane.id}…`;
  try {
    wire(box, await api('POST', `/api/sandboxes/${source.pane.id}/split`, box.pane.size()));
  } catch (e) {
    discard(box);
    showError(`Split of ${source.pane.id} failed: ${e.message}`);
  } finally {
    button.dataset.busy = '0';
    layout();
  }
}

async function close(box) {
  showError('');
  try {
    await api('DELETE', `/api/sandboxes/${box.pane.id}`);
  } catch (e) {
    if (!/no sandbox/.test(e.message)) {
      showError(`Close of ${box.pane.id} failed: ${e.message}`);
      return;
    }
  }
  panes.delete(box.pane.id);
  discard(box);
}

launchButton.onclick = launch;
window.addEventListener('resize', layout);
