// The gallery's pieces: a thumbnail (srcset variants of /m, the file's placeholder underneath
// while it loads, a typed tile for what is not an image) and the relative dates under it.
import { fetchBlob } from './api.js';
import { h } from './dom.js';
import { RESIZABLE, kindOf } from './kinds.js';
import { srcsetWidthsFor, widthFor } from './resizeoptions.js';
import { placeholderCanvas } from './thumbhash.js';

/**
 * The widths the gallery asks /m for: a few steps, so every view shares the server's variants.
 * A strict server's own list replaces them (resizeoptions.js).
 */
export const THUMB_WIDTHS = [240, 320, 480, 720];
export const THUMB_FALLBACK = 320;
/** How wide a tile is on screen: half the screen on a phone, about 220 px elsewhere. */
export const THUMB_SIZES = '(max-width: 720px) 50vw, 240px';

const KIND_LABELS = { image: 'Image', video: 'Video', audio: 'Audio', document: 'Document', archive: 'Archive',
  other: 'File' };

/** The short badge of a file: its extension, else its subtype ("PNG", "PDF", "ZIP"). */
export function badgeOf(file) {
  const name = file.name || '';
  const extension = /\.([A-Za-z0-9]{1,8})$/.exec(name);
  const type = file.content_type || '';
  return (extension ? extension[1] : (type.split('/')[1] || 'file').split(/[+.;-]/)[0].slice(0, 8)).toUpperCase();
}

export function mediaPath(file, params = null) {
  const path = `/m/${encodeURIComponent(file.file_id)}`;
  return params ? `${path}?${new URLSearchParams(params)}` : path;
}

/**
 * The types a private thumbnail is shown from a blob: URL: pictures that cannot hold a script.
 * A blob: URL is the dashboard's own origin, without the sandbox /m and /d answer with, so an
 * SVG (or anything else) shown that way ran its script here once opened in a tab of its own,
 * where it could ask the session of the open tabs (tabsession.js). Other types get their tile.
 */
const BLOB_SAFE = new Set(['image/png', 'image/jpeg', 'image/webp', 'image/gif', 'image/avif']);

/** A tile for a file shown without pixels: its kind and extension. */
export function typeTile(file, label) {
  const kind = kindOf(file.content_type);
  return h('div', { class: 'thumb type-tile', role: 'img', 'aria-label': label, dataset: { kind } },
    h('span', { class: 'type-badge' }, badgeOf(file)),
    h('span', { class: 'type-kind' }, KIND_LABELS[kind] || 'File'));
}

/**
 * The thumbnail of `file` inside a box: public images through srcset variants of /m, private
 * ones fetched with the session (a blob: URL, pushed on `objectUrls` for the caller to revoke).
 * `limits` (resizeoptions.js): the widths a strict server makes, or the stored image where it
 * makes none unsigned; a width it refuses would leave the tile without its picture.
 */
export function thumbnail(file, objectUrls, limits) {
  const name = file.name || file.file_id;
  const type = file.content_type || '';
  if (!type.startsWith('image/')) return typeTile(file, name);
  const box = h('div', { class: 'thumb-box' });
  const under = placeholderCanvas(file.placeholder);
  if (under) box.append(under);
  const img = h('img', { class: 'thumb', alt: name, decoding: 'async', loading: 'lazy', width: '320', height: '320' });
  img.addEventListener('load', () => box.classList.add('loaded'), { once: true });
  img.addEventListener('error', () => box.replaceWith(typeTile(file, name)), { once: true });
  const widths = RESIZABLE.has(type) ? srcsetWidthsFor(limits, THUMB_WIDTHS) : [];
  if (file.is_public) {
    if (widths.length) {
      img.srcset = widths.map((w) => `${mediaPath(file, { width: w })} ${w}w`).join(', ');
      img.sizes = THUMB_SIZES;
      img.src = mediaPath(file, { width: widthFor(limits, THUMB_FALLBACK, THUMB_WIDTHS) });
    } else {
      img.src = mediaPath(file);
    }
  } else {
    // A private file needs the session token, which never goes in a URL: fetch it, show a blob.
    const want = Math.ceil(240 * (window.devicePixelRatio || 1));
    const width = widths.length ? widthFor(limits, want, THUMB_WIDTHS) : null;
    fetchBlob(width ? mediaPath(file, { width }) : mediaPath(file)).then((blob) => {
      if (!BLOB_SAFE.has(blob.type.split(';')[0].trim().toLowerCase())) throw new Error('not shown from a blob');
      const url = URL.createObjectURL(blob);
      objectUrls.push(url);
      img.src = url;
    }).catch(() => box.replaceWith(typeTile(file, name)));
  }
  box.append(img);
  return box;
}

const RELATIVE = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto', style: 'short' });
const STEPS = [[60, 'second'], [60, 'minute'], [24, 'hour'], [7, 'day'], [4.35, 'week'], [12, 'month'],
  [Infinity, 'year']];

/** "3 minutes ago", "yesterday", "last month": when a file arrived, read at a glance. */
export function relativeTime(iso, now = Date.now()) {
  const at = Date.parse(iso);
  if (Number.isNaN(at)) return '';
  let value = (at - now) / 1000;
  for (const [size, unit] of STEPS) {
    if (Math.abs(value) < size) return RELATIVE.format(Math.round(value), unit);
    value /= size;
  }
  return '';
}
