// A menu button (WAI-ARIA "menu button" pattern): one "⋯" button per gallery card instead of a
// row of buttons. Enter, Space or ArrowDown opens it on the first item; arrows, Home and End
// move; Escape closes it and gives the focus back to the button; a click elsewhere closes it.
import { h } from './dom.js';

let openMenu = null; // the one menu open on the page: {close}

document.addEventListener('pointerdown', (event) => {
  if (openMenu && !openMenu.wrap.contains(event.target)) openMenu.close(false);
});

/**
 * A menu button labelled `label` (its accessible name) whose items are
 * [{label, onSelect, danger?}] (null: a separator). Returns the wrapper element.
 */
export function menuButton(label, items, { icon = '⋯', className = '' } = {}) {
  const button = h('button', { type: 'button', class: `menu-button ${className}`.trim(), 'aria-label': label,
    'aria-haspopup': 'menu', 'aria-expanded': 'false', title: label }, icon);
  const list = h('div', { class: 'menu', role: 'menu', 'aria-label': label, hidden: true });
  const wrap = h('div', { class: 'menu-wrap' }, button, list);
  const entries = () => [...list.querySelectorAll('[role=menuitem]')];

  const state = {
    wrap,
    close(refocus = true) {
      list.hidden = true;
      button.setAttribute('aria-expanded', 'false');
      wrap.classList.remove('open');
      if (openMenu === state) openMenu = null;
      if (refocus) button.focus();
    },
  };

  function open(focusIndex = 0) {
    if (openMenu && openMenu !== state) openMenu.close(false);
    list.replaceChildren(...items.filter((item) => item !== undefined).map((item) => (item === null
      ? h('div', { class: 'menu-sep', role: 'separator' })
      : h('button', { type: 'button', role: 'menuitem', tabindex: '-1', class: item.danger ? 'danger' : '',
        onclick: () => {
          state.close(true);
          item.onSelect();
        } }, item.label))));
    list.hidden = false;
    wrap.classList.add('open');
    button.setAttribute('aria-expanded', 'true');
    openMenu = state;
    const all = entries();
    // Open upwards when there is no room below (a card in the last row).
    const below = window.innerHeight - button.getBoundingClientRect().bottom;
    list.classList.toggle('up', below < list.offsetHeight + 12);
    if (all.length) all[(focusIndex + all.length) % all.length].focus();
  }

  button.addEventListener('click', () => (list.hidden ? open(0) : state.close(true)));
  button.addEventListener('keydown', (event) => {
    if (event.key === 'ArrowDown' || event.key === 'ArrowUp') {
      event.preventDefault();
      open(event.key === 'ArrowDown' ? 0 : -1);
    }
  });
  list.addEventListener('keydown', (event) => {
    const all = entries();
    const at = all.indexOf(document.activeElement);
    const move = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: all.length - 1 }[event.key];
    if (move !== undefined) {
      event.preventDefault();
      all[(move + all.length) % all.length].focus();
    } else if (event.key === 'Escape') {
      event.preventDefault();
      event.stopPropagation(); // a menu inside the lightbox closes, not the lightbox
      state.close(true);
    } else if (event.key === 'Tab') {
      state.close(false);
    }
  });
  return wrap;
}
