// One file (#/file/<file_id>): a preview where the browser can show the type (an image resized
// through /m/<id>?width=, PDF, video, audio, the start of a text file), a download otherwise,
// the record's fields, copy buttons (public, download, signed, a resized link; as Markdown, HTML
// or BBCode) and delete.
//
// Previews load from this origin's /m path (what the dashboard's CSP allows). A private file's
// preview uses a signed URL (POST /files/{id}/signed-url): the session token never goes in a URL,
// and the browser can stream and seek a video that way.
import { api, fetchTextHead } from '../api.js';
import {
  announce, confirmAction, copyText, errorBox, field, formatBytes, formatDate, h, select, statusFor,
} from '../dom.js';
import { FORMATS, snippet } from '../copyas.js';
import { RESIZABLE, kindOf, previewOf } from '../kinds.js';

const PREVIEW_STEPS = [320, 480, 640, 800, 1024, 1280, 1600, 2048];
const PREVIEW_MAX_CSS_WIDTH = 760;
const TEXT_PREVIEW_BYTES = 64 * 1024;
const EXPIRIES = [['3600', '1 hour'], ['86400', '1 day'], ['604800', '7 days']];
const FITS = [['contain', 'Fit inside the box'], ['cover', 'Fill the box, crop the rest']];
const QUALITY_MAX = 100;
let resizeLimits = null; // {formats, max_dimension}, from /reference/for-agents once per page load

async function resizeOptions() {
  if (!resizeLimits) {
    resizeLimits = { formats: ['jpeg', 'png', 'webp'], max_dimension: 8192 };
    try {
      const r = await fetch('/reference/for-agents', { credentials: 'omit' });
      if (r.ok) resizeLimits = (await r.json()).limits.resize || resizeLimits;
    } catch {
      // keep the defaults: the server refuses a format it cannot write with a clear 400
    }
  }
  return resizeLimits;
}

/**
 * The width to ask /m for: the space on screen in device pixels, rounded up to a few steps so
 * views share the server's cached variants. The server never enlarges a smaller image.
 */
export function previewWidth(cssWidth, devicePixelRatio) {
  const want = Math.ceil(cssWidth * (devicePixelRatio || 1));
  return PREVIEW_STEPS.find((step) => step >= want) || PREVIEW_STEPS[PREVIEW_STEPS.length - 1];
}

/** A URL of this server as a path on the dashboard's origin (what the CSP lets it load). */
function onThisOrigin(url) {
  const parsed = new URL(url, location.href);
  return parsed.pathname + parsed.search;
}

function withParams(url, params) {
  const query = new URLSearchParams(params).toString();
  if (!query) return url;
  return `${url}${url.includes('?') ? '&' : '?'}${query}`;
}

function preview(file, src, name) {
  const how = previewOf(file.content_type);
  const label = `Preview of ${name}`;
  if (how === 'image') {
    const width = previewWidth(Math.min(PREVIEW_MAX_CSS_WIDTH, document.documentElement.clientWidth - 48),
      window.devicePixelRatio);
    const url = RESIZABLE.has(file.content_type) ? withParams(src, { width }) : src;
    const img = h('img', { class: 'preview-image', src: url, alt: label });
    img.addEventListener('error', () => img.replaceWith(h('p', { class: 'error' }, 'The image could not be shown.')),
      { once: true });
    return img;
  }
  if (how === 'pdf') return h('iframe', { class: 'preview-frame', src, title: label });
  if (how === 'video') return h('video', { class: 'preview-media', src, controls: true, preload: 'metadata', 'aria-label': label });
  if (how === 'audio') return h('audio', { src, controls: true, preload: 'metadata', 'aria-label': label });
  if (how === 'text') {
    const pre = h('pre', { class: 'preview-text', tabindex: '0', 'aria-label': label }, 'Loading…');
    fetchTextHead(`/m/${encodeURIComponent(file.file_id)}`, TEXT_PREVIEW_BYTES).then((text) => {
      pre.textContent = text;
      if (file.size > TEXT_PREVIEW_BYTES) {
        pre.after(h('p', { class: 'muted' }, `The first ${formatBytes(TEXT_PREVIEW_BYTES)} of ${formatBytes(file.size)}.`));
      }
    }).catch((e) => { pre.textContent = `The text could not be loaded: ${e.message}`; });
    return pre;
  }
  return h('p', { class: 'muted no-preview' }, `This browser cannot show ${file.content_type} files here: download it.`);
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
  const path = `/files/${encodeURIComponent(id)}`;

  const sign = (expiresIn = 3600) => api('POST', `${path}/signed-url`, { json: { expires_in: expiresIn } });

  async function copy(url, what) {
    const ok = await copyText(url);
    say(ok ? `Copied the ${what}: ${url}` : `Copying failed; the ${what} is ${url}`, ok ? 'info' : 'error');
  }

  function linksCard(file) {
    const expiry = select('Signed links expire in', EXPIRIES);
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

  function resizeCard(file) {
    const width = field('Width (px)', { type: 'number', min: '1', step: '1', inputmode: 'numeric' });
    const height = field('Height (px)', { type: 'number', min: '1', step: '1', inputmode: 'numeric' });
    const fit = select('Fit', FITS);
    const format = select('Format', [['', 'Same as the file'], ['auto', 'Best the browser takes (AVIF, WebP)']]);
    const quality = field('Quality (1-100)', { type: 'number', min: '1', max: String(QUALITY_MAX), step: '1',
      inputmode: 'numeric', placeholder: 'default' });
    const output = field('Resized link', { type: 'text', readonly: true, class: 'mono' });
    const problem = errorBox();
    const open = h('a', { href: '#', target: '_blank', rel: 'noopener noreferrer' }, 'Open the resized image');
    const copyButton = h('button', { type: 'button', class: 'primary' }, 'Copy resized link');
    let limits = { max_dimension: 8192 };
    let base = file.public_url;
    let note = '';
    const whole = (name, input, max) => { // '' when empty; the server would refuse what this refuses
      const text = input.value.trim();
      if (!text) return '';
      const value = Number(text);
      if (!Number.isInteger(value) || value < 1 || value > max) {
        throw new Error(`${name} must be a whole number from 1 to ${max}`);
      }
      return String(value);
    };
    // The query in the order the API documents it; fit=contain is the default and is left out,
    // so the link names the same cached variant as one written without it.
    const params = () => {
      const out = {};
      for (const [name, input] of [['width', width.input], ['height', height.input]]) {
        const value = whole(name, input, limits.max_dimension);
        if (value) out[name] = value;
      }
      if (fit.input.value === 'cover') {
        if (!out.width || !out.height) throw new Error('Fill and crop needs both a width and a height');
        out.fit = 'cover';
      }
      if (format.input.value) out.format = format.input.value;
      const q = whole('quality', quality.input, QUALITY_MAX);
      if (q) out.quality = q;
      return out;
    };
    const update = () => {
      problem.clear();
      try {
        output.input.value = withParams(base, params());
        open.href = output.input.value;
        copyButton.disabled = false;
      } catch (e) {
        problem.show(e.message);
        copyButton.disabled = true;
      }
    };
    [width.input, height.input, fit.input, format.input, quality.input]
      .forEach((input) => input.addEventListener('input', update));
    copyButton.addEventListener('click', async () => {
      if (!file.is_public) { // a fresh signature, so the copied link lasts its full time
        try {
          base = (await sign()).url;
        } catch (e) {
          say(e.message, 'error');
          return;
        }
        update();
      }
      if (!copyButton.disabled) copy(output.input.value, `resized link${note}`);
    });
    resizeOptions().then((options) => {
      limits = options;
      format.input.append(...options.formats.filter((f) => f !== 'auto')
        .map((f) => h('option', { value: f }, f.toUpperCase())));
    });
    const section = h('section', { class: 'card', 'aria-labelledby': 'resize-title' },
      h('h2', { id: 'resize-title' }, 'Resized copies'),
      h('p', { class: 'muted' }, 'The image fitted inside this box, or filling it with the overflow cropped '
        + '(never enlarged), in this format. "Best the browser takes" sends AVIF or WebP to browsers that '
        + 'show them and the file\'s own format to others. Quality applies to JPEG, WebP and AVIF.'),
      h('div', { class: 'row-form' }, width.wrap, height.wrap, fit.wrap, format.wrap, quality.wrap), problem.el,
      output.wrap,
      h('div', { class: 'row' }, copyButton, open));
    if (!file.is_public) {
      note = ' (signed, expires in 1 hour)';
      sign().then((signed) => { base = signed.url; update(); }).catch((e) => problem.show(e.message));
    }
    update();
    return section;
  }

  async function remove(file, name) {
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
      const file = await api('GET', path);
      const name = file.name || file.file_id;
      heading.textContent = name;
      document.title = `${name} · mediasrv`;
      let src = `/m/${encodeURIComponent(file.file_id)}`;
      let download = file.public_download_url;
      if (!file.is_public) {
        const signed = await sign();
        src = onThisOrigin(signed.url);
        download = signed.download_url;
      }
      const shown = h('section', { class: 'card preview', 'aria-label': `Preview of ${name}` },
        preview(file, src, name),
        h('p', { class: 'row' }, h('a', { class: 'button-like', href: download, download: name }, `Download ${name}`),
          previewOf(file.content_type) ? h('a', { href: src, target: '_blank', rel: 'noopener noreferrer' },
            'Open in a new tab') : null));
      const details = h('div', { class: 'file-details' },
        h('section', { class: 'card', 'aria-labelledby': 'facts-title' }, h('h2', { id: 'facts-title' }, 'Details'),
          facts(file)),
        linksCard(file),
        RESIZABLE.has(file.content_type) ? resizeCard(file) : null,
        h('section', { class: 'card', 'aria-labelledby': 'delete-title' }, h('h2', { id: 'delete-title' }, 'Delete'),
          h('button', { type: 'button', class: 'danger', onclick: () => remove(file, name) }, 'Delete this file')));
      body.replaceChildren(shown, details);
    } catch (e) {
      body.replaceChildren();
      error.show(e.status === 404 ? 'This file does not exist: it may have been deleted.' : e.message);
    } finally {
      body.setAttribute('aria-busy', 'false');
    }
  }

  load();
  return [h('p', { class: 'back' }, h('a', { href: '#/files' }, '← All files')), heading, error.el, body];
}
