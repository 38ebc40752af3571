// What /m takes and, on a strict server (MEDIASRV_ALLOWED_*, MEDIASRV_TRANSFORM_KEY), makes:
// GET /reference/for-agents' limits.resize, read once per page load and shared by every view
// that asks /m for a width (the gallery's thumbnails, the lightbox, the file view's preview and
// variant builder). A width the server does not make is a 400, and a tile with no picture.
//
// The width pickers are pure (no DOM, no fetch): given the limits, the width a view wants and
// the steps it asks for on an unrestricted server, they answer what to ask for instead.
import { withDefaults } from './variants.js';

let loading = null; // the answer in flight or read: every caller of this page load shares it

/**
 * The server's limits.resize (variants.js withDefaults fills what it leaves out). Unreadable
 * (offline, an error): the defaults, not kept, so the next view asks again.
 */
export function resizeOptions() {
  if (!loading) {
    loading = (async () => {
      try {
        const r = await fetch('/reference/for-agents', { credentials: 'omit' });
        if (r.ok) return withDefaults((await r.json()).limits.resize);
      } catch {
        // below: the defaults for now; the server refuses what it does not make with a clear 400
      }
      loading = null;
      return withDefaults(null);
    })();
  }
  return loading;
}

/** The widths the server makes, ascending; null when it makes any width (no list, no key). */
function listedWidths(limits) {
  const lists = limits.allowed || {};
  if (lists.width) return lists.width.map(Number).sort((a, b) => a - b);
  // Other lists without a width list: only the default width (none). A key alone: only signed ones.
  return Object.keys(lists).length || limits.signed_transforms ? [] : null;
}

/**
 * The width to ask /m for when `want` device pixels are wanted: the smallest of `steps` (the
 * view's own, ascending) at least as wide, else the largest, on a server that makes any width;
 * on a strict one the same among the widths it lists. null: it makes no width unsigned, so ask
 * for the stored image (no query).
 */
export function widthFor(limits, want, steps) {
  const widths = listedWidths(limits) || steps;
  if (!widths.length) return null;
  return widths.find((w) => w >= want) || widths[widths.length - 1];
}

/**
 * The widths of a srcset for a picture shown at most `steps`' largest width: `steps` on a server
 * that makes any width; else its listed widths up to the first that covers the largest step (a
 * wider one would only cost bytes); [] when it makes none unsigned.
 */
export function srcsetWidthsFor(limits, steps) {
  const listed = listedWidths(limits);
  if (!listed) return steps;
  const most = steps[steps.length - 1];
  const cover = listed.findIndex((w) => w >= most);
  return cover < 0 ? listed : listed.slice(0, cover + 1);
}
