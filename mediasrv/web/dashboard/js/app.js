// The dashboard's router: hash routes (#/files, ...) so no page path can collide with an API
// route, plus the one real path the reset e-mail links to (/auth/reset-password?token=...).
import { api, hasSession, logout, onSessionEnd, resume } from './api.js';
import { announce, confirmAction, enterView, focusView } from './dom.js';
import {
  checkEmailView, confirmUsedView, confirmedView, forgotView, loginView, registerView, resetView,
} from './views/auth.js';
import { fileView } from './views/file.js';
import { filesView, resetFilesState, uploadQueue } from './views/files.js';
import { invitesView } from './views/invites.js';
import { keysView } from './views/keys.js';
import { settingsView } from './views/settings.js';
import { activityView, usageView } from './views/usage.js';
import { webhooksView } from './views/webhooks.js';

const PUBLIC_ROUTES = {
  '#/login': { title: 'Log in', view: loginView },
  '#/register': { title: 'Create an account', view: registerView },
  '#/check-email': { title: 'Check your e-mail', view: checkEmailView },
  '#/confirmed': { title: 'E-mail confirmed', view: confirmedView },
  '#/confirm-used': { title: 'Link already used', view: confirmUsedView },
  '#/forgot': { title: 'Reset your password', view: forgotView },
};
const PRIVATE_ROUTES = {
  '#/files': { title: 'Files', view: filesView },
  '#/keys': { title: 'API keys', view: keysView },
  '#/webhooks': { title: 'Webhooks', view: webhooksView },
  '#/settings': { title: 'Settings', view: settingsView },
  '#/usage': { title: 'Usage', view: usageView },
  '#/activity': { title: 'Activity', view: activityView },
  '#/invites': { title: 'Invites', view: invitesView },
};

const FILE_ROUTE = /^#\/file\/([^/]+)$/;

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
let resetToken = null;
let email = null;
let isAdmin = null; // null: not asked yet for this session

function go(hash) {
  if (location.hash === hash) render();
  else location.hash = hash;
}

/** Show a view: the status line becomes its own (dom.enterView), then `build` makes its nodes. */
function show(title, build, loggedIn) {
  enterView(location.pathname === '/auth/reset-password' ? location.pathname : (location.hash || '#/files'));
  const nodes = build();
  document.title = `${title} · mediasrv`;
  nav.hidden = !loggedIn;
  document.getElementById('nav-invites').hidden = isAdmin !== true;
  who.hidden = !loggedIn;
  document.getElementById('who-email').textContent = email || '';
  const current = location.hash.replace(FILE_ROUTE, '#/files'); // a file's page is part of Files
  for (const link of nav.querySelectorAll('a:not(.queue-badge)')) {
    if (link.getAttribute('href') === current) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  main.replaceChildren(...nodes.flat().filter(Boolean));
  focusView(main);
}

async function whoAmI() {
  if (email && isAdmin !== null) return;
  try {
    const profile = await api('GET', '/profile');
    email = profile.user.email;
    // Admin accounts (MEDIASRV_ADMIN_EMAILS) may make invite codes: the Invites link shows for them.
    isAdmin = profile.is_admin === true;
  } catch {
    email = null;
  }
}

async function render() {
  if (location.pathname === '/auth/reset-password') {
    show('Choose a new password', () => resetView({ token: resetToken }), false);
    return;
  }
  const [hash, query] = (location.hash || '#/files').split('?');
  const params = new URLSearchParams(query || '');
  const onLoggedIn = (user) => {
    email = user.email;
    announce(`Logged in as ${user.email}.`, 'info', '#/files');
    go('#/files');
  };
  if (PUBLIC_ROUTES[hash]) {
    const route = PUBLIC_ROUTES[hash];
    show(route.title, () => route.view({ go, onLoggedIn, params }), false);
    return;
  }
  const fileId = FILE_ROUTE.exec(hash);
  const route = fileId ? { title: 'File', view: (props) => fileView({ ...props, id: decodeURIComponent(fileId[1]) }) }
    : PRIVATE_ROUTES[hash] || PRIVATE_ROUTES['#/files'];
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
  show(route.title, () => route.view({ go, rerender: render }), true);
}

document.getElementById('logout').addEventListener('click', async () => {
  const pending = uploadQueue.pending();
  if (pending && !await confirmAction(`${pending} upload${pending === 1 ? ' is' : 's are'} not finished. `
    + 'Log out and drop them?', 'Log out')) return;
  await logout();
  email = null;
  isAdmin = null;
  resetFilesState();
  announce('You are logged out.', 'info', '#/login');
  go('#/login');
});

onSessionEnd((reason) => {
  email = null;
  isAdmin = null;
  resetFilesState();
  announce(reason === 'logout' ? 'You logged out in another tab.' : 'Your session has ended. Log in again.',
    reason === 'logout' ? 'info' : 'error', '#/login');
  go('#/login');
});

// Uploads go on while another view is shown: the header says how many are left, and closing
// the tab with some left asks first (the files would not arrive).
const queueBadge = document.getElementById('queue-badge');
uploadQueue.subscribe(() => {
  const pending = uploadQueue.pending();
  queueBadge.hidden = !pending;
  queueBadge.textContent = pending ? `Uploading: ${pending} left` : '';
});
window.addEventListener('beforeunload', (event) => {
  if (uploadQueue.pending()) event.preventDefault();
});

// The reset link carries its token in the query: keep it in memory, drop it from the address
// bar and history so it is not left behind for the next person at this browser.
if (location.pathname === '/auth/reset-password') {
  resetToken = new URLSearchParams(location.search).get('token');
  history.replaceState(null, '', '/auth/reset-password');
}

window.addEventListener('hashchange', render);

// At load: the session of another open tab, or (a reload) this tab's own refresh token.
if (location.pathname === '/') {
  resume().catch(() => {}).finally(render);
} else {
  render();
}
