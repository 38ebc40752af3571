// Files: the upload queue, then the gallery. Search, kind, type, visibility and order are sent
// to the server (GET /files?q=&kind=&sort=...), which sorts and filters every file of the
// account before paging. A card is a thumbnail that opens the lightbox, the name (the file's
// page), and one menu of actions (renamed or made public or private there, the card is made anew
// from the server's answer); a checkbox selects it for bulk delete.
import { api } from '../api.js';
import { confirmAction, errorBox, field, formatBytes, formatDate, h, pager, select, statusFor } from '../dom.js';
import { displayName, fileMenuItems } from '../fileactions.js';
import { relativeTime, thumbnail } from '../gallery.js';
import { kindOf } from '../kinds.js';
import { openLightbox } from '../lightbox.js';
import { menuButton } from '../menu.js';
import { resizeOptions } from '../resizeoptions.js';
import { allowedTypes } from '../uploadmessages.js';
import { UploadQueue } from '../uploadqueue.js';
import { uploadPanel } from './uploadpanel.js';

const PAGE_SIZE = 48;
/** The server's orders (GET /files?sort=), newest first by default. */
export const SORTS = [['-created', 'Newest first'], ['created', 'Oldest first'], ['name', 'Name, A to Z'],
  ['-name', 'Name, Z to A'], ['-size', 'Largest first'], ['size', 'Smallest first']];
/** The server's kinds (GET /files?kind=). */
export const KIND_CHOICES = [['', 'All'], ['image', 'Images'], ['video', 'Video'], ['audio', 'Audio'],
  ['document', 'Documents'], ['archive', 'Archives'], ['other', 'Other']];
const DEFAULT_SORT = '-created';

/** The uploads of this tab: they go on while another view is shown. */
export const uploadQueue = new UploadQueue();
const uploadPrefs = { isPublic: true };
let objectUrls = []; // blob: URLs of private thumbnails, revoked on every re-render

/** Forget the filters, the selection and the uploads (at logout: the next user starts clean). */
export function resetFilesState() {
  filesView.state = null;
  uploadQueue.clear();
  uploadPrefs.isPublic = true;
}

function freshState() {
  return { page: 1, q: '', type: '', kind: '', sort: DEFAULT_SORT, isPublic: '', selected: new Set(),
    items: [], total: 0 };
}

/** Whether a file just uploaded belongs on the first page of the current listing. */
function joinsFirstPage(state, file) {
  const q = state.q.toLowerCase();
  return state.sort === DEFAULT_SORT
    && (!q || displayName(file).toLowerCase().includes(q) || file.file_id.toLowerCase().includes(q))
    && (!state.type || file.content_type === state.type)
    && (!state.kind || kindOf(file.content_type) === state.kind)
    && (state.isPublic === '' || String(file.is_public) === state.isPublic);
}

export function filesView({ rerender }) {
  objectUrls.forEach((url) => URL.revokeObjectURL(url));
  objectUrls = [];
  const say = statusFor();
  const state = filesView.state || (filesView.state = freshState());
  const error = errorBox();
  const grid = h('ul', { class: 'grid', 'aria-label': 'Your files', 'aria-busy': 'true' });
  const pagerSlot = h('div');
  const bulkButton = h('button', { type: 'button', class: 'danger', disabled: true }, 'Delete selected');
  const selectAll = h('input', { type: 'checkbox', id: 'select-all' });
  const countText = h('span', { class: 'muted' });
  const totalText = h('span', { class: 'files-total muted' });
  const title = h('h1', { tabindex: '-1' }, 'Files');
  const cards = new Map(); // file_id -> card, reused across re-renders so thumbnails stay loaded
  let limits = null; // the widths /m makes (resizeoptions.js), read with the first page of files
  const inFlight = new Set(); // per listing request on its way: the files the queue stored meanwhile

  const updateBulk = () => {
    bulkButton.disabled = state.selected.size === 0;
    bulkButton.hidden = state.selected.size === 0; // shown once something is selected
    bulkButton.textContent = state.selected.size ? `Delete selected (${state.selected.size})` : 'Delete selected';
    countText.textContent = state.selected.size ? `${state.selected.size} selected` : '';
    grid.classList.toggle('selecting', state.selected.size > 0);
  };

  const query = () => ({ q: state.q, type: state.type, isPublic: state.isPublic, kind: state.kind,
    sort: state.sort === DEFAULT_SORT ? '' : state.sort });

  async function load() {
    error.clear();
    grid.setAttribute('aria-busy', 'true');
    const storedMeanwhile = [];
    inFlight.add(storedMeanwhile);
    try {
      // The thumbnails' widths come from the server's limits: read with the files, not after.
      const [body, options] = await Promise.all([
        api('GET', '/files', { query: { ...query(), page: state.page, limit: PAGE_SIZE, include: 'placeholder' } }),
        resizeOptions()]);
      limits = options;
      if (body.files.length === 0 && state.page > 1 && body.total > 0) {
        state.page = Math.ceil(body.total / PAGE_SIZE);
        return load();
      }
      // An upload that finished while this page was on its way may be missing from it (the
      // server listed before storing it): the grid showed it already, so it stays.
      const listed = new Set(body.files.map((f) => f.file_id));
      const missed = state.page === 1
        ? storedMeanwhile.filter((f) => !listed.has(f.file_id) && joinsFirstPage(state, f)).reverse() : [];
      state.items = [...missed, ...body.files].slice(0, PAGE_SIZE);
      state.total = body.total + missed.length;
      renderGrid();
    } catch (e) {
      error.show(e.message);
    } finally {
      inFlight.delete(storedMeanwhile);
      grid.setAttribute('aria-busy', 'false');
    }
    return undefined;
  }

  function renderGrid() {
    const filtered = state.q || state.type || state.isPublic || state.kind;
    const shown = state.items.map((file) => cards.get(file.file_id) || card(file));
    cards.clear();
    state.items.forEach((file, i) => cards.set(file.file_id, shown[i]));
    grid.replaceChildren(...(shown.length ? shown
      : [h('li', { class: 'empty' }, filtered ? 'No file matches these filters.' : 'No files yet: drop some above.')]));
    totalText.textContent = state.total ? `${state.total.toLocaleString()} file${state.total === 1 ? '' : 's'}` : '';
    pagerSlot.replaceChildren(state.total > PAGE_SIZE ? pager({ page: state.page, limit: PAGE_SIZE, total: state.total },
      (p) => {
        state.page = p;
        load();
      }, 'Files pages') : '');
    const ids = new Set(state.items.map((f) => f.file_id));
    state.selected = new Set([...state.selected].filter((id) => ids.has(id)));
    selectAll.checked = state.items.length > 0 && state.items.every((f) => state.selected.has(f.file_id));
    updateBulk();
  }

  /** A file the queue just stored joins the grid at once, without asking the API again. */
  async function added(file) {
    inFlight.forEach((storedMeanwhile) => storedMeanwhile.push(file));
    limits = await resizeOptions(); // read already, unless the upload beat the first page
    if (state.page !== 1 || !joinsFirstPage(state, file)) return;
    state.total += 1;
    state.items = [file, ...state.items].slice(0, PAGE_SIZE);
    renderGrid();
  }

  const stopListening = uploadQueue.subscribe((event, row) => {
    if (!grid.isConnected) {
      stopListening();
      return;
    }
    if (event === 'done') added(row.result);
  });

  const removed = (file) => {
    state.selected.delete(file.file_id);
    cards.delete(file.file_id);
    load();
  };

  /**
   * A file renamed or made public or private (the card's menu, the lightbox): its card is made
   * anew from the File the server answered, the focus back on its menu button when it was in the
   * old card. Under a filter or an order it may no longer fit, the page is listed again.
   */
  const changed = (updated) => {
    const at = state.items.findIndex((f) => f.file_id === updated.file_id);
    if (at < 0) return;
    const old = cards.get(updated.file_id);
    const focusHere = old && (old.contains(document.activeElement) || document.activeElement === document.body);
    state.items[at] = { ...state.items[at], ...updated }; // a PATCH answers no placeholder: keep it
    cards.delete(updated.file_id);
    renderGrid();
    const now = cards.get(updated.file_id);
    if (focusHere && now) now.querySelector('.menu-button').focus();
    if (!state.q && !state.isPublic && !state.sort.endsWith('name')) return;
    load().then(() => { // gone from this listing: the focus goes to the top of the view, not nowhere
      if (focusHere && document.activeElement === document.body && title.isConnected) title.focus();
    });
  };

  // The lightbox goes on into the next and previous pages (the grid follows it).
  const turn = async (step) => {
    const page = state.page + step;
    if (page < 1 || (page - 1) * PAGE_SIZE >= state.total) return null;
    state.page = page;
    await load();
    return state.items;
  };
  const preview = (file) => openLightbox([...state.items], state.items.indexOf(file), {
    say, removed, changed, returnFocus: (shown) => {
      const li = cards.get(shown.file_id);
      return li && li.isConnected ? li.querySelector('.thumb-link') : null;
    },
    pages: { offset: () => (state.page - 1) * PAGE_SIZE, total: () => state.total, next: () => turn(1),
      prev: () => turn(-1) },
  });

  function card(file) {
    const name = displayName(file);
    const href = `#/file/${encodeURIComponent(file.file_id)}`;
    const box = h('input', { type: 'checkbox', class: 'pick', checked: state.selected.has(file.file_id),
      'aria-label': `Select ${name}` });
    box.addEventListener('change', () => {
      if (box.checked) state.selected.add(file.file_id); else state.selected.delete(file.file_id);
      updateBulk();
    });
    const open = h('a', { href, class: 'thumb-link', 'aria-label': `Preview ${name}` },
      thumbnail(file, objectUrls, limits));
    open.addEventListener('click', (event) => {
      if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
      event.preventDefault(); // a plain click previews; a middle click opens the file's page in a tab
      preview(file);
    });
    return h('li', { class: 'file', dataset: { fileId: file.file_id, kind: kindOf(file.content_type) } },
      h('div', { class: 'thumb-wrap' }, open, box,
        file.is_public ? null : h('span', { class: 'lock', title: 'Private' }, 'Private')),
      h('div', { class: 'file-meta' },
        h('div', { class: 'file-text' },
          h('a', { href, class: 'file-name', title: name }, name),
          h('span', { class: 'file-sub', title: formatDate(file.created_at) },
            `${formatBytes(file.size)} · ${relativeTime(file.created_at)}`)),
        menuButton(`Actions for ${name}`, fileMenuItems(file, { say, removed, changed }))));
  }

  selectAll.addEventListener('change', () => {
    grid.querySelectorAll('li.file').forEach((li) => {
      const id = li.dataset.fileId;
      const box = li.querySelector('input.pick');
      box.checked = selectAll.checked;
      if (selectAll.checked) state.selected.add(id); else state.selected.delete(id);
    });
    updateBulk();
  });

  bulkButton.addEventListener('click', async () => {
    const ids = [...state.selected];
    if (!ids.length || !await confirmAction(`Delete ${ids.length} file${ids.length > 1 ? 's' : ''}? This cannot be undone.`,
      'Delete')) return;
    try {
      const body = await api('POST', '/files/bulk-delete', { json: { ids } });
      state.selected.clear();
      say(`Deleted ${body.deleted} file${body.deleted === 1 ? '' : 's'}.`
        + (body.errors.length ? ` ${body.errors.length} could not be deleted.` : ''));
      await load();
    } catch (e) {
      say(e.message, 'error');
    }
  });

  // Filters and order: kind, sort, type and visibility apply as soon as they change; search on
  // Enter (or the Search button).
  const search = field('Search', { type: 'search', value: state.q, placeholder: 'Name or file id' });
  const kinds = h('fieldset', { class: 'chips' }, h('legend', { class: 'visually-hidden' }, 'Kind'),
    ...KIND_CHOICES.map(([value, label]) => h('label', { class: 'chip' },
      h('input', { type: 'radio', name: 'kind', value, checked: state.kind === value }), h('span', {}, label))));
  const typeSelect = select('Type', [['', 'Any type']]);
  allowedTypes().then((types) => {
    typeSelect.input.append(...types.map((t) => h('option', { value: t }, t)));
    typeSelect.input.value = state.type;
  });
  const visibility = select('Visibility', [['', 'Public and private'], ['true', 'Public'], ['false', 'Private']]);
  visibility.input.value = state.isPublic;
  const sortSelect = select('Sort by', SORTS);
  sortSelect.input.value = state.sort;
  const apply = () => {
    const kind = kinds.querySelector('input:checked');
    Object.assign(state, { q: search.input.value.trim(), kind: kind ? kind.value : '', type: typeSelect.input.value,
      isPublic: visibility.input.value, sort: sortSelect.input.value, page: 1 });
    load();
  };
  kinds.addEventListener('change', apply);
  for (const input of [sortSelect.input, typeSelect.input, visibility.input]) input.addEventListener('change', apply);
  const filters = h('form', { class: 'filters', role: 'search' },
    h('div', { class: 'search-row' }, search.wrap, h('button', { type: 'submit' }, 'Search')),
    sortSelect.wrap, typeSelect.wrap, visibility.wrap,
    h('button', { type: 'button', class: 'link-button', onclick: () => {
      Object.assign(state, { q: '', type: '', kind: '', isPublic: '', sort: DEFAULT_SORT, page: 1 });
      rerender();
    } }, 'Clear filters'));
  filters.addEventListener('submit', (event) => {
    event.preventDefault();
    apply();
  });

  load();
  return [
    h('div', { class: 'page-head' }, title, totalText),
    uploadPanel(uploadQueue, uploadPrefs),
    h('section', { class: 'toolbar', 'aria-label': 'Filters' }, kinds, filters),
    h('div', { class: 'bulk' }, h('label', { for: 'select-all', class: 'inline' }, selectAll, ' Select all on this page'),
      countText, bulkButton),
    error.el,
    grid,
    pagerSlot,
  ];
}
