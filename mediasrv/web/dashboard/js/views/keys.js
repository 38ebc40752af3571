// API keys: create (the key is shown once, with a copy button and its uploader configurations),
// list, revoke; and a key made for ShareX or Flameshot with its configuration in one step.
import { api } from '../api.js';
import { busy, confirmAction, copyText, errorBox, field, formatDate, h, pager, statusFor } from '../dom.js';
import { configurationButtons, uploadersCard } from '../uploaders.js';

export function keysView() {
  const announce = statusFor();
  const state = { page: 1 };
  const error = errorBox();
  const name = field('Key name', { type: 'text', maxlength: '100', placeholder: 'e.g. CI uploads' });
  const created = h('div', { class: 'created-key', hidden: true });
  const tbody = h('tbody');
  const pagerSlot = h('div');
  const table = h('table', { class: 'table responsive' },
    h('caption', { class: 'visually-hidden' }, 'Your API keys'),
    h('thead', {}, h('tr', {}, ...['Name', 'Key', 'Created', 'Last used', 'Actions'].map((t) => h('th', { scope: 'col' }, t)))),
    tbody);

  async function load() {
    try {
      const body = await api('GET', '/auth/api-keys', { query: { page: state.page, limit: 30 } });
      tbody.replaceChildren(...(body.api_keys.length ? body.api_keys.map(row)
        : [h('tr', {}, h('td', { colspan: '5', class: 'empty' }, 'No API keys yet.'))]));
      pagerSlot.replaceChildren(pager(body, (p) => { state.page = p; load(); }, 'API key pages'));
    } catch (e) {
      error.show(e.message);
    }
  }

  function row(key) {
    const label = key.name || key.key_prefix;
    const cell = (label, content) => h('td', { dataset: { label } }, content); // a card line on a phone
    return h('tr', {},
      cell('Name', key.name || h('span', { class: 'muted' }, '(no name)')),
      cell('Key', h('code', {}, `${key.key_prefix}…`)),
      cell('Created', formatDate(key.created_at)),
      cell('Last used', key.last_used_at ? formatDate(key.last_used_at) : 'Never'),
      cell('Actions', h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke API key ${label}`,
        onclick: async () => {
          if (!await confirmAction(`Revoke the API key ${label}? Scripts using it stop working at once.`,
            'Revoke')) return;
          try {
            await api('DELETE', `/auth/api-keys/${encodeURIComponent(key.id)}`);
            announce(`Revoked the API key ${label}.`);
            load();
          } catch (e) {
            announce(e.message, 'error');
          }
        } }, 'Revoke')));
  }

  function showCreated(key) {
    const secret = field('New API key', { type: 'text', readonly: true, value: key.key, class: 'mono',
      'aria-describedby': 'key-once' });
    const copyButton = h('button', { type: 'button', class: 'primary', onclick: async () => {
      const ok = await copyText(key.key);
      if (!ok) secret.input.select();
      announce(ok ? 'Copied the API key.' : 'Copying failed: the key is selected, press Ctrl+C.', ok ? 'info' : 'error');
    } }, 'Copy API key');
    created.replaceChildren(
      h('h2', {}, `API key ${key.name ? `“${key.name}” ` : ''}created`),
      h('p', { id: 'key-once', class: 'warning' }, 'Copy it now: this is the only time the full key is shown.'),
      secret.wrap,
      h('p', { class: 'muted' }, 'Use it in an uploader: its configuration holds this key.'),
      configurationButtons(key.key),
      h('div', { class: 'row' }, copyButton, h('button', { type: 'button', onclick: () => {
        created.hidden = true;
        created.replaceChildren();
      } }, 'Done, hide the key')));
    created.hidden = false;
    secret.input.focus();
    secret.input.select();
  }

  const form = h('form', { class: 'row-form' }, name.wrap, h('button', { type: 'submit', class: 'primary' },
    'Create API key'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.clear();
    try {
      const value = name.input.value.trim();
      const key = await busy(form, () => api('POST', '/auth/api-keys', { json: value ? { name: value } : {} }));
      name.input.value = '';
      showCreated(key);
      load();
    } catch (e) {
      error.show(e.message);
    }
  });

  load();
  return [
    h('h1', {}, 'API keys'),
    h('p', { class: 'muted' }, 'Keys let scripts upload and manage files without your password. Send one as ',
      h('code', {}, 'Authorization: Bearer <key>'), ' or ', h('code', {}, 'X-Api-Key: <key>'), '.'),
    h('section', { class: 'card' }, form, error.el, created),
    table,
    pagerSlot,
    uploadersCard({ announce, created: load }),
  ];
}
