// The lightbox: one file of the gallery over the page, large, with the previous and next files a
// key away (ArrowLeft / ArrowRight, Home / End; Escape closes and the focus goes back to the
// file's card). Images come as a variant of /m sized to the screen, with the file's
// placeholder underneath while they load; video, audio, PDF and text play or show in place; a
// type the browser cannot show gets its tile and a download. A private file is shown through a
// signed URL (made when it is shown), never with the session token in a URL. On a strict server
// the image's width is one it lists (resizeoptions.js), or none: the stored image.
import { fetchTextHead } from './api.js';
import { formatBytes, formatDate, h } from './dom.js';
import { displayName, fileMenuItems, onThisOrigin, signFile } from './fileactions.js';
import { mediaPath, typeTile } from './gallery.js';
import { RESIZABLE, previewOf } from './kinds.js';
import { menuButton } from './menu.js';
import { resizeOptions, widthFor } from './resizeoptions.js';
import { placeholderCanvas } from './thumbhash.js';

const WIDTHS = [640, 960, 1280, 1600, 2048];
const TEXT_BYTES = 32 * 1024;

function withParams(url, params) {
  return `${url}${url.includes('?') ? '&' : '?'}${new URLSearchParams(params)}`;
}

async function stage(file) {
  const name = displayName(file);
  const how = previewOf(file.content_type);
  if (!how) {
    return h('div', { class: 'lightbox-none' }, typeTile(file, name),
      h('p', {}, `This browser cannot show ${file.content_type} files: download it from the menu.`));
  }
  const [src, limits] = await Promise.all([
    file.is_public ? mediaPath(file) : signFile(file).then((signed) => onThisOrigin(signed.url)),
    resizeOptions()]);
  const label = `Preview of ${name}`;
  if (how === 'image') {
    const box = h('div', { class: 'lightbox-image' });
    const under = placeholderCanvas(file.placeholder);
    if (under) box.append(under);
    const img = h('img', { alt: label, decoding: 'async' });
    // One width, the screen's in device pixels on a step (not a srcset: the server never
    // enlarges, and a srcset would then show a small image smaller than it is).
    const want = Math.ceil(window.innerWidth * 0.92 * (window.devicePixelRatio || 1));
    const width = RESIZABLE.has(file.content_type) ? widthFor(limits, want, WIDTHS) : null;
    img.src = width ? withParams(src, { width }) : src;
    img.addEventListener('load', () => box.classList.add('loaded'), { once: true });
    img.addEventListener('error', () => box.replaceWith(typeTile(file, name)), { once: true });
    box.append(img);
    return box;
  }
  if (how === 'pdf') return h('iframe', { class: 'lightbox-frame', src, title: label });
  if (how === 'video') return h('video', { class: 'lightbox-media', src, controls: true, preload: 'metadata', 'aria-label': label });
  if (how === 'audio') return h('audio', { src, controls: true, preload: 'metadata', 'aria-label': label });
  const pre = h('pre', { class: 'lightbox-text', tabindex: '0', 'aria-label': label }, 'Loading…');
  fetchTextHead(mediaPath(file), TEXT_BYTES).then((text) => { pre.textContent = text; })
    .catch((e) => { pre.textContent = `The text could not be loaded: ${e.message}`; });
  return pre;
}

/**
 * Show `files[index]` in the lightbox. `say` reports (copy, delete); `removed(file)` runs after
 * a delete from the lightbox; `changed(file)` after a rename or a visibility change from its menu
 * (the File as the server answered); `returnFocus(file)` gives the element to focus when it closes.
 * `pages` (optional) goes on past the page's ends: {offset(), total(), next(), prev()}, where
 * next and prev load the neighbouring page and resolve its files (null at the ends).
 */
export function openLightbox(shownFiles, index, { say, removed, changed = null, returnFocus, pages = null }) {
  let files = shownFiles;
  let at = index;
  let token = 0; // the file shown: a late answer for another one is dropped
  const title = h('h2', { class: 'lightbox-title', id: 'lightbox-title' });
  const counter = h('span', { class: 'lightbox-count' });
  const facts = h('span', { class: 'lightbox-facts' });
  const menuSlot = h('div', { class: 'lightbox-menu' });
  const details = h('a', { class: 'lightbox-details' }, 'Open details');
  const body = h('div', { class: 'lightbox-stage' });
  const prev = h('button', { type: 'button', class: 'lightbox-nav prev', 'aria-label': 'Previous file' }, '‹');
  const next = h('button', { type: 'button', class: 'lightbox-nav next', 'aria-label': 'Next file' }, '›');
  const close = h('button', { type: 'button', class: 'lightbox-close', 'aria-label': 'Close' }, '✕');
  const dialog = h('dialog', { class: 'lightbox', 'aria-labelledby': 'lightbox-title' },
    h('header', { class: 'lightbox-bar' },
      h('div', { class: 'lightbox-heading' }, title, h('p', { class: 'lightbox-sub' }, counter, facts)),
      details, menuSlot, close),
    h('div', { class: 'lightbox-body' }, prev, body, next));

  /** The bar over the file: its name, where it is in the list, its facts and its menu. */
  function bar(file) {
    const name = displayName(file);
    title.textContent = name;
    counter.textContent = pages ? `${pages.offset() + at + 1} of ${pages.total()}` : `${at + 1} of ${files.length}`;
    facts.textContent = ` · ${formatBytes(file.size)} · ${formatDate(file.created_at)}${file.is_public ? '' : ' · Private'}`;
    details.href = `#/file/${encodeURIComponent(file.file_id)}`;
    const many = files.length > 1 || (pages && pages.total() > 1);
    prev.disabled = !many;
    next.disabled = !many;
    menuSlot.replaceChildren(menuButton(`Actions for ${name}`, fileMenuItems(file, {
      say, details: false,
      removed: (gone) => {
        files.splice(files.indexOf(gone), 1);
        removed(gone);
        if (!files.length) dialog.close();
        else show(at);
      },
      changed: changed && ((updated) => {
        const now = { ...file, ...updated };
        const i = files.indexOf(file); // -1: the lightbox went on to another page meanwhile
        if (i >= 0) files[i] = now;
        if (i >= 0 && i === at && dialog.open) {
          const hadFocus = menuSlot.contains(document.activeElement) || document.activeElement === document.body;
          // Renamed: the bar only. Made public or private: the picture too, from the link that now works.
          if (updated.is_public !== file.is_public) show(at); else bar(now);
          if (hadFocus) menuSlot.querySelector('.menu-button').focus();
        }
        changed(now);
      }),
    })));
  }

  async function show(wanted) {
    let i = wanted;
    token += 1;
    const mine = token;
    if (pages && (i < 0 || i >= files.length) && pages.total() > files.length) {
      // Past the page's end: the next (or previous) page, and no wrapping round at the very ends.
      const more = i < 0 ? await pages.prev() : await pages.next();
      if (mine !== token) return;
      if (!more || !more.length) return;
      files = [...more];
      i = i < 0 ? files.length - 1 : 0;
    }
    at = (i + files.length) % files.length;
    const file = files[at];
    bar(file);
    body.replaceChildren(h('p', { class: 'lightbox-loading' }, 'Loading…'));
    body.dataset.fileId = file.file_id;
    try {
      const content = await stage(file);
      if (mine === token) body.replaceChildren(content);
    } catch (e) {
      if (mine === token) body.replaceChildren(h('p', { class: 'error' }, e.message));
    }
  }

  prev.addEventListener('click', () => show(at - 1));
  next.addEventListener('click', () => show(at + 1));
  close.addEventListener('click', () => dialog.close());
  details.addEventListener('click', () => dialog.close());
  dialog.addEventListener('keydown', (event) => {
    const tag = event.target.tagName;
    if (tag === 'VIDEO' || tag === 'AUDIO' || tag === 'INPUT') return; // their own arrow keys
    const to = { ArrowLeft: at - 1, ArrowRight: at + 1, Home: 0, End: files.length - 1 }[event.key];
    if (to === undefined || event.altKey || event.ctrlKey || event.metaKey) return;
    if (event.target.closest && event.target.closest('[role=menu]')) return;
    event.preventDefault();
    show(to);
  });
  // A click on the dark backdrop (outside the stage's content) closes, as in every gallery.
  dialog.addEventListener('click', (event) => {
    if (event.target === dialog || event.target.classList.contains('lightbox-body')) dialog.close();
  });
  dialog.addEventListener('close', () => {
    const file = files[at];
    dialog.remove();
    const target = file && returnFocus(file);
    if (target) target.focus();
  });
  document.body.append(dialog);
  dialog.showModal();
  show(at);
  close.focus();
  return dialog;
}
