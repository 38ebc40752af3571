// Webhooks: add an endpoint (its signing secret is shown once, with a copy button), send it a
// test event, enable or disable it, rotate its secret, delete it, and read its recent deliveries.
import { api } from '../api.js';
import { busy, confirmAction, copyText, errorBox, field, formatDate, h, pager, statusFor } from '../dom.js';

const EVENTS = [
  ['file.created', 'File uploaded'],
  ['file.updated', 'File changed'],
  ['file.deleted', 'File deleted'],
];

function eventChecks() {
  const boxes = EVENTS.map(([value, label]) => {
    const input = h('input', { type: 'checkbox', value, checked: true });
    return { input, wrap: h('label', { class: 'check' }, input, ` ${label} `, h('code', {}, value)) };
  });
  const wrap = h('fieldset', { class: 'field events' }, h('legend', {}, 'Events'), ...boxes.map((b) => b.wrap));
  return { wrap, values: () => boxes.filter((b) => b.input.checked).map((b) => b.input.value) };
}

function stateText(hook) {
  if (hook.enabled) return hook.failing_since ? `Enabled, failing since ${formatDate(hook.failing_since)}` : 'Enabled';
  return hook.disabled_reason === 'failing' ? 'Disabled: every delivery failed for 3 days' : 'Disabled';
}

export function webhooksView() {
  const announce = statusFor();
  const error = errorBox();
  const url = field('Endpoint URL', { type: 'url', required: true, maxlength: '2048',
    placeholder: 'https://example.com/webhooks/mediasrv' });
  const description = field('Description', { type: 'text', maxlength: '500', placeholder: 'e.g. search index' });
  const events = eventChecks();
  const created = h('div', { class: 'created-key', hidden: true });
  const tbody = h('tbody');
  const limitNote = h('p', { class: 'muted' });
  const details = h('section', { class: 'card', hidden: true, 'aria-live': 'polite' });
  const table = h('table', { class: 'table responsive' },
    h('caption', { class: 'visually-hidden' }, 'Your webhook endpoints'),
    h('thead', {}, h('tr', {}, ...['Endpoint', 'Events', 'State', 'Created', 'Actions']
      .map((t) => h('th', { scope: 'col' }, t)))),
    tbody);

  async function load() {
    try {
      const body = await api('GET', '/webhooks');
      tbody.replaceChildren(...(body.webhooks.length ? body.webhooks.map(row)
        : [h('tr', {}, h('td', { colspan: '5', class: 'empty' }, 'No webhook endpoints yet.'))]));
      limitNote.textContent = `${body.total} of ${body.limit} endpoints.`;
    } catch (e) {
      error.show(e.message);
    }
  }

  async function act(work, done) {
    try {
      await work();
      if (done) announce(done);
      load();
    } catch (e) {
      announce(e.message, 'error');
    }
  }

  function row(hook) {
    const label = hook.description || hook.url;
    const cell = (name, content) => h('td', { dataset: { label: name } }, content);
    const path = `/webhooks/${encodeURIComponent(hook.id)}`;
    const button = (text, onclick, attrs = {}) => h('button', { type: 'button', onclick, ...attrs }, text);
    return h('tr', {},
      cell('Endpoint', h('div', {}, h('code', { class: 'mono' }, hook.url),
        hook.description ? h('div', { class: 'muted' }, hook.description) : null)),
      cell('Events', hook.events.join(', ')),
      cell('State', h('span', { class: hook.enabled ? '' : 'bad' }, stateText(hook))),
      cell('Created', formatDate(hook.created_at)),
      cell('Actions', h('div', { class: 'row' },
        button('Send test', () => act(() => api('POST', `${path}/test`),
          `Test event queued for ${label}; see its deliveries.`), { disabled: !hook.enabled,
          'aria-label': `Send a test event to ${label}` }),
        button(hook.enabled ? 'Disable' : 'Enable', () => act(() => api('PATCH', path,
          { json: { enabled: !hook.enabled } }), `${hook.enabled ? 'Disabled' : 'Enabled'} ${label}.`),
        { 'aria-label': `${hook.enabled ? 'Disable' : 'Enable'} ${label}` }),
        button('Deliveries', () => showDeliveries(hook, 1), { 'aria-label': `Deliveries of ${label}` }),
        button('Rotate secret', async () => {
          if (!await confirmAction(`Replace the signing secret of ${label}? Your receiver must use the new one `
            + 'for the next deliveries.', 'Rotate')) return;
          act(async () => showSecret(await api('POST', `${path}/rotate-secret`), 'New signing secret'));
        }, { 'aria-label': `Rotate the signing secret of ${label}` }),
        button('Delete', async () => {
          if (!await confirmAction(`Delete the webhook ${label}? Its pending deliveries are dropped.`, 'Delete')) return;
          act(() => api('DELETE', path), `Deleted the webhook ${label}.`);
        }, { class: 'danger', 'aria-label': `Delete the webhook ${label}` }))));
  }

  async function showDeliveries(hook, page) {
    try {
      const body = await api('GET', `/webhooks/${encodeURIComponent(hook.id)}/deliveries`,
        { query: { page, limit: 30 } });
      const rows = body.deliveries.map((d) => h('tr', {},
        h('td', { dataset: { label: 'Event' } }, d.event),
        h('td', { dataset: { label: 'Status' } }, h('span', { class: d.status === 'failed' ? 'bad' : '' }, d.status)),
        h('td', { dataset: { label: 'Response' } }, d.response_code ?? (d.error || '—')),
        h('td', { dataset: { label: 'Duration' } }, d.duration_ms === null ? '—' : `${d.duration_ms} ms`),
        h('td', { dataset: { label: 'Attempts' } }, String(d.attempts)),
        h('td', { dataset: { label: 'Next retry' } }, d.next_retry_at ? formatDate(d.next_retry_at) : '—'),
        h('td', { dataset: { label: 'Created' } }, formatDate(d.created_at))));
      details.replaceChildren(
        h('h2', {}, `Deliveries to ${hook.description || hook.url}`),
        h('table', { class: 'table responsive' },
          h('thead', {}, h('tr', {}, ...['Event', 'Status', 'Response', 'Duration', 'Attempts', 'Next retry', 'Created']
            .map((t) => h('th', { scope: 'col' }, t)))),
          h('tbody', {}, ...(rows.length ? rows
            : [h('tr', {}, h('td', { colspan: '7', class: 'empty' }, 'No deliveries yet.'))]))),
        pager(body, (p) => showDeliveries(hook, p), 'Delivery pages'),
        h('div', { class: 'row' }, h('button', { type: 'button', onclick: () => showDeliveries(hook, page) }, 'Refresh'),
          h('button', { type: 'button', onclick: () => { details.hidden = true; } }, 'Close')));
      details.hidden = false;
    } catch (e) {
      announce(e.message, 'error');
    }
  }

  function showSecret(body, title) {
    const secret = field('Signing secret', { type: 'text', readonly: true, value: body.secret, class: 'mono',
      'aria-describedby': 'secret-once' });
    created.replaceChildren(
      h('h2', {}, title),
      h('p', { id: 'secret-once', class: 'warning' }, 'Copy it now: this is the only time the secret is shown. '
        + 'Your receiver verifies each delivery with it (a Standard Webhooks library: '
        + 'Webhook(secret).verify(body, headers)).'),
      secret.wrap,
      h('div', { class: 'row' },
        h('button', { type: 'button', class: 'primary', onclick: async () => {
          const ok = await copyText(body.secret);
          if (!ok) secret.input.select();
          announce(ok ? 'Copied the secret.' : 'Copying failed: the secret is selected, press Ctrl+C.', ok ? 'info' : 'error');
        } }, 'Copy secret'),
        h('button', { type: 'button', onclick: () => { created.hidden = true; created.replaceChildren(); } },
          'Done, hide the secret')));
    created.hidden = false;
    secret.input.focus();
    secret.input.select();
  }

  const form = h('form', { class: 'row-form' }, url.wrap, description.wrap, events.wrap,
    h('button', { type: 'submit', class: 'primary' }, 'Add endpoint'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.clear();
    const chosen = events.values();
    if (!chosen.length) {
      error.show('Choose at least one event.');
      return;
    }
    try {
      const json = { url: url.input.value.trim(), events: chosen };
      if (description.input.value.trim()) json.description = description.input.value.trim();
      const body = await busy(form, () => api('POST', '/webhooks', { json }));
      url.input.value = '';
      description.input.value = '';
      showSecret(body, 'Webhook endpoint added');
      load();
    } catch (e) {
      error.show(e.message);
    }
  });

  load();
  return [
    h('h1', {}, 'Webhooks'),
    h('p', { class: 'muted' }, 'mediasrv POSTs a signed JSON event to each endpoint when a file is uploaded, '
      + 'changed or deleted, and retries for about a day until the endpoint answers 2xx. An endpoint failing '
      + 'for 3 days is disabled and you get an e-mail.'),
    h('section', { class: 'card' }, form, error.el, created),
    limitNote,
    table,
    details,
  ];
}
