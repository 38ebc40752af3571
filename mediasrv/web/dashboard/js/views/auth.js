// Account pages: log in, register, "check your e-mail", confirmed, forgot and reset password.
import { anonymous, login } from '../api.js';
import { busy, errorBox, field, h } from '../dom.js';

function page(title, ...content) {
  return [h('section', { class: 'card narrow' }, h('h1', {}, title), ...content)];
}

function loginForm(onLoggedIn) {
  const email = field('Email', { type: 'email', name: 'email', autocomplete: 'username', required: true });
  const password = field('Password', { type: 'password', name: 'password', autocomplete: 'current-password',
    required: true });
  const error = errorBox();
  const form = h('form', { class: 'stack', novalidate: false },
    email.wrap, password.wrap, error.el, h('button', { type: 'submit', class: 'primary' }, 'Log in'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.clear();
    try {
      const user = await busy(form, () => login(email.input.value, password.input.value));
      onLoggedIn(user);
    } catch (e) {
      error.show(e.code === 'EMAIL_NOT_VERIFIED'
        ? 'Confirm your e-mail address first: open the link we sent you.' : e.message);
      password.input.focus();
    }
  });
  return form;
}

export function loginView({ onLoggedIn, notice }) {
  return page('Log in',
    notice ? h('p', { class: 'notice', role: 'status' }, notice) : null,
    loginForm(onLoggedIn),
    h('p', {}, h('a', { href: '#/register' }, 'Create an account'), ' · ',
      h('a', { href: '#/forgot' }, 'Forgot your password?')));
}

export function confirmedView({ onLoggedIn }) {
  return loginView({ onLoggedIn, notice: 'Your e-mail address is confirmed. Log in to start uploading.' });
}

/** Where a confirmation link opened a second time lands (GET /auth/confirm, from a browser). */
export function confirmUsedView({ onLoggedIn }) {
  return loginView({ onLoggedIn, notice: 'This confirmation link was already used, so your address is already '
    + 'confirmed: log in below. (A link also stops working after 48 hours, or when the address is registered '
    + 'again before it is confirmed: then the newest e-mail to it has a link to choose your password. If yours '
    + 'expired unused, "Forgot your password?" sends a new link that confirms the address too.)' });
}

export function registerView({ go, params }) {
  const email = field('Email', { type: 'email', name: 'email', autocomplete: 'username', required: true });
  const password = field('Password', { type: 'password', name: 'password', autocomplete: 'new-password',
    required: true, minlength: '6', 'aria-describedby': 'pw-hint' });
  // An invite-only server (MEDIASRV_REGISTRATION=invite) needs a code: an invite link
  // (#/register?invite=...) fills it in; elsewhere it stays empty and is not sent.
  const invite = field('Invite code (if you were given one)', { type: 'text', name: 'invite', autocomplete: 'off',
    value: (params && params.get('invite')) || '', class: 'mono' });
  const error = errorBox();
  const form = h('form', { class: 'stack' }, email.wrap, password.wrap,
    h('p', { id: 'pw-hint', class: 'muted' }, 'At least 6 characters.'), invite.wrap, error.el,
    h('button', { type: 'submit', class: 'primary' }, 'Create account'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.clear();
    const body = { email: email.input.value, password: password.input.value };
    if (invite.input.value.trim()) body.invite = invite.input.value.trim();
    try {
      await busy(form, () => anonymous('POST', '/auth/register', body));
      sessionStorage.setItem('mediasrv.registered_email', email.input.value);
      go('#/check-email');
    } catch (e) {
      error.show(e.message);
    }
  });
  return page('Create an account', form, h('p', {}, 'Already registered? ', h('a', { href: '#/login' }, 'Log in')));
}

export function checkEmailView() {
  const address = sessionStorage.getItem('mediasrv.registered_email');
  return page('Check your e-mail',
    h('p', {}, 'We sent a confirmation link to ', address ? h('strong', {}, address) : 'your address', '.'),
    h('p', {}, 'Open it to confirm your address; it brings you back here to log in. The link works once and ',
      'expires in 48 hours.'),
    h('p', {}, h('a', { href: '#/login' }, 'Back to log in')));
}

export function forgotView() {
  const email = field('Email', { type: 'email', name: 'email', autocomplete: 'username', required: true });
  const error = errorBox();
  const done = h('p', { class: 'notice', role: 'status', hidden: true });
  const form = h('form', { class: 'stack' }, email.wrap, error.el, done,
    h('button', { type: 'submit', class: 'primary' }, 'Send reset link'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.clear();
    try {
      const body = await busy(form, () => anonymous('POST', '/auth/forgot-password', { email: email.input.value }));
      done.textContent = body.message;
      done.hidden = false;
    } catch (e) {
      error.show(e.message);
    }
  });
  return page('Reset your password', form, h('p', {}, h('a', { href: '#/login' }, 'Back to log in')));
}

/** The page the reset e-mail links to: /auth/reset-password?token=... */
export function resetView({ token }) {
  if (!token) {
    return page('Choose a new password', h('p', { class: 'error', role: 'alert' },
      'This link has no reset token. Ask for a new link.'), h('p', {}, h('a', { href: '/#/forgot' }, 'Reset your password')));
  }
  const password = field('New password', { type: 'password', autocomplete: 'new-password', required: true,
    minlength: '6' });
  const repeat = field('Repeat new password', { type: 'password', autocomplete: 'new-password', required: true,
    minlength: '6' });
  const error = errorBox();
  const form = h('form', { class: 'stack' }, password.wrap, repeat.wrap, error.el,
    h('button', { type: 'submit', class: 'primary' }, 'Set new password'));
  const section = h('section', { class: 'card narrow' }, h('h1', {}, 'Choose a new password'), form);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.clear();
    if (password.input.value !== repeat.input.value) {
      error.show('The two passwords differ.');
      repeat.input.focus();
      return;
    }
    try {
      const body = await busy(form, () => anonymous('POST', '/auth/reset-password',
        { token, password: password.input.value }));
      form.replaceWith(h('div', {}, h('p', { class: 'notice', role: 'status' }, body.message),
        h('p', {}, h('a', { href: '/#/login' }, 'Log in'))));
    } catch (e) {
      error.show(e.code === 'INVALID_TOKEN'
        ? 'This link is invalid, used or expired. Ask for a new one from the log-in page.' : e.message);
    }
  });
  return [section];
}
