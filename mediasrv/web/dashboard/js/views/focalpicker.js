// The focal point of an image, set on the file view's preview: the point a crop with
// gravity=focal keeps in view (PATCH /files/{id} {"focal_point": {x, y}}, fractions of the width
// and height from the top left, the way the server crops the auto-rotated image the preview shows).
//
// A click or tap saves the point under the pointer. With the keyboard, the picture takes the
// focus: the arrow keys move a marker (Shift: ten times as far), Enter saves it, Escape puts it
// back. A crosshair marks the stored point; "Clear focal point" removes it (null). Each save says
// how it went in a toast and in the status line (the live region screen readers hear).
import { h } from '../dom.js';
import { toast } from '../toast.js';

const STEP = 0.01;
const FAST_STEP = 0.1;
const MOVES = { ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1], ArrowDown: [0, 1] };
let pickers = 0;

const clamp = (value) => Math.min(1, Math.max(0, value));
/** A coordinate as the server keeps it for a variant: 4 decimals (images/spec.py _fraction). */
const fraction = (value) => Math.round(clamp(value) * 10000) / 10000;
const percent = (value) => `${Math.round(value * 100)}%`;

/**
 * Wrap `img` (the preview of `file`) in the picker. `save(point)`: PATCH the point (null
 * clears it) and answer the File; `changed(file)`: after a save; `say`: the view's status line.
 * Returns {el: the picture to show in place of img, controls: the help, the value and the clear
 * button}.
 */
export function focalPicker({ file, img, name, save, changed, say }) {
  pickers += 1;
  const helpId = `focal-help-${pickers}`;
  const marker = h('span', { class: 'focal-marker', hidden: true, 'aria-hidden': 'true' });
  const el = h('div', {
    class: 'focal-picker', tabindex: '0', role: 'group', 'aria-roledescription': 'focal point picker',
    'aria-label': `Focal point of ${name}`, 'aria-describedby': helpId,
  }, img, marker);
  const value = h('p', { class: 'focal-value' });
  const clear = h('button', { type: 'button' }, 'Clear focal point');
  const controls = h('div', { class: 'focal-controls' },
    h('p', { class: 'muted hint', id: helpId }, 'Click or tap the picture to set its focal point: the part '
      + 'a crop with gravity=focal keeps. Keyboard: focus the picture, move the point with the arrow keys '
      + '(Shift: faster), Enter saves, Escape puts it back.'),
    h('div', { class: 'row' }, value, clear));

  let stored = file.focal_point;
  let pending = null; // a point moved with the keyboard, not saved yet
  let saving = false;

  function show() {
    const point = pending || stored;
    marker.hidden = !point;
    marker.classList.toggle('pending', Boolean(pending));
    if (point) {
      marker.style.left = `${point.x * 100}%`;
      marker.style.top = `${point.y * 100}%`;
    }
    if (pending) {
      value.textContent = `Focal point: ${percent(pending.x)} across, ${percent(pending.y)} down (not saved: `
        + 'Enter saves, Escape puts it back)';
    } else {
      value.textContent = stored ? `Focal point: ${percent(stored.x)} across, ${percent(stored.y)} down`
        : 'No focal point: gravity=focal keeps the most interesting part.';
    }
    clear.disabled = !stored || saving;
    el.setAttribute('aria-busy', saving ? 'true' : 'false');
  }

  async function store(point) {
    if (saving) return;
    saving = true;
    show();
    try {
      const updated = await save(point);
      stored = updated.focal_point;
      pending = null;
      const message = stored ? `Saved the focal point: ${percent(stored.x)} across, ${percent(stored.y)} down.`
        : 'Cleared the focal point.';
      toast(message);
      say(message);
      changed(updated);
    } catch (e) {
      const message = `The focal point was not saved: ${e.message}`;
      toast(message, 'error');
      say(message, 'error');
    } finally {
      saving = false;
      show();
    }
  }

  img.addEventListener('click', (event) => {
    const box = img.getBoundingClientRect();
    if (!box.width || !box.height) return;
    store({ x: fraction((event.clientX - box.left) / box.width), y: fraction((event.clientY - box.top) / box.height) });
  });
  el.addEventListener('keydown', (event) => {
    if (event.target !== el) return;
    const move = MOVES[event.key];
    if (move) {
      event.preventDefault(); // not a page scroll
      const from = pending || stored || { x: 0.5, y: 0.5 };
      const step = event.shiftKey ? FAST_STEP : STEP;
      pending = { x: fraction(from.x + move[0] * step), y: fraction(from.y + move[1] * step) };
      show();
    } else if (event.key === 'Enter' && pending) {
      event.preventDefault();
      store(pending);
    } else if (event.key === 'Escape' && pending) {
      event.preventDefault();
      pending = null;
      show();
    }
  });
  clear.addEventListener('click', () => store(null));
  show();
  return { el, controls };
}
