// Small DOM helpers. Text always goes in as text nodes (never innerHTML): file names and
// everything else the API returns are untrusted.

/** h('button', {type: 'button', onclick: fn}, 'Label') -> element. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else if (name === 'class') {
      el.className = value;
    } else if (name === 'dataset') {
      Object.assign(el.dataset, value);
    } else if (name in el && typeof value !== 'string') {
      el[name] = value;
    } else {
      el.setAttribute(name, value === true ? '' : value);
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

let fieldCounter = 0;

/** A labelled input: {wrap, input}. Every input of the dashboard has a visible label. */
export function field(label, attrs = {}) {
  fieldCounter += 1;
  const id = attrs.id || `f${fieldCounter}`;
  const input = h(attrs.tag || 'input', { ...attrs, tag: undefined, id });
  const wrap = h('div', { class: 'field' }, h('label', { for: id }, label), input);
  return { wrap, input };
}

/** A labelled <select> with [value, text] options. */
export function select(label, options, attrs = {}) {
  fieldCounter += 1;
  const id = `f${fieldCounter}`;
  const input = h('select', { ...attrs, id }, options.map(([value, text]) => h('option', { value }, text)));
  return { wrap: h('div', { class: 'field' }, h('label', { for: id }, label), input), input };
}

// The status line under the header belongs to one view at a time: the router calls enterView
// as it shows a view, which clears what another view said. A view's late answers (a copy, a
// delete) use the announcer it got from statusFor, so they never land on the next view.
let viewToken = 0;
let currentView = null;
let carried = null; // {view, message, kind}: said just before navigating, shown by that view

function writeStatus(message, kind) {
  const el = document.getElementById('status');
  el.textContent = message;
  el.dataset.kind = kind;
}

/** The router shows the view `view` (its route): the status line is its own from now on. */
export function enterView(view) {
  viewToken += 1;
  currentView = view;
  const kept = carried && carried.view === view ? carried : null;
  carried = null;
  writeStatus(kept ? kept.message : '', kept ? kept.kind : 'info');
}

/**
 * Announce a message in the polite live region, on the current view; with `view`, on that view
 * when the router shows it next (a message said just before navigating there).
 */
export function announce(message, kind = 'info', view = null) {
  if (view) {
    carried = { view, message, kind };
    return;
  }
  writeStatus(message, kind);
}

/** An announce bound to the view being built: dropped once another view (or a re-render) shows. */
export function statusFor() {
  const token = viewToken;
  return (message, kind = 'info') => {
    if (token === viewToken) writeStatus(message, kind);
  };
}

/** The route of the view on screen. */
export function viewShown() {
  return currentView;
}

/** An inline error block for a form. */
export function errorBox() {
  const box = h('p', { class: 'error', role: 'alert', hidden: true });
  return {
    el: box,
    show(message) {
      box.textContent = message;
      box.hidden = false;
    },
    clear() {
      box.textContent = '';
      box.hidden = true;
    },
  };
}

/**
 * Disable a form's controls while work runs, and restore them after. A control that had the
 * focus gets it back (disabling it dropped the focus on the page: a keyboard user would start
 * over from the top), unless the focus went somewhere else meanwhile.
 */
export async function busy(form, work) {
  const controls = [...form.querySelectorAll('button, input, select, textarea')];
  const before = controls.map((c) => c.disabled);
  const focused = controls.includes(document.activeElement) ? document.activeElement : null;
  controls.forEach((c) => { c.disabled = true; });
  form.setAttribute('aria-busy', 'true');
  try {
    return await work();
  } finally {
    controls.forEach((c, i) => { c.disabled = before[i]; });
    form.removeAttribute('aria-busy');
    const now = document.activeElement;
    const lost = !now || now === focused || now.contains(form); // on the page, or on the dialog around the form
    if (focused && focused.isConnected && !focused.disabled && lost) focused.focus();
  }
}

/** Ask with the page's <dialog>; resolves true when confirmed. Esc or Cancel resolve false. */
export function confirmAction(text, confirmLabel = 'Confirm') {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = confirmLabel;
  dialog.returnValue = '';
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.showModal();
  });
}

/** Copy text to the clipboard; falls back to selecting it in a field the caller shows. */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    return false;
  }
}

export function formatBytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(value < 10 ? 1 : 0).replace(/\.0$/, '')} ${units[unit]}`;
}

/** "3 s", "2 min 5 s", "1 h 4 min": a duration a person reads at a glance. */
export function formatDuration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min${s % 60 ? ` ${s % 60} s` : ''}`;
  const m = Math.round(s / 60);
  return `${Math.floor(m / 60)} h${m % 60 ? ` ${m % 60} min` : ''}`;
}

export function formatDate(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

/** Previous/next buttons and "Page X of Y" for a page envelope. */
export function pager({ page, limit, total }, go, label) {
  const pages = Math.max(1, Math.ceil(total / limit));
  return h('nav', { class: 'pager', 'aria-label': label },
    h('button', { type: 'button', disabled: page <= 1, onclick: () => go(page - 1) }, 'Previous page'),
    h('span', {}, `Page ${page} of ${pages} (${total} total)`),
    h('button', { type: 'button', disabled: page >= pages, onclick: () => go(page + 1) }, 'Next page'));
}

// Focus after a view change: on the view's heading, so a screen reader starts there and the
// keyboard goes on from it; not at page load (nothing is outlined before the person acts).
let interacted = false;
for (const name of ['keydown', 'pointerdown']) {
  document.addEventListener(name, () => { interacted = true; }, { capture: true, once: true });
}

// The skip link focuses <main> itself: following its #main would change the router's hash.
const skip = document.querySelector('a.skip');
if (skip) {
  skip.addEventListener('click', (event) => {
    event.preventDefault();
    document.getElementById('main').focus();
  });
}

/** Move the focus to the view just shown in `main` (its h1), unless the page just loaded. */
export function focusView(main) {
  if (!interacted) return;
  const heading = main.querySelector('h1');
  if (heading) {
    heading.tabIndex = -1;
    heading.focus({ preventScroll: true });
  }
}
