// A terminal in the page attached to one sandbox: xterm.js over the sandbox's websocket
// (binary frames are terminal bytes, text frames JSON control), fitted to its box, the
// window size sent on every change, reconnecting with a repaint when the socket drops.
'use strict';

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(path, init);
  } catch (e) {
    throw new Error(`the server did not answer (${e.message}): is chalk-web still running?`);
  }
  const text = await r.text();
  let v = {};
  try { v = text ? JSON.parse(text) : {}; } catch (_) { v = { error: text.trim() }; }
  if (!r.ok) throw new Error(v.error || `${r.status} ${r.statusText}`);
  return v;
}

function showError(message) {
  const el = document.getElementById('error');
  el.textContent = message;
  el.hidden = !message;
}

function seconds(ms) {
  return ms === undefined || ms === null ? '?' : `${(ms / 1000).toFixed(2)} s`;
}

function megabytes(bytes) {
  return `${(bytes / 1e6).toFixed(1)} MB`;
}

class Pane {
  constructor(el, opts = {}) {
    this.el = el;
    this.onState = opts.onState || (() => {});
    this.onStatus = opts.onStatus || (() => {});
    this.id = null;
    this.closed = false;
    this.detached = false;
    this.retry = 0;
    this.term = new Terminal({
      cursorBlink: true,
      fontSize: 14,
      scrollback: 5000,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", monospace',
      theme: { background: '#101418' },
    });
    this.fitter = new FitAddon.FitAddon();
    this.term.loadAddon(this.fitter);
    this.term.open(el);
    this.fit();
    this.encoder = new TextEncoder();
    this.term.onData((d) => this.send(this.encoder.encode(d)));
    this.term.onResize(({ cols, rows }) => this.sendSize(cols, rows));
    this.term.attachCustomKeyEventHandler((e) => this.clipboardKeys(e));
    this.observer = new ResizeObserver(() => this.fit());
    this.observer.observe(el);
  }

  fit() {
    try { this.fitter.fit(); } catch (_) { /* not laid out yet */ }
  }

  size() {
    this.fit();
    return { cols: this.term.cols, rows: this.term.rows };
  }

  // Ctrl+Shift+C copies the selection, Ctrl+Shift+V pastes (Ctrl+C stays the terminal's).
  clipboardKeys(e) {
    if (e.type !== 'keydown' || !e.ctrlKey || !e.shiftKey) return true;
    if (e.code === 'KeyC') {
      const s = this.term.getSelection();
      if (s && navigator.clipboard) navigator.clipboard.writeText(s);
      return false;
    }
    // The browser's own paste (its event reaches xterm.js) does the pasting: only keep
    // the key itself from the terminal.
    if (e.code === 'KeyV') return false;
    return true;
  }

  attach(id) {
    this.id = id;
    this.connect();
  }

  connect() {
    const proto = location.protocol === 'https:' ? 'wss' : 'ws';
    const ws = new WebSocket(`${proto}://${location.host}/api/sandboxes/${this.id}/tty`);
    ws.binaryType = 'arraybuffer';
    this.ws = ws;
    ws.onopen = () => {
      this.retry = 0;
      this.onStatus('');
      this.sendSize(this.term.cols, this.term.rows);
    };
    ws.onmessage = (m) => {
      if (typeof m.data !== 'string') {
        this.term.write(new Uint8Array(m.data));
        return;
      }
      const msg = JSON.parse(m.data);
      if (msg.type === 'hello') this.term.reset();
      else if (msg.type === 'state') this.onState(msg.sandbox);
    };
    ws.onclose = () => {
      if (this.closed || this.ws !== ws) return;
      this.reconnect();
    };
  }

  async reconnect() {
    const wait = Math.min(5000, 250 * 2 ** this.retry++);
    this.onStatus(`connection lost: reconnecting in ${seconds(wait)}…`);
    await new Promise((r) => setTimeout(r, wait));
    if (this.closed) return;
    try {
      await api('GET', `/api/sandboxes/${this.id}`);
    } catch (e) {
      if (/no sandbox/.test(e.message)) {
        this.onStatus(`sandbox ${this.id} is gone (${e.message})`);
        this.closed = true;
        return;
      }
    }
    this.connect();
  }

  send(bytes) {
    if (!this.detached && this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(bytes);
  }

  type(text) {
    this.send(this.encoder.encode(text));
  }

  sendSize(cols, rows) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ type: 'resize', cols, rows }));
    }
  }

  // The screen and scrollback as text (what the tests read).
  text() {
    const b = this.term.buffer.active;
    const lines = [];
    for (let i = 0; i < b.length; i++) lines.push(b.getLine(i).translateToString(true));
    return lines.join('\n');
  }

  // Leaves the sandbox: the socket closed, the screen cleared, ready to attach another.
  detach() {
    const ws = this.ws;
    this.ws = null;
    this.id = null;
    if (ws) ws.close();
    this.term.reset();
    this.onStatus('');
  }

  dispose() {
    this.closed = true;
    this.observer.disconnect();
    if (this.ws) this.ws.close();
    this.term.dispose();
  }
}
