// Invite codes, for admin accounts (MEDIASRV_ADMIN_EMAILS) of an invite-only server: make a
// few (each shown once, as a code and as a registration link), list which were used.
import { api } from '../api.js';
import { busy, copyText, errorBox, field, formatDate, h, pager, statusFor } from '../dom.js';

export function invitesView() {
  const announce = statusFor();
  const state = { page: 1 };
  const error = errorBox();
  const count = field('How many', { type: 'number', min: '1', max: '50', value: '1', required: true });
  const days = field('Valid for (days)', { type: 'number', min: '1', max: '366', value: '7', required: true });
  const created = h('div', { class: 'created-key', hidden: true });
  const tbody = h('tbody');
  const pagerSlot = h('div');
  const table = h('table', { class: 'table responsive' },
    h('caption', { class: 'visually-hidden' }, 'Invite codes'),
    h('thead', {}, h('tr', {}, ...['Created', 'Expires', 'Used'].map((t) => h('th', { scope: 'col' }, t)))),
    tbody);

  async function load() {
    try {
      const body = await api('GET', '/admin/invites', { query: { page: state.page, limit: 30 } });
      tbody.replaceChildren(...(body.invites.length ? body.invites.map(row)
        : [h('tr', {}, h('td', { colspan: '3', class: 'empty' }, 'No invite codes yet.'))]));
      pagerSlot.replaceChildren(pager(body, (p) => { state.page = p; load(); }, 'Invite pages'));
    } catch (e) {
      error.show(e.message);
    }
  }

  function row(invite) {
    const cell = (label, content) => h('td', { dataset: { label } }, content);
    return h('tr', {},
      cell('Created', formatDate(invite.created_at)),
      cell('Expires', formatDate(invite.expires_at)),
      cell('Used', invite.used_at ? formatDate(invite.used_at) : h('span', { class: 'muted' }, 'Not yet')));
  }

  function showCreated(body) {
    const links = body.codes.map((code) => `${location.origin}/#/register?invite=${encodeURIComponent(code)}`);
    const copyButton = h('button', { type: 'button', class: 'primary', onclick: async () => {
      const ok = await copyText(links.join('\n'));
      announce(ok ? `Copied ${links.length === 1 ? 'the link' : `${links.length} links`}.`
        : 'Copying failed: select the links and press Ctrl+C.', ok ? 'info' : 'error');
    } }, links.length === 1 ? 'Copy link' : 'Copy links');
    created.replaceChildren(
      h('h2', {}, `${links.length} invite${links.length === 1 ? '' : 's'} made`),
      h('p', { class: 'warning' }, `Copy them now: they are shown only this once. Each works for one `
        + `registration until ${formatDate(body.expires_at)}.`),
      h('ul', { class: 'invite-links' }, ...links.map((link) => h('li', {}, h('code', { class: 'mono' }, link)))),
      h('div', { class: 'row' }, copyButton, h('button', { type: 'button', onclick: () => {
        created.hidden = true;
        created.replaceChildren();
      } }, 'Done, hide them')));
    created.hidden = false;
  }

  const form = h('form', { class: 'row-form' }, count.wrap, days.wrap,
    h('button', { type: 'submit', class: 'primary' }, 'Make invites'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.clear();
    try {
      const json = { count: Number(count.input.value), days: Number(days.input.value) };
      showCreated(await busy(form, () => api('POST', '/admin/invites', { json })));
      load();
    } catch (e) {
      error.show(e.message);
    }
  });

  load();
  return [
    h('h1', {}, 'Invites'),
    h('p', { class: 'muted' }, 'On this server people register with an invite. Send someone a link; it fills in '
      + 'the code on the registration page.'),
    h('section', { class: 'card' }, form, error.el, created),
    table,
    pagerSlot,
  ];
}
