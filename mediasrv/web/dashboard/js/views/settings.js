// Settings: the custom domain with its status, and the upload size cap.
import { api } from '../api.js';
import { busy, errorBox, field, formatBytes, formatDate, h, statusFor } from '../dom.js';

const MB = 1024 * 1024;

export function settingsView() {
  const announce = statusFor();
  const domainStatus = h('dl', { class: 'facts' });
  const capText = h('p', {});
  const domainError = errorBox();
  const capError = errorBox();
  const domain = field('Custom domain', { type: 'text', placeholder: 'media.example.com', autocomplete: 'off',
    'aria-describedby': 'domain-help' });
  const cap = field('Maximum upload size (MB)', { type: 'number', min: '0.001', step: 'any', inputmode: 'decimal' });

  function show(settings) {
    const d = settings.custom_domain;
    domain.input.value = d ? d.hostname : '';
    const rows = d ? [
      ['Hostname', d.hostname], ['Verification', d.verification_status], ['Certificate', d.ssl_status === 'external'
        ? 'not issued by mediasrv: the server\'s TLS front end provides it' : d.ssl_status],
      ['Checked', formatDate(d.updated_at)], ['Public URLs start with', settings.public_url_base || 'the server URL'],
      // While pending, the proof of control the server asks for (manual provider): a DNS TXT record.
      ...(d.verification_record ? [['Publish a TXT record named', d.verification_record.name],
        ['holding', d.verification_record.value]] : []),
    ] : [['Custom domain', 'None: public URLs use the server URL']];
    domainStatus.replaceChildren(...rows.flatMap(([k, v]) => [h('dt', {}, k),
      h('dd', { class: v === 'active' ? 'ok' : '' }, v)]));
    removeButton.disabled = !d;
    refreshButton.disabled = !d;
    cap.input.value = String(Math.round((settings.max_upload_size_bytes / MB) * 1000) / 1000);
    capText.textContent = `Uploads larger than ${formatBytes(settings.max_upload_size_bytes)} are refused.`;
  }

  async function patch(form, errors, body, done) {
    errors.clear();
    try {
      show(await busy(form, () => api('PATCH', '/settings', { json: body })));
      announce(done);
    } catch (e) {
      errors.show(e.message);
    }
  }

  const removeButton = h('button', { type: 'button', class: 'danger' }, 'Remove custom domain');
  const refreshButton = h('button', { type: 'button' }, 'Check domain status');
  const domainForm = h('form', { class: 'stack' }, domain.wrap,
    h('p', { id: 'domain-help', class: 'muted' },
      'Point a CNAME record for the hostname at this server, save it here, then check its status.'),
    domainError.el,
    h('div', { class: 'row' }, h('button', { type: 'submit', class: 'primary' }, 'Save custom domain'),
      refreshButton, removeButton));
  domainForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const value = domain.input.value.trim();
    patch(domainForm, domainError, { custom_domain: value || null }, value ? `Saved ${value}.` : 'Removed the custom domain.');
  });
  refreshButton.addEventListener('click', () => patch(domainForm, domainError, { refresh_custom_domain: true },
    'Domain status checked.'));
  removeButton.addEventListener('click', () => patch(domainForm, domainError, { custom_domain: null },
    'Removed the custom domain.'));

  const capForm = h('form', { class: 'stack' }, cap.wrap, capText, capError.el,
    h('div', { class: 'row' }, h('button', { type: 'submit', class: 'primary' }, 'Save upload limit'),
      h('button', { type: 'button', onclick: () => patch(capForm, capError, { max_upload_size_bytes: null },
        'Upload limit reset to the server maximum.') }, 'Use the server maximum')));
  capForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const mb = Number(cap.input.value);
    if (!Number.isFinite(mb) || mb <= 0) {
      capError.show('Enter a size in MB greater than 0.');
      return;
    }
    patch(capForm, capError, { max_upload_size_bytes: Math.max(1, Math.round(mb * MB)) }, 'Upload limit saved.');
  });

  // Both forms stay disabled until the current settings arrive, so a value typed before then
  // is never overwritten by the late answer.
  const setEnabled = (on) => [domainForm, capForm].forEach((f) => { for (const el of f.elements) el.disabled = !on; });
  setEnabled(false);
  api('GET', '/settings').then((settings) => { setEnabled(true); show(settings); })
    .catch((e) => domainError.show(e.message));
  return [
    h('h1', {}, 'Settings'),
    h('section', { class: 'card', 'aria-labelledby': 'domain-title' },
      h('h2', { id: 'domain-title' }, 'Custom domain'), domainStatus, domainForm),
    h('section', { class: 'card', 'aria-labelledby': 'cap-title' },
      h('h2', { id: 'cap-title' }, 'Upload size limit'), capForm),
  ];
}
