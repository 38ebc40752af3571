// The Upload card of the Files view: the drop zone and one row per file of the queue, with its
// size, progress, speed and time left, its wait ("waiting 41 s: rate limit"), and Cancel, Retry
// and Remove. The queue outlives the view (uploads go on while you look at another page); this
// card draws it whenever the Files view is shown.
import { formatBytes, formatDuration, h } from '../dom.js';
import { allowedTypes, failureText } from '../uploadmessages.js';

function rowNote(queue, row) {
  switch (row.state) {
    case 'queued':
      return 'Queued';
    case 'uploading': {
      if (!row.speed) return 'Uploading';
      const left = (row.file.size - row.loaded) / row.speed;
      return `Uploading · ${formatBytes(row.speed)}/s · ${formatDuration(left)} left`;
    }
    case 'waiting': {
      const { seconds, reason } = queue.waitOf(row);
      return `waiting ${seconds} s: ${reason}`;
    }
    case 'done': {
      const seconds = (row.finishedAt - row.startedAt) / 1000;
      return seconds >= 1 ? `Done in ${formatDuration(seconds)}` : 'Done';
    }
    case 'failed':
      return failureText(row);
    default:
      return 'Cancelled';
  }
}

function rowSize(row) {
  if (row.state === 'uploading' && row.loaded < row.file.size) {
    return `${formatBytes(row.loaded)} of ${formatBytes(row.file.size)}`;
  }
  return formatBytes(row.file.size);
}

function rowView(queue, row) {
  const name = row.file.name;
  const progress = h('progress', { max: '100', value: '0', 'aria-label': `Upload progress of ${name}` });
  const size = h('span', { class: 'muted upload-size' });
  const note = h('span', { class: 'upload-note' });
  const cancel = h('button', { type: 'button', 'aria-label': `Cancel upload of ${name}`,
    onclick: () => queue.cancel(row) }, 'Cancel');
  const retry = h('button', { type: 'button', 'aria-label': `Retry upload of ${name}`,
    onclick: () => queue.retry(row) }, 'Retry');
  const remove = h('button', { type: 'button', 'aria-label': `Remove ${name} from the uploads`,
    onclick: () => queue.remove(row) }, 'Remove');
  const li = h('li', { dataset: { state: row.state } },
    h('span', { class: 'file-name upload-name', title: name }, name), size, note, progress,
    h('span', { class: 'upload-actions' }, cancel, retry, remove));
  return {
    li,
    update() {
      li.dataset.state = row.state;
      const percent = row.state === 'done' ? 100
        : Math.round((row.file.size ? row.loaded / row.file.size : 0) * 100);
      progress.value = percent;
      size.textContent = rowSize(row);
      note.textContent = rowNote(queue, row);
      const finished = row.state === 'failed' || row.state === 'cancelled';
      cancel.hidden = !['queued', 'uploading', 'waiting'].includes(row.state);
      retry.hidden = !finished;
      remove.hidden = !finished;
    },
  };
}

function summaryText(queue) {
  const c = queue.counts();
  if (!c.total) return '';
  const parts = [`${c.done} of ${c.total} uploaded`];
  if (c.uploading) parts.push(`${c.uploading} uploading`);
  if (c.queued) parts.push(`${c.queued} queued`);
  if (c.waiting) parts.push(`${c.waiting} waiting`);
  if (c.failed) parts.push(`${c.failed} failed`);
  if (c.cancelled) parts.push(`${c.cancelled} cancelled`);
  return parts.join(' · ');
}

/** The Upload card; `isPublic` is {checked} kept by the caller across renders. */
export function uploadPanel(queue, prefs) {
  const input = h('input', { type: 'file', multiple: true, id: 'upload-input', class: 'visually-hidden-file' });
  const isPublic = h('input', { type: 'checkbox', id: 'upload-public', checked: prefs.isPublic,
    onchange: () => { prefs.isPublic = isPublic.checked; } });
  const list = h('ul', { class: 'uploads', 'aria-label': 'Uploads' });
  // Counts change a few times per file: a polite live region. The countdown ticks every
  // second, so it lives outside it (a screen reader hears the pause once, not 60 times).
  const summary = h('p', { class: 'upload-summary', role: 'status' });
  const pause = h('p', { class: 'upload-pause warning', hidden: true });
  const retryFailed = h('button', { type: 'button', onclick: () => queue.retryFailed() }, 'Retry failed');
  const clearDone = h('button', { type: 'button', onclick: () => queue.clearFinished() }, 'Clear finished');
  const tools = h('div', { class: 'row upload-tools' }, summary, retryFailed, clearDone);
  const zone = h('div', { class: 'dropzone' },
    h('p', {}, 'Drag and drop files here, or '),
    h('label', { for: 'upload-input', class: 'button-like' }, 'Choose files to upload'), input,
    h('label', { for: 'upload-public', class: 'inline' }, isPublic, ' Upload as public'));
  const section = h('section', { class: 'card upload-card', 'aria-labelledby': 'upload-title' },
    h('h2', { id: 'upload-title' }, 'Upload'), zone, tools, pause, list);

  const views = new Map();
  const addRow = (row) => {
    const view = rowView(queue, row);
    views.set(row.id, view);
    view.update();
    list.append(view.li);
  };
  const refresh = () => {
    for (const view of views.values()) view.update();
    const c = queue.counts();
    const text = summaryText(queue);
    if (summary.textContent !== text) summary.textContent = text;
    retryFailed.hidden = !c.failed;
    clearDone.hidden = !c.done;
    tools.hidden = !c.total;
    const now = Date.now();
    pause.hidden = !(queue.pausedUntil > now && queue.pending());
    if (!pause.hidden) {
      const seconds = Math.ceil((queue.pausedUntil - now) / 1000);
      pause.textContent = `Paused by the server (${queue.pauseReason}): resuming by itself in ${seconds} s.`;
    }
  };
  queue.rows.forEach(addRow);
  refresh();
  allowedTypes().then(() => { if (section.isConnected) refresh(); }); // a refused type's row names the list

  const unsubscribe = queue.subscribe((event, row) => {
    // Events come later than the synchronous render that inserts this card, so a card not in
    // the page is one a newer view replaced: that view draws the queue now.
    if (!section.isConnected) {
      unsubscribe();
      return;
    }
    if (event === 'added') addRow(row);
    else if (event === 'removed') {
      const view = views.get(row.id);
      if (view) view.li.remove();
      views.delete(row.id);
    } else if (event === 'progress') {
      const view = views.get(row.id);
      if (view) view.update();
      return;
    }
    refresh();
  });

  const start = (files) => {
    if (files.length) queue.add([...files], { isPublic: isPublic.checked });
  };
  input.addEventListener('change', () => {
    start(input.files);
    input.value = '';
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
    if (event.dataTransfer) start(event.dataTransfer.files);
  });
  return section;
}
