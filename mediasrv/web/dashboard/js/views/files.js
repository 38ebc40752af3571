// Files: the upload queue, search and filters (kind, type, visibility), sort, a thumbnail grid
// whose cards open the file view, copy URLs, delete and bulk delete.
import { api, fetchBlob } from '../api.js';
import {
  confirmAction, copyText, errorBox, field, formatBytes, formatDate, h, pager, select, statusFor,
} from '../dom.js';
import { KINDS, RESIZABLE, kindOf } from '../kinds.js';
import { UploadQueue } from '../uploadqueue.js';
import { uploadPanel } from './uploadpanel.js';

const PAGE_SIZE = 24;
const THUMB_WIDTH = 320;
const CATALOGUE_PAGE = 100; // the API's largest page
const CATALOGUE_CAP = 1000; // sorting or a kind filter reads at most this many files (10 requests)
const SORTS = [['newest', 'Newest first'], ['oldest', 'Oldest first'], ['name', 'Name, A to Z'],
  ['name-desc', 'Name, Z to A'], ['largest', 'Largest first'], ['smallest', 'Smallest first']];
const byName = (f) => (f.name || f.file_id);
const COMPARE = {
  newest: (a, b) => b.created_at.localeCompare(a.created_at) || b.file_id.localeCompare(a.file_id),
  oldest: (a, b) => a.created_at.localeCompare(b.created_at) || a.file_id.localeCompare(b.file_id),
  name: (a, b) => byName(a).localeCompare(byName(b), undefined, { numeric: true, sensitivity: 'base' }),
  'name-desc': (a, b) => byName(b).localeCompare(byName(a), undefined, { numeric: true, sensitivity: 'base' }),
  largest: (a, b) => b.size - a.size || COMPARE.newest(a, b),
  smallest: (a, b) => a.size - b.size || COMPARE.newest(a, b),
};

/** The uploads of this tab: they go on while another view is shown. */
export const uploadQueue = new UploadQueue();
const uploadPrefs = { isPublic: true };
let allowedTypes = null; // fetched once per page load
let objectUrls = []; // blob: URLs of private thumbnails, revoked on every re-render

async function contentTypes() {
  if (!allowedTypes) {
    const r = await fetch('/reference/allowed-content-types', { credentials: 'omit' });
    allowedTypes = r.ok ? (await r.json()).content_types : [];
  }
  return allowedTypes;
}

function thumbnail(file) {
  const name = file.name || file.file_id;
  const type = file.content_type || '';
  const extension = /\.([A-Za-z0-9]{1,8})$/.exec(name);
  const badge = extension ? extension[1] : (type.split('/')[1] || 'file').split('+')[0].slice(0, 8);
  const placeholder = () => h('div', { class: 'thumb placeholder', role: 'img', 'aria-label': name },
    badge.toUpperCase());
  if (!type.startsWith('image/')) return placeholder();
  const src = RESIZABLE.has(type) ? `/m/${encodeURIComponent(file.file_id)}?width=${THUMB_WIDTH}`
    : `/m/${encodeURIComponent(file.file_id)}`;
  const img = h('img', { class: 'thumb', alt: name, decoding: 'async', width: '320', height: '240' });
  img.addEventListener('error', () => img.replaceWith(placeholder()), { once: true });
  if (file.is_public) {
    img.src = src;
  } else {
    // A private file needs the session token, which never goes in a URL: fetch it, show a blob.
    fetchBlob(src).then((blob) => {
      const url = URL.createObjectURL(blob);
      objectUrls.push(url);
      img.src = url;
    }).catch(() => img.replaceWith(placeholder()));
  }
  return img;
}

/** Forget the filters, the selection and the uploads (at logout: the next user starts clean). */
export function resetFilesState() {
  filesView.state = null;
  uploadQueue.clear();
  uploadPrefs.isPublic = true;
}

function freshState() {
  return { page: 1, q: '', type: '', kind: '', sort: 'newest', isPublic: '', selected: new Set(),
    items: [], total: 0, catalogue: null };
}

/** Whether a file passes the filters the API applies (q, type, visibility), checked here. */
function matchesServerFilters(state, file) {
  const q = state.q.toLowerCase();
  return (!q || byName(file).toLowerCase().includes(q) || file.file_id.toLowerCase().includes(q))
    && (!state.type || file.content_type === state.type)
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
  const capNote = h('p', { class: 'muted', hidden: true });
  const bulkButton = h('button', { type: 'button', class: 'danger', disabled: true }, 'Delete selected');
  const selectAll = h('input', { type: 'checkbox', id: 'select-all' });
  const countText = h('span', { class: 'muted' });
  const cards = new Map(); // file_id -> card, reused across re-renders so thumbnails stay loaded

  const updateBulk = () => {
    bulkButton.disabled = state.selected.size === 0;
    bulkButton.textContent = state.selected.size ? `Delete selected (${state.selected.size})` : 'Delete selected';
    countText.textContent = state.selected.size ? `${state.selected.size} selected` : '';
  };

  // The API lists newest first, a page at a time. Another order or a kind filter needs every
  // matching file: read once (up to CATALOGUE_CAP) and kept until the filters change.
  const catalogueMode = () => state.sort !== 'newest' || state.kind !== '';
  const serverQuery = () => ({ q: state.q, type: state.type, isPublic: state.isPublic });

  async function fetchCatalogue() {
    const files = [];
    let total = 0;
    for (let page = 1; files.length < CATALOGUE_CAP; page += 1) {
      const body = await api('GET', '/files', { query: { ...serverQuery(), page, limit: CATALOGUE_PAGE } });
      files.push(...body.files);
      total = body.total;
      if (body.files.length < CATALOGUE_PAGE || files.length >= total) break;
    }
    return { key: JSON.stringify(serverQuery()), files, total };
  }

  function arrange() {
    const list = state.catalogue.files.filter((f) => !state.kind || kindOf(f.content_type) === state.kind)
      .sort(COMPARE[state.sort]);
    const pages = Math.max(1, Math.ceil(list.length / PAGE_SIZE));
    state.page = Math.min(state.page, pages);
    state.items = list.slice((state.page - 1) * PAGE_SIZE, state.page * PAGE_SIZE);
    state.total = list.length;
    const truncated = state.catalogue.total > state.catalogue.files.length;
    capNote.hidden = !truncated;
    capNote.textContent = truncated ? `Sorted and filtered among your ${state.catalogue.files.length} newest `
      + `matching files (of ${state.catalogue.total}).` : '';
  }

  async function load({ refetch = true } = {}) {
    error.clear();
    grid.setAttribute('aria-busy', 'true');
    try {
      if (catalogueMode()) {
        if (refetch || !state.catalogue || state.catalogue.key !== JSON.stringify(serverQuery())) {
          state.catalogue = await fetchCatalogue();
        }
        arrange();
      } else {
        state.catalogue = null;
        capNote.hidden = true;
        const body = await api('GET', '/files', { query: { ...serverQuery(), page: state.page, limit: PAGE_SIZE } });
        if (body.files.length === 0 && state.page > 1 && body.total > 0) {
          state.page = Math.ceil(body.total / PAGE_SIZE);
          return load();
        }
        state.items = body.files;
        state.total = body.total;
      }
      renderGrid();
    } catch (e) {
      error.show(e.message);
    } finally {
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
    pagerSlot.replaceChildren(pager({ page: state.page, limit: PAGE_SIZE, total: state.total }, (p) => {
      state.page = p;
      load({ refetch: false });
    }, 'Files pages'));
    const ids = new Set(state.items.map((f) => f.file_id));
    state.selected = new Set([...state.selected].filter((id) => ids.has(id)));
    selectAll.checked = state.items.length > 0 && state.items.every((f) => state.selected.has(f.file_id));
    updateBulk();
  }

  /** A file the queue just stored joins the grid at once, without asking the API again. */
  function added(file) {
    if (!matchesServerFilters(state, file)) return;
    if (state.catalogue) {
      state.catalogue.files.push(file);
      state.catalogue.total += 1;
      arrange();
    } else {
      state.total += 1;
      if (state.page === 1) state.items = [file, ...state.items].slice(0, PAGE_SIZE);
    }
    renderGrid();
  }

  const stopListening = uploadQueue.subscribe((event, row) => {
    if (!grid.isConnected) {
      stopListening();
      return;
    }
    if (event === 'done') added(row.result);
  });

  async function copySigned(file, which) {
    try {
      const body = await api('POST', `/files/${encodeURIComponent(file.file_id)}/signed-url`, { json: {} });
      await copy(which === 'download' ? body.download_url : body.url,
        `signed ${which === 'download' ? 'download ' : ''}URL`, file);
    } catch (e) {
      say(e.message, 'error');
    }
  }

  async function copy(url, what, file) {
    const ok = await copyText(url);
    say(ok ? `Copied the ${what} of ${file.name || file.file_id}: ${url}`
      : `Copying failed; the ${what} is ${url}`, ok ? 'info' : 'error');
  }

  async function remove(file) {
    const name = file.name || file.file_id;
    if (!await confirmAction(`Delete ${name}? This cannot be undone.`, 'Delete')) return;
    try {
      await api('DELETE', `/files/${encodeURIComponent(file.file_id)}`);
      state.selected.delete(file.file_id);
      say(`Deleted ${name}.`);
      await load();
    } catch (e) {
      say(e.message, 'error');
    }
  }

  function card(file) {
    const name = file.name || file.file_id;
    const nameId = `name-${file.file_id}`;
    const href = `#/file/${encodeURIComponent(file.file_id)}`;
    const box = h('input', { type: 'checkbox', checked: state.selected.has(file.file_id),
      'aria-label': `Select ${name}` });
    box.addEventListener('change', () => {
      if (box.checked) state.selected.add(file.file_id); else state.selected.delete(file.file_id);
      updateBulk();
    });
    const button = (label, onclick) => h('button', { type: 'button', onclick, 'aria-describedby': nameId }, label);
    const actions = file.is_public
      ? [button('Copy public URL', () => copy(file.public_url, 'public URL', file)),
        button('Copy download URL', () => copy(file.public_download_url, 'download URL', file)),
        button('Copy signed URL', () => copySigned(file, 'view'))]
      : [button('Copy signed URL', () => copySigned(file, 'view')),
        button('Copy signed download URL', () => copySigned(file, 'download'))];
    const del = h('button', { type: 'button', class: 'danger', onclick: () => remove(file), 'aria-describedby': nameId },
      'Delete');
    return h('li', { class: 'file', dataset: { fileId: file.file_id } },
      // The thumbnail opens the file too; keyboard users reach it through the name (one tab stop).
      h('div', { class: 'thumb-wrap' }, h('a', { href, class: 'thumb-link', tabindex: '-1', 'aria-label': `Open ${name}` },
        thumbnail(file)),
        h('label', { class: 'pick' }, box)),
      h('div', { class: 'file-meta' },
        h('a', { id: nameId, href, class: 'file-name', title: name }, name),
        h('span', { class: 'muted' }, `${formatBytes(file.size)} · ${formatDate(file.created_at)}`),
        h('span', { class: file.is_public ? 'badge' : 'badge private' }, file.is_public ? 'Public' : 'Private')),
      h('div', { class: 'actions' }, ...actions, del));
  }

  selectAll.addEventListener('change', () => {
    grid.querySelectorAll('li.file').forEach((li) => {
      const id = li.dataset.fileId;
      const box = li.querySelector('input[type=checkbox]');
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

  // Filters and order. Kind and sort apply as soon as they change; search on submit.
  const search = field('Search', { type: 'search', value: state.q, placeholder: 'Name or file id' });
  const kindSelect = select('Kind', KINDS);
  kindSelect.input.value = state.kind;
  const typeSelect = select('Type', [['', 'Any type']]);
  contentTypes().then((types) => {
    typeSelect.input.append(...types.map((t) => h('option', { value: t }, t)));
    typeSelect.input.value = state.type;
  });
  const visibility = select('Visibility', [['', 'Public and private'], ['true', 'Public'], ['false', 'Private']]);
  visibility.input.value = state.isPublic;
  const sortSelect = select('Sort by', SORTS);
  sortSelect.input.value = state.sort;
  const apply = () => {
    Object.assign(state, { q: search.input.value.trim(), kind: kindSelect.input.value, type: typeSelect.input.value,
      isPublic: visibility.input.value, sort: sortSelect.input.value, page: 1 });
    load({ refetch: false });
  };
  kindSelect.input.addEventListener('change', apply);
  sortSelect.input.addEventListener('change', apply);
  const filters = h('form', { class: 'filters', role: 'search' }, search.wrap, kindSelect.wrap, typeSelect.wrap,
    visibility.wrap, sortSelect.wrap,
    h('button', { type: 'submit' }, 'Apply filters'),
    h('button', { type: 'button', onclick: () => {
      Object.assign(state, { q: '', type: '', kind: '', isPublic: '', sort: 'newest', page: 1, catalogue: null });
      rerender();
    } }, 'Clear filters'));
  filters.addEventListener('submit', (event) => {
    event.preventDefault();
    apply();
  });

  load();
  return [
    h('h1', {}, 'Files'),
    uploadPanel(uploadQueue, uploadPrefs),
    filters,
    h('div', { class: 'bulk' }, h('label', { for: 'select-all', class: 'inline' }, selectAll, ' Select all on this page'),
      countText, bulkButton),
    error.el,
    capNote,
    grid,
    pagerSlot,
  ];
}
