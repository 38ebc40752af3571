// The file view's variant builder ("Variants"): size, crop and gravity, pixel density, format and
// quality, background, first frame, blur and sharpen, written as the server's canonical /m link
// (variants.js), with a live preview of that variant, "Copy resized link" and "Copy srcset".
//
// The values are checked in the page against what the server publishes (GET /reference/for-agents,
// limits.resize: the ranges and, on a strict server, its lists), so a refused value says why here
// instead of as a broken image. A private file's links are signed (POST /files/{id}/signed-url):
// the preview's base is renewed before it expires, and each copy gets a fresh signature, so the
// copied link lasts its full hour.
import { errorBox, field, formatBytes, h, select } from '../dom.js';
import {
  VariantError, onThisOrigin, srcset, srcsetWidths, variantParams, withQuery,
} from '../variants.js';

const FITS = [['contain', 'Fit inside the box'], ['cover', 'Fill the box, crop the rest']];
const GRAVITY_NAMES = {
  center: 'Centre', north: 'Top', south: 'Bottom', east: 'Right', west: 'Left', northeast: 'Top right',
  northwest: 'Top left', southeast: 'Bottom right', southwest: 'Bottom left',
  attention: 'The most eye-catching part', entropy: 'The most detailed part', focal: 'This file\'s focal point',
};
const GRAVITY_HINTS = {
  attention: 'Keeps what draws the eye: skin tones, saturated colour, edges.',
  entropy: 'Keeps the most detailed part of the picture.',
};
/** Stored types that may be animated: the only ones "first frame only" changes. */
const ANIMATABLE = new Set(['image/gif', 'image/webp']);
const PREVIEW_DELAY_MS = 400;
const RESIGN_BEFORE_MS = 5 * 60 * 1000;

function percent(value) {
  return `${Math.round(value * 100)}%`;
}

/** Where gravity=focal crops for this file, in words. */
export function focalWords(point) {
  return point
    ? `this file's focal point (${percent(point.x)} across, ${percent(point.y)} down)`
    : 'this file\'s focal point (or the most interesting part when none is set, as now)';
}

/**
 * The builder for `file` (a File of a resizable image). `limits`: the server's limits.resize with
 * defaults (variants.js withDefaults); `sign()`: a signed URL of the file; `copy(text, what)`
 * copies and says so; `say(message, kind)`: the view's status line; `knownWidth()`: the image's
 * width in pixels when the page already knows it, else null. Returns {el, refresh(file)}: refresh
 * after the file changed (its focal point, its visibility), so the link and the preview are what
 * the file now takes: unsigned while it is public, signed while it is private.
 */
export function variantCard({ file, limits, sign, copy, say, knownWidth }) {
  const numeric = (label, attrs) => field(label, { type: 'number', inputmode: 'decimal', ...attrs });
  const width = numeric('Width (px)', { min: '1', max: String(limits.max_dimension), step: '1', inputmode: 'numeric' });
  const height = numeric('Height (px)', { min: '1', max: String(limits.max_dimension), step: '1',
    inputmode: 'numeric' });
  const dpr = numeric(`Pixel density (dpr, ${limits.dpr.min}-${limits.dpr.max})`, {
    min: String(limits.dpr.min), max: String(limits.dpr.max), step: '0.01', placeholder: '1' });
  const fit = select('Fit', FITS);
  const listed = (name, values) => (limits.allowed[name] ? values.filter((v) => limits.allowed[name].includes(v)
    || (name === 'gravity' && v === 'center')) : values);
  const gravity = select('Gravity', listed('gravity', limits.gravities)
    .map((g) => [g, `${GRAVITY_NAMES[g] || g}${g === 'center' ? ' (default)' : ''}`]));
  const gravityHint = h('p', { class: 'muted hint', id: `${gravity.input.id}-hint` });
  gravity.input.setAttribute('aria-describedby', gravityHint.id);
  gravity.wrap.append(gravityHint);
  const formats = listed('format', limits.formats);
  const format = select('Format', [['', 'Same as the file'],
    ...(formats.includes('auto') ? [['auto', 'Best the browser takes (AVIF, WebP)']] : []),
    ...formats.filter((f) => f !== 'auto').map((f) => [f, f.toUpperCase()])]);
  const quality = numeric(`Quality (${limits.quality.min}-${limits.quality.max})`, {
    min: String(limits.quality.min), max: String(limits.quality.max), step: '1', inputmode: 'numeric',
    placeholder: 'default' });
  const bg = field('Background colour', { type: 'color', value: '#ffffff' });
  const bgHint = h('p', { class: 'muted hint', id: `${bg.input.id}-hint` },
    'Fills transparent parts only where the output has no alpha (JPEG).');
  bg.input.setAttribute('aria-describedby', bgHint.id);
  bg.wrap.append(bgHint);
  const firstFrame = h('input', { type: 'checkbox' });
  const firstFrameWrap = h('label', { class: 'check' }, firstFrame, 'First frame only (a still of the animation)');
  const blur = numeric(`Blur (sigma ${limits.blur.min}-${limits.blur.max})`, {
    min: String(limits.blur.min), max: String(limits.blur.max), step: '0.01', placeholder: 'none' });
  const sharpen = numeric(`Sharpen (sigma ${limits.sharpen.min}-${limits.sharpen.max})`, {
    min: String(limits.sharpen.min), max: String(limits.sharpen.max), step: '0.01', placeholder: 'none' });
  const inputs = { width, height, dpr, fit, gravity, format, quality, bg, blur, sharpen,
    firstFrame: { input: firstFrame } };
  const animatable = ANIMATABLE.has((file.content_type || '').split(';')[0].trim().toLowerCase());

  const output = field('Resized link', { type: 'text', readonly: true, class: 'mono' });
  const problem = errorBox();
  problem.el.id = `${output.input.id}-problem`;
  const open = h('a', { target: '_blank', rel: 'noopener noreferrer' }, 'Open the resized image');
  const copyButton = h('button', { type: 'button', class: 'primary' }, 'Copy resized link');
  const srcsetButton = h('button', { type: 'button' }, 'Copy srcset');
  const thumb = h('img', { class: 'variant-thumb', alt: 'Preview of this variant', hidden: true });
  const thumbNote = h('figcaption', { class: 'muted', 'aria-live': 'polite' });
  const figure = h('figure', { class: 'variant-preview', dataset: { state: 'empty' } }, thumb, thumbNote);

  let base = file.public_url;
  let signedUntil = 0;
  let isPublic = file.is_public; // as the link was last written
  let note = '';
  let current = null; // the valid query, or null while a value is refused
  let timer = null;
  let wanted = '';

  /** The base of the preview's link: a private file's signature renewed before it expires. */
  async function freshBase() {
    if (file.is_public) return file.public_url;
    if (Date.now() > signedUntil - RESIGN_BEFORE_MS) {
      const signed = await sign();
      base = signed.url;
      signedUntil = Date.parse(signed.expires_at) || Date.now() + 3600 * 1000;
    }
    return base;
  }

  const raw = () => ({
    width: width.input.value, height: height.input.value, fit: fit.input.value,
    gravity: fit.input.value === 'cover' ? gravity.input.value : '', format: format.input.value,
    quality: quality.input.value, dpr: dpr.input.value, blur: blur.input.value, sharpen: sharpen.input.value,
    bg: bg.input.value, firstFrame: animatable && firstFrame.checked,
    bad: Object.entries({ width, height, dpr, quality, blur, sharpen })
      .filter(([, f]) => f.input.validity.badInput).map(([name]) => name),
  });

  function showGravity() {
    const cover = fit.input.value === 'cover';
    gravity.wrap.hidden = !cover;
    gravity.input.disabled = !cover;
    const chosen = gravity.input.value;
    gravityHint.textContent = chosen === 'focal'
      ? `Crops around ${focalWords(file.focal_point)}. Click the picture above to ${
        file.focal_point ? 'move' : 'set'} it.`
      : GRAVITY_HINTS[chosen] || 'The part of the picture the crop keeps.';
  }

  function update() {
    problem.clear();
    Object.values(inputs).forEach(({ input }) => input.removeAttribute('aria-invalid'));
    showGravity();
    try {
      current = variantParams(raw(), limits);
      output.input.value = withQuery(file.is_public ? file.public_url : base, current);
      open.href = output.input.value;
      open.removeAttribute('aria-disabled');
      copyButton.disabled = false;
      srcsetButton.disabled = false;
    } catch (e) {
      if (!(e instanceof VariantError)) throw e;
      current = null;
      problem.show(e.message);
      const bad = inputs[e.field];
      if (bad) {
        bad.input.setAttribute('aria-invalid', 'true');
        bad.input.setAttribute('aria-errormessage', problem.el.id);
      }
      open.removeAttribute('href');
      open.setAttribute('aria-disabled', 'true');
      copyButton.disabled = true;
      srcsetButton.disabled = true;
    }
    clearTimeout(timer);
    timer = setTimeout(showPreview, PREVIEW_DELAY_MS);
  }

  /** The variant as an image in the card (after a pause in typing: each new link is a resize). */
  async function showPreview() {
    const query = current;
    if (!query || !Object.keys(query).length) {
      wanted = '';
      thumb.hidden = true;
      thumb.removeAttribute('src');
      figure.dataset.state = 'empty';
      thumbNote.textContent = query ? 'No change yet: the link serves the file as it is.'
        : 'The preview waits for a value the server takes.';
      return;
    }
    let from;
    try {
      from = await freshBase();
    } catch (e) {
      thumbNote.textContent = `The preview needs a signed link: ${e.message}`;
      return;
    }
    if (query !== current) return; // changed while signing: its own preview follows
    // A moved focal point is a new variant under the same link; `v` (ignored by /m) makes the
    // browser fetch it instead of showing the crop it cached for the old point.
    const point = file.focal_point;
    const buster = query.gravity === 'focal' ? { v: point ? `${point.x}x${point.y}` : 'none' } : {};
    const src = onThisOrigin(withQuery(from, { ...query, ...buster }));
    if (src === wanted) return;
    wanted = src;
    figure.dataset.state = 'loading';
    thumbNote.textContent = 'Making the variant…';
    thumb.src = src;
  }

  thumb.addEventListener('load', () => {
    if (onThisOrigin(thumb.currentSrc || thumb.src) !== wanted) return;
    thumb.hidden = false;
    figure.dataset.state = 'ready';
    const timing = performance.getEntriesByName(thumb.currentSrc).pop();
    const bytes = timing && timing.encodedBodySize ? `, ${formatBytes(timing.encodedBodySize)}` : '';
    thumbNote.textContent = `This variant: ${thumb.naturalWidth} × ${thumb.naturalHeight} px${bytes}.`;
  });
  thumb.addEventListener('error', async () => {
    const failed = wanted;
    if (!failed || onThisOrigin(thumb.src) !== failed) return;
    thumb.hidden = true;
    figure.dataset.state = 'failed';
    let reason = 'the server did not answer an image';
    try { // the server's own words (a 400's JSON), e.g. a strict server's refusal
      const answer = await fetch(failed, { credentials: 'omit' });
      const body = await answer.json();
      if (body && body.error) reason = body.error;
    } catch {
      // keep the general reason
    }
    if (wanted === failed) thumbNote.textContent = `No preview: ${reason}.`;
  });

  let widthOfImage = null;
  /** The image's width (capped at the largest srcset width), for srcset's candidates. */
  async function imageWidth() {
    const known = knownWidth();
    if (known) return known;
    if (!widthOfImage) {
      widthOfImage = (async () => {
        // A variant as wide as the widest candidate: never enlarged, so its width is the
        // smaller of the two, all a srcset needs.
        const widest = Math.max(...srcsetWidths(null, limits));
        const probe = new Image();
        probe.src = onThisOrigin(withQuery(await freshBase(), { width: String(widest) }));
        await probe.decode();
        return probe.naturalWidth;
      })().catch(() => {
        widthOfImage = null;
        return null; // unknown: every candidate is offered
      });
    }
    return widthOfImage;
  }

  /** A freshly signed base for a copied link of a private file (it lasts its full time). */
  async function copyBase() {
    if (file.is_public) return file.public_url;
    const signed = await sign();
    base = signed.url;
    signedUntil = Date.parse(signed.expires_at) || 0;
    return base;
  }

  [width, height, dpr, fit, gravity, format, quality, bg, blur, sharpen]
    .forEach(({ input }) => input.addEventListener('input', update));
  firstFrame.addEventListener('change', update);
  copyButton.addEventListener('click', async () => {
    try {
      await copyBase();
    } catch (e) {
      say(e.message, 'error');
      return;
    }
    update();
    if (!copyButton.disabled) copy(output.input.value, `resized link${note}`);
  });
  srcsetButton.addEventListener('click', async () => {
    if (!current) return;
    try {
      const from = await copyBase();
      const widths = srcsetWidths(await imageWidth(), limits);
      copy(srcset(from, raw(), widths, limits), `srcset${note}`);
    } catch (e) {
      say(e.message, 'error');
    }
  });

  const group = (legend, ...children) => h('fieldset', { class: 'variant-group' }, h('legend', {}, legend),
    h('div', { class: 'row-form' }, ...children));
  const el = h('section', { class: 'card variants', 'aria-labelledby': 'resize-title' },
    h('h2', { id: 'resize-title' }, 'Resized copies and variants'),
    h('p', { class: 'muted' }, 'The image fitted inside this box, or filling it with the overflow cropped '
      + '(never enlarged), in this format. Gravity says which part a crop keeps; pixel density multiplies the '
      + 'box for sharp screens. "Best the browser takes" sends AVIF or WebP to browsers that show them and '
      + 'the file\'s own format to others. Quality applies to JPEG, WebP and AVIF.'),
    h('div', { class: 'variant-groups' },
      group('Size', width.wrap, height.wrap, dpr.wrap),
      group('Crop', fit.wrap, gravity.wrap),
      group('Output', format.wrap, quality.wrap, bg.wrap, animatable ? firstFrameWrap : null),
      group('Filters', blur.wrap, sharpen.wrap)),
    problem.el,
    h('div', { class: 'variant-result' }, figure,
      h('div', { class: 'stack' }, output.wrap, h('div', { class: 'row' }, copyButton, srcsetButton, open))),
    h('p', { class: 'muted hint' }, `"Copy srcset" gives this variant at widths up to the image's own (`
      + `${srcsetWidths(null, limits).join(', ')}), each as "link Nw" for an <img srcset>; with both a width `
      + 'and a height the box keeps its shape, and dpr is left out: the browser picks the density.'));
  /** The link's base for the file's visibility: its public URL, or a signed one made now. */
  function followVisibility() {
    isPublic = file.is_public;
    note = isPublic ? '' : ' (signed, expires in 1 hour)';
    base = file.public_url;
    signedUntil = 0;
    if (!isPublic) {
      freshBase().then(() => {
        if (!file.is_public) update();
      }).catch((e) => problem.show(e.message));
    }
  }

  followVisibility();
  update();
  return {
    el,
    refresh(changed) {
      Object.assign(file, changed);
      if (file.is_public !== isPublic) followVisibility();
      update();
    },
  };
}
