// A short note at the bottom of the screen ("Copied the public URL"), for what happens far
// from the status line under the header (a card's menu halfway down the gallery, the
// lightbox). Visual only: the status line, a live region, already says it to screen readers.
import { h } from './dom.js';

const SHOWN_MS = 2600;
let current = null;

export function toast(message, kind = 'info') {
  if (current) current.remove();
  const note = h('div', { class: 'toast', 'aria-hidden': 'true', dataset: { kind } }, message);
  // Inside an open modal dialog (the lightbox), or it would sit under the dialog's backdrop.
  (document.querySelector('dialog[open]') || document.body).append(note);
  current = note;
  setTimeout(() => {
    note.remove();
    if (current === note) current = null;
  }, SHOWN_MS);
}
