// One file (#/file/<file_id>): a preview where the browser can show the type (an image resized
// through /m/<id>?width=, PDF, video, audio, the start of a text file), a download otherwise,
// the record's fields, copy buttons (public, download, signed; as Markdown, HTML or BBCode), the
// variant builder (variantcard.js), the focal point picker on an image's preview (focalpicker.js),
// its name and visibility (PATCH /files/{id} with `name` or `is_public`: the page follows without
// a reload, its links, preview and badge included) and delete.
//
// Previews load from this origin's /m path (what the dashboard's CSP allows). A private file's
// preview uses a signed URL (POST /files/{id}/signed-url): the session token never goes in a URL,
// and the browser can stream and seek a video that way.
import { api, fetchTextHead } from '../api.js';
import {
  announce, busy, confirmAction, copyText, errorBox, formatBytes, formatDate, h, select, statusFor,
} from '../dom.js';
import { FORMATS, snippet } from '../copyas.js';
import {
  acceptInput, displayName, nameField, nameToSend, refuseInput, renamedWords, updateFile, visibilityWords,
} from '../fileactions.js';
import { RESIZABLE, kindOf, previewOf } from '../kinds.js';
import { toast } from '../toast.js';
import { resizeOptions, widthFor } from '../resizeoptions.js';
import { onThisOrigin, withQuery } from '../variants.js';
import { focalPicker } from './focalpicker.js';
import { variantCard } from './variantcard.js';

const PREVIEW_STEPS = [320, 480, 640, 800, 1024, 1280, 1600, 2048];
const PREVIEW_MAX_CSS_WIDTH = 760;
const TEXT_PREVIEW_BYTES = 64 * 1024;
const EXPIRIES = [['3600', '1 hour'], ['86400', '1 day'], ['604800', '7 days']];

/**
 * The width to ask /m for: the space on screen in device pixels, rounded up to a few steps so
 * views share the server's cached variants (on a strict server, to the widths it lists; null
 * where it makes none unsigned: the stored image). The server never enlarges a smaller image.
 */
export function previewWidth(cssWidth, devicePixelRatio, limits) {
  return widthFor(limits, Math.ceil(cssWidth * (devicePixelRatio || 1)), PREVIEW_STEPS);
}

/**
 * The preview of `file` from `src`; an image's own element as `image` (the focal point picker's).
 * `setSource(src)` loads it from another URL (the file turned public or private: the old one
 * stops working); `setName(name)` names it anew.
 */
function preview(file, src, name, limits) {
  const how = previewOf(file.content_type);
  const label = `Preview of ${name}`;
  const labelled = (el, attribute) => ({ setName: (now) => el.setAttribute(attribute, `Preview of ${now}`) });
  if (how === 'image') {
    const width = RESIZABLE.has(file.content_type)
      ? previewWidth(Math.min(PREVIEW_MAX_CSS_WIDTH, document.documentElement.clientWidth - 48),
        window.devicePixelRatio, limits) : null;
    const query = width ? { width: String(width) } : {};
    const img = h('img', { class: 'preview-image', src: withQuery(src, query), alt: label });
    img.addEventListener('error', () => (img.closest('.focal-picker') || img)
      .replaceWith(h('p', { class: 'error' }, 'The image could not be shown.')), { once: true });
    return { el: img, image: img, asked: query.width ? Number(query.width) : null, ...labelled(img, 'alt'),
      setSource: (now) => { img.src = withQuery(now, query); } };
  }
  const played = (el, attribute) => ({ el, ...labelled(el, attribute), setSource: (now) => { el.src = now; } });
  if (how === 'pdf') return played(h('iframe', { class: 'preview-frame', src, title: label }), 'title');
  if (how === 'video') {
    return played(h('video', { class: 'preview-media', src, controls: true, preload: 'metadata', 'aria-label': label }),
      'aria-label');
  }
  if (how === 'audio') {
    return played(h('audio', { src, controls: true, preload: 'metadata', 'aria-label': label }), 'aria-label');
  }
  const unchanged = { setSource: () => {} }; // read with the session, whatever the visibility
  if (how === 'text') {
    const pre = h('pre', { class: 'preview-text', tabindex: '0', 'aria-label': label }, 'Loading…');
    fetchTextHead(`/m/${encodeURIComponent(file.file_id)}`, TEXT_PREVIEW_BYTES).then((text) => {
      pre.textContent = text;
      if (file.size > TEXT_PREVIEW_BYTES) {
        pre.after(h('p', { class: 'muted' }, `The first ${formatBytes(TEXT_PREVIEW_BYTES)} of ${formatBytes(file.size)}.`));
      }
    }).catch((e) => { pre.textContent = `The text could not be loaded: ${e.message}`; });
    return { el: pre, ...unchanged, ...labelled(pre, 'aria-label') };
  }
  return { el: h('p', { class: 'muted no-preview' }, `This browser cannot show ${file.content_type} files here: download it.`),
    ...unchanged, setName: () => {} };
}

function facts(file) {
  const rows = [
    ['Name', file.name || '(no name)'], ['File id', h('code', {}, file.file_id)], ['Type', file.content_type],
    ['Kind', kindOf(file.content_type)], ['Size', `${formatBytes(file.size)} (${file.size.toLocaleString()} bytes)`],
    ['Visibility', file.is_public ? 'Public: anyone with the link' : 'Private: you, or a signed link'],
    ['Uploaded', formatDate(file.created_at)],
    ...(file.is_public ? [['Public URL', h('code', {}, file.public_url)]] : []),
  ];
  return h('dl', { class: 'facts' }, rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

export function fileView({ id, go }) {
  const say = statusFor();
  const error = errorBox();
  const body = h('div', { class: 'file-view', 'aria-busy': 'true' }, h('p', { class: 'muted' }, 'Loading…'));
  const heading = h('h1', { class: 'file-title' }, 'File');
  const badge = h('p', { class: 'badge private file-badge', hidden: true }, 'Private');
  const path = `/files/${encodeURIComponent(id)}`;
  let expiryChoice = EXPIRIES[0][0]; // the signed links' lifetime, kept when the links card is made anew

  const sign = (expiresIn = 3600) => api('POST', `${path}/signed-url`, { json: { expires_in: expiresIn } });

  /** Where the page loads the file from and downloads it: public links, or signed ones (private). */
  async function sources(file) {
    if (file.is_public) return { src: `/m/${encodeURIComponent(file.file_id)}`, download: file.public_download_url };
    const signed = await sign();
    return { src: onThisOrigin(signed.url), download: signed.download_url };
  }

  async function copy(url, what) {
    const ok = await copyText(url);
    say(ok ? `Copied the ${what}: ${url}` : `Copying failed; the ${what} is ${url}`, ok ? 'info' : 'error');
  }

  function linksCard(file) {
    const expiry = select('Signed links expire in', EXPIRIES);
    expiry.input.value = expiryChoice;
    expiry.input.addEventListener('change', () => { expiryChoice = expiry.input.value; });
    const copySigned = async (which) => {
      try {
        const signed = await sign(Number(expiry.input.value));
        await copy(which === 'download' ? signed.download_url : signed.url,
          `signed ${which === 'download' ? 'download ' : ''}URL (expires ${formatDate(signed.expires_at)})`);
      } catch (e) {
        say(e.message, 'error');
      }
    };
    const button = (label, onclick) => h('button', { type: 'button', onclick }, label);
    // Copy as Markdown, HTML or BBCode: the public URL, or a signed one for the chosen time.
    const copyAs = async (format, label) => {
      try {
        const url = file.is_public ? file.public_url : (await sign(Number(expiry.input.value))).url;
        await copy(snippet(format, file, url), label);
      } catch (e) {
        say(e.message, 'error');
      }
    };
    return h('section', { class: 'card', 'aria-labelledby': 'links-title' },
      h('h2', { id: 'links-title' }, 'Links'),
      h('div', { class: 'row' },
        file.is_public ? button('Copy public URL', () => copy(file.public_url, 'public URL')) : null,
        file.is_public ? button('Copy download URL', () => copy(file.public_download_url, 'download URL')) : null,
        button('Copy signed URL', () => copySigned('view')),
        button('Copy signed download URL', () => copySigned('download'))),
      h('div', { class: 'row' }, ...FORMATS.filter(([format]) => format !== 'url').map(([format, label]) =>
        button(`Copy as ${label}`, () => copyAs(format, label)))),
      h('div', { class: 'row-form' }, expiry.wrap));
  }

  /**
   * Rename (a form: the server's refusal under the field) and public or private (one button that
   * says what it does). `changed(file)` makes the rest of the page follow the answer.
   */
  function manageCard(file, changed) {
    const named = nameField(file);
    const form = h('form', { class: 'stack name-form', 'aria-label': 'Rename' }, named.wrap, named.hint,
      named.error.el, h('div', { class: 'row' }, h('button', { type: 'submit', class: 'primary' }, 'Save name')));
    named.input.addEventListener('input', () => acceptInput(named.input, named.error));
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      acceptInput(named.input, named.error);
      const name = nameToSend(named.input.value);
      if (name === (file.name || null)) {
        named.input.value = file.name || '';
        say('Nothing to save: that is the name already.');
        return;
      }
      const before = displayName(file);
      try {
        const updated = await busy(form, () => updateFile(file, { name }));
        changed(updated);
        named.input.value = file.name || '';
        const message = renamedWords(before, file);
        say(message);
        toast(message);
      } catch (e) {
        refuseInput(named.input, named.error, e.message);
      }
    });

    const state = h('p', { class: 'visibility-state', id: 'visibility-state' });
    const toggle = h('button', { type: 'button', 'aria-describedby': 'visibility-state' });
    const refused = errorBox();
    const visibility = h('div', { class: 'stack visibility', role: 'group', 'aria-labelledby': 'visibility-title' },
      h('h3', { id: 'visibility-title' }, 'Visibility'), state, h('div', { class: 'row' }, toggle), refused.el);
    const showVisibility = () => {
      state.textContent = file.is_public ? 'Public: anyone with its link can open it, no sign-in or signature needed.'
        : 'Private: only you, or someone you give a signed link (it expires).';
      toggle.textContent = file.is_public ? 'Make private' : 'Make public';
    };
    toggle.addEventListener('click', async () => {
      refused.clear();
      try {
        const updated = await busy(visibility, () => updateFile(file, { is_public: !file.is_public }));
        changed(updated);
        showVisibility();
        const message = visibilityWords(file);
        say(message);
        toast(message);
      } catch (e) {
        refused.show(`The visibility was not changed: ${e.message}`);
      }
    });
    showVisibility();
    return h('section', { class: 'card manage', 'aria-labelledby': 'manage-title' },
      h('h2', { id: 'manage-title' }, 'Name and visibility'), form, visibility);
  }

  async function remove(name) {
    if (!await confirmAction(`Delete ${name}? This cannot be undone.`, 'Delete')) return;
    try {
      await api('DELETE', path);
      announce(`Deleted ${name}.`, 'info', '#/files');
      go('#/files');
    } catch (e) {
      say(e.message, 'error');
    }
  }

  async function load() {
    try {
      const [file, limits] = await Promise.all([api('GET', path), resizeOptions()]);
      let name = displayName(file);
      let { src, download } = await sources(file);
      const shown = preview(file, src, name, limits);
      const resizable = RESIZABLE.has(file.content_type);
      const builder = resizable ? variantCard({
        file, limits, sign, copy, say,
        // the preview's width, when it is the image's own: asked wider, never enlarged
        knownWidth: () => {
          const img = shown.image;
          return img && shown.asked && img.complete && img.naturalWidth && img.naturalWidth < shown.asked
            ? img.naturalWidth : null;
        },
      }) : null;
      const picker = resizable && shown.image ? focalPicker({
        file, img: shown.image, name, say,
        save: (point) => api('PATCH', path, { json: { focal_point: point } }),
        changed: (updated) => builder.refresh(updated),
      }) : null;
      const downloadLink = h('a', { class: 'button-like', href: download, download: name }, `Download ${name}`);
      const openLink = previewOf(file.content_type)
        ? h('a', { href: src, target: '_blank', rel: 'noopener noreferrer' }, 'Open in a new tab') : null;
      const previewCard = h('section', { class: 'card preview', 'aria-label': `Preview of ${name}` },
        picker ? picker.el : shown.el,
        picker ? picker.controls : null,
        h('p', { class: 'row' }, downloadLink, openLink));
      let factsList = facts(file);
      let links = linksCard(file);

      /** Everything the page shows of the name and the visibility, from `file` as it is now. */
      const show = () => {
        name = displayName(file);
        heading.textContent = name;
        document.title = `${name} · mediasrv`;
        badge.hidden = file.is_public;
        previewCard.setAttribute('aria-label', `Preview of ${name}`);
        shown.setName(name);
        if (picker) picker.el.setAttribute('aria-label', `Focal point of ${name}`);
        downloadLink.textContent = `Download ${name}`;
        downloadLink.download = name;
        const nextFacts = facts(file);
        factsList.replaceWith(nextFacts);
        factsList = nextFacts;
        const nextLinks = linksCard(file);
        links.replaceWith(nextLinks);
        links = nextLinks;
      };
      // A rename or a visibility change: the page follows the File the server answered. Made
      // public or private, the preview and the download come from the links that now work.
      let turns = 0; // the latest visibility change: an older one's links arrive too late
      const changed = (updated) => {
        const turned = updated.is_public !== file.is_public;
        if (builder) builder.refresh(updated);
        Object.assign(file, updated);
        show();
        if (!turned) return;
        turns += 1;
        const mine = turns;
        sources(file).then((now) => {
          if (mine !== turns) return;
          if (now.src !== src) shown.setSource(now.src);
          ({ src, download } = now);
          downloadLink.href = download;
          if (openLink) openLink.href = src;
        }).catch((e) => say(`The preview could not follow the change: ${e.message}`, 'error'));
      };

      const details = h('div', { class: 'file-details' },
        h('section', { class: 'card', 'aria-labelledby': 'facts-title' }, h('h2', { id: 'facts-title' }, 'Details'),
          factsList),
        manageCard(file, changed),
        links,
        h('section', { class: 'card', 'aria-labelledby': 'delete-title' }, h('h2', { id: 'delete-title' }, 'Delete'),
          h('button', { type: 'button', class: 'danger', onclick: () => remove(name) }, 'Delete this file')));
      show();
      body.replaceChildren(previewCard, builder ? builder.el : '', details);
    } catch (e) {
      body.replaceChildren();
      error.show(e.status === 404 ? 'This file does not exist: it may have been deleted.' : e.message);
    } finally {
      body.setAttribute('aria-busy', 'false');
    }
  }

  load();
  return [h('p', { class: 'back' }, h('a', { href: '#/files' }, '← All files')), heading, badge, error.el, body];
}
