// The dashboard's router: hash routes (#/files, ...) so no page path can collide with an API
// route, plus the one real path the reset e-mail links to (/auth/reset-password?token=...).
import { api, hasSession, logout, onSessionEnd, refresh } from './api.js';
import { announce } from './dom.js';
import {
  checkEmailView, confirmedView, forgotView, loginView, registerView, resetView,
} from './views/auth.js';
import { filesView, resetFilesState } from './views/files.js';
import { keysView } from './views/keys.js';
import { settingsView } from './views/settings.js';
import { activityView, usageView } from './views/usage.js';

const PUBLIC_ROUTES = {
  '#/login': { title: 'Log in', view: loginView },
  '#/register': { title: 'Create an account', view: registerView },
  '#/check-email': { title: 'Check your e-mail', view: checkEmailView },
  '#/confirmed': { title: 'E-mail confirmed', view: confirmedView },
  '#/forgot': { title: 'Reset your password', view: forgotView },
};
const PRIVATE_ROUTES = {
  '#/files': { title: 'Files', view: filesView },
  '#/keys': { title: 'API keys', view: keysView },
  '#/settings': { title: 'Settings', view: settingsView },
  '#/usage': { title: 'Usage', view: usageView },
  '#/activity': { title: 'Activity', view: activityView },
};

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
let resetToken = null;
let email = null;

function go(hash) {
  if (location.hash === hash) render();
  else location.hash = hash;
}

function show(title, nodes, loggedIn) {
  document.title = `${title} · mediasrv`;
  nav.hidden = !loggedIn;
  who.hidden = !loggedIn;
  document.getElementById('who-email').textContent = email || '';
  for (const link of nav.querySelectorAll('a')) {
    if (link.getAttribute('href') === location.hash) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  main.replaceChildren(...nodes.flat().filter(Boolean));
  main.focus({ preventScroll: true });
}

async function whoAmI() {
  if (email) return;
  try {
    email = (await api('GET', '/profile')).user.email;
  } catch {
    email = null;
  }
}

async function render() {
  if (location.pathname === '/auth/reset-password') {
    show('Choose a new password', resetView({ token: resetToken }), false);
    return;
  }
  const hash = location.hash || '#/files';
  const onLoggedIn = (user) => {
    email = user.email;
    announce(`Logged in as ${user.email}.`);
    go('#/files');
  };
  if (PUBLIC_ROUTES[hash]) {
    const route = PUBLIC_ROUTES[hash];
    show(route.title, route.view({ go, onLoggedIn }), false);
    return;
  }
  const route = PRIVATE_ROUTES[hash] || PRIVATE_ROUTES['#/files'];
  if (!hasSession()) {
    go('#/login');
    return;
  }
  try {
    await whoAmI();
  } catch {
    // shown by the view's own calls
  }
  if (!hasSession()) {
    go('#/login');
    return;
  }
  show(route.title, route.view({ go, rerender: render }), true);
}

document.getElementById('logout').addEventListener('click', async () => {
  await logout();
  email = null;
  resetFilesState();
  announce('You are logged out.');
  go('#/login');
});

onSessionEnd(() => {
  email = null;
  resetFilesState();
  announce('Your session has ended. Log in again.', 'error');
  go('#/login');
});

// The reset link carries its token in the query: keep it in memory, drop it from the address
// bar and history so it is not left behind for the next person at this browser.
if (location.pathname === '/auth/reset-password') {
  resetToken = new URLSearchParams(location.search).get('token');
  history.replaceState(null, '', '/auth/reset-password');
}

window.addEventListener('hashchange', render);

// A reload of a logged-in tab: trade the stored refresh token for a fresh access token first.
if (hasSession() && location.pathname === '/') {
  refresh().catch(() => {}).finally(render);
} else {
  render();
}
