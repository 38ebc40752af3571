// An /m variant as the server writes it: the builder's values checked against the ranges and the
// strict-mode lists the server publishes (GET /reference/for-agents, limits.resize), then written
// the canonical way (mediasrv/images/spec.py, canonical_pairs): defaults left out, decimals
// without trailing zeros, bg in lower case, parameters in the documented order. A link written
// any other way is answered 308, and a cache in front would hold the variant twice.
//
// No DOM here: the file view's builder (views/variantcard.js) and the tests call these.

/** The /m parameters that name a variant, in the order the documents list them. */
export const PARAMETERS = ['width', 'height', 'fit', 'gravity', 'format', 'quality', 'dpr', 'animated', 'blur',
  'sharpen', 'bg'];

const DEFAULT_BG = 'ffffff';

/** What the server takes when its discovery document cannot be read (the same as images/spec.py). */
export const DEFAULT_LIMITS = Object.freeze({
  max_dimension: 8192,
  formats: ['jpeg', 'png', 'webp', 'auto'],
  fits: ['contain', 'cover'],
  gravities: ['center', 'north', 'south', 'east', 'west', 'northeast', 'northwest', 'southeast', 'southwest',
    'attention', 'entropy', 'focal'],
  quality: { min: 1, max: 100 },
  dpr: { min: 1, max: 4 },
  blur: { min: 0.3, max: 100 },
  sharpen: { min: 0.3, max: 10 },
  allowed: {},
  signed_transforms: false,
});

/** The widths "Copy srcset" offers when the server has no list of its own. */
export const SRCSET_WIDTHS = [320, 640, 960, 1280, 1920];

/** A value the server would refuse: `field` names the builder's input, `message` says why. */
export class VariantError extends Error {
  constructor(field, message) {
    super(message);
    this.field = field;
  }
}

/** The server's limits with anything it did not publish taken from DEFAULT_LIMITS. */
export function withDefaults(published) {
  return { ...DEFAULT_LIMITS, ...(published || {}), allowed: { ...((published && published.allowed) || {}) } };
}

function whole(field, label, text, low, high) {
  const value = Number(text);
  if (!/^[0-9]+$/.test(text) || !Number.isInteger(value) || value < low || value > high) {
    throw new VariantError(field, `${label} must be a whole number from ${low} to ${high}`);
  }
  return String(value);
}

/**
 * A decimal parameter as /m writes it (images/spec.py decimal_text): "2.0" is "2", "1.50" is
 * "1.5", ".5" is "0.5"; at most two decimals once trailing zeros go, within [low, high].
 */
export function decimalText(field, label, text, { min: low, max: high }) {
  const refuse = () => new VariantError(field,
    `${label} must be a number from ${low} to ${high} with at most two decimals`);
  const match = /^([0-9]*)(?:\.([0-9]*))?$/.exec(text);
  if (!match || (!match[1] && !match[2])) throw refuse();
  const integer = match[1].replace(/^0+(?=[0-9])/, '') || '0';
  const fraction = (match[2] || '').replace(/0+$/, '');
  if (fraction.length > 2 || integer.length > 3) throw refuse();
  const written = fraction ? `${integer}.${fraction}` : integer;
  const value = Number(written);
  if (value < low || value > high) throw refuse();
  return written;
}

/** RRGGBB in lower case from "#RRGGBB" (a colour input) or "RRGGBB". */
export function colourText(text) {
  const match = /^#?([0-9a-fA-F]{6})$/.exec(text.trim());
  if (!match) throw new VariantError('bg', 'The background must be a colour as six hex digits, RRGGBB');
  return match[1].toLowerCase();
}

/**
 * Why the server's strict mode (its published lists, its signing key) would refuse `params`:
 * {name, message}, or null when it makes them.
 */
function outsideLists(params, limits) {
  const lists = limits.allowed || {};
  const names = Object.keys(params);
  if (!Object.keys(lists).length) {
    return limits.signed_transforms && names.length ? {
      name: names[0],
      message: 'This server makes only transforms signed with its own key (MEDIASRV_TRANSFORM_KEY), which the '
        + 'dashboard cannot sign',
    } : null;
  }
  for (const name of names) {
    const allowed = lists[name];
    if (!allowed) return { name, message: `This server makes only the variants its owner lists: not ${name}` };
    if (!allowed.includes(params[name])) {
      return { name, message: `This server makes ${name} only as ${allowed.join(', ')}` };
    }
  }
  return null;
}

/** The builder's input each parameter comes from, where the names differ. */
const INPUT_OF = { animated: 'firstFrame' };
const LABELS = { width: 'width', height: 'height', quality: 'quality', dpr: 'Pixel density (dpr)', blur: 'Blur',
  sharpen: 'Sharpen' };

/**
 * The /m query parameters (name -> text, in PARAMETERS order) for the builder's raw values:
 * {width, height, fit, gravity, format, quality, dpr, blur, sharpen, bg, firstFrame} as typed
 * ('' when empty; `bad` lists inputs whose text the browser could not read as a number).
 * Throws VariantError for what /m would refuse (400), with the server's ranges in the message.
 */
export function variantParams(raw, limits = DEFAULT_LIMITS) {
  const text = (name) => String(raw[name] === undefined || raw[name] === null ? '' : raw[name]).trim();
  for (const name of raw.bad || []) {
    throw new VariantError(name, `${LABELS[name] || name} must be a number`);
  }
  const out = {};
  for (const name of ['width', 'height']) {
    if (text(name)) out[name] = whole(name, name, text(name), 1, limits.max_dimension);
  }
  const fit = text('fit') || 'contain';
  if (!limits.fits.includes(fit)) throw new VariantError('fit', `fit must be one of ${limits.fits.join(', ')}`);
  if (fit === 'cover') {
    if (!out.width || !out.height) throw new VariantError('fit', 'Fill and crop needs both a width and a height');
    out.fit = 'cover';
    const gravity = text('gravity') || 'center';
    if (!limits.gravities.includes(gravity)) {
      throw new VariantError('gravity', `gravity must be one of ${limits.gravities.join(', ')}`);
    }
    if (gravity !== 'center') out.gravity = gravity;
  }
  const format = text('format').toLowerCase();
  if (format) {
    const written = format === 'jpg' ? 'jpeg' : format;
    if (!limits.formats.includes(written)) {
      throw new VariantError('format', `format must be one of ${limits.formats.join(', ')}`);
    }
    out.format = written;
  }
  if (text('quality')) {
    out.quality = whole('quality', 'quality', text('quality'), limits.quality.min, limits.quality.max);
  }
  if (text('dpr')) {
    const dpr = decimalText('dpr', LABELS.dpr, text('dpr'), limits.dpr);
    if (dpr !== '1') {
      if (!out.width && !out.height) {
        throw new VariantError('dpr', 'Pixel density (dpr) multiplies the box: give a width or a height');
      }
      out.dpr = dpr;
    }
  }
  if (raw.firstFrame) out.animated = 'false';
  if (text('blur')) out.blur = decimalText('blur', 'Blur', text('blur'), limits.blur);
  if (text('sharpen')) out.sharpen = decimalText('sharpen', 'Sharpen', text('sharpen'), limits.sharpen);
  if (text('bg')) {
    const bg = colourText(text('bg'));
    if (bg !== DEFAULT_BG) out.bg = bg;
  }
  const refusal = outsideLists(out, limits);
  if (refusal) throw new VariantError(INPUT_OF[refusal.name] || refusal.name, refusal.message);
  return out;
}

/** `url` with `params` added to its query ("?" or "&"), each value percent-encoded. */
export function withQuery(url, params) {
  const query = Object.entries(params)
    .filter(([, value]) => value !== undefined && value !== null && value !== '')
    .map(([name, value]) => `${name}=${encodeURIComponent(value)}`).join('&');
  if (!query) return url;
  return `${url}${url.includes('?') ? '&' : '?'}${query}`;
}

/** A URL of this server as a path on the dashboard's origin (what the dashboard's CSP lets it load). */
export function onThisOrigin(url, here = globalThis.location && globalThis.location.href) {
  const parsed = new URL(url, here);
  return parsed.pathname + parsed.search;
}

/**
 * The widths of a srcset for an image `imageWidth` pixels wide (null: unknown): the server's
 * allowed widths when it lists them, else SRCSET_WIDTHS; each capped at the image's width (the
 * server never enlarges, so a wider candidate would be the same picture under a false "w").
 */
export function srcsetWidths(imageWidth, limits = DEFAULT_LIMITS) {
  const listed = (limits.allowed && limits.allowed.width) || null;
  const widths = (listed ? listed.map(Number) : SRCSET_WIDTHS).slice().sort((a, b) => a - b);
  if (!imageWidth) return widths;
  if (listed) { // only listed widths are made: those the image has, else the smallest
    const fitting = widths.filter((w) => w <= imageWidth);
    return fitting.length ? fitting : widths.slice(0, 1);
  }
  return [...new Set(widths.map((w) => Math.min(w, imageWidth)))];
}

/**
 * An <img srcset> value, like the Python client's media.srcset: `url Nw` for each width, the
 * builder's other parameters kept. A box (width and height both set) keeps its shape at every
 * width; a height alone and dpr are left out (the "w" descriptors let the browser pick the
 * density). Candidates the server would refuse (its strict lists) are skipped; a VariantError
 * when none is left.
 */
export function srcset(base, raw, widths, limits = DEFAULT_LIMITS) {
  const boxed = String(raw.width || '').trim() && String(raw.height || '').trim();
  const candidates = [];
  let refusal = null;
  for (const width of widths) {
    const height = boxed ? String(Math.max(1, Math.round(width * Number(raw.height) / Number(raw.width)))) : '';
    try {
      const params = variantParams({ ...raw, width: String(width), height, dpr: '' }, limits);
      candidates.push(`${withQuery(base, params)} ${width}w`);
    } catch (e) {
      if (!(e instanceof VariantError)) throw e;
      refusal = refusal || e;
    }
  }
  if (!candidates.length) throw refusal || new VariantError('width', 'No width is left for a srcset');
  return candidates.join(', ');
}
