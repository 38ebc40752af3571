// Files: drag-and-drop upload with per-file progress, search and filters, a thumbnail grid,
// copy URLs, delete and bulk delete.
import { api, fetchBlob, upload } from '../api.js';
import {
  announce, confirmAction, copyText, errorBox, field, formatBytes, formatDate, h, pager, select,
} from '../dom.js';

const PAGE_SIZE = 24;
const THUMB_WIDTH = 320;
const RESIZABLE = new Set(['image/jpeg', 'image/png', 'image/gif', 'image/webp', 'image/avif', 'image/tiff',
  'image/heic', 'image/heif', 'image/bmp']);
const PARALLEL_UPLOADS = 3;

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
  const placeholder = () => h('div', { class: 'thumb placeholder', 'aria-hidden': 'true' }, badge.toUpperCase());
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

/** Forget the filters and selection (at logout: the next user starts clean). */
export function resetFilesState() {
  filesView.state = null;
}

export function filesView({ rerender }) {
  objectUrls.forEach((url) => URL.revokeObjectURL(url));
  objectUrls = [];
  const state = filesView.state || (filesView.state = { page: 1, q: '', type: '', isPublic: '', selected: new Set() });
  const error = errorBox();
  const grid = h('ul', { class: 'grid', 'aria-label': 'Your files', 'aria-busy': 'true' });
  const pagerSlot = h('div');
  const bulkButton = h('button', { type: 'button', class: 'danger', disabled: true }, 'Delete selected');
  const selectAll = h('input', { type: 'checkbox', id: 'select-all' });
  const countText = h('span', { class: 'muted' });

  const updateBulk = () => {
    bulkButton.disabled = state.selected.size === 0;
    bulkButton.textContent = state.selected.size ? `Delete selected (${state.selected.size})` : 'Delete selected';
    countText.textContent = state.selected.size ? `${state.selected.size} selected` : '';
  };

  async function load() {
    error.clear();
    grid.setAttribute('aria-busy', 'true');
    try {
      const body = await api('GET', '/files', {
        query: { page: state.page, limit: PAGE_SIZE, q: state.q, type: state.type, isPublic: state.isPublic },
      });
      if (body.files.length === 0 && state.page > 1 && body.total > 0) {
        state.page = Math.ceil(body.total / PAGE_SIZE);
        return load();
      }
      grid.replaceChildren(...(body.files.length ? body.files.map(card)
        : [h('li', { class: 'empty' }, state.q || state.type || state.isPublic
          ? 'No file matches these filters.' : 'No files yet: drop some above.')]));
      pagerSlot.replaceChildren(pager(body, (p) => { state.page = p; load(); }, 'Files pages'));
      const ids = new Set(body.files.map((f) => f.file_id));
      state.selected = new Set([...state.selected].filter((id) => ids.has(id)));
      selectAll.checked = body.files.length > 0 && body.files.every((f) => state.selected.has(f.file_id));
      updateBulk();
    } catch (e) {
      error.show(e.message);
    } finally {
      grid.setAttribute('aria-busy', 'false');
    }
  }

  async function copySigned(file, which) {
    try {
      const body = await api('POST', `/files/${encodeURIComponent(file.file_id)}/signed-url`, { json: {} });
      await copy(which === 'download' ? body.download_url : body.url,
        `signed ${which === 'download' ? 'download ' : ''}URL`, file);
    } catch (e) {
      announce(e.message, 'error');
    }
  }

  async function copy(url, what, file) {
    const ok = await copyText(url);
    announce(ok ? `Copied the ${what} of ${file.name || file.file_id}: ${url}`
      : `Copying failed; the ${what} is ${url}`, ok ? 'info' : 'error');
  }

  async function remove(file) {
    const name = file.name || file.file_id;
    if (!await confirmAction(`Delete ${name}? This cannot be undone.`, 'Delete')) return;
    try {
      await api('DELETE', `/files/${encodeURIComponent(file.file_id)}`);
      state.selected.delete(file.file_id);
      announce(`Deleted ${name}.`);
      await load();
    } catch (e) {
      announce(e.message, 'error');
    }
  }

  function card(file) {
    const name = file.name || file.file_id;
    const nameId = `name-${file.file_id}`;
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
      h('div', { class: 'thumb-wrap' }, thumbnail(file), h('label', { class: 'pick' }, box)),
      h('div', { class: 'file-meta' },
        h('strong', { id: nameId, class: 'file-name', title: name }, name),
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
      announce(`Deleted ${body.deleted} file${body.deleted === 1 ? '' : 's'}.`
        + (body.errors.length ? ` ${body.errors.length} could not be deleted.` : ''));
      await load();
    } catch (e) {
      announce(e.message, 'error');
    }
  });

  // Filters
  const search = field('Search', { type: 'search', value: state.q, placeholder: 'Name or file id' });
  const typeSelect = select('Type', [['', 'Any type']]);
  contentTypes().then((types) => {
    typeSelect.input.append(...types.map((t) => h('option', { value: t }, t)));
    typeSelect.input.value = state.type;
  });
  const visibility = select('Visibility', [['', 'Public and private'], ['true', 'Public'], ['false', 'Private']]);
  visibility.input.value = state.isPublic;
  const filters = h('form', { class: 'filters', role: 'search' }, search.wrap, typeSelect.wrap, visibility.wrap,
    h('button', { type: 'submit' }, 'Apply filters'),
    h('button', { type: 'button', onclick: () => {
      Object.assign(state, { q: '', type: '', isPublic: '', page: 1 });
      rerender();
    } }, 'Clear filters'));
  filters.addEventListener('submit', (event) => {
    event.preventDefault();
    Object.assign(state, { q: search.input.value.trim(), type: typeSelect.input.value,
      isPublic: visibility.input.value, page: 1 });
    load();
  });

  load();
  return [
    h('h1', {}, 'Files'),
    uploader(() => { state.page = 1; load(); }),
    filters,
    h('div', { class: 'bulk' }, h('label', { for: 'select-all', class: 'inline' }, selectAll, ' Select all on this page'),
      countText, bulkButton),
    error.el,
    grid,
    pagerSlot,
  ];
}

function uploader(onUploaded) {
  const input = h('input', { type: 'file', multiple: true, id: 'upload-input', class: 'visually-hidden-file' });
  const isPublic = h('input', { type: 'checkbox', id: 'upload-public', checked: true });
  const list = h('ul', { class: 'uploads', 'aria-label': 'Uploads' });
  const zone = h('div', { class: 'dropzone' },
    h('p', {}, 'Drag and drop files here, or '),
    h('label', { for: 'upload-input', class: 'button-like' }, 'Choose files to upload'), input,
    h('label', { for: 'upload-public', class: 'inline' }, isPublic, ' Upload as public'));

  async function start(files) {
    const jobs = [...files].map((file) => {
      const progress = h('progress', { max: '100', value: '0', 'aria-label': `Upload progress of ${file.name}` });
      const note = h('span', { class: 'muted' }, 'Waiting');
      const row = h('li', {}, h('span', { class: 'file-name' }, file.name), progress, note);
      list.prepend(row);
      return { file, progress, note, row };
    });
    let failed = 0;
    const queue = [...jobs];
    const worker = async () => {
      for (let job = queue.shift(); job; job = queue.shift()) {
        job.note.textContent = 'Uploading';
        try {
          await upload(job.file, {
            isPublic: isPublic.checked,
            onProgress: (loaded, total) => {
              job.progress.value = total ? Math.round((loaded / total) * 100) : 100;
            },
          });
          job.progress.value = 100;
          job.note.textContent = 'Done';
          job.row.dataset.state = 'done';
        } catch (e) {
          failed += 1;
          job.note.textContent = `Failed: ${e.message}`;
          job.row.dataset.state = 'failed';
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(PARALLEL_UPLOADS, jobs.length) }, worker));
    announce(`Uploaded ${jobs.length - failed} of ${jobs.length} file${jobs.length === 1 ? '' : 's'}.`,
      failed ? 'error' : 'info');
    onUploaded();
  }

  input.addEventListener('change', () => {
    if (input.files.length) start(input.files).finally(() => { input.value = ''; });
  });
  for (const name of ['dragenter', 'dragover']) {
    zone.addEventListener(name, (event) => {
      event.preventDefault();
      zone.classList.add('over');
    });
  }
  for (const name of ['dragleave', 'drop']) {
    zone.addEventListener(name, () => zone.classList.remove('over'));
  }
  zone.addEventListener('drop', (event) => {
    event.preventDefault();
    if (event.dataTransfer && event.dataTransfer.files.length) start(event.dataTransfer.files);
  });
  return h('section', { class: 'card', 'aria-labelledby': 'upload-title' },
    h('h2', { id: 'upload-title' }, 'Upload'), zone, list);
}
